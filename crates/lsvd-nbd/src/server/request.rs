//! Checking a request header against what was negotiated, before any device call.
//!
//! Kept pure (no I/O) so every rule — range, alignment, payload size, flags, meta
//! context — is unit-tested directly; the device then only ever sees requests that satisfy
//! the contract documented on [`crate::BlockDevice`].

use std::sync::Arc;

use crate::proto::consts::*;
use crate::proto::transmission::{Command, RequestHeader};
use crate::{BlockSizes, ZeroRequest};

use super::{MAX_PAYLOAD_BYTES, RefusalReason};

/// Context id of `base:allocation` (`NBD_OPT_SET_META_CONTEXT` reports it).
pub(crate) const ALLOCATION_CONTEXT_ID: u32 = 1;

/// Context id of the first of the device's selected contexts; the next ones follow.
pub(crate) const FIRST_DEVICE_CONTEXT_ID: u32 = 2;

/// The meta contexts a session selected for its export: a BLOCK_STATUS answers one
/// chunk for each, in this order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MetaContexts {
    /// `base:allocation`, answered from `BlockDevice::block_status`.
    pub allocation: bool,
    /// The device's contexts (`BlockDevice::meta_context_status`), in the order
    /// selected, at most `MAX_SELECTED_CONTEXTS`.
    pub device: Vec<String>,
}

impl MetaContexts {
    pub fn count(&self) -> usize {
        usize::from(self.allocation) + self.device.len()
    }

    /// `(context id, name)` of each selected context; `None` names `base:allocation`.
    pub fn ids(&self) -> impl Iterator<Item = (u32, Option<&str>)> {
        let allocation = self
            .allocation
            .then_some((ALLOCATION_CONTEXT_ID, None::<&str>));
        let device = (FIRST_DEVICE_CONTEXT_ID..)
            .zip(self.device.iter())
            .map(|(id, name)| (id, Some(name.as_str())));
        allocation.into_iter().chain(device)
    }
}

/// What the transmission phase needs to know about the negotiated export and session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExportParams {
    pub size: u64,
    /// Advertised (and enforced) block sizes, already sanitised.
    pub sizes: BlockSizes,
    pub structured: bool,
    /// The meta contexts selected for this export; BLOCK_STATUS is allowed if any.
    pub contexts: Arc<MetaContexts>,
    /// The export is read-only: WRITE, TRIM and WRITE_ZEROES get EPERM.
    pub read_only: bool,
}

/// A request that passed validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Read {
        offset: u64,
        length: u32,
    },
    /// The payload was read separately by the connection loop.
    Write {
        offset: u64,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Cache {
        offset: u64,
        length: u32,
    },
    WriteZeroes(ZeroRequest),
    BlockStatus {
        offset: u64,
        length: u32,
        req_one: bool,
    },
}

/// Why a request is refused: the NBD error value, a message for humans, and the
/// reason it is counted under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rejection {
    pub error: u32,
    pub message: &'static str,
    pub reason: RefusalReason,
}

fn reject(error: u32, message: &'static str) -> Rejection {
    let reason = match error {
        EPERM => RefusalReason::ReadOnly,
        _ => RefusalReason::Invalid,
    };
    Rejection {
        error,
        message,
        reason,
    }
}

fn reject_for(error: u32, message: &'static str, reason: RefusalReason) -> Rejection {
    Rejection {
        error,
        message,
        reason,
    }
}

/// Block sizes to advertise and enforce, derived from the device's wish but forced to
/// satisfy the spec (powers of two, minimum ≤ 64 KiB, preferred ≥ 512, maximum between
/// preferred and [`MAX_PAYLOAD_BYTES`]), so a sloppy device cannot make the server divide
/// by zero or advertise nonsense.
pub(crate) fn sanitize_block_sizes(wanted: BlockSizes) -> BlockSizes {
    let pow2 = |v: u32| v.checked_next_power_of_two().unwrap_or(1 << 31);
    let minimum = pow2(wanted.minimum_bytes.max(1)).min(1 << 16);
    let cap = MAX_PAYLOAD_BYTES as u32;
    let preferred = pow2(wanted.preferred_bytes.max(minimum).max(512)).min(cap);
    let maximum = wanted.maximum_bytes.min(cap).max(preferred);
    // Keep maximum a multiple of the minimum so the largest allowed request is aligned.
    let maximum = maximum - maximum % minimum;
    BlockSizes {
        minimum_bytes: minimum,
        preferred_bytes: preferred,
        maximum_bytes: maximum,
    }
}

/// Validates `hdr` (anything but DISC, which the loop handles itself).
pub(crate) fn validate(hdr: &RequestHeader, p: &ExportParams) -> Result<Op, Rejection> {
    if let Command::Unknown(_) = hdr.command {
        return Err(reject(EINVAL, "unknown command"));
    }
    if hdr.flags & !hdr.command.allowed_flags() != 0 {
        return Err(reject(
            EINVAL,
            "command flag not supported for this command",
        ));
    }
    let fua = hdr.flags & CMD_FLAG_FUA != 0;
    let (offset, length) = (hdr.offset, hdr.length);
    // Offset and length of FLUSH and DISC are reserved; nothing to check.
    if hdr.command == Command::Flush {
        return Ok(Op::Flush);
    }
    if p.read_only
        && matches!(
            hdr.command,
            Command::Write | Command::Trim | Command::WriteZeroes
        )
    {
        return Err(reject(EPERM, "the export is read-only"));
    }
    if hdr.command == Command::BlockStatus && p.contexts.count() == 0 {
        return Err(reject(EINVAL, "no metadata context was negotiated"));
    }
    if matches!(hdr.command, Command::Read | Command::Write) && length > p.sizes.maximum_bytes {
        return Err(reject_for(
            EINVAL,
            "request longer than the maximum block size",
            RefusalReason::TooLarge,
        ));
    }
    let end = offset.checked_add(u64::from(length));
    if end.is_none_or(|end| end > p.size) {
        let error = match hdr.command {
            Command::Write | Command::WriteZeroes => ENOSPC,
            _ => EINVAL,
        };
        return Err(reject_for(
            error,
            "request past the end of the export",
            RefusalReason::OutOfRange,
        ));
    }
    let min = u64::from(p.sizes.minimum_bytes.max(1));
    let ends_at_export_end = end == Some(p.size);
    if offset % min != 0 || (u64::from(length) % min != 0 && !ends_at_export_end) {
        return Err(reject_for(
            EINVAL,
            "request not aligned to the minimum block size",
            RefusalReason::Misaligned,
        ));
    }
    Ok(match hdr.command {
        Command::Read => Op::Read { offset, length },
        Command::Write => Op::Write { offset, fua },
        Command::Trim => Op::Trim {
            offset,
            length,
            fua,
        },
        Command::Cache => Op::Cache { offset, length },
        Command::WriteZeroes => Op::WriteZeroes(ZeroRequest {
            offset,
            length,
            fua,
            no_hole: hdr.flags & CMD_FLAG_NO_HOLE != 0,
        }),
        Command::BlockStatus => {
            if length == 0 {
                return Err(reject(EINVAL, "block status of an empty range"));
            }
            Op::BlockStatus {
                offset,
                length,
                req_one: hdr.flags & CMD_FLAG_REQ_ONE != 0,
            }
        }
        Command::Flush | Command::Disc | Command::Unknown(_) => {
            return Err(reject(EINVAL, "command not valid here"));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::XorShift;

    fn params() -> ExportParams {
        ExportParams {
            size: 1 << 20,
            sizes: BlockSizes {
                minimum_bytes: 512,
                preferred_bytes: 4096,
                maximum_bytes: 65536,
            },
            structured: true,
            contexts: Arc::new(MetaContexts {
                allocation: true,
                device: Vec::new(),
            }),
            read_only: false,
        }
    }

    fn hdr(command: Command, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader {
            flags,
            command,
            cookie: 1,
            offset,
            length,
        }
    }

    #[test]
    fn a_read_only_export_refuses_writes_trims_and_zeroes_with_eperm() {
        let p = ExportParams {
            read_only: true,
            ..params()
        };
        for command in [Command::Write, Command::Trim, Command::WriteZeroes] {
            assert_eq!(
                validate(&hdr(command, 0, 0, 512), &p).map_err(|r| r.error),
                Err(EPERM),
                "{command:?}"
            );
        }
        assert!(validate(&hdr(Command::Read, 0, 0, 512), &p).is_ok());
        assert_eq!(validate(&hdr(Command::Flush, 0, 0, 0), &p), Ok(Op::Flush));
        assert!(validate(&hdr(Command::Write, 0, 0, 512), &params()).is_ok());
    }

    #[test]
    fn accepts_valid_requests() {
        let p = params();
        assert_eq!(
            validate(&hdr(Command::Read, 0, 0, 4096), &p),
            Ok(Op::Read {
                offset: 0,
                length: 4096
            })
        );
        assert_eq!(
            validate(&hdr(Command::Write, CMD_FLAG_FUA, 512, 512), &p),
            Ok(Op::Write {
                offset: 512,
                fua: true
            })
        );
        assert_eq!(validate(&hdr(Command::Flush, 0, 99, 7), &p), Ok(Op::Flush));
        assert_eq!(
            validate(
                &hdr(
                    Command::WriteZeroes,
                    CMD_FLAG_NO_HOLE | CMD_FLAG_FUA,
                    0,
                    1 << 20
                ),
                &p
            ),
            Ok(Op::WriteZeroes(ZeroRequest {
                offset: 0,
                length: 1 << 20,
                fua: true,
                no_hole: true
            }))
        );
        assert_eq!(
            validate(&hdr(Command::BlockStatus, CMD_FLAG_REQ_ONE, 0, 1 << 20), &p),
            Ok(Op::BlockStatus {
                offset: 0,
                length: 1 << 20,
                req_one: true
            })
        );
        assert_eq!(
            validate(&hdr(Command::Trim, 0, 0, 0), &p),
            Ok(Op::Trim {
                offset: 0,
                length: 0,
                fua: false
            })
        );
    }

    #[test]
    fn rejects_invalid_requests() {
        let p = params();
        let err = |h: RequestHeader| validate(&h, &p).map_err(|r| r.error);
        assert_eq!(err(hdr(Command::Unknown(42), 0, 0, 0)), Err(EINVAL));
        assert_eq!(err(hdr(Command::Read, CMD_FLAG_DF, 0, 512)), Err(EINVAL));
        assert_eq!(err(hdr(Command::Read, 1 << 15, 0, 512)), Err(EINVAL));
        assert_eq!(
            err(hdr(Command::Trim, CMD_FLAG_NO_HOLE, 0, 512)),
            Err(EINVAL)
        );
        assert_eq!(
            err(hdr(Command::WriteZeroes, CMD_FLAG_FAST_ZERO, 0, 512)),
            Err(EINVAL)
        );
        assert_eq!(err(hdr(Command::Read, 0, 1 << 20, 512)), Err(EINVAL));
        assert_eq!(err(hdr(Command::Write, 0, 1 << 20, 512)), Err(ENOSPC));
        assert_eq!(
            err(hdr(Command::WriteZeroes, 0, (1 << 20) - 512, 1024)),
            Err(ENOSPC)
        );
        assert_eq!(err(hdr(Command::Cache, 0, u64::MAX - 10, 512)), Err(EINVAL));
        assert_eq!(err(hdr(Command::Read, 0, 1, 512)), Err(EINVAL));
        assert_eq!(err(hdr(Command::Write, 0, 0, 513)), Err(EINVAL));
        assert_eq!(err(hdr(Command::Read, 0, 0, 65536 + 512)), Err(EINVAL));
        assert_eq!(err(hdr(Command::BlockStatus, 0, 0, 0)), Err(EINVAL));
        let no_ctx = ExportParams {
            contexts: Arc::default(),
            ..p
        };
        assert!(validate(&hdr(Command::BlockStatus, 0, 0, 512), &no_ctx).is_err());
    }

    #[test]
    fn every_rejection_names_the_reason_it_is_counted_under() {
        let p = params();
        let reason = |h: RequestHeader, p: &ExportParams| validate(&h, p).map_err(|r| r.reason);
        assert_eq!(
            reason(hdr(Command::Write, 0, 0, 65536 + 512), &p),
            Err(RefusalReason::TooLarge)
        );
        assert_eq!(
            reason(hdr(Command::Read, 0, 1 << 20, 512), &p),
            Err(RefusalReason::OutOfRange)
        );
        assert_eq!(
            reason(hdr(Command::WriteZeroes, 0, 1 << 20, 512), &p),
            Err(RefusalReason::OutOfRange)
        );
        assert_eq!(
            reason(hdr(Command::Trim, 0, 100, 512), &p),
            Err(RefusalReason::Misaligned)
        );
        let ro = ExportParams {
            read_only: true,
            ..p.clone()
        };
        assert_eq!(
            reason(hdr(Command::Trim, 0, 0, 512), &ro),
            Err(RefusalReason::ReadOnly)
        );
        for h in [
            hdr(Command::Unknown(99), 0, 0, 0),
            hdr(Command::Read, CMD_FLAG_NO_HOLE, 0, 512),
            hdr(Command::BlockStatus, 0, 0, 0),
        ] {
            assert_eq!(reason(h, &p), Err(RefusalReason::Invalid));
        }
    }

    #[test]
    fn unaligned_tail_of_unaligned_export_is_allowed() {
        let p = ExportParams {
            size: 1000,
            ..params()
        };
        assert!(validate(&hdr(Command::Read, 0, 512, 488), &p).is_ok());
        assert!(validate(&hdr(Command::Read, 0, 0, 488), &p).is_err());
    }

    #[test]
    fn block_sizes_are_sanitized() {
        let s = |min, pref, max| {
            sanitize_block_sizes(BlockSizes {
                minimum_bytes: min,
                preferred_bytes: pref,
                maximum_bytes: max,
            })
        };
        assert_eq!(
            s(512, 4096, 1 << 20),
            BlockSizes {
                minimum_bytes: 512,
                preferred_bytes: 4096,
                maximum_bytes: 1 << 20
            }
        );
        assert_eq!(
            s(0, 0, 0),
            BlockSizes {
                minimum_bytes: 1,
                preferred_bytes: 512,
                maximum_bytes: 512
            }
        );
        assert_eq!(
            s(1000, 3000, u32::MAX),
            BlockSizes {
                minimum_bytes: 1024,
                preferred_bytes: 4096,
                maximum_bytes: 32 << 20
            }
        );
        assert_eq!(s(u32::MAX, u32::MAX, 5).minimum_bytes, 1 << 16);
    }

    #[test]
    fn random_headers_never_panic() {
        let mut rng = XorShift(42);
        for _ in 0..50_000 {
            let h = RequestHeader {
                flags: rng.next_u64() as u16,
                command: Command::from_u16(rng.below(10) as u16),
                cookie: rng.next_u64(),
                offset: if rng.below(2) == 0 {
                    rng.next_u64()
                } else {
                    rng.below(1 << 21)
                },
                length: rng.next_u64() as u32,
            };
            let sizes = sanitize_block_sizes(BlockSizes {
                minimum_bytes: rng.next_u64() as u32,
                preferred_bytes: rng.next_u64() as u32,
                maximum_bytes: rng.next_u64() as u32,
            });
            let p = ExportParams {
                size: rng.next_u64() >> rng.below(64),
                sizes,
                ..params()
            };
            if let Ok(Op::Read { offset, length }) = validate(&h, &p) {
                assert!(offset + u64::from(length) <= p.size);
                assert!(length <= sizes.maximum_bytes);
            }
        }
    }
}
