//! Mode 0 (spec §6.2): a plane stored as it is, its n bytes after the mode byte.

use super::STORED;

/// Reads a stored record's bytes after its mode byte, at `at`, for a plane of `n` bytes:
/// where they start, and the offset after them.
pub(super) fn parse(stored: &[u8], at: usize, n: usize) -> Result<(usize, usize), String> {
    match stored.len().checked_sub(at) {
        Some(rest) if rest >= n => Ok((at, at + n)),
        _ => Err("cut short".into()),
    }
}

/// Appends a stored record of `plane`.
pub(super) fn write(plane: &[u8], out: &mut Vec<u8>) {
    out.push(STORED);
    out.extend_from_slice(plane);
}
