//! Writes the seed corpora under fuzz/corpus/<target>/ from real encoded structures:
//! the format encoders' output (mostly of `lsvd_core::format::examples`, the values
//! the format tests pin to golden bytes),
//! the NBD codec's messages, and client byte streams recorded from nbdinfo and qemu-io
//! (fuzz/captures/, made with fuzz/tools/capture_nbd.py).
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --example make_seeds` (deterministic: the
//! same files every run). Each seed starts with the target's mode byte (see the
//! targets' docs): 0 for "decode these bytes", 1 for "build a value from these bytes".

use std::fs;
use std::path::{Path, PathBuf};

use lsvd_core::compression::Compression;
use lsvd_core::format::VolumeId;
use lsvd_core::format::cache_super::encode_cache_super;
use lsvd_core::format::chain_drive::encode_drive_record;
use lsvd_core::format::checkpoint::encode_checkpoint;
use lsvd_core::format::clone_link::encode_clone_link;
use lsvd_core::format::diff::{DiffHeader, DiffRecord, encode_diff};
use lsvd_core::format::examples::{self, OBJECT_EXTENTS, RECORD_EXTENTS};
use lsvd_core::format::log_index::encode_log_index;
use lsvd_core::format::object::{
    ExtentSource, ObjectExtent, ObjectKind, ObjectSpec, encode_compressed_object, encode_object,
};
use lsvd_core::format::record::encode_record;
use lsvd_core::format::replica_status::{PassInProgress, ReplicaStatus, encode_replica_status};
use lsvd_core::format::sealed::encode_sealed_header;
use lsvd_core::format::snapshot::{SnapshotRecord, encode_snapshot};
use lsvd_core::format::volume_keys::{CIPHER_AES256_GCM, VolumeKeys, encode_volume_keys};
use lsvd_core::format::volume_meta::{VolumeMeta, encode_volume_meta};
use lsvd_core::format::volume_settings::{VolumeSettings, encode_volume_settings};
use lsvd_core::format::volume_super::{VolumeSuper, encode_volume_super};
use lsvd_fuzz::format_targets::fix_record;
use lsvd_nbd::BlockSizes;
use lsvd_nbd::proto::consts::*;
use lsvd_nbd::proto::handshake::{
    Info, InfoRequest, MetaContextRequest, encode_greeting, encode_info, encode_meta_context,
    encode_option, encode_option_reply,
};
use lsvd_nbd::proto::transmission::{
    Command, RequestHeader, encode_block_status_chunk, encode_error_chunk, encode_simple_reply,
};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

fn put(target: &str, name: &str, mode: &[u8], bytes: &[u8]) {
    let d = dir().join(target);
    fs::create_dir_all(&d).expect("create corpus dir");
    let mut v = mode.to_vec();
    v.extend_from_slice(bytes);
    fs::write(d.join(name), v).expect("write seed");
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| seed.wrapping_add((i * 7) as u8)).collect()
}

/// Diff streams: from a base and from nothing, empty and with data and zero records;
/// and generator inputs.
fn diffs() {
    let header = |from: Option<&str>| DiffHeader {
        volume: VolumeId([3; 16]),
        size_bytes: 1 << 20,
        created_unix_ms: 1_700_000_000_000,
        from_snapshot: from.map(str::to_string),
        from_through_seq: if from.is_some() { 4 } else { 0 },
        to_snapshot: "daily".to_string(),
        to_through_seq: 9,
    };
    let records = vec![
        DiffRecord::Data {
            offset: 4096,
            data: pattern(4096, 1),
        },
        DiffRecord::Zeros {
            offset: 65536,
            length: 65536,
        },
        DiffRecord::Data {
            offset: 1 << 19,
            data: pattern(512, 2),
        },
    ];
    for (name, from, recs) in [
        ("from-base", Some("weekly"), records.clone()),
        ("from-nothing", None, records),
        ("empty", Some("weekly"), vec![]),
    ] {
        let bytes = encode_diff(&header(from), &recs).expect("encode a diff");
        put("format_diff", name, &[0], &bytes);
    }
    for i in 0..4u8 {
        put(
            "format_diff",
            &format!("generate-{i}"),
            &[1],
            &pattern(600, i * 31),
        );
    }
}

fn records() {
    let vol = VolumeId([9; 16]);
    let rec = encode_record(vol, 11, 0xdead_beef, &RECORD_EXTENTS, &pattern(4096, 1));
    put("format_record", "v4-data-and-zero", &[0], &rec);
    // Versions 1-3: the same header relabelled, padded to 4096, checksums refitted.
    for version in 1u16..=3 {
        let mut old = vec![0u8; 4096 + 4096];
        old[..96].copy_from_slice(&rec[..96]);
        old[8..10].copy_from_slice(&version.to_le_bytes());
        old[12..16].copy_from_slice(&4096u32.to_le_bytes());
        old[4096..].copy_from_slice(&pattern(4096, 1));
        fix_record(&mut old);
        put("format_record", &format!("v{version}"), &[0], &old);
    }
    put("format_record", "generate", &[1], &pattern(64, 3));
}

fn objects() {
    let vol = VolumeId([7; 16]);
    let spec = ObjectSpec {
        kind: ObjectKind::Data,
        volume: vol,
        seq: 5,
        last_record_seq: 40,
        extents: &OBJECT_EXTENTS,
        trims: &[(1000, 8)],
        volume_size_bytes: None,
        parts_after: 0,
        epoch: 2,
        first_record_seq: 38,
    };
    let gc_extents = [ObjectExtent {
        lba: 16,
        sectors: 4,
        source: Some(ExtentSource {
            object_seq: 3,
            object_offset: 4096,
        }),
    }];
    let gc = ObjectSpec {
        kind: ObjectKind::Gc,
        extents: &gc_extents,
        trims: &[],
        ..spec
    };
    let ckp = ObjectSpec {
        kind: ObjectKind::Checkpoint,
        extents: &[],
        trims: &[],
        ..spec
    };
    let resize = ObjectSpec {
        extents: &[],
        trims: &[(4096, 4096)],
        volume_size_bytes: Some(2 << 20),
        ..spec
    };
    let part = ObjectSpec {
        parts_after: 2,
        ..spec
    };
    // Version 5: 72 KiB that compress (two chunks, the second short), with each codec.
    let long_extents = [ObjectExtent {
        lba: 64,
        sectors: 144,
        source: None,
    }];
    let long = ObjectSpec {
        extents: &long_extents,
        ..spec
    };
    let seeds = [
        ("data", spec, pattern(17 * 512, 2)),
        ("gc", gc, pattern(2048, 5)),
        ("checkpoint", ckp, pattern(300, 9)),
        ("resize", resize, Vec::new()),
        ("part", part, pattern(17 * 512, 2)),
    ];
    for (name, spec, data) in &seeds {
        put("format_object", name, &[0], &encode_object(spec, data));
    }
    for (name, compression) in [
        ("data-lz4", Compression::Lz4),
        ("data-zstd", Compression::Zstd(3)),
    ] {
        let object = encode_compressed_object(&long, &pattern(144 * 512, 6), compression);
        put("format_object", name, &[0], &object);
    }
    put("format_object", "generate", &[1], &pattern(96, 4));
}

fn checkpoints() {
    let plain = encode_checkpoint(&examples::checkpoint());
    put("format_checkpoint", "one-object", &[0], &plain);
    let hylog = encode_checkpoint(&examples::checkpoint_with_heat());
    put("format_checkpoint", "with-heat", &[0], &hylog);
    put("format_checkpoint", "generate", &[1], &pattern(80, 6));
}

fn log_indexes() {
    let records = examples::log_index_records();
    let headers = records.iter().map(|(at, header)| (*at, header.as_slice()));
    let ix = encode_log_index(VolumeId([5; 16]), 4, 77, headers);
    put("format_log_index", "two-records", &[0], &ix);
    put("format_log_index", "generate", &[1], &pattern(120, 8));
}

fn supers() {
    let cs = examples::cache_super(5);
    let vs = VolumeSuper {
        volume: VolumeId([4; 16]),
        generation: 3,
        session: 2,
        clean: true,
        deleting: false,
        newest_checkpoint: Some(10),
        previous_checkpoint: None,
        durable_through: 40,
        last_record_seq: 41,
        written_unix_ms: 1_800_000_000_000,
        epoch: 2,
        lease_timeout_ms: 10_000,
        holder: "host-a pid 42 (lsvd serve)".into(),
        history: lsvd_core::history::History {
            from_seq: 0,
            segments: vec![
                lsvd_core::history::Segment {
                    first_seq: 1,
                    epoch: 1,
                    after_seq: 0,
                },
                lsvd_core::history::Segment {
                    first_seq: 9,
                    epoch: 2,
                    after_seq: 7,
                },
            ],
        },
    };
    let vm = VolumeMeta {
        volume: VolumeId([9; 16]),
        size_bytes: 16 << 30,
        created_unix_secs: 1_800_000_000,
        name: "disk0".into(),
        encrypted: false,
    };
    let snap = SnapshotRecord {
        volume: VolumeId([9; 16]),
        name: "before-upgrade".into(),
        base_checkpoint: Some(10),
        through_seq: 14,
        last_record_seq: 41,
        created_unix_ms: 1_800_000_000_000,
        history: lsvd_core::history::History {
            from_seq: 10,
            segments: vec![lsvd_core::history::Segment {
                first_seq: 9,
                epoch: 2,
                after_seq: 7,
            }],
        },
    };
    let link = examples::clone_link();
    let status = ReplicaStatus {
        volume: VolumeId([9; 16]),
        updated_unix_ms: 1_800_000_005_000,
        current_as_of_unix_ms: 1_800_000_000_000,
        lag_objects: 3,
        replica_next_seq: 40,
        source_next_seq: 41,
        bytes_copied: 1 << 20,
        generation: Some(5),
        peer: "file:///replica".into(),
        pass: Some(PassInProgress {
            started_unix_ms: 1_800_000_004_000,
            checkpoint: Some((32, 2)),
            through_seq: 41,
        }),
    };
    let drive = examples::drive_record();
    // In the order of the target's `which` byte.
    let seeds = [
        ("cache-super", encode_cache_super(&cs)[..96].to_vec()),
        ("volume-super", encode_volume_super(&vs)),
        ("volume-meta", encode_volume_meta(&vm)),
        ("snapshot", encode_snapshot(&snap).expect("a valid record")),
        (
            "clone-link",
            encode_clone_link(&link).expect("a valid link"),
        ),
        (
            "replica-status",
            encode_replica_status(&status).expect("a valid status"),
        ),
        ("chain-drive", encode_drive_record(&drive)),
        (
            "volume-settings",
            encode_volume_settings(&VolumeSettings {
                volume: VolumeId([4; 16]),
                compression: Compression::Zstd(3),
                changed_unix_ms: 1_800_000_000_000,
            }),
        ),
        (
            "volume-keys",
            encode_volume_keys(&VolumeKeys {
                cipher: CIPHER_AES256_GCM,
                key_id: [1; 8],
                nonce: [2; 12],
                wrapped_key: [3; 48],
            }),
        ),
        ("sealed-header", encode_sealed_header()),
    ];
    for (which, (name, bytes)) in (0u8..).zip(&seeds) {
        put("format_supers", name, &[0, which], bytes);
    }
    for which in 0..10u8 {
        put(
            "format_supers",
            &format!("generate-{which}"),
            &[1, which],
            &pattern(100, which),
        );
    }
}

fn proto(captures: &[(String, Vec<u8>)]) {
    let t = "nbd_proto";
    put(t, "greeting", &[0], &encode_greeting());
    put(t, "client-flags", &[1], &3u32.to_be_bytes());
    let mut opt = Vec::new();
    encode_option(&mut opt, OPT_GO, &[]);
    put(t, "option-header", &[2], &opt[..16]);
    let mut go = Vec::new();
    InfoRequest {
        name: "disk".into(),
        requests: vec![INFO_NAME, INFO_BLOCK_SIZE],
    }
    .encode(&mut go);
    put(t, "option-go", &[3, OPT_GO as u8], &go);
    let mut meta = Vec::new();
    MetaContextRequest {
        export_name: String::new(),
        queries: vec![META_CONTEXT_BASE_ALLOCATION.into()],
    }
    .encode(&mut meta);
    put(
        t,
        "option-set-meta",
        &[3, OPT_SET_META_CONTEXT as u8],
        &meta,
    );
    put(
        t,
        "option-export-name",
        &[3, OPT_EXPORT_NAME as u8],
        b"disk",
    );
    let mut reply = Vec::new();
    encode_option_reply(&mut reply, OPT_GO, REP_ACK, &[]);
    put(t, "option-reply", &[4], &reply);
    for (i, info) in [
        Info::Export {
            size: 1 << 20,
            transmission_flags: 0x1ed,
        },
        Info::Name("disk".into()),
        Info::BlockSize(BlockSizes {
            minimum_bytes: 512,
            preferred_bytes: 4096,
            maximum_bytes: 32 << 20,
        }),
    ]
    .iter()
    .enumerate()
    {
        let mut out = Vec::new();
        encode_info(&mut out, OPT_GO, info);
        put(t, &format!("info-{i}"), &[5], &out[20..]);
    }
    let mut mc = Vec::new();
    encode_meta_context(
        &mut mc,
        OPT_SET_META_CONTEXT,
        1,
        META_CONTEXT_BASE_ALLOCATION,
    );
    put(t, "meta-context", &[6], &mc[20..]);
    let req = RequestHeader {
        flags: CMD_FLAG_FUA,
        command: Command::Write,
        cookie: 9,
        offset: 4096,
        length: 512,
    };
    put(t, "request", &[7], &req.encode());
    let mut simple = Vec::new();
    encode_simple_reply(&mut simple, EINVAL, 9);
    put(t, "simple-reply", &[8], &simple);
    let mut err = Vec::new();
    encode_error_chunk(&mut err, 9, EIO, "boom", true);
    put(t, "chunk-header", &[9], &err[..20]);
    put(t, "error-chunk", &[10], &err[20..]);
    let mut bs = Vec::new();
    let ext = lsvd_nbd::AllocationExtent {
        length_bytes: 4096,
        flags: 3,
    };
    encode_block_status_chunk(&mut bs, 9, 1, &[ext, ext], true);
    put(t, "block-status", &[11], &bs[20..]);
    // Real clients' options, as the option parser sees them (header stripped).
    for (name, stream) in captures {
        let mut at = 4; // client flags
        let mut n = 0;
        while at + 16 <= stream.len() && stream[at..at + 8] == IHAVEOPT.to_be_bytes() {
            let opt = u32::from_be_bytes([
                stream[at + 8],
                stream[at + 9],
                stream[at + 10],
                stream[at + 11],
            ]);
            let len = u32::from_be_bytes([
                stream[at + 12],
                stream[at + 13],
                stream[at + 14],
                stream[at + 15],
            ]) as usize;
            let Some(data) = stream.get(at + 16..at + 16 + len) else {
                break;
            };
            put(t, &format!("{name}-option-{n}"), &[3, opt as u8], data);
            at += 16 + len;
            n += 1;
        }
    }
}

/// Builds session scripts: each call mirrors one read the session target makes.
#[derive(Default)]
struct Script(Vec<u8>);

impl Script {
    fn n(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn b(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.extend_from_slice(bytes);
        self
    }
    /// Export sizes 64 KiB and 4 KiB, 512-byte minimum block, 32 MiB maximum.
    fn setup(&mut self, no_zeroes: bool) -> &mut Self {
        self.n(65535)
            .n(4096)
            .n(1)
            .n(0)
            .n(if no_zeroes { 2 } else { 1 })
    }
    /// An option with no data: op, not raw, not oversized.
    fn plain_option(&mut self, op: u32) -> &mut Self {
        self.n(op).n(1).n(1)
    }
    fn structured(&mut self) -> &mut Self {
        self.plain_option(8)
    }
    fn set_meta(&mut self, name: u32) -> &mut Self {
        // op 10, not raw, name, one query "base:allocation", not oversized
        self.n(10).n(1).n(name).n(1).n(0).n(1)
    }
    /// GO (op 6) for export `name`, asking for NAME and BLOCK_SIZE.
    fn go(&mut self, name: u32) -> &mut Self {
        self.n(6)
            .n(1)
            .n(name)
            .n(2)
            .b(&1u16.to_le_bytes())
            .b(&3u16.to_le_bytes())
            .n(1)
    }
    /// A request: command choice, flags choice, range mode 3 (raw offset and length).
    fn request(&mut self, cmd: u32, flags: u32, offset: u64, length: u32) -> &mut Self {
        self.n(cmd).n(flags).n(3).b(&offset.to_le_bytes()).n(length);
        if cmd == 2 || cmd == 3 {
            self.b(&[0x41]);
        }
        self
    }
}

fn sessions(t: &str, captures: &[(String, Vec<u8>)]) {
    // nbdinfo --map-like: structured replies, base:allocation, GO, I/O, block status.
    let mut s = Script::default();
    s.setup(true).structured().set_meta(0).go(0);
    s.request(2, 5, 0, 8192) // WRITE
        .request(0, 5, 0, 8192) // READ
        .request(8, 5, 0, 65536) // BLOCK_STATUS
        .request(8, 2, 4096, 4096) // BLOCK_STATUS, REQ_ONE
        .request(5, 0, 0, 4096) // TRIM
        .request(7, 1, 4096, 512) // WRITE_ZEROES NO_HOLE
        .request(0, 5, 0, 16384) // READ
        .request(4, 0, 0, 0) // FLUSH
        .request(2, 0, 65536 - 512, 1024) // WRITE past the end
        .request(9, 5, 0, 0); // DISC
    put(t, "structured-session", &[], &s.0);
    // qemu-like: old-style EXPORT_NAME with zero padding, simple replies.
    let mut s = Script::default();
    s.setup(false).n(0).n(1).n(1).n(1); // EXPORT_NAME "disk", not oversized
    s.request(2, 0, 512, 4096)
        .request(0, 0, 0, 8192)
        .request(6, 5, 0, 4096) // CACHE
        .request(0, 5, 1 << 40, 512) // READ far past the end
        // Unknown command 0x99: choice 10, "not raw", the code, flags 0, offset 0, length 0.
        .n(10)
        .b(&[0, 0x99, 0])
        .n(5)
        .n(3)
        .b(&0u64.to_le_bytes())
        .n(0);
    put(t, "export-name-session", &[], &s.0);
    // LIST, INFO, unknown option, STARTTLS, ABORT.
    let mut s = Script::default();
    s.setup(true).plain_option(2);
    s.n(4).n(1).n(2).n(1).b(&2u16.to_le_bytes()).n(1); // INFO "other", DESCRIPTION
    s.n(11).n(0x55).n(1).n(1).plain_option(3).plain_option(1);
    put(t, "options-then-abort", &[], &s.0);
    // Real clients' byte streams after their flags, sent raw (op 12).
    for (name, stream) in captures {
        let mut s = Script::default();
        s.setup(true).n(12).b(stream.get(4..).unwrap_or(&[]));
        put(t, &format!("{name}-capture"), &[], &s.0);
    }
}

/// Scripts for lsvd's adapter (`nbd_volume`), besides the sessions both targets take:
/// the first number makes the volume 4 MiB, so CACHE and NO_HOLE zeroing run in
/// several 1 MiB pieces and BLOCK_STATUS sees data, trims and zeros side by side.
fn volume_sessions() {
    let t = "nbd_volume";
    const MIB: u64 = 1 << 20;
    let mut s = Script::default();
    s.n(1023).n(0).n(1).n(0).n(2); // 4 MiB, then as `setup`
    s.structured().set_meta(0).go(0);
    s.request(2, 5, 0, 65536) // WRITE
        .request(2, 0, 3 * MIB, 131072) // WRITE, FUA
        .request(7, 1, 4096, (2 * MIB + 8192) as u32) // WRITE_ZEROES NO_HOLE, 3 pieces
        .request(8, 5, 0, (4 * MIB) as u32) // BLOCK_STATUS of everything
        .request(5, 5, 3 * MIB + 4096, 8192) // TRIM inside the data
        .request(7, 5, 3 * MIB + 65536, 4096) // WRITE_ZEROES (a hole)
        .request(8, 2, 3 * MIB, (MIB) as u32) // BLOCK_STATUS, REQ_ONE
        .request(6, 5, 0, (4 * MIB) as u32) // CACHE of everything
        .request(4, 5, 0, 0) // FLUSH
        .request(0, 5, 3 * MIB, 262144) // READ
        .request(8, 5, 2 * MIB, (2 * MIB) as u32) // BLOCK_STATUS of the second half
        .request(9, 5, 0, 0); // DISC
    put(t, "pieces-and-status", &[], &s.0);
    // Simple replies, NO_HOLE zeroing with FUA over the whole volume, then reads.
    let mut s = Script::default();
    s.n(1023).n(0).n(1).n(0).n(1).n(0).n(1).n(1).n(1); // EXPORT_NAME "disk"
    s.request(2, 5, MIB - 4096, 8192)
        .request(7, 0, 0, (4 * MIB) as u32) // WRITE_ZEROES, FUA
        .request(2, 5, 2 * MIB, 4096)
        .request(7, 1, 0, (4 * MIB) as u32) // WRITE_ZEROES, NO_HOLE: 4 pieces
        .request(0, 5, MIB - 4096, 8192)
        .request(6, 5, 4 * MIB - 512, 512) // CACHE of the last sector
        .request(6, 5, 4 * MIB, 512); // CACHE past the end
    put(t, "zero-everything", &[], &s.0);
}

/// Trace lines from lsvd-trace's own parser tests, one seed per format (the first byte
/// is the index of the format in `Format::ALL`).
fn traces() {
    use lsvd_trace::Format;
    let samples: [(Format, &str); 9] = [
        (
            Format::Msr,
            "128166385295514663,hm,0,Write,9056014336,2048,2833\n128166385295514700,hm,1,Read,4096,512,10\n",
        ),
        (
            Format::MsrCut,
            "223.412 0 3159347200 36864 0\n224.0 0 4096 512 1\n",
        ),
        (
            Format::Spc,
            "0,303567,3584,w,0.026214\n1,2,512,R,1.5,extra,fields\n",
        ),
        (Format::Spc, "26214000 0 303567 7 0\n"),
        (
            Format::CloudPhysicsCsv,
            "version,time,op,size,lbn\n1,5633898,2a,6656,40409911\n1,5633898,35,0,0\n",
        ),
        (Format::Tencent, "1538323200,4247200,128,1,1058\n"),
        (
            Format::Systor,
            "Timestamp,Response,IOType,LUN,Offset,Size\n1455591804.310701000,0.006475000,R,0,203468398592,32768\n",
        ),
        (Format::Disksim, "938513000 4 264719034 16 0\n"),
        (Format::Vscsi, ""),
    ];
    for (i, (format, text)) in samples.iter().enumerate() {
        let index = Format::ALL
            .iter()
            .position(|f| f == format)
            .expect("listed") as u8;
        let mut bytes = text.as_bytes().to_vec();
        if *format == Format::Vscsi {
            // Two version-2 records (40 bytes each): zeros with a READ(10) opcode.
            for n in 0..2u8 {
                let mut rec = [0u8; 40];
                rec[0] = 0x28;
                rec[8] = n;
                rec[16] = 8;
                bytes.extend_from_slice(&rec);
            }
        }
        put(
            "trace_parse",
            &format!("{}-{i}", format.name()),
            &[index],
            &bytes,
        );
    }
}

fn main() {
    let caps = Path::new(env!("CARGO_MANIFEST_DIR")).join("captures");
    let mut captures = Vec::new();
    let mut entries: Vec<_> = fs::read_dir(&caps)
        .expect("fuzz/captures")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        let name = p
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("capture")
            .to_owned();
        captures.push((name, fs::read(&p).expect("read capture")));
    }
    records();
    objects();
    checkpoints();
    log_indexes();
    supers();
    diffs();
    proto(&captures);
    sessions("nbd_session", &captures);
    sessions("nbd_volume", &captures);
    volume_sessions();
    traces();
    println!("seeds written under {}", dir().display());
}
