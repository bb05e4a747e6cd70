//! `lsvd export-diff` and `lsvd import-diff`: the blocks that changed between two
//! snapshots, as a stream, and that stream applied to a copy of the volume.
//!
//! Why: incremental backup. A full export once, then a diff per snapshot, each as
//! large as what changed, restores every snapshot elsewhere (another store, another
//! site) by applying them in order. What changed comes from the volume's maps
//! (`Volume::changes`), so an export-diff reads only the changed data, whatever the
//! volume's size; the stream format is `lsvd_core::format::diff` (docs/format/diff.md).
//! An import-diff applies only where it fits: on a volume whose newest snapshot is the
//! diff's base and that was not written since (or, for a diff from nothing, a volume
//! never written), and it ends by taking the diff's snapshot there, so the next diff
//! of the chain fits in turn.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};

use lsvd_core::error::{Error, ErrorKind, Result};
use lsvd_core::format::diff::{
    DiffDecoder, DiffEncoder, DiffHeader, DiffRecord, encode_diff_header,
};
use lsvd_core::size::format_size;
use lsvd_engine::{Change, ChangeBase, Volume};

use super::Common;
use super::progress::Progress;

/// The changes asked for at a time (map work only).
const SCAN_BYTES: u64 = 64 << 20;
/// Data read, and written as one record, at a time.
const RECORD_BYTES: u64 = 1 << 20;
/// The largest zeroing request sent to the volume at once.
const ZERO_BYTES: u64 = 1 << 30;

fn corrupt(input: &str, e: lsvd_core::format::FormatError) -> Error {
    Error::with_source(
        ErrorKind::Corrupt,
        format!("{input} is not a whole lsvd diff"),
        e,
    )
}

/// `lsvd export-diff VOL@SNAP [--from-snap BASE] OUT`.
pub async fn export_diff(
    common: &Common,
    source: &str,
    from: Option<&str>,
    out: &str,
    quiet: bool,
) -> Result<()> {
    let (volume, snapshot) = lsvd_engine::split_export_name(source);
    let Some(snap) = snapshot else {
        return Err(Error::bad_input(format!(
            "export-diff reads a snapshot: give VOL@SNAP (take one with `lsvd snapshot create {volume} NAME`)"
        )));
    };
    lsvd_engine::keys::validate_volume_name(volume)?;
    if let Some(base) = from {
        lsvd_engine::validate_snapshot_name(base)?;
    }
    super::image::refuse_existing(out)?;
    let what = format!("diff-{source}");
    super::image::with_snapshot(common, volume, snap, &what, async |vol| {
        let base = vol.change_base(from).await?;
        let to_through_seq = vol.snapshot_record().await?.map_or(0, |r| r.through_seq);
        let header = DiffHeader {
            volume: vol.meta().volume,
            size_bytes: vol.size_bytes(),
            created_unix_ms: lsvd_engine::now_unix_ms(),
            from_snapshot: from.map(str::to_string),
            from_through_seq: if from.is_some() {
                base.through_seq()
            } else {
                0
            },
            to_snapshot: snap.to_string(),
            to_through_seq,
        };
        write_diff(vol, &base, &header, out, quiet).await
    })
    .await
}

/// Write the diff to `out`; a file this made is removed again if it fails (half a
/// diff is no diff: do not leave one to be found).
async fn write_diff(
    vol: &Volume,
    base: &ChangeBase,
    header: &DiffHeader,
    out: &str,
    quiet: bool,
) -> Result<()> {
    let sink: Box<dyn Write> = if out == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(out)
                .map_err(|e| Error::local_io(format!("cannot create {out}"), e))?,
        )
    };
    let written = write_records(vol, base, header, out, sink, quiet).await;
    if written.is_err() && out != "-" {
        let _ = std::fs::remove_file(out);
    }
    written
}

async fn write_records(
    vol: &Volume,
    base: &ChangeBase,
    header: &DiffHeader,
    out: &str,
    sink: Box<dyn Write>,
    quiet: bool,
) -> Result<()> {
    let mut sink = BufWriter::with_capacity(RECORD_BYTES as usize, sink);
    let put = |sink: &mut BufWriter<Box<dyn Write>>, bytes: &[u8]| {
        sink.write_all(bytes)
            .map_err(|e| Error::local_io("cannot write the diff", e))
    };
    let encoded = encode_diff_header(header).map_err(|e| Error::bad_input(e.to_string()))?;
    put(&mut sink, &encoded)?;
    let size = header.size_bytes;
    let what = match &header.from_snapshot {
        Some(b) => format!(
            "export-diff {}@{} from {b}",
            vol.meta().name,
            header.to_snapshot
        ),
        None => format!("export-diff {}@{}", vol.meta().name, header.to_snapshot),
    };
    let mut progress = Progress::new(what, size, quiet);
    let mut enc = DiffEncoder::new(size);
    let bad = |e: lsvd_core::format::FormatError| {
        Error::new(
            ErrorKind::Permanent,
            format!("the volume's changes do not make a diff: {e}"),
        )
    };
    let (mut zeroed_bytes, mut at) = (0u64, 0u64);
    while at < size {
        let window = SCAN_BYTES.min(size - at);
        let mut offset = at;
        for (bytes, change) in vol.changes(base, at, window).await? {
            match change {
                Change::Same => {}
                Change::Zero => {
                    put(&mut sink, &enc.zeros(offset, bytes).map_err(bad)?)?;
                    zeroed_bytes += bytes;
                }
                Change::Data => {
                    let mut done = 0;
                    while done < bytes {
                        let n = RECORD_BYTES.min(bytes - done);
                        let data = vol.read(offset + done, n).await?;
                        // Written as zeros reads as zeros: a zero record says the same.
                        if data.iter().all(|&b| b == 0) {
                            put(&mut sink, &enc.zeros(offset + done, n).map_err(bad)?)?;
                            zeroed_bytes += n;
                        } else {
                            put(&mut sink, &enc.data(offset + done, &data).map_err(bad)?)?;
                            put(&mut sink, &data)?;
                        }
                        done += n;
                    }
                }
            }
            offset += bytes;
        }
        at += window;
        progress.update(at);
    }
    put(&mut sink, &enc.end())?;
    sink.flush()
        .map_err(|e| Error::local_io("cannot write the diff", e))?;
    drop(sink);
    if out != "-" {
        File::open(out)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::local_io(format!("cannot sync {out}"), e))?;
    }
    let (records, data_bytes) = enc.totals();
    progress.finish(
        size,
        &format!(
            "{} of data and {} zeroed in {records} records (of a {} volume)",
            format_size(data_bytes),
            format_size(zeroed_bytes),
            format_size(size)
        ),
    );
    Ok(())
}

/// `lsvd import-diff IN VOL`.
pub async fn import_diff(
    common: &Common,
    input: &str,
    volume: &str,
    compression: Option<lsvd_core::compression::Compression>,
    encrypt: bool,
    quiet: bool,
) -> Result<()> {
    lsvd_engine::keys::validate_volume_name(volume)?;
    let open = || -> Result<Box<dyn Read + Send>> {
        Ok(if input == "-" {
            Box::new(std::io::stdin())
        } else {
            Box::new(BufReader::new(File::open(input).map_err(|e| {
                Error::local_io(format!("cannot open {input}"), e)
            })?))
        })
    };
    // A file is checked whole before the volume is touched; standard input can be
    // read once only, and a damaged stream then stops part way (said below).
    if input != "-" {
        let mut check = DiffDecoder::new(open()?).map_err(|e| corrupt(input, e))?;
        while check
            .next_record()
            .map_err(|e| corrupt(input, e))?
            .is_some()
        {}
    }
    let mut decoder = DiffDecoder::new(open()?).map_err(|e| corrupt(input, e))?;
    let header = decoder.header().clone();
    let store = super::admin::store(common)?;
    let exists = match lsvd_engine::read_meta(&store, volume).await {
        Ok(_) => true,
        Err(e) if e.kind == ErrorKind::NotFound => false,
        Err(e) => return Err(e),
    };
    if !exists {
        if let Some(base) = &header.from_snapshot {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "volume '{volume}' does not exist: this diff applies on top of snapshot '{base}', \
                     so restore the chain up to '{base}' first (a diff made without --from-snap creates the volume)"
                ),
            ));
        }
        super::admin::create(
            common,
            volume,
            &header.size_bytes.to_string(),
            compression,
            encrypt,
        )
        .await?;
    }
    let what = format!("import-diff {volume}@{}", header.to_snapshot);
    super::snapshot::with_volume(common, volume, async |vol| {
        check_fits(vol, &header).await?;
        let applied = apply(vol, &mut decoder, &header, &what, quiet).await;
        applied.map_err(|e| {
            Error::new(
                e.kind,
                format!(
                    "{}; volume '{volume}' now holds part of the diff: make it again from its \
                     newest snapshot (or delete it) before applying this diff again",
                    e.message
                ),
            )
        })
    })
    .await
}

/// Refuse, in one line, a volume the diff does not apply to.
async fn check_fits(vol: &Volume, header: &DiffHeader) -> Result<()> {
    let name = &vol.meta().name;
    let refuse = |why: String| Err(Error::new(ErrorKind::Conflict, why));
    if vol.size_bytes() != header.size_bytes {
        return refuse(format!(
            "volume '{name}' is {} and the diff's volume {}: resize it first (lsvd resize)",
            format_size(vol.size_bytes()),
            format_size(header.size_bytes)
        ));
    }
    let snapshots = vol.snapshot_names().await?;
    if snapshots.contains(&header.to_snapshot) {
        return refuse(format!(
            "volume '{name}' already has snapshot '{}': this diff was applied already",
            header.to_snapshot
        ));
    }
    let newest = snapshots.last().map(String::as_str);
    if newest != header.from_snapshot.as_deref() {
        return refuse(match (&header.from_snapshot, newest) {
            (Some(base), Some(n)) => format!(
                "the diff applies on top of snapshot '{base}', and volume '{name}''s newest snapshot is '{n}'"
            ),
            (Some(base), None) => format!(
                "the diff applies on top of snapshot '{base}', and volume '{name}' has no snapshots"
            ),
            (None, _) => format!(
                "the diff starts from the empty volume, and volume '{name}' has snapshots: apply it to a new volume"
            ),
        });
    }
    let base = vol.change_base(newest).await?;
    let written = vol
        .changes(&base, 0, vol.size_bytes())
        .await?
        .iter()
        .any(|&(_, c)| c != Change::Same);
    if written {
        return refuse(match newest {
            Some(n) => format!(
                "volume '{name}' was written since its snapshot '{n}': the diff applies only to the volume as that snapshot holds it"
            ),
            None => format!(
                "volume '{name}' was written: a diff from the empty volume applies only to a volume never written"
            ),
        });
    }
    Ok(())
}

async fn apply(
    vol: &Volume,
    decoder: &mut DiffDecoder<Box<dyn Read + Send>>,
    header: &DiffHeader,
    what: &str,
    quiet: bool,
) -> Result<()> {
    let mut progress = Progress::new(what, header.size_bytes, quiet);
    let (mut data_bytes, mut zeroed_bytes) = (0u64, 0u64);
    while let Some(record) = decoder.next_record().map_err(|e| corrupt("the input", e))? {
        match record {
            DiffRecord::Data { offset, data } => {
                let n = data.len() as u64;
                super::image::wait_for_log_room(vol).await;
                vol.write(offset, data, false).await?;
                data_bytes += n;
                progress.update(offset + n);
            }
            DiffRecord::Zeros { offset, length } => {
                let mut done = 0;
                while done < length {
                    let n = ZERO_BYTES.min(length - done);
                    vol.write_zeroes(offset + done, n, false).await?;
                    done += n;
                }
                zeroed_bytes += length;
                progress.update(offset + length);
            }
        }
    }
    vol.flush().await?;
    vol.create_snapshot(&header.to_snapshot).await?;
    progress.finish(
        header.size_bytes,
        &format!(
            "{} of data and {} zeroed applied; snapshot '{}' taken",
            format_size(data_bytes),
            format_size(zeroed_bytes),
            header.to_snapshot
        ),
    );
    Ok(())
}
