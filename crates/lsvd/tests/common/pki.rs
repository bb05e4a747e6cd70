//! Throwaway certificates for the TLS tests, made with `openssl` in a temp dir: a CA, a
//! server certificate for 127.0.0.1/localhost, client certificates, and the client
//! directories libnbd (`tls-certificates=DIR`) and qemu (`tls-creds-x509,dir=DIR`) read:
//! `ca-cert.pem`, `client-cert.pem`, `client-key.pem`.

use std::path::{Path, PathBuf};

use super::{SHORT, run_ok, tool};

/// The files of one test PKI.
pub struct Pki {
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// A client with a certificate signed by the CA.
    pub client_dir: PathBuf,
    /// A client that trusts the server but has no certificate of its own.
    pub no_cert_dir: PathBuf,
    /// A client whose certificate comes from another CA.
    pub rogue_dir: PathBuf,
}

const SERVER_EXT: &str = "basicConstraints=CA:FALSE\n\
keyUsage=critical,digitalSignature,keyEncipherment\n\
extendedKeyUsage=serverAuth\n\
subjectAltName=DNS:localhost,IP:127.0.0.1\n";

const CLIENT_EXT: &str = "basicConstraints=CA:FALSE\n\
keyUsage=critical,digitalSignature,keyEncipherment\n\
extendedKeyUsage=clientAuth\n";

fn openssl(args: &[&str]) {
    run_ok(tool("openssl").args(args), SHORT);
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// A self-signed CA named `cn`: (cert, key).
fn make_ca(dir: &Path, cn: &str) -> (PathBuf, PathBuf) {
    let cert = dir.join(format!("{cn}-cert.pem"));
    let key = dir.join(format!("{cn}-key.pem"));
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-days",
        "2",
        "-subj",
        &format!("/CN={cn}"),
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        s(&key),
        "-out",
        s(&cert),
    ]);
    (cert, key)
}

/// A leaf certificate `cert`/`key` named `cn`, signed by `ca`, with extensions `ext`.
fn make_leaf(dir: &Path, ca: &(PathBuf, PathBuf), cn: &str, ext: &str, cert: &Path, key: &Path) {
    let csr = dir.join(format!("{cn}.csr"));
    let ext_file = dir.join(format!("{cn}.ext"));
    std::fs::write(&ext_file, ext).expect("write extensions");
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-subj",
        &format!("/CN={cn}"),
        "-keyout",
        s(key),
        "-out",
        s(&csr),
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        s(&csr),
        "-CA",
        s(&ca.0),
        "-CAkey",
        s(&ca.1),
        "-set_serial",
        "2",
        "-days",
        "2",
        "-extfile",
        s(&ext_file),
        "-out",
        s(cert),
    ]);
}

impl Pki {
    /// Makes every file under `dir` (about 0.1 s of openssl).
    pub fn new(dir: &Path) -> Pki {
        let ca_dir = dir.join("ca");
        std::fs::create_dir_all(&ca_dir).expect("mkdir ca");
        let ca = make_ca(&ca_dir, "lsvd-test-ca");
        let rogue_ca = make_ca(&ca_dir, "rogue-ca");
        let server_cert = ca_dir.join("server-cert.pem");
        let server_key = ca_dir.join("server-key.pem");
        make_leaf(
            &ca_dir,
            &ca,
            "localhost",
            SERVER_EXT,
            &server_cert,
            &server_key,
        );

        let client_dir = dir.join("client");
        let no_cert_dir = dir.join("client-no-cert");
        let rogue_dir = dir.join("client-rogue");
        for d in [&client_dir, &no_cert_dir, &rogue_dir] {
            std::fs::create_dir_all(d).expect("mkdir client dir");
            std::fs::copy(&ca.0, d.join("ca-cert.pem")).expect("copy ca");
        }
        // A client certificate from the CA, and one from the rogue CA.
        for (issuer, name, dir) in [
            (&ca, "client", &client_dir),
            (&rogue_ca, "rogue-client", &rogue_dir),
        ] {
            let (cert, key) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
            make_leaf(&ca_dir, issuer, name, CLIENT_EXT, &cert, &key);
        }
        Pki {
            ca_cert: ca.0,
            server_cert,
            server_key,
            client_dir,
            no_cert_dir,
            rogue_dir,
        }
    }

    /// `--tls-cert CERT --tls-key KEY --tls-client-ca CA`
    pub fn serve_args(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            s(&self.server_cert).into(),
            "--tls-key".into(),
            s(&self.server_key).into(),
            "--tls-client-ca".into(),
            s(&self.ca_cert).into(),
        ]
    }
}

/// `nbds://127.0.0.1:PORT/NAME?tls-certificates=DIR` (libnbd).
pub fn nbds_uri(port: u16, name: &str, dir: &Path) -> String {
    format!(
        "nbds://127.0.0.1:{port}/{name}?tls-certificates={}",
        dir.display()
    )
}
