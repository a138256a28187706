//! Mode 6 (spec §6.2.6, since 1.10): one rANS table for the plane, and blocks of 16384 symbols
//! that each decode with 32 interleaved states over one shared stream of 16-bit words.

use super::cost::{self, Cost, Margin};
use super::RANS_BLOCKS;
use crate::rans::{self, BlockLayout, Table, BLOCK_SYMBOLS};

/// The minor version of format 1 that defines block records (mode 6, spec §6.2.6): a writer
/// writes them only into files that declare it.
pub const BLOCKS_SINCE_MINOR: u16 = 10;

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

/// Replaces the mode-2 record of `plane` that starts at `start` of `out` with a mode-6 one
/// where [`cost::chosen`] takes it by a delta's margin, returning the cost of the record left.
pub(super) fn replace_lanes_if_chosen(table: &Table, plane: &[u8], start: usize, out: &mut Vec<u8>) -> Cost {
    let mut record = Vec::with_capacity(out.len() - start);
    write(table, plane, &mut record);
    let lanes = (out.len() - start) as f64;
    if !cost::chosen(record.len() as f64, cost::BLOCKS, lanes, cost::LANES, Margin::DELTA) {
        return cost::LANES;
    }
    out.truncate(start);
    out.extend_from_slice(&record);
    cost::BLOCKS
}

/// Reads a mode-6 record after its mode byte, at `at`, for a plane of `n` symbols: its table
/// and its blocks.
pub(super) fn parse(stored: &[u8], at: usize, n: usize) -> Result<(Table, BlockLayout), String> {
    let (table, after) = Table::read(&stored[at..])?;
    let layout = BlockLayout::read(stored, stored.len() - after.len(), n)?;
    Ok((table, layout))
}
