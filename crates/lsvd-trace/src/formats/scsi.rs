//! SCSI command codes shared by the two CloudPhysics formats, which record
//! the raw CDB opcode instead of a read/write flag.

use crate::Op;

/// The data direction of a SCSI opcode, or `None` for commands that are
/// not plain data transfers (TEST UNIT READY, SYNCHRONIZE CACHE, UNMAP,
/// WRITE SAME, ...), which readers skip.
///
/// UNMAP (0x42) is not mapped to [`Op::Trim`]: its transfer length is the
/// parameter list, not the unmapped range, which vscsi does not record.
#[inline]
pub(crate) fn classify(opcode: u64) -> Option<Op> {
    match opcode {
        // READ(6), READ(10), READ(12), READ(16)
        0x08 | 0x28 | 0xa8 | 0x88 => Some(Op::Read),
        // WRITE(6), WRITE(10), WRITE(12), WRITE(16), and WRITE AND VERIFY
        0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0xae | 0x8e => Some(Op::Write),
        _ => None,
    }
}
