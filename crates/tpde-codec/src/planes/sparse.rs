//! Mode 5 (spec §6.2.5, since 1.8): a plane almost all one byte, as that fill byte, the
//! positions that differ from it and a mode 0 or 2 record of their bytes.

use std::ops::Range;

use tpde_format::CodecTag;

use super::cost::{self, Cost, Margin};
use super::estimate::coded_bytes;
use super::{lanes, PlaneForm, PlaneRecord, RANS_LANES, SPARSE, STORED};
use crate::positions::PositionCoder;
use crate::rans::{self, Table};

/// The minor version of format 1 that defines sparse plane records (mode 5, spec §6.2.5): a
/// writer writes them only into files that declare it.
pub const SPARSE_PLANES_SINCE_MINOR: u16 = 8;

/// How a sparse plane record codes its positions (spec §6.2.5): the byte after its count.
const SPARSE_CODERS: [PositionCoder; 2] = [PositionCoder::Rice, PositionCoder::Packed];

/// A sparse plane record (mode 5, spec §6.2.5).
#[derive(Clone, Debug)]
pub struct SparsePlane {
    /// The byte at every position not listed.
    pub fill: u8,
    /// Positions listed.
    pub count: usize,
    /// Their coder.
    pub coder: PositionCoder,
    /// The coded positions.
    pub positions: Range<usize>,
    /// The record of the bytes at those positions: [`PlaneRecord::Stored`] or
    /// [`PlaneRecord::Lanes`], of `count` symbols.
    pub values: Box<PlaneRecord>,
}

impl SparsePlane {
    /// The record's positions (into `positions`) and the bytes listed there (borrowed from
    /// `stored`, or decoded into `values`, a buffer of any length), checked: a listed byte equal
    /// to the fill byte is malformed, since a writer lists exactly the bytes that differ. For a
    /// plane of `n` bytes.
    pub fn listed<'a>(
        &self,
        stored: &'a [u8],
        n: usize,
        positions: &mut Vec<u32>,
        values: &'a mut Vec<u8>,
    ) -> Result<&'a [u8], String> {
        self.coder.decode(&stored[self.positions.clone()], self.count, n as u64, positions)?;
        let bytes: &[u8] = match &*self.values {
            PlaneRecord::Stored(at) => &stored[*at..*at + self.count],
            PlaneRecord::Lanes(table, layout) => {
                values.resize(self.count, 0);
                rans::decode_lanes(table, stored, layout, values)?;
                values
            }
            _ => unreachable!("parse admits stored and lane records only"),
        };
        if let Some((p, &v)) = positions.iter().zip(bytes).find(|(_, &v)| v == self.fill) {
            return Err(format!("position {p} is listed with the fill byte {v:#04x}"));
        }
        Ok(bytes)
    }

    /// Decodes the plane into `out` (n bytes): [`SparsePlane::listed`], then fill and scatter.
    pub fn decode(
        &self,
        stored: &[u8],
        positions: &mut Vec<u32>,
        values: &mut Vec<u8>,
        out: &mut [u8],
    ) -> Result<(), String> {
        let bytes = self.listed(stored, out.len(), positions, values)?;
        out.fill(self.fill);
        for (&p, &v) in positions.iter().zip(bytes) {
            out[p as usize] = v;
        }
        Ok(())
    }
}

thread_local! {
    /// This thread's buffers for a sparse plane's positions and listed bytes.
    static SPARSE_SCRATCH: std::cell::RefCell<(Vec<u32>, Vec<u8>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// [`SparsePlane::decode`] with this thread's buffers.
pub(super) fn decode(sparse: &SparsePlane, stored: &[u8], out: &mut [u8]) -> Result<(), String> {
    SPARSE_SCRATCH.with_borrow_mut(|(positions, values)| sparse.decode(stored, positions, values, out))
}

/// Replaces the record of `plane` written at `start` of `out`, costing `cost` to decode, by a
/// sparse record (spec §6.2.5) when at most [`SPARSE_SHARE`] of the plane differs from its
/// commonest byte and [`cost::chosen`] takes it by a delta's margin (a fill, a few positions
/// and their bytes decode faster than any rANS record of the plane).
pub(super) fn write_sparse_if_chosen(plane: &[u8], hist: &[u64; 256], start: usize, cost: Cost, out: &mut Vec<u8>) {
    let n = plane.len();
    let fill = (0..256).max_by_key(|&b| hist[b]).expect("256 symbols") as u8;
    let listed = (n as u64 - hist[usize::from(fill)]) as f64;
    if listed > n as f64 * SPARSE_SHARE {
        return;
    }
    SPARSE_SCRATCH.with_borrow_mut(|(positions, values)| {
        positions.clear();
        positions.extend((0..n as u32).filter(|&i| plane[i as usize] != fill));
        values.clear();
        values.extend(positions.iter().map(|&p| plane[p as usize]));
        let mut record = vec![SPARSE, fill];
        record.extend((positions.len() as u32).to_le_bytes());
        // The smaller coder: Golomb-Rice, or the packed blocks a GPU decodes in parallel.
        let (k, coder) = SPARSE_CODERS
            .into_iter()
            .enumerate()
            .min_by_key(|(_, c)| c.cost_bits(positions).div_ceil(8))
            .expect("two coders");
        record.push(k as u8);
        let len_at = record.len();
        record.extend([0; 4]);
        coder.encode(positions, &mut record);
        let len = (record.len() - len_at - 4) as u32;
        record[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
        let vhist = rans::histogram(values);
        let vtable = Table::from_histogram(&vhist);
        if !values.is_empty()
            && coded_bytes(&vtable, &vhist, values.len(), PlaneForm::Lanes) < values.len() as f64 * 0.98
        {
            vtable.write_record(PlaneForm::Lanes, values, &mut record);
        } else {
            super::stored::write(values, &mut record);
        }
        let sparse = Cost::sparse(listed / n as f64);
        if cost::chosen(record.len() as f64, sparse, (out.len() - start) as f64, cost, Margin::DELTA) {
            out.truncate(start);
            out.extend_from_slice(&record);
        }
    });
}

/// The most of a plane a sparse record lists: beyond it, decoding its positions one by one
/// costs about what decoding every symbol of a lane record does (measured on this project's
/// CPUs: `examples/plane_records`).
const SPARSE_SHARE: f64 = 1.0 / 32.0;

/// Reads a sparse plane record's fields after its mode byte, at `at`, for a plane of `n`
/// bytes; returns it and the offset after it.
pub(super) fn parse(codec: CodecTag, stored: &[u8], at: usize, n: usize) -> Result<(SparsePlane, usize), String> {
    let head = stored.get(at..at + 10).ok_or("the sparse record's header is cut short")?;
    let fill = head[0];
    let count = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
    let coder =
        *SPARSE_CODERS.get(usize::from(head[5])).ok_or_else(|| format!("position coder {} is not 0 or 1", head[5]))?;
    let len = u32::from_le_bytes(head[6..10].try_into().expect("4 bytes")) as usize;
    if count > n {
        return Err(format!("{count} positions listed in a plane of {n}"));
    }
    let start = at + 10;
    if len > stored.len() - start {
        return Err(format!("{len} bytes of positions run past the chunk"));
    }
    let positions = start..start + len;
    let mode = *stored.get(positions.end).ok_or("the record of the listed bytes is missing")?;
    let rest = positions.end + 1;
    let (values, end) = match mode {
        STORED => {
            let (start, end) =
                super::stored::parse(stored, rest, count).map_err(|_| "the listed bytes are cut short")?;
            (PlaneRecord::Stored(start), end)
        }
        RANS_LANES => {
            let (table, layout) = lanes::parse_lanes(stored, rest, count)?;
            let end = layout.bytes.end;
            (PlaneRecord::Lanes(table, layout), end)
        }
        m => return Err(format!("the listed bytes have mode {m}, not 0 or 2 ({codec})")),
    };
    Ok((SparsePlane { fill, count, coder, positions, values: Box::new(values) }, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Positions that run past the chunk, and positions that fill it with no values record after
    /// them, are each named for what they are (a corpus file sees only the category, which is
    /// the same: cargo-mutants, conformance/mutants.md).
    #[test]
    fn positions_past_the_chunk_are_named() {
        let record = |positions_len: u32| {
            let mut r = vec![0u8, 1, 0, 0, 0, 1]; // fill 0, one position, packed
            r.extend(positions_len.to_le_bytes());
            r.extend([0; 4]);
            parse(CodecTag::DeltaXorContext, &r, 0, 16).unwrap_err()
        };
        assert!(record(5).contains("5 bytes of positions run past the chunk"), "{}", record(5));
        assert!(record(4).contains("the record of the listed bytes is missing"), "{}", record(4));
    }
}
