//! Byte planes (spec §6.2): the value path every float-aware codec shares.
//!
//! Elements of `w` bytes are split into `w` planes, plane `j` holding byte `j` (little-endian)
//! of every element. Float bit patterns are first rotated left by one bit, which puts the
//! sign in bit 0 and the exponent in the top bits: the top plane of an f32 or bf16 is then
//! exactly the exponent, a low-entropy byte, and the low planes are near-random mantissa. Each
//! plane is stored as it is or rANS-coded with its own table, whichever is smaller.
//!
//! ```text
//! plane   u8 mode: 0 stored (n bytes follow) | 1 rANS (table, stream) | 2 rANS lanes (table,
//!         lanes) | 3 rANS lanes with contexts (map, tables, lanes) | 4 rANS lanes with base
//!         contexts (map, tables, lanes); see rans.rs | 5 sparse (a fill byte, the positions
//!         that differ from it, a mode 0 or 2 record of their bytes; since 1.8). The serial tags
//!         use modes 0 and 1, the lane tags 0 and 2, `planes-context` 0, 2 and 3,
//!         `delta-xor-context` and `delta-sub-context` 0, 2, 4 and 5, `delta-predicted` 0, 2
//!         and 4.
//! ```

use std::ops::Range;

use tpde_format::{CodecTag, DType};

use crate::positions::PositionCoder;
use crate::rans::{self, context, Contexts, LaneLayout, Table};
#[cfg(test)]
use crate::shuffle::split;
pub(crate) use crate::shuffle::with_word;
use crate::shuffle::{map_bytes, merge, split_into};
pub use crate::shuffle::{rotate, rotated_into, rotates};
use crate::CodecError;

const STORED: u8 = 0;
const RANS: u8 = 1;
const RANS_LANES: u8 = 2;
const RANS_CONTEXTS: u8 = 3;
const RANS_BASE_CONTEXTS: u8 = 4;
const SPARSE: u8 = 5;

/// The minor version of format 1 that defines sparse plane records (mode 5, spec §6.2.5): a
/// writer writes them only into files that declare it.
pub const SPARSE_PLANES_SINCE_MINOR: u16 = 8;

/// How a sparse plane record codes its positions (spec §6.2.5): the byte after its count.
const SPARSE_CODERS: [PositionCoder; 2] = [PositionCoder::Rice, PositionCoder::Packed];

/// How a codec's rANS planes are laid out: one serial stream (spec §6.2.2) or independent lanes
/// (§6.2.3) that a GPU decodes in parallel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlaneForm {
    /// Mode 1 records: four interleaved states over one byte stream.
    Serial,
    /// Mode 2 records: lanes with their own state and bytes.
    Lanes,
    /// Mode 2 or 3 records: lanes, with one table or with tables chosen by each lane's symbol
    /// before (spec §6.2.4). Only the keyframe tag `planes-context` has this form.
    Contexts,
    /// Mode 2 or 4 records: lanes, with one table or with tables chosen by each element's base
    /// (spec §6.4.1). Only the dense delta tags `delta-xor-context` and `delta-sub-context`.
    BaseContexts,
}

impl PlaneForm {
    /// The form a codec tag's plane records take.
    pub fn of(tag: CodecTag) -> PlaneForm {
        if tag == CodecTag::PlanesContext {
            PlaneForm::Contexts
        } else if matches!(tag, CodecTag::DeltaXorContext | CodecTag::DeltaSubContext | CodecTag::DeltaPredicted) {
            PlaneForm::BaseContexts
        } else if tag.lanes() {
            PlaneForm::Lanes
        } else {
            PlaneForm::Serial
        }
    }

    /// The form of the keyframes that go with deltas in this form: lane-form keyframes may use
    /// contexts.
    pub fn keyframe(self) -> PlaneForm {
        match self {
            PlaneForm::Serial => PlaneForm::Serial,
            PlaneForm::Lanes | PlaneForm::Contexts | PlaneForm::BaseContexts => PlaneForm::Contexts,
        }
    }

    /// The form of the dense deltas that go with keyframes in this form: lane-form deltas may
    /// use base contexts.
    pub fn dense(self) -> PlaneForm {
        match self {
            PlaneForm::Serial => PlaneForm::Serial,
            PlaneForm::Lanes | PlaneForm::Contexts | PlaneForm::BaseContexts => PlaneForm::BaseContexts,
        }
    }
}

/// One plane record, found by [`parse`]: offsets are into the chunk's stored bytes.
#[derive(Clone, Debug)]
pub enum PlaneRecord {
    /// Mode 0: the plane's n bytes start here.
    Stored(usize),
    /// Mode 1: a table and a serial rANS stream (from its `u32 len`).
    Serial(Table, Range<usize>),
    /// Mode 2: a table and rANS lanes.
    Lanes(Table, LaneLayout),
    /// Mode 3: a context map, its tables and rANS lanes.
    Contexts(Contexts, LaneLayout),
    /// Mode 4: a base-context map, its tables and rANS lanes.
    BaseContexts(Contexts, LaneLayout),
    /// Mode 5: a fill byte, the positions where the plane differs from it and a mode 0 or 2
    /// record of the bytes there.
    Sparse(SparsePlane),
}

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
    /// This thread's buffer for a chunk's planes, split to encode or decoded to merge, reused
    /// from chunk to chunk: a buffer allocated per chunk faults in and zeroes fresh pages.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Chunks of at least this many elements are estimated from a sample (see
/// [`sampled_histograms`]).
const SAMPLE_FROM: usize = 1 << 16;
/// The sample: one block of this many elements in every [`SAMPLE_STRIDE`].
const SAMPLE_BLOCK: usize = 1024;
const SAMPLE_STRIDE: usize = 8;

/// The plane histograms of `n` elements of `w` bytes, for choosing a form: `elements(range)`
/// gives the (transformed) elements of a byte range. Counted from every eighth block of 1024
/// elements when there are at least 65 536, which ranks the forms as the full count does on
/// checkpoint data at an eighth of the cost, and then scaled to `n`, so that the tables' cost
/// weighs as it will; from all of them below.
pub fn sampled_histograms<E: AsRef<[u8]>>(n: usize, w: usize, elements: impl Fn(Range<usize>) -> E) -> Vec<[u64; 256]> {
    if n < SAMPLE_FROM {
        return histograms(elements(0..n * w).as_ref(), w);
    }
    let mut counts = [[0u32; 256]; rans::GROUP];
    let mut sampled = 0u64;
    for start in (0..n).step_by(SAMPLE_BLOCK * SAMPLE_STRIDE) {
        let end = (start + SAMPLE_BLOCK).min(n);
        rans::count(elements(start * w..end * w).as_ref(), &mut counts);
        sampled += (end - start) as u64;
    }
    let scale = n as f64 / sampled as f64;
    fold(&counts, w).iter().map(|h| h.map(|c| (c as f64 * scale).round() as u64)).collect()
}

/// The histogram of every plane of elements of `w` bytes, counted in place.
pub fn histograms(elements: &[u8], w: usize) -> Vec<[u64; 256]> {
    let mut counts = [[0u32; 256]; rans::GROUP];
    rans::count(elements, &mut counts);
    fold(&counts, w)
}

/// Each plane's histogram from [`rans::count`]'s tables: table k counts plane k mod w.
fn fold(counts: &[[u32; 256]; rans::GROUP], w: usize) -> Vec<[u64; 256]> {
    (0..w).map(|j| std::array::from_fn(|s| counts[j..].iter().step_by(w).map(|t| u64::from(t[s])).sum())).collect()
}

/// Estimated stored bytes of planes with these histograms (entropy plus tables).
pub fn estimate(hists: &[[u64; 256]]) -> f64 {
    hists
        .iter()
        .map(|h| {
            let n: u64 = h.iter().sum();
            if n == 0 {
                return 1.0;
            }
            let bits: f64 = h
                .iter()
                .filter(|&&c| c > 0)
                .map(|&c| {
                    let p = c as f64 / n as f64;
                    -(c as f64) * p.log2()
                })
                .sum();
            let rans = bits / 8.0 + 32.0 + 2.0 * h.iter().filter(|&&c| c > 0).count() as f64 + 20.0;
            1.0 + rans.min(n as f64)
        })
        .sum()
}

impl Table {
    /// Appends a rANS plane record of `plane` in `form`: mode, this table, the stream or lanes.
    fn write_record(&self, form: PlaneForm, plane: &[u8], out: &mut Vec<u8>) {
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

/// For a plane about to be coded with one table, at `order0` estimated bytes: writes it as a
/// context record if that is estimated under `gain` of it (16 tables decode more slowly than
/// one, so a smaller gain is not worth it), returning whether it did. Chosen from a sample of
/// the pairs, as the forms are.
fn write_contexts(plane: &[u8], order0: f64, gain: f64, out: &mut Vec<u8>) -> bool {
    let n = plane.len();
    let lanes = rans::lane_count(n);
    let sampled = n >= SAMPLE_FROM;
    let pairs = context::pair_counts(plane, lanes, sampled);
    let Some(map) = worth(&pairs, n, order0 * gain) else {
        return false;
    };
    out.push(RANS_CONTEXTS);
    Contexts::encode_neighbours(map, (!sampled).then_some(&*pairs), plane, out);
    true
}

/// [`write_contexts`] for a base-context record (spec §6.4.1), with the plane's base contexts
/// in place of the symbols before. `indexed`: the map whose table indices INDICES holds for
/// these contexts, if any (a chunk's planes share their contexts, so the maps grouping them by
/// how often each occurs are alike, and the indices are computed once).
fn write_base_contexts(
    plane: &[u8],
    contexts: &[u8],
    order0: f64,
    indexed: &mut Option<[u8; 256]>,
    out: &mut Vec<u8>,
) -> bool {
    let n = plane.len();
    let sampled = n >= SAMPLE_FROM;
    let pairs = context::given_pair_counts(plane, contexts, sampled);
    let Some(map) = worth(&pairs, n, order0 * BASE_CONTEXT_GAIN) else {
        return false;
    };
    INDICES.with_borrow_mut(|tables| {
        if *indexed != Some(map) {
            tables.clear();
            tables.extend_from_slice(contexts);
            map_bytes(&map, tables);
            *indexed = Some(map);
        }
        let model = if sampled { Contexts::count_tables(map, plane, tables) } else { Contexts::new(map, &pairs) };
        out.push(RANS_BASE_CONTEXTS);
        model.encode_given(plane, tables, out);
    });
    true
}

/// A base-context record is written where it is estimated under this share of the order-0
/// record's bytes.
const BASE_CONTEXT_GAIN: f64 = 0.95;

/// A neighbour-context record in a keyframe of 4- or 8-byte elements is written where it is
/// estimated under this share of the order-0 record's bytes. A context symbol decodes in about
/// 1.8 ns on a Zen 3 core, an order-0 one in 1.1: at 0.98, the top planes of f32 Adam moments
/// took 81 ms of a 121 ms keyframe decode; at 0.95, 63 ms, for 0.27% more bytes at most (issue
/// 38: a keyframe may grow by 0.3% for speed; `examples/keyframe_planes`).
const WIDE_KEYFRAME_CONTEXT_GAIN: f64 = 0.95;

/// The same everywhere else: in a delta file's keyframe chunks (delta files must not grow) and
/// in keyframes of 1- and 2-byte elements. A 2-byte element's top plane is about twice the
/// share of its chunk a 4-byte one's is, so the same plane saving grows the file twice as much:
/// at 0.95, bf16 Adam moments' keyframes grew by 0.45-0.9%.
const CONTEXT_GAIN: f64 = 0.98;

/// The map grouping these pair counts (of a plane of `n` symbols, or a sample of it) when its
/// record is estimated under `limit` bytes.
fn worth(pairs: &context::Pairs, n: usize, limit: f64) -> Option<[u8; 256]> {
    let map = Contexts::group(pairs)?;
    let counted: u64 = pairs.iter().flatten().copied().map(u64::from).sum();
    let bytes = Contexts::estimate(&map, pairs, n as f64 / counted.max(1) as f64) + 8.0 * rans::lane_count(n) as f64;
    (bytes < limit).then_some(map)
}

/// The base context of every element of `base` (spec §6.4.1): the top byte of its `planes`
/// transform, for bf16 and f32 exactly the exponent. Into `out`, a buffer of any length and
/// content.
pub fn base_contexts(dtype: DType, base: &[u8], out: &mut Vec<u8>) {
    let w = dtype.size() as usize;
    out.resize(base.len() / w, 0);
    // The top byte of rotl1(x) is bits 8w−9 … 8w−2 of x (for one byte, its low bits then its
    // top bit). Indexed stores into a sized buffer, which the compiler vectorises (extending
    // the buffer through an iterator measured slow).
    let float = rotates(dtype);
    with_word!(w, T => {
        let shift = (T::BITS - 8).saturating_sub(u32::from(float && w > 1));
        for (o, b) in out.iter_mut().zip(base.chunks_exact(w)) {
            let x = T::from_le_bytes(b.try_into().expect("w bytes"));
            let x = if float && w == 1 { x.rotate_left(1) } else { x >> shift };
            *o = x.to_le_bytes()[0];
        }
    });
}

/// The table index `map` gives every element of `base` by its base context: the decoder's one
/// pass over the base per chunk. The contexts first (a loop the compiler vectorises), then the
/// map over them, vectorised by hand ([`map_bytes`]): with the map looked up in the
/// same scalar loop, this pass was 8% of a one-core bf16 delta decode.
fn base_tables(dtype: DType, base: &[u8], map: &[u8; 256], out: &mut Vec<u8>) {
    base_contexts(dtype, base, out);
    map_bytes(map, out);
}

/// A dense delta's base elements, whose base contexts (spec §6.4.1) choose the tables of its
/// mode-4 plane records.
#[derive(Clone, Copy, Debug)]
pub struct BaseElements<'a> {
    /// The tensor's dtype.
    pub dtype: DType,
    /// The chunk's elements in the base, as many as the chunk decodes.
    pub elements: &'a [u8],
}

/// Appends the planes of `elements` (already transformed), `w` bytes each, in `form`: each
/// plane rANS-coded with a table of its own, or stored when rANS would shrink it by under 2%
/// (not worth its decode time).
pub fn encode(elements: &[u8], w: usize, form: PlaneForm, out: &mut Vec<u8>) {
    encode_with(elements, w, form, None, false, CONTEXT_GAIN, out);
}

/// [`encode`] for a keyframe file's chunk: neighbour contexts only where they save more, since
/// a keyframe is what a resume reads.
pub fn encode_keyframe(elements: &[u8], w: usize, form: PlaneForm, out: &mut Vec<u8>) {
    let gain = if w >= 4 { WIDE_KEYFRAME_CONTEXT_GAIN } else { CONTEXT_GAIN };
    encode_with(elements, w, form, None, false, gain, out);
}

/// [`encode`] in [`PlaneForm::BaseContexts`], the elements' base contexts given; with
/// `sparse`, a plane almost all one byte may take a sparse record (spec §6.2.5, format 1.8).
pub fn encode_against_base(elements: &[u8], w: usize, contexts: &[u8], sparse: bool, out: &mut Vec<u8>) {
    encode_with(elements, w, PlaneForm::BaseContexts, Some(contexts), sparse, CONTEXT_GAIN, out);
}

fn encode_with(
    elements: &[u8],
    w: usize,
    form: PlaneForm,
    contexts: Option<&[u8]>,
    sparse: bool,
    gain: f64,
    out: &mut Vec<u8>,
) {
    let n = elements.len() / w;
    // A plane that a sample shows to be near-random (the low mantissa bytes) is stored without
    // being counted in full: the full count of every plane was a tenth of a delta pack.
    let sampled = (n >= SAMPLE_FROM).then(|| sampled_histograms(n, w, |r| &elements[r]));
    SCRATCH.with_borrow_mut(|planes| {
        split_into(elements, w, planes);
        encode_planes(planes, n, w, sampled.as_deref(), form, contexts, sparse, gain, out)
    })
}

#[allow(clippy::too_many_arguments)]
fn encode_planes(
    planes: &[u8],
    n: usize,
    w: usize,
    sampled: Option<&[[u64; 256]]>,
    form: PlaneForm,
    contexts: Option<&[u8]>,
    sparse: bool,
    gain: f64,
    out: &mut Vec<u8>,
) {
    // The map whose table indices INDICES holds for this chunk's contexts, if any.
    let mut indexed = None;
    for (j, plane) in planes.chunks_exact(n.max(1)).enumerate() {
        let near_random = sampled
            .is_some_and(|s| coded_bytes(&Table::from_histogram(&s[j]), &s[j], n, form) >= n as f64 * NEAR_RANDOM);
        if n > 0 && !near_random {
            let hist = rans::histogram(plane);
            let table = Table::from_histogram(&hist);
            let order0 = coded_bytes(&table, &hist, n, form);
            if order0 < n as f64 * 0.98 {
                let start = out.len();
                let written = match (form, contexts) {
                    (PlaneForm::Contexts, _) => write_contexts(plane, order0, gain, out),
                    (PlaneForm::BaseContexts, Some(c)) => write_base_contexts(plane, c, order0, &mut indexed, out),
                    _ => false,
                };
                if !written {
                    table.write_record(form, plane, out);
                }
                if sparse {
                    write_sparse_if_smaller(plane, &hist, start, out);
                }
                continue;
            }
        }
        out.push(STORED);
        out.extend_from_slice(plane);
    }
    if n == 0 {
        out.resize(out.len() + w, STORED);
    }
}

/// Replaces the record of `plane` written at `start` of `out` by a sparse record (spec §6.2.5)
/// when at most [`SPARSE_SHARE`] of the plane differs from its commonest byte and the sparse
/// record is smaller: it then decodes faster too (a fill, a few positions, their bytes).
fn write_sparse_if_smaller(plane: &[u8], hist: &[u64; 256], start: usize, out: &mut Vec<u8>) {
    let n = plane.len();
    let fill = (0..256).max_by_key(|&b| hist[b]).expect("256 symbols") as u8;
    if (n as u64 - hist[usize::from(fill)]) as f64 > n as f64 * SPARSE_SHARE {
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
            record.push(STORED);
            record.extend_from_slice(values);
        }
        if record.len() < out.len() - start {
            out.truncate(start);
            out.extend_from_slice(&record);
        }
    });
}

/// The most of a plane a sparse record lists: beyond it, decoding its positions one by one
/// costs about what decoding every symbol of a lane record does (measured on this project's
/// CPUs: `examples/plane_records`).
const SPARSE_SHARE: f64 = 1.0 / 32.0;

/// A sampled plane estimated at this share of its length or more is stored without a full
/// count: well above the 0.98 at which a counted plane is, so that sampling decides only what
/// a full count would have.
const NEAR_RANDOM: f64 = 0.995;

/// The bytes of a rANS record of `n` symbols with histogram `hist` in `form`, coded with `table`.
fn coded_bytes(table: &Table, hist: &[u64; 256], n: usize, form: PlaneForm) -> f64 {
    let lanes = match form {
        PlaneForm::Serial => 0.0,
        _ => 8.0 * rans::lane_count(n) as f64,
    };
    table.encoded_len() as f64 + table.cost_bytes(hist) + lanes
}

/// Reads the `w` plane records of `n` elements at offset `at` of a `codec` chunk's `stored`
/// bytes, checking their structure (modes, tables, lengths) but decoding no symbol. Returns
/// them and the offset after the last.
pub fn parse(
    codec: CodecTag,
    stored: &[u8],
    at: usize,
    w: usize,
    n: usize,
) -> Result<(Vec<PlaneRecord>, usize), CodecError> {
    let corrupt = rans::corrupt(codec);
    let form = PlaneForm::of(codec);
    let mut at = at;
    let mut records = Vec::with_capacity(w);
    for j in 0..w {
        let mode = *stored.get(at).ok_or_else(|| corrupt(format!("plane {j} is missing")))?;
        at += 1;
        let rest = &stored[at..];
        let record = match (mode, form) {
            (STORED, _) => {
                if rest.len() < n {
                    return Err(corrupt(format!("stored plane {j} is cut short")));
                }
                at += n;
                PlaneRecord::Stored(at - n)
            }
            (RANS, PlaneForm::Serial) => {
                let (table, after) = Table::read(rest).map_err(&corrupt)?;
                let begin = stored.len() - after.len();
                let len = after.get(..4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as u64);
                let len = len.ok_or_else(|| corrupt("rANS stream length is cut short".into()))?;
                if len > after.len() as u64 - 4 {
                    return Err(corrupt(format!("rANS stream of {len} bytes runs past the chunk")));
                }
                at = begin + 4 + len as usize;
                PlaneRecord::Serial(table, begin..at)
            }
            (RANS_LANES, PlaneForm::Lanes | PlaneForm::Contexts | PlaneForm::BaseContexts) => {
                let (table, after) = Table::read(rest).map_err(&corrupt)?;
                let layout = LaneLayout::read(stored, stored.len() - after.len(), n).map_err(&corrupt)?;
                at = layout.bytes.end;
                PlaneRecord::Lanes(table, layout)
            }
            (RANS_CONTEXTS, PlaneForm::Contexts) => {
                let (model, after) = Contexts::read(rest).map_err(&corrupt)?;
                let layout = LaneLayout::read(stored, stored.len() - after.len(), n).map_err(&corrupt)?;
                at = layout.bytes.end;
                PlaneRecord::Contexts(model, layout)
            }
            (RANS_BASE_CONTEXTS, PlaneForm::BaseContexts) => {
                let (model, after) = Contexts::read(rest).map_err(&corrupt)?;
                let layout = LaneLayout::read(stored, stored.len() - after.len(), n).map_err(&corrupt)?;
                at = layout.bytes.end;
                PlaneRecord::BaseContexts(model, layout)
            }
            (SPARSE, PlaneForm::BaseContexts) if codec != CodecTag::DeltaPredicted => {
                let (sparse, end) =
                    parse_sparse(codec, stored, at, n).map_err(|e| corrupt(format!("plane {j}: {e}")))?;
                at = end;
                PlaneRecord::Sparse(sparse)
            }
            (m, _) => return Err(corrupt(format!("plane {j} has mode {m}, not one of {codec}'s"))),
        };
        records.push(record);
    }
    Ok((records, at))
}

/// Reads a sparse plane record's fields after its mode byte, at `at`, for a plane of `n`
/// bytes; returns it and the offset after it.
fn parse_sparse(codec: CodecTag, stored: &[u8], at: usize, n: usize) -> Result<(SparsePlane, usize), String> {
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
        STORED if stored.len() - rest >= count => (PlaneRecord::Stored(rest), rest + count),
        STORED => return Err("the listed bytes are cut short".into()),
        RANS_LANES => {
            let (table, after) = Table::read(&stored[rest..])?;
            let layout = LaneLayout::read(stored, stored.len() - after.len(), count)?;
            let end = layout.bytes.end;
            (PlaneRecord::Lanes(table, layout), end)
        }
        m => return Err(format!("the listed bytes have mode {m}, not 0 or 2 ({codec})")),
    };
    Ok((SparsePlane { fill, count, coder, positions, values: Box::new(values) }, end))
}

/// Decodes `w` planes at offset `at` of `stored` into `out` (the elements, still transformed,
/// except that with `unrotate` each is rotated back right by one bit), returning the offset
/// after them.
/// `base`: the base of a chunk in [`PlaneForm::BaseContexts`].
pub fn decode(
    codec: CodecTag,
    stored: &[u8],
    at: usize,
    w: usize,
    unrotate: bool,
    base: Option<BaseElements<'_>>,
    out: &mut [u8],
) -> Result<usize, CodecError> {
    let n = out.len() / w;
    let (records, end) = parse(codec, stored, at, w, n)?;
    if n == 0 {
        return Ok(end);
    }
    // Stored planes merge straight from the chunk; only coded ones are decoded, into this
    // thread's scratch buffer, which every decode overwrites whole.
    SCRATCH.with_borrow_mut(|scratch| decode_with(codec, stored, &records, n, unrotate, base, scratch, out))?;
    Ok(end)
}

thread_local! {
    /// This thread's buffer for the table index of every element of a chunk with base-context
    /// records.
    static INDICES: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// This thread's buffers for a sparse plane's positions and listed bytes.
    static SPARSE_SCRATCH: std::cell::RefCell<(Vec<u32>, Vec<u8>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

#[allow(clippy::too_many_arguments)]
fn decode_with(
    codec: CodecTag,
    stored: &[u8],
    records: &[PlaneRecord],
    n: usize,
    unrotate: bool,
    base: Option<BaseElements<'_>>,
    scratch: &mut Vec<u8>,
    out: &mut [u8],
) -> Result<(), CodecError> {
    let corrupt = rans::corrupt(codec);
    // The map the table indices in INDICES were computed with, for this chunk: the planes of
    // one chunk share their contexts, so the writer gives them the same map, and the indices
    // are computed once.
    let mut indexed: Option<&[u8; 256]> = None;
    let coded = records.iter().filter(|r| !matches!(r, PlaneRecord::Stored(_))).count();
    if scratch.len() < n * coded {
        scratch.resize(n * coded, 0);
    }
    let decoded = &mut scratch[..n * coded];
    let mut free = decoded.chunks_exact_mut(n);
    for record in records {
        match record {
            PlaneRecord::Stored(_) => {}
            PlaneRecord::Serial(table, stream) => {
                let plane = free.next().expect("a buffer per coded plane");
                rans::decode(table, &stored[stream.clone()], plane).map_err(&corrupt)?;
            }
            PlaneRecord::Lanes(table, layout) => {
                let plane = free.next().expect("a buffer per coded plane");
                rans::decode_lanes(table, stored, layout, plane).map_err(&corrupt)?;
            }
            PlaneRecord::Contexts(model, layout) => {
                let plane = free.next().expect("a buffer per coded plane");
                model.decode_lanes(stored, layout, plane).map_err(&corrupt)?;
            }
            PlaneRecord::Sparse(sparse) => {
                let plane = free.next().expect("a buffer per coded plane");
                SPARSE_SCRATCH
                    .with_borrow_mut(|(positions, values)| sparse.decode(stored, positions, values, plane))
                    .map_err(&corrupt)?;
            }
            PlaneRecord::BaseContexts(model, layout) => {
                let plane = free.next().expect("a buffer per coded plane");
                let base = base.ok_or_else(|| corrupt("a base-context record without a base".into()))?;
                INDICES
                    .with_borrow_mut(|tables| {
                        if indexed != Some(model.map()) {
                            base_tables(base.dtype, base.elements, model.map(), tables);
                            indexed = Some(model.map());
                        }
                        model.decode_given(stored, layout, tables, plane)
                    })
                    .map_err(&corrupt)?;
            }
        }
    }
    let mut decoded = decoded.chunks_exact(n);
    let planes: Vec<&[u8]> = records
        .iter()
        .map(|r| match r {
            PlaneRecord::Stored(at) => &stored[*at..*at + n],
            _ => decoded.next().expect("one decoded plane per coded record"),
        })
        .collect();
    merge(&planes, out, unrotate);
    Ok(())
}

/// The spec's bound for `planes`: `decoded_length ≤ 32768 × stored_length`. It holds for every
/// valid encoding because no rANS symbol is free: each costs at least log2(4096/4095) bits, one
/// byte per 22 713 symbols (spec §6.2.2).
pub const MAX_EXPANSION: u64 = 32768;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plane_histograms_count_each_plane() {
        let bytes: Vec<u8> = (0..1000u32).map(|i| (i * i % 251) as u8 ^ (i % 3) as u8).collect();
        for w in [1, 2, 4, 8] {
            for len in [0, w, 15 * w, 16 * w, 17 * w, bytes.len() / w * w] {
                let elements = &bytes[..len];
                let mut expected = vec![[0u64; 256]; w];
                for (i, &b) in elements.iter().enumerate() {
                    expected[i % w][usize::from(b)] += 1;
                }
                assert_eq!(histograms(elements, w), expected, "w {w} len {len}");
            }
        }
    }

    /// A keyframe file's top plane of 4-byte elements takes neighbour contexts only where they
    /// save more than in a delta file's keyframe chunk: on planes whose symbols lean on the one
    /// before by degrees, some take contexts in a delta and order 0 in a keyframe, none the
    /// other way round; 2-byte elements choose alike in both.
    #[test]
    fn keyframes_take_contexts_only_for_a_larger_gain() {
        let (mut split, mut wrong) = (0, 0);
        for lean in (20..80u32).step_by(2) {
            let mut x = 0x2545_F491u32 ^ lean;
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x
            };
            // The symbol before again with probability lean/200, else a skewed draw.
            let mut plane = vec![0u8; 1 << 18];
            for i in 1..plane.len() {
                let r = next();
                plane[i] = if r % 200 < lean { plane[i - 1] } else { (r >> 8).trailing_zeros().min(12) as u8 };
            }
            // As the top plane of 4-byte elements whose other planes are stored.
            let elements: Vec<u8> = plane
                .iter()
                .enumerate()
                .flat_map(|(i, &p)| [(i * 7) as u8, (i * 13) as u8, (i * 31) as u8, p])
                .collect();
            let top = |out: &[u8], w: usize| {
                // w − 1 stored planes (a mode byte and the plane each) come first.
                assert!(out.iter().step_by(plane.len() + 1).take(w - 1).all(|&m| m == STORED));
                out[(w - 1) * (plane.len() + 1)]
            };
            let mode = |keyframe: bool, elements: &[u8], w: usize| {
                let mut out = Vec::new();
                if keyframe {
                    encode_keyframe(elements, w, PlaneForm::Contexts, &mut out);
                } else {
                    encode(elements, w, PlaneForm::Contexts, &mut out);
                }
                top(&out, w)
            };
            // 2-byte elements keep the delta's gain: their top plane is a larger share.
            let halves: Vec<u8> = plane.iter().enumerate().flat_map(|(i, &p)| [(i * 7) as u8, p]).collect();
            assert_eq!(mode(false, &halves, 2), mode(true, &halves, 2), "lean {lean}, 2-byte elements");
            match (mode(false, &elements, 4), mode(true, &elements, 4)) {
                (RANS_CONTEXTS, RANS_LANES) => split += 1,
                (RANS_LANES, RANS_CONTEXTS) => wrong += 1,
                _ => {}
            }
        }
        assert!(split > 0, "no plane between the two gains");
        assert_eq!(wrong, 0);
    }

    #[test]
    fn split_and_merge_are_byte_planes_at_every_width_and_length() {
        for w in [1, 2, 4, 8] {
            for n in (0..80).chain([1021, 4096 + 3]) {
                let mut x = 0x9E37_79B9u32 ^ (n * w) as u32;
                let elements: Vec<u8> = (0..n * w)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        (x >> 24) as u8
                    })
                    .collect();
                let planes = split(&elements, w);
                for i in 0..n {
                    for j in 0..w {
                        assert_eq!(planes[j * n + i], elements[w * i + j], "w {w}, n {n}, element {i}, byte {j}");
                    }
                }
                let mut back = vec![0u8; n * w];
                let parts: Vec<&[u8]> = (0..w).map(|j| &planes[j * n..(j + 1) * n]).collect();
                merge(&parts, &mut back, false);
                assert_eq!(back, elements, "w {w}, n {n}");
                merge(&parts, &mut back, true);
                let mut again = Vec::new();
                rotated_into(&back, w, &mut again);
                assert_eq!(again, elements, "w {w}, n {n}, unrotated");
                rotate(&mut back, w, true);
                assert_eq!(back, elements, "w {w}, n {n}, unrotated");
            }
        }
    }
}
