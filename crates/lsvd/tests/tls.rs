//! NBD over TLS with real clients: libnbd (`nbdcopy`, `nbdinfo` with `nbds://` URIs and
//! a certificate directory) and qemu (`qemu-io` with `tls-creds-x509`), against
//! certificates made per test with `openssl` (common/pki.rs).
//!
//! Asserted: data written over TLS reads back identical over TLS, over the plain Unix
//! socket and after a restart; plain clients are refused (with a server log line) when
//! TLS is required and served when it is optional; clients without a certificate or
//! with one from another CA are refused; the `--insecure` rule for non-loopback
//! addresses, for NBD and for `--metrics`; bad certificate files, and a key its group
//! or others can read, fail the start with one line; TLS without `--tls-client-ca`
//! warns that any client gets every export, on loopback too.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

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

/// `qemu-io` running `command` on `vol` over plain-text NBD at `port`.
fn plain_qemu_io(port: u16, command: &str) -> Command {
    let mut cmd = tool("qemu-io");
    cmd.args([
        "--image-opts",
        &format!("driver=nbd,host=127.0.0.1,port={port},export=vol"),
        "-c",
        command,
    ]);
    cmd
}

#[test]
fn tls_required_round_trips_and_refuses_strangers() {
    require_tools(TOOLS);
    let (dir, lsvd, socket) = new_volume("tls_required", "8M");
    let pki = Pki::new(&dir.subdir("pki"));
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
    let plain_qemu = run_timeout(&mut plain_qemu_io(port, "read 0 4k"), SHORT);
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
    // Client certificates are the access control: no warning.
    assert!(!log.contains("without --tls-client-ca"), "{log}");
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
    let (dir, lsvd, socket) = new_volume("tls_optional", "4M");
    let pki = Pki::new(&dir.subdir("pki"));
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
    let plain = run_ok(&mut plain_qemu_io(port, "read -P 0x3c 0 64k"), SHORT);
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
    // Encryption without access control, on loopback too: the server says so.
    assert!(
        log.contains("warn: serving 127.0.0.1:0 over TLS without --tls-client-ca")
            && log.contains(
                "any client that completes a TLS handshake can read and write every export"
            ),
        "{log}"
    );
}

/// One `lsvd serve` that must not start; returns its single error line.
fn serve_error(lsvd: &Lsvd, socket: &Path, args: &[&str]) -> String {
    let out = run_timeout(&mut lsvd.serve_cmd(socket, args), SHORT);
    let err = stderr(&out);
    usage_error(&out, "serve");
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
    let (dir, lsvd, socket) = new_volume("tls_refusals", "4M");
    let pki = Pki::new(&dir.subdir("pki"));
    let cert = pki.server_cert.to_str().expect("utf-8");
    let key = pki.server_key.to_str().expect("utf-8");

    let err = serve_error(&lsvd, &socket, &["vol", "--listen", "0.0.0.0:0"]);
    assert!(
        err.contains("not a loopback address")
            && err.contains("--tls-cert")
            && err.contains("--insecure"),
        "{err}"
    );
    // TLS off loopback (no client CA): the flags the cases below add to.
    let tls_off_loopback = [
        "vol",
        "--listen",
        "0.0.0.0:0",
        "--tls-cert",
        cert,
        "--tls-key",
        key,
    ];
    let optional = [&tls_off_loopback[..], &["--tls", "optional"]].concat();
    let err = serve_error(&lsvd, &socket, &optional);
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
    // A key its group or others can read: refused, naming the file and the fix.
    for mode in [0o644, 0o640, 0o604] {
        let open_key = dir.join(format!("open-key-{mode:o}.pem"));
        std::fs::copy(&pki.server_key, &open_key).expect("copy key");
        let mut perms = std::fs::metadata(&open_key).expect("stat").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, mode);
        std::fs::set_permissions(&open_key, perms).expect("chmod");
        let open_key = open_key.to_str().expect("utf-8");
        let err = tls_case(cert, open_key, &[]);
        assert!(
            err.contains(&format!("TLS key {open_key}"))
                && err.contains(&format!("chmod 600 {open_key}"))
                && err.contains(&format!("mode {mode:04o}")),
            "{err}"
        );
    }
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
    let mut server = lsvd.serve(&socket, &tls_off_loopback);
    let log = server.log();
    assert!(log.contains("without --tls-client-ca"), "{log}");
    assert!(!log.contains("--insecure"), "{log}");
    server.stop_clean();
}

/// `--metrics` is plain HTTP without access control: on a non-loopback address it
/// needs `--insecure` (refused in one line otherwise, before anything is opened), and
/// is served with a warning; loopback needs nothing.
#[test]
fn metrics_off_loopback_need_insecure() {
    let (_dir, lsvd, socket) = new_volume("metrics_insecure", "4M");
    for addr in ["0.0.0.0:0", "[::]:0"] {
        let err = serve_error(&lsvd, &socket, &["vol", "--metrics", addr]);
        assert!(
            err.contains(&format!("refusing to serve metrics on {addr}"))
                && err.contains("not a loopback address")
                && err.contains("--metrics 127.0.0.1:PORT")
                && err.contains("--insecure"),
            "{err}"
        );
    }
    // Refused before the data directory is locked or a write log made.
    assert!(!lsvd.data.join("vol.wlog").exists());

    let mut server = lsvd.serve(&socket, &["vol", "--metrics", "127.0.0.1:0"]);
    wait_until(SHORT, || server.log().contains("lsvd: metrics on"));
    let log = server.stop_clean();
    assert!(log.contains("lsvd: metrics on http://127.0.0.1:"), "{log}");
    assert!(!log.contains("warn:"), "{log}");

    let mut server = lsvd.serve(&socket, &["vol", "--metrics", "0.0.0.0:0", "--insecure"]);
    // The metrics line comes after the socket the server is waited for.
    wait_until(SHORT, || server.log().contains("lsvd: metrics on"));
    let log = server.log();
    assert!(
        log.contains("warn: serving metrics on 0.0.0.0:0 (--insecure)"),
        "{log}"
    );
    let port: u16 = log
        .split("lsvd: metrics on http://0.0.0.0:")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no metrics line\n{log}"));
    assert!(
        wait_until(SHORT, || metric(
            &format!("127.0.0.1:{port}"),
            "size_bytes",
            "vol"
        )
        .is_some()),
        "the metrics are served\n{}",
        server.log()
    );
    server.stop_clean();
}
