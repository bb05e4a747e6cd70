//! A real ext4 filesystem on an lsvd volume: nbdfuse exposes the export as a file, a
//! loop device turns that into a block device, mkfs.ext4 + mount + a file tree, then a
//! clean server restart and a full verification (checksums and bytes, e2fsck clean).
//!
//! Needs root, /dev/fuse and loop devices. It fails loudly (never skips) if they are
//! missing.

// Tests and examples run real processes, sockets and devices in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use common::*;

const TOOLS: &[&str] = &[
    "nbdfuse",
    "fusermount3",
    "losetup",
    "mkfs.ext4",
    "e2fsck",
    "mount",
    "umount",
    "sha256sum",
    "sync",
];

fn preflight() {
    require_tools(TOOLS);
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the ext4 test needs root (losetup, mount); run the tests as root"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: nbdfuse cannot work here (load the fuse module or give the container /dev/fuse)"
    );
    assert!(
        Path::new("/dev/loop-control").exists(),
        "/dev/loop-control is missing: loop devices cannot be created here"
    );
}

/// nbdfuse + loop device + mount, torn down in reverse order on drop even if the test
/// panicked halfway.
struct Rig {
    fuse_dir: PathBuf,
    mount_dir: PathBuf,
    log_dir: PathBuf,
    nbdfuse: Option<Child>,
    loop_dev: Option<String>,
    mounted: bool,
    attaches: u32,
}

impl Rig {
    fn new(fuse_dir: PathBuf, mount_dir: PathBuf, log_dir: PathBuf) -> Rig {
        Rig {
            fuse_dir,
            mount_dir,
            log_dir,
            nbdfuse: None,
            loop_dev: None,
            mounted: false,
            attaches: 0,
        }
    }

    fn dev(&self) -> String {
        self.loop_dev.clone().expect("loop device attached")
    }

    /// nbdfuse FUSE_DIR URI, wait for FUSE_DIR/nbd, then losetup.
    fn attach(&mut self, uri: &str) {
        self.attaches += 1;
        let pidfile = self.log_dir.join(format!("nbdfuse-{}.pid", self.attaches));
        let log = self.log_dir.join(format!("nbdfuse-{}.log", self.attaches));
        let mut nbdfuse = tool("nbdfuse");
        nbdfuse.arg("-P").arg(&pidfile).arg(&self.fuse_dir).arg(uri);
        let child = spawn_logging(&mut nbdfuse, &log);
        self.nbdfuse = Some(child);
        let file = self.fuse_dir.join("nbd");
        let ok = wait_until(Duration::from_secs(30), || {
            pidfile.exists() && file.exists()
        });
        if !ok {
            let exited = self
                .nbdfuse
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            panic!(
                "nbdfuse did not expose {} within 30s (exited: {exited:?}); log:\n{}",
                file.display(),
                std::fs::read_to_string(
                    self.log_dir.join(format!("nbdfuse-{}.log", self.attaches))
                )
                .unwrap_or_default()
            );
        }
        let out = run_ok(tool("losetup").args(["-f", "--show"]).arg(&file), SHORT);
        let dev = stdout(&out).trim().to_string();
        assert!(dev.starts_with("/dev/loop"), "losetup printed {dev:?}");
        self.loop_dev = Some(dev);
    }

    fn mount(&mut self) {
        run_ok(tool("mount").arg(self.dev()).arg(&self.mount_dir), SHORT);
        self.mounted = true;
    }

    fn umount(&mut self) {
        run_ok(tool("umount").arg(&self.mount_dir), LONG);
        self.mounted = false;
    }

    fn fsck_clean(&self) -> String {
        let out = run_timeout(tool("e2fsck").arg("-fn").arg(self.dev()), LONG);
        assert_eq!(
            out.status.code(),
            Some(0),
            "e2fsck -fn must find a clean filesystem\n{}",
            show("e2fsck -fn", &out)
        );
        stdout(&out)
    }

    /// losetup -d, fusermount3 -u, wait for nbdfuse to exit.
    fn detach(&mut self) {
        if let Some(dev) = self.loop_dev.take() {
            run_ok(tool("losetup").arg("-d").arg(&dev), SHORT);
        }
        if let Some(mut child) = self.nbdfuse.take() {
            run_ok(tool("fusermount3").arg("-u").arg(&self.fuse_dir), SHORT);
            let exited = wait_until(Duration::from_secs(60), || {
                matches!(child.try_wait(), Ok(Some(_)))
            });
            if !exited {
                let _ = child.kill();
                let _ = child.wait();
                panic!("nbdfuse did not exit after fusermount3 -u");
            }
            let status = child.wait().expect("wait nbdfuse");
            assert!(status.success(), "nbdfuse exited with {status}");
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let quiet = |c: &mut std::process::Command| {
            let _ = c
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        if self.mounted {
            quiet(tool("umount").arg(&self.mount_dir));
            quiet(tool("umount").arg("-l").arg(&self.mount_dir));
        }
        if let Some(dev) = self.loop_dev.take() {
            quiet(tool("losetup").arg("-d").arg(&dev));
        }
        if let Some(mut child) = self.nbdfuse.take() {
            quiet(tool("fusermount3").arg("-u").arg(&self.fuse_dir));
            if !wait_until(Duration::from_secs(10), || {
                matches!(child.try_wait(), Ok(Some(_)))
            }) {
                quiet(tool("fusermount3").arg("-uz").arg(&self.fuse_dir));
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

/// The file tree: (relative path, seed, size). A few hundred small files of random
/// sizes in nested dirs, some empty, plus one 50 MB file.
fn tree() -> Vec<(String, u64, usize)> {
    let mut x = 0x5EED_u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut files = Vec::new();
    for i in 0..300u64 {
        let size = match next() % 10 {
            0 => 0,
            1..=6 => (next() % 16384) as usize,
            _ => (next() % (256 * 1024)) as usize,
        };
        files.push((
            format!("dir{:02}/sub{}/file{i:03}.bin", i % 12, i % 3),
            1000 + i,
            size,
        ));
    }
    files.push(("big/fifty-megabytes.bin".to_string(), 7, 50_000_000));
    files
}

fn write_tree(root: &Path) {
    for (rel, seed, size) in tree() {
        let p = root.join(&rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, random_bytes(seed, size)).expect("write file");
    }
}

fn verify_tree(root: &Path) {
    for (rel, seed, size) in tree() {
        let p = root.join(&rel);
        let got = std::fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        assert_eq!(got.len(), size, "{rel}: size");
        assert!(got == random_bytes(seed, size), "{rel}: contents differ");
    }
}

/// `sha256sum` of every file, paths relative to `root`, sorted.
fn checksums(root: &Path) -> String {
    let mut rels: Vec<String> = tree().into_iter().map(|(r, _, _)| r).collect();
    rels.sort();
    let out = run_ok(tool("sha256sum").args(&rels).current_dir(root), LONG);
    let text = stdout(&out);
    assert_eq!(text.lines().count(), rels.len());
    text
}

#[test]
fn ext4_on_lsvd_survives_a_server_restart() {
    preflight();
    let dir = TempDir::new("ext4");
    let lsvd = Lsvd::new(dir.join("data"));
    lsvd.create("fs", "1G");
    let socket = dir.join("nbd.sock");
    let mut server = lsvd.serve(&socket, &["fs"]);
    let mut rig = Rig::new(
        dir.subdir("fuse"),
        dir.subdir("mnt"),
        dir.path().to_path_buf(),
    );

    rig.attach(&server.uri("fs"));
    run_ok(tool("mkfs.ext4").arg("-q").arg(rig.dev()), LONG);
    rig.mount();
    let mnt = rig.mount_dir.clone();
    write_tree(&mnt);
    let before = checksums(&mnt);
    run_ok(&mut tool("sync"), LONG);
    rig.umount();
    rig.fsck_clean();
    rig.detach();
    server.stop_clean();
    let info = lsvd.info_json("fs");
    assert_eq!(info["closed_cleanly"], true, "{info}");

    let mut server = lsvd.serve(&socket, &["fs"]);
    rig.attach(&server.uri("fs"));
    rig.fsck_clean();
    rig.mount();
    assert_eq!(
        checksums(&mnt),
        before,
        "sha256 of every file after restart"
    );
    verify_tree(&mnt);
    // The filesystem is still writable after the restart.
    std::fs::write(mnt.join("after-restart.txt"), b"still writable\n").expect("write");
    run_ok(&mut tool("sync"), LONG);
    rig.umount();
    rig.fsck_clean();
    rig.detach();
    server.stop_clean();
}
