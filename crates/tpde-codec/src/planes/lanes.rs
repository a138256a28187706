//! Modes 1 and 2 (spec §6.2.2, §6.2.3): one rANS table for the whole plane, and a serial stream
//! (the serial tags) or independent lanes (the lane tags).

use std::ops::Range;

use super::{PlaneForm, RANS, RANS_LANES};
use crate::rans::{self, LaneLayout, Table};

impl Table {
    /// Appends a rANS plane record of `plane` in `form`: mode, this table, the stream or lanes.
    pub(super) fn write_record(&self, form: PlaneForm, plane: &[u8], out: &mut Vec<u8>) {
        match form {
            PlaneForm::Serial => {
                out.push(RANS);
                self.write(out);
                rans::encode(self, plane, out);
            }
            PlaneForm::Lanes | PlaneForm::Contexts | PlaneForm::BaseContexts => {
                out.push(RANS_LANES);
                self.write(out);
                rans::encode_lanes(self, plane, out);
            }
        }
    }
}

/// Reads a mode-1 record after its mode byte, at `at`: its table and the range of its stream
/// (from its `u32 len`).
pub(super) fn parse_serial(stored: &[u8], at: usize) -> Result<(Table, Range<usize>), String> {
    let (table, after) = Table::read(&stored[at..])?;
    let begin = stored.len() - after.len();
    let len = after.get(..4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as u64);
    let len = len.ok_or("rANS stream length is cut short")?;
    if len > after.len() as u64 - 4 {
        return Err(format!("rANS stream of {len} bytes runs past the chunk"));
    }
    Ok((table, begin..begin + 4 + len as usize))
}

/// Reads a mode-2 record after its mode byte, at `at`, for a plane of `n` symbols: its table
/// and its lanes.
pub(super) fn parse_lanes(stored: &[u8], at: usize, n: usize) -> Result<(Table, LaneLayout), String> {
    let (table, after) = Table::read(&stored[at..])?;
    let layout = LaneLayout::read(stored, stored.len() - after.len(), n)?;
    Ok((table, layout))
}
