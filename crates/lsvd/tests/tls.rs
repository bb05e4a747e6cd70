//! NBD over TLS with real clients: libnbd (`nbdcopy`, `nbdinfo` with `nbds://` URIs and
//! a certificate directory) and qemu (`qemu-io` with `tls-creds-x509`), against
//! certificates made per test with `openssl` (common/pki.rs).
//!
//! Asserted: data written over TLS reads back identical over TLS, over the plain Unix
//! socket and after a restart; plain clients are refused (with a server log line) when
//! TLS is required and served when it is optional; clients without a certificate or
//! with one from another CA are refused; the `--insecure` rule for non-loopback
//! addresses; bad certificate files fail the start with one line.

mod common;

use std::path::Path;
use std::process::Output;

use common::pki::{Pki, nbds_uri};
use common::*;

const TOOLS: &[&str] = &["openssl", "nbdinfo", "nbdcopy", "qemu-io"];

/// The port of the TLS listener, from the server's "serving ... on nbds://" line.
fn tls_port(server: &Server) -> u16 {
    let log = server.log();
    let at = log
        .find("on nbds://127.0.0.1:")
        .unwrap_or_else(|| panic!("no nbds:// line in the server log\n{log}"));
    let rest = &log[at + "on nbds://127.0.0.1:".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().expect("port number")
}

/// A 1-line error from a client that did not get in (exit status non-zero).
fn assert_refused(out: &Output, what: &str) {
    assert!(
        !out.status.success(),
        "{what} was served\n{}",
        show(what, out)
    );
}

/// `lsvd serve` for `vol` with the TLS flags `extra` on 127.0.0.1:0 and a plain Unix
/// socket next to it.
fn serve_tls(lsvd: &Lsvd, socket: &Path, extra: &[String]) -> Server {
    let mut args: Vec<&str> = vec!["vol", "--listen", "127.0.0.1:0"];
    args.extend(extra.iter().map(String::as_str));
    lsvd.serve(socket, &args)
}

fn qemu_io(dir: &Path, port: u16, commands: &[&str]) -> Output {
    let mut cmd = tool("qemu-io");
    cmd.arg("--object")
        .arg(format!(
            "tls-creds-x509,id=tls0,dir={},endpoint=client",
            dir.display()
        ))
        .arg("--image-opts")
        .arg(format!(
            "driver=nbd,host=127.0.0.1,port={port},export=vol,tls-creds=tls0"
        ));
    for c in commands {
        cmd.arg("-c").arg(c);
    }
    run_timeout(&mut cmd, SHORT)
}

#[test]
fn tls_required_round_trips_and_refuses_strangers() {
    require_tools(TOOLS);
    let dir = TempDir::new("tls_required");
    let pki = Pki::new(&dir.subdir("pki"));
    let lsvd = Lsvd::new(dir.join("data"));
    lsvd.create("vol", "8M");
    let socket = dir.join("nbd.sock");
    let mut server = serve_tls(&lsvd, &socket, &pki.serve_args());
    let port = tls_port(&server);
    let log = server.log();
    assert!(log.contains("TLS required"), "{log}");
    let uri = nbds_uri(port, "vol", &pki.client_dir);

    // libnbd: 8 MiB in over TLS, back out over TLS and over the plain Unix socket.
    let image = dir.join("in.raw");
    write_random_image(&image, 18, 8 * MIB, 3);
    nbdcopy(image.to_str().expect("utf-8"), &uri);
    let out_tls = dir.join("out-tls.raw");
    nbdcopy(&uri, out_tls.to_str().expect("utf-8"));
    assert_files_equal(&image, &out_tls);
    let out_unix = dir.join("out-unix.raw");
    nbdcopy(&server.uri("vol"), out_unix.to_str().expect("utf-8"));
    assert_files_equal(&image, &out_unix);

    // qemu: write a pattern over TLS and read it back (qemu-io -P checks every byte).
    let out = qemu_io(
        &pki.client_dir,
        port,
        &["write -P 0xa7 1M 64k", "read -P 0xa7 1M 64k"],
    );
    assert!(out.status.success(), "{}", show("qemu-io over TLS", &out));
    assert!(!stdout(&out).contains("Pattern verification failed"));

    // A plain client is refused, and the server says so.
    let plain = run_timeout(
        tool("nbdinfo").arg(format!("nbd://127.0.0.1:{port}/vol")),
        SHORT,
    );
    assert_refused(&plain, "plain nbdinfo");
    let plain_qemu = run_timeout(
        tool("qemu-io").args([
            "--image-opts",
            &format!("driver=nbd,host=127.0.0.1,port={port},export=vol"),
            "-c",
            "read 0 4k",
        ]),
        SHORT,
    );
    assert_refused(&plain_qemu, "plain qemu-io");
    // Clients without a certificate, or with one from another CA, are refused.
    for (what, client) in [
        ("nbdinfo without a client certificate", &pki.no_cert_dir),
        ("nbdinfo with a certificate from another CA", &pki.rogue_dir),
    ] {
        let out = run_timeout(tool("nbdinfo").arg(nbds_uri(port, "vol", client)), SHORT);
        assert_refused(&out, what);
    }
    let out = qemu_io(&pki.rogue_dir, port, &["read 0 4k"]);
    assert_refused(&out, "qemu-io with a certificate from another CA");

    let log = server.log();
    assert!(
        log.contains("refused a plain-text client (127.0.0.1:"),
        "no log line for the refused plain client\n{log}"
    );
    assert!(
        log.contains("TLS handshake with 127.0.0.1:") && log.contains("failed"),
        "no log line for the refused certificate\n{log}"
    );

    // After a restart the data (nbdcopy's and qemu's) reads back over TLS.
    server.stop_clean();
    let mut server = serve_tls(&lsvd, &socket, &pki.serve_args());
    let uri = nbds_uri(tls_port(&server), "vol", &pki.client_dir);
    let after = dir.join("after-restart.raw");
    nbdcopy(&uri, after.to_str().expect("utf-8"));
    let mut expect = std::fs::read(&image).expect("read image");
    expect[MIB as usize..(MIB + 64 * KIB) as usize].fill(0xa7);
    assert!(
        std::fs::read(&after).expect("read back") == expect,
        "data after restart differs"
    );
    server.stop_clean();
}

#[test]
fn tls_optional_serves_plain_and_tls_clients() {
    require_tools(TOOLS);
    let dir = TempDir::new("tls_optional");
    let pki = Pki::new(&dir.subdir("pki"));
    let lsvd = Lsvd::new(dir.join("data"));
    lsvd.create("vol", "4M");
    let socket = dir.join("nbd.sock");
    // No client CA: any client that completes the handshake is served.
    let args: Vec<String> = [
        "--tls-cert",
        pki.server_cert.to_str().expect("utf-8"),
        "--tls-key",
        pki.server_key.to_str().expect("utf-8"),
        "--tls",
        "optional",
    ]
    .map(String::from)
    .to_vec();
    let mut server = serve_tls(&lsvd, &socket, &args);
    let port = tls_port(&server);

    let out = qemu_io(&pki.no_cert_dir, port, &["write -P 0x3c 0 64k"]);
    assert!(out.status.success(), "{}", show("qemu-io over TLS", &out));
    let plain = run_ok(
        tool("qemu-io").args([
            "--image-opts",
            &format!("driver=nbd,host=127.0.0.1,port={port},export=vol"),
            "-c",
            "read -P 0x3c 0 64k",
        ]),
        SHORT,
    );
    assert!(!stdout(&plain).contains("Pattern verification failed"));
    let size = run_ok(
        tool("nbdinfo")
            .arg("--size")
            .arg(nbds_uri(port, "vol", &pki.no_cert_dir)),
        SHORT,
    );
    assert_eq!(stdout(&size).trim(), (4 * MIB).to_string());
    let log = server.stop_clean();
    assert!(!log.contains("refused"), "{log}");
}

/// One `lsvd serve` that must not start; returns its single error line.
fn serve_error(lsvd: &Lsvd, socket: &Path, args: &[&str]) -> String {
    let out = run_timeout(&mut lsvd.serve_cmd(socket, args), SHORT);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{}", show("serve", &out));
    assert!(
        err.starts_with("lsvd: error: ") && err.trim_end().lines().count() == 1,
        "expected one 'lsvd: error:' line\n{}",
        show("serve", &out)
    );
    assert!(!socket.exists(), "refused server must not listen");
    err
}

#[test]
fn plain_text_off_loopback_needs_insecure_and_bad_files_fail_the_start() {
    require_tools(&["openssl", "nbdinfo"]);
    let dir = TempDir::new("tls_refusals");
    let pki = Pki::new(&dir.subdir("pki"));
    let lsvd = Lsvd::new(dir.join("data"));
    lsvd.create("vol", "4M");
    let socket = dir.join("nbd.sock");
    let cert = pki.server_cert.to_str().expect("utf-8");
    let key = pki.server_key.to_str().expect("utf-8");

    let err = serve_error(&lsvd, &socket, &["vol", "--listen", "0.0.0.0:0"]);
    assert!(
        err.contains("not a loopback address")
            && err.contains("--tls-cert")
            && err.contains("--insecure"),
        "{err}"
    );
    let err = serve_error(
        &lsvd,
        &socket,
        &[
            "vol",
            "--listen",
            "0.0.0.0:0",
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "--tls",
            "optional",
        ],
    );
    assert!(
        err.contains("--tls required") && err.contains("--insecure"),
        "{err}"
    );

    let missing = dir.join("missing.pem");
    let missing = missing.to_str().expect("utf-8");
    let rogue_key = pki.rogue_dir.join("client-key.pem");
    let rogue_key = rogue_key.to_str().expect("utf-8");
    let tls_case = |cert: &str, key: &str, extra: &[&str]| {
        let mut args = vec![
            "vol",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert,
            "--tls-key",
            key,
        ];
        args.extend_from_slice(extra);
        serve_error(&lsvd, &socket, &args)
    };
    let err = tls_case(missing, key, &[]);
    assert!(
        err.contains("cannot read TLS certificate") && err.contains(missing),
        "{err}"
    );
    let err = tls_case(key, key, &[]);
    assert!(err.contains("holds no certificate"), "{err}");
    let err = tls_case(cert, cert, &[]);
    assert!(err.contains("no usable private key"), "{err}");
    let err = tls_case(cert, rogue_key, &[]);
    assert!(err.contains("cannot be used together"), "{err}");
    let err = tls_case(cert, key, &["--tls-client-ca", missing]);
    assert!(err.contains("cannot read client CA certificate"), "{err}");
    // TLS is for TCP: with only a Unix socket, the flags are a mistake.
    let err = serve_error(
        &lsvd,
        &socket,
        &["vol", "--tls-cert", cert, "--tls-key", key],
    );
    assert!(err.contains("Unix sockets are always plain"), "{err}");

    // --insecure: starts, with a warning, and serves plain NBD.
    let mut server = lsvd.serve(&socket, &["vol", "--listen", "0.0.0.0:0", "--insecure"]);
    let log = server.log();
    assert!(
        log.contains("warn: serving plain-text NBD on 0.0.0.0:0 (--insecure)"),
        "{log}"
    );
    let out = run_ok(tool("nbdinfo").arg("--size").arg(server.uri("vol")), SHORT);
    assert_eq!(stdout(&out).trim(), (4 * MIB).to_string());
    server.stop_clean();

    // TLS without a client CA off loopback: allowed, with a warning that anyone may
    // connect.
    let mut server = lsvd.serve(
        &socket,
        &[
            "vol",
            "--listen",
            "0.0.0.0:0",
            "--tls-cert",
            cert,
            "--tls-key",
            key,
        ],
    );
    let log = server.log();
    assert!(log.contains("without --tls-client-ca"), "{log}");
    assert!(!log.contains("--insecure"), "{log}");
    server.stop_clean();
}
