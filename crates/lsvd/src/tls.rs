//! TLS for `lsvd serve` (NBD's STARTTLS) with rustls: loads the PEM files named on the
//! command line, checks them at startup, and implements [`lsvd_nbd::TlsAcceptor`].
//!
//! Why here and not in `lsvd-nbd`: the protocol crate only knows a handshake seam, so
//! it stays free of a TLS stack; rustls (with the aws-lc-rs provider that the S3
//! client already builds) lives in the binary that needs it.
//!
//! Access control is by client certificate: with a client CA, the handshake fails for
//! a client that presents no certificate or one not signed by that CA. The private key
//! must be its owner's alone (mode 600): one that its group or others can read is
//! refused at startup, since whoever reads it can pose as the server.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lsvd_nbd::server::tls::{BoxFuture, BoxStream};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use lsvd_core::error::{Error, Result};

/// Socket bytes read ahead below TLS, per connection.
const READ_BUFFER_BYTES: usize = 64 << 10;

/// The TLS files of `lsvd serve`, as given.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Clients must present a certificate signed by one of these CAs.
    pub client_ca: Option<PathBuf>,
}

/// A ready TLS server configuration.
#[derive(Clone)]
pub struct Acceptor {
    inner: tokio_rustls::TlsAcceptor,
}

impl lsvd_nbd::TlsAcceptor for Acceptor {
    fn accept(&self, stream: BoxStream) -> BoxFuture<'_, io::Result<BoxStream>> {
        Box::pin(async move {
            // rustls pulls at most 4 KiB from the socket per read: without a buffer
            // underneath, a 4 KiB WRITE costs two or more read syscalls.
            let buffered = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, stream);
            let tls = self.inner.accept(buffered).await?;
            Ok(Box::new(tls) as BoxStream)
        })
    }
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    // Read first: a missing file is an I/O error, not "no certificate".
    let bytes = std::fs::read(path)
        .map_err(|e| Error::bad_input(format!("cannot read {what} {}: {e}", path.display())))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| {
            Error::bad_input(format!("{what} {} is not valid PEM: {e}", path.display()))
        })?;
    if certs.is_empty() {
        return Err(Error::bad_input(format!(
            "{what} {} holds no certificate (expected PEM: -----BEGIN CERTIFICATE-----)",
            path.display()
        )));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::bad_input(format!("cannot read TLS key {}: {e}", path.display())))?;
    let key = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        Error::bad_input(format!(
            "TLS key {} holds no usable private key (expected PEM: -----BEGIN PRIVATE KEY-----, \
             RSA PRIVATE KEY or EC PRIVATE KEY): {e}",
            path.display()
        ))
    })?;
    check_key_mode(path)?;
    Ok(key)
}

/// A private key its group or others may read (or write) is refused: whoever can read
/// it can pose as this server to every client. Checked once the file is known to hold
/// a key (a file that holds none is a different mistake, reported as such).
fn check_key_mode(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|e| Error::bad_input(format!("cannot read TLS key {}: {e}", path.display())))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(Error::bad_input(format!(
            "TLS key {} is open to its group or others (mode {:04o}): anyone who can read it \
             can pose as this server; run chmod 600 {} (and keep it owned by the user lsvd \
             runs as)",
            path.display(),
            mode & 0o7777,
            path.display()
        )));
    }
    Ok(())
}

impl TlsFiles {
    /// Reads and checks every file; any problem is a one-line `BadInput` error.
    pub fn load(&self) -> Result<Acceptor> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let certs = read_certs(&self.cert, "TLS certificate")?;
        let key = read_key(&self.key)?;
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::bad_input(format!("TLS setup: {e}")))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for cert in read_certs(ca, "client CA certificate")? {
                    roots.add(cert).map_err(|e| {
                        Error::bad_input(format!(
                            "client CA certificate {} is not usable: {e}",
                            ca.display()
                        ))
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| {
                            Error::bad_input(format!("client CA certificate {}: {e}", ca.display()))
                        })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder.with_single_cert(certs, key).map_err(|e| {
            Error::bad_input(format!(
                "TLS certificate {} and key {} cannot be used together: {e}",
                self.cert.display(),
                self.key.display()
            ))
        })?;
        Ok(Acceptor {
            inner: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }
}
