//! Compression through the real binary and real NBD clients: `lsvd create
//! --compression`, `lsvd config`, `lsvd serve --compression`; text written with
//! nbdcopy is stored in at most half its size, random data in at most 2% more than its
//! own; everything reads back after a restart and `lsvd check` opens every chunk.
//! The text is this repository's own sources and documents (real text, the same on
//! every machine at a given commit).
//! Runs on the S3 pass too (scripts/test-s3.sh).

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;

/// A real text corpus: this repository's own Rust sources and Markdown documents,
/// in path order, concatenated up to `len` bytes (the workspace holds more than 4 MiB
/// of them; fewer is refused, so the figure is always over the same amount).
fn text_corpus(len: usize) -> Vec<u8> {
    fn walk(dir: &std::path::Path, files: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() && !name.starts_with('.') && name != "target" {
                walk(&path, files);
            } else if name.ends_with(".rs") || name.ends_with(".md") {
                files.push(path);
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files.sort();
    let mut out = Vec::with_capacity(len);
    for f in files {
        if out.len() >= len {
            break;
        }
        out.extend(std::fs::read(&f).unwrap_or_default());
    }
    assert!(
        out.len() >= len,
        "only {} bytes of text in {}",
        out.len(),
        root.display()
    );
    out.truncate(len);
    out
}

/// Data and GC objects' bytes as `lsvd info` lists them.
fn stored_bytes(lsvd: &Lsvd) -> u64 {
    let info = lsvd.info_json("vol");
    info["store_listed_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no store_listed_bytes in {info}"))
}

/// The bytes stored over `client_bytes` written, printed with `what`.
fn stored_ratio(lsvd: &Lsvd, client_bytes: usize, what: &str) -> f64 {
    let stored = stored_bytes(lsvd);
    let ratio = stored as f64 / client_bytes as f64;
    println!("{what}: {client_bytes} bytes stored as {stored} ({ratio:.4})");
    ratio
}

/// A test's directory and an lsvd keeping its data there (nbdcopy required).
fn fresh(test: &str) -> (TempDir, Lsvd) {
    require_tools(&["nbdcopy"]);
    let dir = TempDir::new(test);
    let lsvd = Lsvd::new(dir.join("data"));
    (dir, lsvd)
}

/// Write `image` at the start of the volume with nbdcopy through a server started
/// with `serve_args`, stop it cleanly (everything uploaded), then read the volume back
/// through a new server and compare.
fn write_then_read_back(dir: &TempDir, lsvd: &Lsvd, image: &[u8], serve_args: &[&str]) {
    let socket = dir.join("nbd.sock");
    let src = dir.join("image.in");
    std::fs::write(&src, image).expect("write the image file");
    let mut server = lsvd.serve(&socket, &[&["vol"], serve_args].concat());
    nbdcopy(src.to_str().expect("utf-8 path"), &server.uri("vol"));
    server.stop_clean();
    let mut server = lsvd.serve(&socket, &["vol"]);
    let back = dir.join("image.out");
    nbdcopy(&server.uri("vol"), back.to_str().expect("utf-8 path"));
    server.stop_clean();
    let read = std::fs::read(&back).expect("read back");
    assert!(
        read[..image.len()] == *image,
        "the volume reads back what was written"
    );
}

fn check_ok(lsvd: &Lsvd) {
    let out = lsvd.run(&["check", "vol"]);
    assert!(out.status.success(), "{}", show("lsvd check vol", &out));
}

#[test]
fn text_is_stored_in_half_its_size_and_reads_back() {
    let (dir, lsvd) = fresh("compression-text");
    lsvd.assert_stdout_mentions(&[(
        &["create", "vol", "--size", "16M", "--compression", "lz4"],
        &["compressed with lz4"],
    )]);
    lsvd.assert_stdout_mentions(&[(&["config", "vol"], &["compression lz4"])]);
    let text = text_corpus(4 << 20);
    write_then_read_back(&dir, &lsvd, &text, &[]);
    let ratio = stored_ratio(&lsvd, text.len(), "lz4, text");
    assert!(ratio <= 0.5, "text stored in {ratio} of its size");
    let info = lsvd.info_json("vol");
    assert_eq!(info["compression"], "lz4", "{info}");
    check_ok(&lsvd);
    // A clone compresses as its base does.
    lsvd.run_ok(&["snapshot", "create", "vol", "s1"]);
    lsvd.assert_stdout_mentions(&[
        (&["clone", "vol@s1", "copy"], &["compressed with lz4"]),
        (&["config", "copy"], &["compression lz4"]),
    ]);
}

#[test]
fn random_data_costs_at_most_two_percent_more_than_raw() {
    let (dir, lsvd) = fresh("compression-random");
    lsvd.create("vol", "16M");
    let random = random_bytes(44, 8 << 20);
    // The server's flag wins over the volume's settings (none here).
    write_then_read_back(&dir, &lsvd, &random, &["--compression", "zstd:3"]);
    let ratio = stored_ratio(&lsvd, random.len(), "zstd:3, random bytes");
    assert!(
        ratio <= 1.02,
        "random bytes stored in {ratio} of their size"
    );
    check_ok(&lsvd);
}

/// A volume changes compression with `lsvd config`: old objects still read, new ones
/// are compressed, and the change is refused for a volume that does not exist or a
/// codec lsvd does not know (usage errors, exit 2).
#[test]
fn config_changes_compression_for_new_objects() {
    let (dir, lsvd) = fresh("compression-config");
    lsvd.create("vol", "16M");
    let text = text_corpus(2 << 20);
    write_then_read_back(&dir, &lsvd, &text, &[]);
    let raw = stored_bytes(&lsvd);
    assert!(raw >= text.len() as u64, "raw: {raw}");
    lsvd.assert_stdout_mentions(&[(
        &["config", "vol", "--compression", "zstd"],
        &["compression zstd:3", "next time a server opens vol"],
    )]);
    // The same text again further on: the new objects are compressed, and the old
    // range reads back as it was.
    let mut image = text.clone();
    image.extend_from_slice(&text);
    write_then_read_back(&dir, &lsvd, &image, &[]);
    let after = stored_bytes(&lsvd);
    assert!(
        after < raw + text.len() as u64 / 2,
        "rewriting {} bytes of text compressed added {} bytes",
        image.len(),
        after.saturating_sub(raw)
    );
    check_ok(&lsvd);
    for (args, needle) in [
        (
            &["create", "other", "--size", "1M", "--compression", "zlib"][..],
            "expected none, lz4",
        ),
        (
            &["config", "vol", "--compression", "zstd:42"][..],
            "expected none, lz4",
        ),
    ] {
        let out = lsvd.run(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}",
            show(&format!("{args:?}"), &out)
        );
        assert!(
            stderr(&out).contains(needle),
            "{}",
            show(&format!("{args:?}"), &out)
        );
    }
    let out = lsvd.run(&["config", "nosuch", "--compression", "lz4"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        show("config nosuch", &out)
    );
    assert!(
        stderr(&out).contains("no volume 'nosuch'"),
        "{}",
        show("config nosuch", &out)
    );
}
