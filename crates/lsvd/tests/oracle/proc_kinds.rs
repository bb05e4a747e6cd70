//! Process-level crash kinds: the real `lsvd serve` over NBD, killed with SIGKILL.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use super::checker::{self, Rule};
use super::history::{Content, History};
use super::process::{Server, ServerArgs};
use super::rng::Rng;
use super::stamp::{BLOCK, Seen};
use super::workload::{self, Control, Hooks, Spec, Target};
use super::{Failure, Stats, TempDir};
use crate::common::let_ms_pass;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcKind {
    /// (i) SIGKILL, restart on the same data directory.
    Kill,
    /// (iv) SIGKILL, delete the write log, restart: recovery from the store alone.
    CacheDeleted,
}

const NBLOCKS: u64 = 4096; // 16 MiB

pub async fn episode(
    kind: ProcKind,
    seed: u64,
    rounds: u32,
    stats: Arc<Stats>,
) -> Result<(), Failure> {
    let mut rng = Rng::new(seed);
    let mut tmp = TempDir::new("proc");
    let args = random_args(&mut rng);
    let ctx = format!(
        "lsvd serve, 16 MiB volume, {args:?}, data dir {}",
        tmp.path().display()
    );
    let data = tmp.path().join("data");
    let mut server = Server::create(&data, &tmp.path().join("store"), "16M", args)
        .map_err(|e| Failure::new(0, format!("{ctx}: {e}")))?;
    if kind == ProcKind::CacheDeleted {
        // Without its data directory a restarted server is another host: it waits for
        // the killed one's lease to lapse. The takeover kinds' lease keeps that to
        // about 2 s a point instead of the default 10 s.
        server.extra = vec![
            "--lease-timeout".to_string(),
            super::takeover::LEASE.to_string(),
        ];
    }
    let nconns = rng.range(1, 3) as usize;
    let mut conns = server
        .start(nconns)
        .await
        .map_err(|e| Failure::new(0, format!("{ctx}: {e}")))?;
    if conns[0].size_bytes != NBLOCKS * BLOCK as u64 {
        return Err(Failure::new(
            0,
            format!("{ctx}: export size {}", conns[0].size_bytes),
        ));
    }
    let ids = Arc::new(AtomicU64::new(1));
    let mut contents = vec![Content::Zero; NBLOCKS as usize];
    let wlog = server.wlog();
    let mut gc_seen = (0u64, 0u64);
    for round in 0..rounds {
        let mut notes: Vec<String> = Vec::new();
        let fail = |what: String, notes: &Vec<String>, server: &Server| {
            Failure::new(
                round,
                format!(
                    "{ctx}\nround notes:\n  {}\n{what}\nserver stderr (tail):\n{}",
                    notes.join("\n  "),
                    server.stderr_tail()
                ),
            )
        };
        if kind == ProcKind::CacheDeleted {
            // The store must hold the base contents.
            let caught_up = matches!(
                server.syncer().sync(Duration::from_secs(60)).await,
                Ok(true)
            );
            if !caught_up {
                tmp.keep = true;
                return Err(fail(
                    "the store did not catch up with the write log within 60 s".into(),
                    &notes,
                    &server,
                ));
            }
        }
        let hist = Arc::new(History::new(contents.clone()));
        let mut spec = Spec::random(&mut rng, NBLOCKS);
        if kind == ProcKind::CacheDeleted {
            spec.store_barriers = rng.range(1, 2) as u32;
        }
        notes.push(format!("workload {spec:?}"));
        let target = Target::nbd(&conns, &wlog, Some(server.syncer()));
        let killer = Arc::new(server.killer());
        let hooks = Hooks::server_process({
            let k = killer.clone();
            move || k()
        });
        let ctl = Arc::new(Control::default());
        let out = workload::run(target, spec, hist.clone(), ids.clone(), hooks, ctl).await;
        if !out.crashed {
            let wait = rng.below(300);
            notes.push(format!("killed {wait} ms after the workload ended"));
            let_ms_pass(wait).await;
            killer();
        }
        server.kill();
        for c in &conns {
            c.disconnect().await;
        }
        drop(conns);
        out.count(&stats);
        notes.push(out.summary());
        let rule = match kind {
            ProcKind::Kill => Rule::CacheIntact,
            ProcKind::CacheDeleted => {
                // The write log alone, or the whole data directory (read cache too).
                let r = if rng.chance(0.5) {
                    notes.push("deleted the write log".into());
                    std::fs::remove_file(&wlog)
                } else {
                    notes.push("deleted the whole data directory".into());
                    std::fs::remove_dir_all(&data)
                };
                r.map_err(|e| fail(format!("deleting the cache: {e}"), &notes, &server))?;
                Rule::CacheLost
            }
        };
        // Sometimes crash the recovery too: SIGKILL while it replays the log or
        // uploads what it replayed, then recover again (same rule).
        if rng.chance(0.3) {
            let wait = *rng.pick(&[0, 5, 20, 50, 150, 400]);
            let during_open = rng.chance(0.5);
            notes.push(format!(
                "recovery killed {wait} ms after {}",
                if during_open {
                    "the process started"
                } else {
                    "it accepted connections"
                }
            ));
            let r = if during_open {
                server.spawn()
            } else {
                server.start(1).await.map(drop)
            };
            if let Err(e) = r {
                tmp.keep = true;
                return Err(fail(format!("first restart failed: {e}"), &notes, &server));
            }
            let_ms_pass(wait).await;
            server.kill();
            stats.add("recoveries_killed", 1);
        }
        conns = server.start(nconns).await.map_err(|e| {
            tmp.keep = true;
            fail(
                format!("restart after SIGKILL failed: {e}"),
                &notes,
                &server,
            )
        })?;
        let seen = Target::nbd(&conns, &wlog, None)
            .read_all(NBLOCKS)
            .await
            .map_err(|e| {
                tmp.keep = true;
                fail(format!("reading the recovered disk: {e}"), &notes, &server)
            })?;
        let rec = hist.snapshot();
        stats.add("crash_points", 1);
        let what = format!("rule {rule:?} violated");
        if let Err(e) = checker::judge(&rec, &seen, rule, Vec::new(), &out.hangs, &stats, &what) {
            tmp.keep = true;
            return Err(fail(e, &notes, &server));
        }
        contents = checker::contents(&seen)
            .ok_or_else(|| fail("garbage in a checked state".into(), &notes, &server))?;
        note_gc(&server, &stats, &mut gc_seen, true);
    }
    // A clean stop (SIGTERM) and restart must keep everything.
    let end = |what: String, server: &Server| {
        Failure::new(
            rounds.saturating_sub(1),
            format!(
                "{ctx}\nafter the last round: {what}\nserver stderr (tail):\n{}",
                server.stderr_tail()
            ),
        )
    };
    for c in &conns {
        c.disconnect().await;
    }
    drop(conns);
    let status = server
        .stop()
        .map_err(|e| end(format!("stopping: {e}"), &server))?;
    if !status.success() {
        return Err(end(format!("clean stop exited with {status}"), &server));
    }
    note_gc(&server, &stats, &mut gc_seen, false);
    let conns = server
        .start(1)
        .await
        .map_err(|e| end(format!("restart after a clean stop: {e}"), &server))?;
    let seen = Target::nbd(&conns, &wlog, None)
        .read_all(NBLOCKS)
        .await
        .map_err(|e| end(format!("reading after a clean restart: {e}"), &server))?;
    let diff: Vec<String> = seen
        .iter()
        .zip(&contents)
        .enumerate()
        .filter(|(_, (s, c))| !matches!((s, c), (Seen::Zero, Content::Zero)) && **s != to_seen(**c))
        .take(10)
        .map(|(b, (s, c))| format!("block {b}: {s:?}, expected {c:?}"))
        .collect();
    if !diff.is_empty() {
        return Err(end(
            format!(
                "a clean stop and restart changed the disk:\n  {}",
                diff.join("\n  ")
            ),
            &server,
        ));
    }
    for c in &conns {
        c.disconnect().await;
    }
    let _ = server.stop();
    Ok(())
}

/// Server settings for an episode, drawn from `rng`.
pub fn random_args(rng: &mut Rng) -> ServerArgs {
    ServerArgs {
        batch_size: rng.pick(&["64K", "256K", "1M"]).to_string(),
        batch_timeout_ms: *rng.pick(&[50, 100, 200]),
        uploads: *rng.pick(&[1, 2, 4]),
        read_cache_size: rng.pick(&["0", "1M", "4M"]).to_string(),
        gc_start: *rng.pick(&[0.0, 0.7, 0.85, 0.9]),
        gc_policy: rng.pick(&["greedy", "cost-benefit"]).to_string(),
        // Free each record once uploaded, or keep uploaded ones for reads until the
        // 16 MiB log needs the space.
        log_free_target: rng.pick(&["all", "2M", "8M"]).to_string(),
        // Client objects wait for GC as soon as it falls behind, or GC runs beside
        // them, paced by how much of the headroom (a quarter of the 16 MiB log) is used.
        gc_headroom: rng.pick(&["0", "auto"]).to_string(),
        // Defragmenting GC (plugged gaps copied from other objects) or not.
        gc_defrag_hole: rng.pick(&["0", "8K"]).to_string(),
    }
}

pub fn to_seen(c: Content) -> Seen {
    match c {
        Content::Zero => Seen::Zero,
        Content::Write(id) => Seen::Write(id),
    }
}

/// Count the GC passes the volume's newest checkpoint records since the last look
/// (passes whose closing checkpoint a SIGKILL lost are not seen); `round`: the look
/// ends a crash round.
pub fn note_gc(server: &Server, stats: &Stats, seen: &mut (u64, u64), round: bool) {
    if let Some((passes, moved)) = server.lifetime_gc() {
        let new = passes.saturating_sub(seen.0);
        stats.add("gc_passes", new);
        stats.add("gc_moved_kib", moved.saturating_sub(seen.1) >> 10);
        if round {
            stats.add("rounds_with_gc_pass", u64::from(new > 0));
        }
        *seen = (passes.max(seen.0), moved.max(seen.1));
    }
}
