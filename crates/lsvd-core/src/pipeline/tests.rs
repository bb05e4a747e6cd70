//! The pipeline driven by a small in-memory driver: numbering, apply order, batch
//! timeout and checkpoint cadence, GC passes and holding client batches, the drain,
//! and a seeded random schedule of all of them.

use std::collections::BTreeMap;

use lsvd_trace::synthetic::prng::Rng;

use super::*;
use crate::format::object::{ObjectHeader, ObjectKind, header_without_data};
use crate::gc::{self, GcConfig, GcPolicy};

/// A write-log position stand-in: (record, sector in record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct At(u64, u64);

impl Location for At {
    fn advance(&self, sectors: u64) -> Self {
        At(self.0, self.1 + sectors)
    }
}

type P = Pipeline<At, ObjectHeader>;

const MS: u64 = 1_000_000;

fn config(gc: GcConfig) -> PipelineConfig {
    PipelineConfig {
        batch_size_bytes: 64 << 10,
        batch_timeout_ns: Some(2000 * MS),
        checkpoint_every_objects: 4,
        checkpoint_interval_ns: Some(60_000 * MS),
        uploads_in_flight: 3,
        gc,
        gc_max_backlog: 2,
        gc_headroom_bytes: 0,
    }
}

fn gc_off() -> GcConfig {
    GcConfig {
        start_utilization: 0.0,
        ..GcConfig::default()
    }
}

fn pipeline(gc: GcConfig) -> P {
    Pipeline::new(config(gc), StoreState::new(64 << 20), 0)
}

/// The header an upload would produce (data is not modelled).
fn header_of(p: &P, u: &Upload<At, ObjectHeader>) -> ObjectHeader {
    match u {
        Upload::Data { seq, batch } => {
            let mut h = header_without_data(
                ObjectKind::Data,
                *seq,
                batch.last_record_seq,
                batch.object_extents(),
                batch.trims.clone(),
            );
            h.volume_size_bytes = batch.volume_size_bytes;
            h.parts_after = batch.parts_after;
            h
        }
        Upload::Gc { object, .. } => object.clone(),
        Upload::Checkpoint { seq, .. } => {
            let mut h = header_without_data(
                ObjectKind::Checkpoint,
                *seq,
                p.store().last_record_seq(),
                Vec::new(),
                Vec::new(),
            );
            (h.header_bytes, h.data_bytes) = (64, 100);
            h
        }
    }
}

/// A record of one 4 KiB write at block `block`.
fn write(p: &mut P, now_ns: u64, record: u64, block: u64) {
    p.record(
        now_ns,
        record,
        &[BatchItem::Data {
            lba: block * 8,
            sectors: 8,
            at: At(record, 0),
        }],
    );
}

/// Upload and apply everything the pipeline hands out, finishing checkpoints (and
/// deleting what they leave out) at once. Returns the sequence numbers handed out.
fn drain_uploads(p: &mut P) -> Vec<u64> {
    let mut seqs = Vec::new();
    while let Some(u) = p.next_upload(true) {
        seqs.push(u.seq());
        let h = header_of(p, &u);
        p.upload_done(u.seq(), h);
        p.apply_all_ready().expect("in order");
        if let Upload::Checkpoint { seq, dead, .. } = u {
            for (d, _) in dead {
                p.forget_object(d);
            }
            p.checkpoint_finished(seq);
        }
    }
    seqs
}

#[test]
fn objects_are_numbered_and_applied_in_order_whatever_order_uploads_finish() {
    let mut p = pipeline(gc_off());
    // 16 KiB per batch of 4 KiB writes: 16 records make 4 batches... at 64 KiB per
    // batch, 64 records make 4 batches, and the 4th is followed by a checkpoint.
    for r in 1..=64 {
        write(&mut p, 0, r, r);
    }
    let mut started = Vec::new();
    while let Some(u) = p.next_upload(true) {
        started.push(u);
    }
    // Three in flight at most.
    assert_eq!(
        started.iter().map(|u| u.seq()).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    // Finish 3, then 1, then 2: nothing applies before 1 is done.
    let h: Vec<ObjectHeader> = started.iter().map(|u| header_of(&p, u)).collect();
    p.upload_done(3, h[2].clone());
    assert_eq!(p.begin_apply().expect("ok"), None);
    p.upload_done(1, h[0].clone());
    assert_eq!(applied_seqs(&mut p), [1]);
    p.upload_done(2, h[1].clone());
    assert_eq!(applied_seqs(&mut p), [2, 3]);
    assert_eq!(
        p.freeable_through(),
        48,
        "records of the first three objects"
    );
    // The 4th object, then its checkpoint (only once 4 is applied).
    let u4 = p.next_upload(true).expect("object 4");
    assert_eq!(u4.seq(), 4);
    assert!(p.next_upload(true).is_none(), "checkpoint waits for 4");
    let h4 = header_of(&p, &u4);
    p.upload_done(4, h4);
    p.apply_all_ready().expect("ok");
    match p.next_upload(true) {
        Some(Upload::Checkpoint { seq: 5, clean, .. }) => assert!(!clean),
        other => panic!("expected checkpoint 5, got {other:?}"),
    }
    assert!(
        p.next_upload(true).is_none(),
        "nothing runs beside a checkpoint"
    );
}

/// hylog: a batch holding blocks of two heat classes becomes two data objects,
/// coldest first, numbered together; the first says one part follows it; no checkpoint
/// comes between them although one falls due after the first; the batch's records are
/// freed (and the store's `last_record_seq` moves) only once its last part is applied.
#[test]
fn a_batch_split_by_heat_is_consecutive_parts_that_free_its_records_at_the_last() {
    let mut p = pipeline(gc_off());
    // Blocks 0..16 hot (class 1), the rest cold; 4 KiB regions.
    let mut table = vec![0u8; 4096];
    table[..16].fill(1);
    p.set_batch_classes(Some(RegionClasses::from_table(8, table)));
    // Three batches of cold blocks only (one object each), then one of both.
    for r in 1..=48 {
        write(&mut p, 0, r, 100 + r);
    }
    for r in 49..=64 {
        let block = if r % 2 == 0 { r % 16 } else { 1000 + r };
        write(&mut p, 0, r, block);
    }
    let mut uploads = Vec::new();
    while let Some(u) = p.next_upload(true) {
        let h = header_of(&p, &u);
        uploads.push((u.seq(), h.clone()));
        p.upload_done(u.seq(), h);
    }
    let (parts, whole): (Vec<_>, Vec<_>) = uploads.iter().partition(|(s, _)| *s >= 4);
    assert_eq!(whole.len(), 3);
    assert!(whole.iter().all(|(_, h)| h.parts_after == 0));
    assert_eq!(
        parts
            .iter()
            .map(|(s, h)| (*s, h.kind, h.parts_after))
            .collect::<Vec<_>>(),
        [(4, ObjectKind::Data, 1), (5, ObjectKind::Data, 0)],
        "the checkpoint waits for both parts"
    );
    let lbas = |h: &ObjectHeader| h.extents.iter().map(|e| e.lba / 8).collect::<Vec<_>>();
    assert!(
        lbas(&parts[0].1).iter().all(|&b| b > 1000),
        "cold part first"
    );
    assert!(
        lbas(&parts[1].1).iter().all(|&b| b < 16),
        "then the hot part"
    );
    assert_eq!(lbas(&parts[0].1).len() + lbas(&parts[1].1).len(), 16);
    // Apply up to the first part: the batch's records are not freed yet.
    p.apply_all_ready().expect("in order");
    assert_eq!(p.freeable_through(), 64, "all applied");
    let mut q = pipeline(gc_off());
    let mut table = vec![0u8; 4096];
    table[..16].fill(1);
    q.set_batch_classes(Some(RegionClasses::from_table(8, table)));
    for r in 49..=64 {
        let block = if r % 2 == 0 { r % 16 } else { 1000 + r };
        write(&mut q, 0, r - 48, block);
    }
    let first = q.next_upload(true).expect("first part");
    let second = q.next_upload(true).expect("second part");
    let (h1, h2) = (header_of(&q, &first), header_of(&q, &second));
    q.upload_done(1, h1);
    q.apply_all_ready().expect("in order");
    assert_eq!(q.store().next_object_seq(), 2, "the first part is applied");
    assert_eq!(q.freeable_through(), 0, "but frees no record of its batch");
    assert_eq!(q.store().last_record_seq(), 0);
    q.upload_done(2, h2);
    q.apply_all_ready().expect("in order");
    assert_eq!(
        (q.freeable_through(), q.store().last_record_seq()),
        (16, 16)
    );
}

#[test]
fn nothing_is_handed_out_before_the_store_is_writable() {
    let mut p = pipeline(gc_off());
    for r in 1..=16 {
        write(&mut p, 0, r, r);
    }
    assert!(p.next_upload(false).is_none());
    assert_eq!(p.next_upload(true).map(|u| u.seq()), Some(1));
}

#[test]
fn a_batch_closes_when_its_timeout_passes() {
    let mut p = pipeline(gc_off());
    write(&mut p, 0, 1, 1);
    assert!(!p.tick(1999 * MS));
    assert!(p.next_upload(true).is_none());
    assert!(p.tick(2000 * MS), "closed by the timeout");
    assert_eq!(p.batches_closed_by_timeout(), 1);
    assert_eq!(drain_uploads(&mut p), [1]);
    // A record arriving after the deadline starts the next batch.
    write(&mut p, 3000 * MS, 2, 2);
    write(&mut p, 5500 * MS, 3, 3);
    assert_eq!(p.batches_closed_by_timeout(), 2);
    let u = p.next_upload(true).expect("batch of record 2");
    match u {
        Upload::Data { seq: 2, batch } => {
            assert_eq!((batch.first_record_seq, batch.last_record_seq), (2, 2))
        }
        other => panic!("{other:?}"),
    }
    assert!(p.batch_open(), "record 3 is in the open batch");
}

#[test]
fn a_checkpoint_follows_every_n_client_objects_and_the_interval() {
    let mut p = pipeline(gc_off());
    // Four full batches: objects 1-4, checkpoint 5.
    for r in 1..=64 {
        write(&mut p, 0, r, r);
    }
    assert_eq!(drain_uploads(&mut p), [1, 2, 3, 4, 5]);
    // One more object: no checkpoint until the interval has passed since 5.
    write(&mut p, 1000 * MS, 65, 1);
    p.tick(3100 * MS);
    assert_eq!(drain_uploads(&mut p), [6]);
    // Checkpoint 5 was queued at time 0.
    p.tick(59_999 * MS);
    assert!(p.next_upload(true).is_none());
    p.tick(60_000 * MS);
    assert_eq!(drain_uploads(&mut p), [7], "checkpoint by interval");
    // Idle: no checkpoint without new objects.
    p.tick(1_000_000 * MS);
    assert!(p.next_upload(true).is_none());
}

/// GC settings that collect as soon as anything is dead.
fn eager_gc() -> GcConfig {
    GcConfig {
        start_utilization: 0.9,
        stop_utilization: 0.95,
        policy: GcPolicy::Greedy,
        pass_bytes: 1 << 20,
        defrag_hole_bytes: 0,
    }
}

/// Overwrite the same 16 blocks over and over, so objects die.
fn overwrite_round(p: &mut P, record: &mut u64) {
    for b in 0..16 {
        *record += 1;
        write(p, 0, *record, b);
    }
}

/// [`overwrite_round`] as one client object: the batch is closed after it.
fn overwrite_batch(p: &mut P, record: &mut u64) {
    overwrite_round(p, record);
    p.close_batch();
}

/// Apply every object that is ready; their sequence numbers in apply order.
fn applied_seqs(p: &mut P) -> Vec<u64> {
    let applied = p.apply_all_ready().expect("in order");
    applied.iter().map(|a| a.header.seq).collect()
}

/// Run a GC pass the way a driver does: plan, read, reserve, queue.
fn gc_pass(p: &mut P) -> Option<(u64, usize)> {
    let pass = p.gc_plan()?;
    let groups = gc_groups(p, &pass.victims);
    let first = p.gc_reserve(groups.len())?;
    queue_gc_objects(p, first, &groups);
    Some((first, groups.len()))
}

/// The live extents of `victims`, grouped into GC objects.
fn gc_groups(p: &P, victims: &std::collections::BTreeSet<u64>) -> Vec<Vec<gc::Relocation>> {
    let relocations = gc::live_extents(p.store(), victims);
    gc::group_relocations(&relocations, p.config().batch_size_bytes)
}

/// Queue one GC object a group, numbered from `first` (reserved by the caller).
fn queue_gc_objects(p: &mut P, first: u64, groups: &[Vec<gc::Relocation>]) {
    let last_record = p.store().last_record_seq();
    let objects = groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let h = gc::gc_object_header(first + i as u64, last_record, g);
            (h.total_bytes(), h)
        })
        .collect();
    p.gc_queue(objects);
}

#[test]
fn client_batches_wait_unnumbered_while_a_gc_pass_holds_numbers() {
    let mut p = pipeline(eager_gc());
    let mut record = 0;
    // Fill 32 blocks (two objects), then overwrite half of each: both die partly.
    for b in 0..32 {
        record += 1;
        write(&mut p, 0, record, b);
        if b == 15 {
            drain_uploads(&mut p);
        }
    }
    for b in (0..8).chain(16..24) {
        record += 1;
        write(&mut p, 0, record, b);
    }
    drain_uploads(&mut p);
    assert_eq!(p.store().next_object_seq(), 4, "{}", p.describe());
    let pass = p.gc_plan().expect("utilization is below 0.9");
    let groups = gc_groups(&p, &pass.victims);
    let first = p.gc_reserve(groups.len()).expect("writes go on");
    // While the pass holds its numbers: a client batch closes, time passes far beyond
    // the checkpoint interval. Nothing may be numbered (a checkpoint numbered now
    // would sit in the queue before the pass's objects and wait for them forever).
    overwrite_batch(&mut p, &mut record);
    p.tick(1_000_000 * MS);
    assert_eq!(p.uploads_held(), 1);
    assert!(p.next_upload(true).is_none(), "{}", p.describe());
    queue_gc_objects(&mut p, first, &groups);
    let n = groups.len() as u64;
    assert!(n > 0, "the pass moves live data");
    let handed = drain_uploads(&mut p);
    // GC objects, the pass's checkpoint, then the held client batch. The checkpoint
    // interval passed while the pass held its numbers, but its checkpoint is the one
    // that was due.
    let want: Vec<u64> = (first..first + n + 2).collect();
    assert_eq!(handed, want, "{}", p.describe());
    assert!(!p.gc_pass_in_flight(), "the pass's checkpoint ended it");
    for v in &pass.victims {
        assert!(
            !p.store().objects().contains_key(v),
            "victim {v} was deleted"
        );
    }
}

#[test]
fn gc_waits_while_client_objects_queue_up_and_while_a_pass_runs() {
    let mut p: P = Pipeline::new(
        PipelineConfig {
            checkpoint_every_objects: 1,
            gc_max_backlog: 0,
            gc_headroom_bytes: 0,
            ..config(eager_gc())
        },
        StoreState::new(64 << 20),
        0,
    );
    let mut record = 0;
    overwrite_round(&mut p, &mut record);
    drain_uploads(&mut p);
    // Overwrite half of object 1: it stays, half dead, and utilization drops.
    for b in 0..8 {
        record += 1;
        write(&mut p, 0, record, b);
    }
    p.close_batch();
    let u = p.next_upload(true).expect("the client object");
    let h = header_of(&p, &u);
    p.upload_done(u.seq(), h);
    p.apply_all_ready().expect("in order");
    assert!(gc::should_collect(p.store(), &p.config().gc, false));
    // Its checkpoint waits in the queue: with a backlog of 0, no pass yet.
    assert_eq!(p.uploads_queued(), 1);
    assert!(p.gc_plan().is_none(), "{}", p.describe());
    drain_uploads(&mut p);
    let pass = p.gc_plan().expect("object 1 is half dead");
    assert!(pass.victims.contains(&1));
    assert!(p.gc_pass_in_flight());
    assert!(p.gc_plan().is_none(), "one pass at a time");
    p.gc_abandon();
    assert!(!p.gc_pass_in_flight());
    assert_eq!(p.gc_plan(), Some(pass), "an abandoned pass can be retried");
}

#[test]
fn client_batches_are_held_when_gc_falls_behind_and_released_when_it_stalls() {
    // Collect below 0.9 live: after overwriting everything once, the store is at 0.5.
    let mut p = pipeline(eager_gc());
    let mut record = 0;
    overwrite_batch(&mut p, &mut record);
    drain_uploads(&mut p);
    overwrite_batch(&mut p, &mut record);
    // Object 2 went out (nothing pending, store within its bound); applied, object 1
    // is dead but not yet deleted: the store holds twice the live data.
    drain_uploads(&mut p);
    overwrite_batch(&mut p, &mut record);
    assert_eq!(p.uploads_held(), 1, "{}", p.describe());
    assert!(p.take_wakes().gc, "GC is asked to make room");
    // A pass collects object 1 (fully dead) and the batch goes.
    let (first, n) = gc_pass(&mut p).expect("a pass");
    assert_eq!(n, 0, "a dead object has nothing to move");
    let handed = drain_uploads(&mut p);
    assert_eq!(handed[0], first, "the pass's checkpoint");
    assert_eq!(p.uploads_held(), 0);
    assert!(
        handed.len() >= 2,
        "the held batch went after it: {handed:?}"
    );

    // Stalled: GC should collect but nothing qualifies (every object fully live,
    // utilization low only because of headers): a held batch must not wait for it.
    let tiny = GcConfig {
        start_utilization: 0.999,
        stop_utilization: 0.9999,
        policy: GcPolicy::Greedy,
        pass_bytes: 1 << 20,
        defrag_hole_bytes: 0,
    };
    let mut p = pipeline(tiny);
    let mut record = 0;
    for b in 0..64 {
        record += 1;
        write(&mut p, 0, record, b * 3);
    }
    p.close_batch();
    drain_uploads(&mut p);
    for b in 64..80 {
        record += 1;
        write(&mut p, 0, record, b * 3);
    }
    p.close_batch();
    assert!(p.uploads_held() > 0, "{}", p.describe());
    assert!(p.gc_plan().is_none(), "no victims: stalled");
    assert_eq!(p.uploads_held(), 0, "released once GC stalled");
}

#[test]
fn shutdown_drains_then_takes_a_clean_checkpoint() {
    let mut p = pipeline(gc_off());
    for r in 1..=20 {
        write(&mut p, 0, r, r);
    }
    assert!(!p.drained());
    assert!(p.begin_clean_checkpoint().is_err());
    p.stop_writes();
    assert!(p.gc_plan().is_none(), "no GC once writes stopped");
    let handed = drain_uploads(&mut p);
    assert_eq!(handed, [1, 2]);
    assert!(p.drained(), "{}", p.describe());
    let u = p.begin_clean_checkpoint().expect("drained");
    assert!(matches!(
        u,
        Upload::Checkpoint {
            seq: 3,
            clean: true,
            ..
        }
    ));
    assert!(!p.drained(), "the clean checkpoint is in progress");
    let h = header_of(&p, &u);
    p.upload_done(3, h);
    p.apply_all_ready().expect("ok");
    p.checkpoint_finished(3);
    assert!(p.drained());
    assert_eq!(p.store().next_object_seq(), 4);
    assert_eq!(p.freeable_through(), 20);
}

#[test]
fn a_gc_pass_started_before_the_writes_stopped_is_dropped() {
    let mut p = pipeline(eager_gc());
    let mut record = 0;
    overwrite_batch(&mut p, &mut record);
    overwrite_batch(&mut p, &mut record);
    drain_uploads(&mut p);
    let _pass = p.gc_plan().expect("a pass");
    p.stop_writes();
    assert_eq!(p.gc_reserve(1), None);
    assert!(!p.gc_pass_in_flight());
    drain_uploads(&mut p);
    assert!(p.drained(), "{}", p.describe());
}

/// Which record each 4 KiB block of stored data came from: (object, offset) ->
/// record. Every write in the random schedule is one aligned 4 KiB block and every
/// trim whole blocks, so extents are whole blocks too.
#[derive(Default)]
struct Provenance(BTreeMap<(u64, u64), u64>);

impl Provenance {
    fn note(&mut self, u: &Upload<At, ObjectHeader>, h: &ObjectHeader) {
        match u {
            Upload::Data { batch, .. } => {
                let mut off = h.header_bytes as u64;
                for piece in &batch.extents {
                    for k in 0..piece.sectors / 8 {
                        self.0.insert((h.seq, off + k * 4096), piece.location.0);
                    }
                    off += piece.sectors * 512;
                }
            }
            Upload::Gc { .. } => {
                for (e, off) in h.extent_offsets() {
                    let src = e.source.expect("GC extents carry their source");
                    for k in 0..e.sectors as u64 / 8 {
                        let from = self.0[&(src.object_seq, src.object_offset + k * 4096)];
                        self.0.insert((h.seq, off + k * 4096), from);
                    }
                }
            }
            Upload::Checkpoint { .. } => {}
        }
    }

    fn record_at(&self, object_seq: u64, offset: u64) -> u64 {
        self.0[&(object_seq, offset)]
    }
}

/// A seeded random schedule of writes, trims, ticks, uploads finishing in any order
/// and GC passes: numbers are handed out once each, in order; objects are applied in
/// order; after the drain, every block of the store map holds the data of the newest
/// record that wrote it (trimmed blocks are unmapped), and the log is freeable through
/// the last record.
#[test]
fn random_schedules_keep_sequence_order_and_lose_nothing() {
    let (mut passes, mut gc_objects, mut held_max, mut split) = (0, 0, 0, 0);
    for seed in 0..40u64 {
        let mut rng = Rng::new(seed);
        let gc = if seed % 3 == 0 { gc_off() } else { eager_gc() };
        let mut p = pipeline(gc);
        // Half the schedules split batches by heat (three classes, block by block).
        if seed % 2 == 1 {
            let table = (0..48).map(|b| (b * 7 % 3) as u8).collect();
            p.set_batch_classes(Some(RegionClasses::from_table(8, table)));
        }
        // block -> the record that wrote it last (None: trimmed)
        let mut model: BTreeMap<u64, Option<u64>> = BTreeMap::new();
        let mut prov = Provenance::default();
        let mut record = 0u64;
        let mut now = 0u64;
        let mut handed_out: Vec<u64> = Vec::new();
        let mut running: Vec<Upload<At, ObjectHeader>> = Vec::new();
        let mut applied: Vec<u64> = Vec::new();
        let finish = |p: &mut P,
                      prov: &mut Provenance,
                      applied: &mut Vec<u64>,
                      u: Upload<At, ObjectHeader>| {
            let h = header_of(p, &u);
            prov.note(&u, &h);
            p.upload_done(u.seq(), h);
            for a in p.apply_all_ready().expect("in order") {
                applied.push(a.header.seq);
            }
            if let Upload::Checkpoint { seq, dead, .. } = u {
                for (d, _) in dead {
                    p.forget_object(d);
                }
                p.checkpoint_finished(seq);
            }
        };
        for _ in 0..3000 {
            match rng.below(100) {
                0..=54 => {
                    record += 1;
                    let block = rng.below(48);
                    write(&mut p, now, record, block);
                    model.insert(block, Some(record));
                }
                55..=59 => {
                    record += 1;
                    let block = rng.below(44);
                    p.record(
                        now,
                        record,
                        &[BatchItem::Zero {
                            lba: block * 8,
                            sectors: 32,
                        }],
                    );
                    for b in block..block + 4 {
                        model.insert(b, None);
                    }
                }
                60..=64 => {
                    now += rng.below(3000) * MS;
                    p.tick(now);
                }
                65..=79 => {
                    if let Some(u) = p.next_upload(true) {
                        handed_out.push(u.seq());
                        running.push(u);
                    }
                }
                80..=94 => {
                    if !running.is_empty() {
                        let i = rng.below(running.len() as u64) as usize;
                        let u = running.swap_remove(i);
                        finish(&mut p, &mut prov, &mut applied, u);
                    }
                }
                _ => {
                    if let Some((_, n)) = gc_pass(&mut p) {
                        passes += 1;
                        gc_objects += n;
                    }
                }
            }
            held_max = held_max.max(p.uploads_held());
        }
        p.stop_writes();
        loop {
            while let Some(u) = p.next_upload(true) {
                handed_out.push(u.seq());
                running.push(u);
            }
            let Some(u) = running.pop() else { break };
            finish(&mut p, &mut prov, &mut applied, u);
        }
        assert!(p.drained(), "seed {seed}: {}", p.describe());
        split += p.batches_split();
        let want: Vec<u64> = (1..=handed_out.len() as u64).collect();
        let mut sorted = handed_out.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, want, "seed {seed}: every number once");
        assert_eq!(applied, want, "seed {seed}: applied in order");
        assert_eq!(p.freeable_through(), record, "seed {seed}");
        let store = p.store();
        for (&block, &last) in &model {
            let pieces = store.map().lookup(block * 8, 8);
            match last {
                None => assert!(
                    pieces.iter().all(|x| x.location.is_none()),
                    "seed {seed}: block {block} was trimmed last"
                ),
                Some(r) => {
                    assert_eq!(pieces.len(), 1, "seed {seed}: block {block}");
                    let at = pieces[0].location.expect("written");
                    assert_eq!(
                        prov.record_at(at.object_seq, at.offset),
                        r,
                        "seed {seed}: block {block} holds its newest write"
                    );
                }
            }
        }
        assert_eq!(
            store.live_bytes(),
            model.values().filter(|v| v.is_some()).count() as u64 * 4096,
            "seed {seed}"
        );
    }
    // The schedules exercised what they are meant to.
    assert!(
        passes > 100 && gc_objects > 100,
        "{passes} passes, {gc_objects} GC objects"
    );
    assert!(held_max > 0, "client batches were held");
    assert!(split > 100, "{split} batches split");
}

/// A resize closes the open batch and follows it as an object of its own: no data,
/// the new size, and (shrinking) a trim of everything cut off; the store state takes
/// the size when it applies, after the writes queued before it.
#[test]
fn a_resize_is_an_object_of_its_own_after_the_open_batch() {
    let mut p = pipeline(gc_off());
    let old = p.store().volume_size_bytes;
    write(&mut p, 0, 1, 3);
    p.resize(old * 2);
    write(&mut p, 0, 2, old * 2 / 4096 - 1);
    p.close_batch();
    let mut uploads = Vec::new();
    while let Some(u) = p.next_upload(true) {
        uploads.push(u);
    }
    let headers: Vec<ObjectHeader> = uploads.iter().map(|u| header_of(&p, u)).collect();
    assert_eq!(headers.len(), 3, "{headers:?}");
    assert_eq!(headers[0].volume_size_bytes, None);
    assert_eq!(headers[1].volume_size_bytes, Some(old * 2));
    assert!(headers[1].extents.is_empty() && headers[1].trims.is_empty());
    assert_eq!(headers[1].last_record_seq, 1, "covers what came before it");
    for h in &headers {
        p.upload_done(h.seq, h.clone());
    }
    p.apply_all_ready()
        .expect("the write past the old end applies after the grow");
    assert_eq!(p.store().volume_size_bytes, old * 2);

    // Shrink to a quarter: the object trims the rest, and a block written there
    // before reads as nothing.
    p.resize(old / 2);
    let u = p.next_upload(true).expect("the resize object");
    let h = header_of(&p, &u);
    assert_eq!(h.volume_size_bytes, Some(old / 2));
    assert_eq!(h.trims, vec![(old / 2 / 512, (old * 2 - old / 2) / 512)]);
    p.upload_done(h.seq, h);
    p.apply_all_ready().expect("applies");
    assert_eq!(p.store().volume_size_bytes, old / 2);
    assert_eq!(p.store().map().mapped_sectors(), 8, "only block 3 is left");
}

/// `gc_headroom_bytes`: client batches go on past the store bound by that much
/// (without it they are held), and a GC pass starts even with client objects queued
/// for upload (without headroom, more than `gc_max_backlog` queued keep GC off).
#[test]
fn headroom_lets_clients_go_on_and_gc_run_beside_their_uploads() {
    let run = |headroom_bytes: u64| {
        let cfg = PipelineConfig {
            gc_headroom_bytes: headroom_bytes,
            ..config(eager_gc())
        };
        let mut p = Pipeline::new(cfg, StoreState::new(64 << 20), 0);
        let mut record = 0;
        // Four objects of 16 blocks, then half of each overwritten: the store holds
        // half-dead objects (GC victims) and is above live / start.
        for b in 0..64 {
            record += 1;
            write(&mut p, 0, record, b);
        }
        p.close_batch();
        drain_uploads(&mut p);
        let halves = [0..8, 16..24, 32..40, 48..56];
        for half in halves.clone() {
            for b in half {
                record += 1;
                write(&mut p, 0, record, b);
            }
        }
        p.close_batch();
        drain_uploads(&mut p);
        // Four more batches of overwrites, not uploaded.
        for _ in 0..4 {
            for half in halves.clone() {
                for b in half {
                    record += 1;
                    write(&mut p, 0, record, b);
                }
            }
            p.close_batch();
        }
        let held = p.uploads_held();
        let pending = p.uploads_pending();
        let gc_starts = p.gc_plan().is_some();
        (held, pending, gc_starts)
    };
    let (held_without, pending, gc_starts) = run(0);
    assert!(held_without > 2, "without headroom the batches wait for GC");
    assert_eq!(pending, held_without, "all of them held, none queued");
    assert!(gc_starts, "nothing queued: GC starts");
    let (held, pending, gc_starts) = run(1 << 20);
    assert_eq!(held, 0, "1 MiB of headroom takes four rounds of 64 KiB");
    assert!(
        pending > 2,
        "queued for upload, more than gc_max_backlog: {pending}"
    );
    assert!(gc_starts, "and GC starts beside them");
}
