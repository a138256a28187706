//! Mode 6 (spec §6.2.6, since 1.10): one rANS table for the plane, and blocks of 16384 symbols
//! that each decode with 32 interleaved states over one shared stream of 16-bit words.

use super::RANS_BLOCKS;
use crate::rans::{self, BlockLayout, Table, BLOCK_SYMBOLS};

/// The minor version of format 1 that defines block records (mode 6, spec §6.2.6): a writer
/// writes them only into files that declare it.
pub const BLOCKS_SINCE_MINOR: u16 = 10;

/// In a keyframe of 4-byte elements that may hold block records, a context record (mode 3) is
/// written only where it is estimated under this share of the order-0 record's bytes (0.95
/// without blocks): an order-0 block decodes about three times as fast as a context lane, and
/// on real fp32 and mixed-precision fine-tunes this made keyframe chunks decode 1.7-1.8x as fast
/// for 0.29-0.37% more bytes than 1.9's (`examples/block_records`, docs/measurements.md). Not
/// for 2-byte elements: at 0.95 of the 0.98 they keep, bf16 keyframes grew by 1.25%.
pub(super) const WIDE_KEYFRAME_CONTEXT_GAIN: f64 = 0.93;

/// Appends a mode-6 record of `plane`: mode, `table`, the blocks.
pub(super) fn write(table: &Table, plane: &[u8], out: &mut Vec<u8>) {
    out.push(RANS_BLOCKS);
    table.write(out);
    rans::encode_blocks(table, plane, out);
}

/// Whether the writer codes a plane of `n` symbols in blocks rather than lanes: from one
/// whole block on. A shorter plane decodes in one partial block either way, and its index
/// would cost more than the lanes' (the block form's 132 bytes a block against 8 a lane).
pub(super) fn worth_it(n: usize) -> bool {
    n >= BLOCK_SYMBOLS
}

/// A delta's order-0 plane takes the block form (mode 6) where it is at most this share of the
/// lane form's (mode 2) bytes. Blocks decode about twice as fast as lanes, and a delta is what
/// a training run writes every step: at 1.0 (1.10's rule, no byte more) the lanes of a real
/// fine-tune's f32 Adam-moments delta were 12% of its unpack; at 1.01 the delta is 0.10% larger
/// and its own decode time 6-12% shorter (0.65-0.70 → 0.50-0.60 of its keyframe's, AVX-512;
/// `tools/bench/delta_decode.py`, docs/measurements.md); 1.02 gained nothing more.
const DELTA_BLOCK_MARGIN: f64 = 1.01;

/// Replaces the mode-2 record of `plane` that starts at `start` of `out` with a mode-6 one
/// where that is within [`DELTA_BLOCK_MARGIN`] of its bytes.
pub(super) fn replace_lanes_if_within_margin(table: &Table, plane: &[u8], start: usize, out: &mut Vec<u8>) {
    let mut record = Vec::with_capacity(out.len() - start);
    write(table, plane, &mut record);
    if record.len() as f64 <= (out.len() - start) as f64 * DELTA_BLOCK_MARGIN {
        out.truncate(start);
        out.extend_from_slice(&record);
    }
}

/// Reads a mode-6 record after its mode byte, at `at`, for a plane of `n` symbols: its table
/// and its blocks.
pub(super) fn parse(stored: &[u8], at: usize, n: usize) -> Result<(Table, BlockLayout), String> {
    let (table, after) = Table::read(&stored[at..])?;
    let layout = BlockLayout::read(stored, stored.len() - after.len(), n)?;
    Ok((table, layout))
}
