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
//!         that differ from it, a mode 0 or 2 record of their bytes; since 1.8) | 6 rANS
//!         blocks (table, blocks; since 1.10) | 7 rANS blocks with base contexts (map, tables,
//!         blocks of 65536; since 1.11) | 8 rANS blocks with neighbour contexts (the same; since
//!         1.11). The serial tags use modes 0 and 1, the lane tags 0, 2 and 6,
//!         `planes-context` 0, 2, 3, 6 and 8, `delta-xor-context`, `delta-sub-context` and
//!         `delta-predicted` 0, 2, 4, 5, 6 and 7.
//! ```
//!
//! Each record has its module: [`stored`] (mode 0), [`lanes`] (modes 1 and 2, one table),
//! [`contexts`] (modes 3, 4, 7 and 8, tables chosen by context), [`sparse`] (mode 5) and
//! [`blocks`] (mode 6); this one
//! splits and merges the planes and dispatches by mode, [`estimate`] holds the sizes the writer
//! chooses records by, and [`cost`] their decode costs and the rule that weighs the two.

mod blocks;
mod contexts;
mod cost;
mod estimate;
mod lanes;
mod sparse;
mod stored;

use std::ops::Range;

use tpde_format::CodecTag;

pub use blocks::BLOCKS_SINCE_MINOR;
pub use contexts::{base_contexts, BaseElements, CONTEXT_BLOCKS_SINCE_MINOR};
pub use estimate::{estimate, histograms, sampled_histograms};
pub use sparse::{SparsePlane, SPARSE_PLANES_SINCE_MINOR};

use cost::Margin;
use estimate::coded_bytes;

use crate::rans::{self, BlockLayout, Contexts, LaneLayout, Table};
#[cfg(test)]
use crate::shuffle::split;
pub(crate) use crate::shuffle::with_word;
pub use crate::shuffle::Finish;
use crate::shuffle::{merge, split_into};
pub use crate::shuffle::{rotate, rotated_into, rotates};
use crate::CodecError;

const STORED: u8 = 0;
const RANS: u8 = 1;
const RANS_LANES: u8 = 2;
const RANS_CONTEXTS: u8 = 3;
const RANS_BASE_CONTEXTS: u8 = 4;
const SPARSE: u8 = 5;
const RANS_BLOCKS: u8 = 6;
const RANS_BASE_CONTEXT_BLOCKS: u8 = 7;
const RANS_CONTEXT_BLOCKS: u8 = 8;

/// The plane records a writer may use beyond those its codec tag had from the start: each came
/// with a minor version (spec §11), so a file may hold it only if it declares that version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Records {
    /// Mode 5, sparse (since 1.8), where a tag allows it.
    pub sparse: bool,
    /// Mode 6, rANS blocks (since 1.10), for order-0 planes in lane form.
    pub blocks: bool,
    /// Modes 7 and 8, rANS blocks with base or neighbour contexts (since 1.11), in place of
    /// modes 4 and 3's lanes.
    pub context_blocks: bool,
}

impl Records {
    /// Only the records every version of the tag allows.
    pub const FIRST: Records = Records { sparse: false, blocks: false, context_blocks: false };

    /// The records a file that declares minor version `minor` may hold.
    pub fn of(minor: u16) -> Records {
        Records {
            sparse: minor >= SPARSE_PLANES_SINCE_MINOR,
            blocks: minor >= BLOCKS_SINCE_MINOR,
            context_blocks: minor >= CONTEXT_BLOCKS_SINCE_MINOR,
        }
    }
}

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
    /// Mode 6: a table and rANS blocks.
    Blocks(Table, BlockLayout),
    /// Mode 7: a base-context map, its tables and rANS blocks of 65536 symbols.
    BaseContextBlocks(Contexts, BlockLayout),
    /// Mode 8: a context map, its tables and rANS blocks of 65536 symbols.
    ContextBlocks(Contexts, BlockLayout),
}

thread_local! {
    /// This thread's buffer for a chunk's planes, split to encode or decoded to merge, reused
    /// from chunk to chunk: a buffer allocated per chunk faults in and zeroes fresh pages.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Appends the planes of `elements` (already transformed), `w` bytes each, in `form`: each
/// plane rANS-coded with a table of its own, or stored when rANS would shrink it by under 2%
/// (not worth its decode time).
/// `records`: the newer records the file may hold.
pub fn encode(elements: &[u8], w: usize, form: PlaneForm, records: Records, out: &mut Vec<u8>) {
    encode_with(elements, w, form, None, records, Margin::KEYFRAME, out);
}

/// [`encode`] for a keyframe file's chunk: neighbour contexts only where they save more, since
/// a keyframe is what a resume reads.
pub fn encode_keyframe(elements: &[u8], w: usize, form: PlaneForm, records: Records, out: &mut Vec<u8>) {
    encode_with(elements, w, form, None, records, Margin::keyframe(w, records), out);
}

/// [`encode`] in [`PlaneForm::BaseContexts`], the elements' base contexts given; with
/// `records.sparse`, a plane almost all one byte may take a sparse record (spec §6.2.5).
pub fn encode_against_base(elements: &[u8], w: usize, contexts: &[u8], records: Records, out: &mut Vec<u8>) {
    encode_with(elements, w, PlaneForm::BaseContexts, Some(contexts), records, Margin::DELTA, out);
}

fn encode_with(
    elements: &[u8],
    w: usize,
    form: PlaneForm,
    contexts: Option<&[u8]>,
    records: Records,
    margin: Margin,
    out: &mut Vec<u8>,
) {
    let n = elements.len() / w;
    // A plane that a sample shows to be near-random (the low mantissa bytes) is stored without
    // being counted in full: the full count of every plane was a tenth of a delta pack.
    let sampled = (n >= estimate::SAMPLE_FROM).then(|| sampled_histograms(n, w, |r| &elements[r]));
    SCRATCH.with_borrow_mut(|planes| {
        split_into(elements, w, planes);
        encode_planes(planes, n, w, sampled.as_deref(), form, contexts, records, margin, out)
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
    records: Records,
    margin: Margin,
    out: &mut Vec<u8>,
) {
    // The map whose table indices INDICES holds for this chunk's contexts, if any.
    let mut indexed = None;
    for (j, plane) in planes.chunks_exact(n.max(1)).enumerate() {
        let near_random = sampled.is_some_and(|s| {
            coded_bytes(&Table::from_histogram(&s[j]), &s[j], n, form) >= n as f64 * estimate::NEAR_RANDOM
        });
        if n > 0 && !near_random {
            let hist = rans::histogram(plane);
            let table = Table::from_histogram(&hist);
            let order0 = coded_bytes(&table, &hist, n, form);
            // Coded at all where that saves 2% of storing it (which decodes at copy speed).
            if cost::saves(order0, n as f64, Margin::KEYFRAME) {
                let start = out.len();
                let written = match (form, contexts) {
                    (PlaneForm::Contexts, _) => contexts::write_contexts(plane, order0, margin, records, out),
                    (PlaneForm::BaseContexts, Some(c)) => {
                        contexts::write_base_contexts(plane, c, order0, records, &mut indexed, out)
                    }
                    _ => None,
                };
                // Else order 0: blocks in a keyframe's chunk, in a delta's where chosen over lanes.
                let cost = written.unwrap_or_else(|| {
                    let blocks = records.blocks && form != PlaneForm::Serial && blocks::worth_it(n);
                    match (blocks, form) {
                        (true, PlaneForm::Contexts) => {
                            blocks::write(&table, plane, out);
                            cost::BLOCKS
                        }
                        (true, _) => {
                            table.write_record(form, plane, out);
                            blocks::replace_lanes_if_chosen(&table, plane, start, out)
                        }
                        (false, _) => {
                            table.write_record(form, plane, out);
                            cost::LANES
                        }
                    }
                });
                if records.sparse && form == PlaneForm::BaseContexts {
                    sparse::write_sparse_if_chosen(plane, &hist, start, cost, out);
                }
                continue;
            }
        }
        stored::write(plane, out);
    }
    if n == 0 {
        out.resize(out.len() + w, STORED);
    }
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
        let record = match (mode, form) {
            (STORED, _) => {
                let (start, end) =
                    stored::parse(stored, at, n).map_err(|_| corrupt(format!("stored plane {j} is cut short")))?;
                at = end;
                PlaneRecord::Stored(start)
            }
            (RANS, PlaneForm::Serial) => {
                let (table, stream) = lanes::parse_serial(stored, at).map_err(&corrupt)?;
                at = stream.end;
                PlaneRecord::Serial(table, stream)
            }
            (RANS_LANES, PlaneForm::Lanes | PlaneForm::Contexts | PlaneForm::BaseContexts) => {
                let (table, layout) = lanes::parse_lanes(stored, at, n).map_err(&corrupt)?;
                at = layout.bytes.end;
                PlaneRecord::Lanes(table, layout)
            }
            (RANS_CONTEXTS, PlaneForm::Contexts) => {
                let (model, layout) = contexts::parse(stored, at, n).map_err(&corrupt)?;
                at = layout.bytes.end;
                PlaneRecord::Contexts(model, layout)
            }
            (RANS_BASE_CONTEXTS, PlaneForm::BaseContexts) => {
                let (model, layout) = contexts::parse(stored, at, n).map_err(&corrupt)?;
                at = layout.bytes.end;
                PlaneRecord::BaseContexts(model, layout)
            }
            (RANS_CONTEXT_BLOCKS, PlaneForm::Contexts) => {
                let (model, layout) = contexts::parse_blocks(stored, at, n, false).map_err(&corrupt)?;
                at = layout.words.end;
                PlaneRecord::ContextBlocks(model, layout)
            }
            (RANS_BASE_CONTEXT_BLOCKS, PlaneForm::BaseContexts) => {
                let (model, layout) = contexts::parse_blocks(stored, at, n, true).map_err(&corrupt)?;
                at = layout.words.end;
                PlaneRecord::BaseContextBlocks(model, layout)
            }
            (RANS_BLOCKS, PlaneForm::Lanes | PlaneForm::Contexts | PlaneForm::BaseContexts) => {
                let (table, layout) = blocks::parse(stored, at, n).map_err(&corrupt)?;
                at = layout.words.end;
                PlaneRecord::Blocks(table, layout)
            }
            (SPARSE, PlaneForm::BaseContexts) => {
                let (sparse, end) =
                    sparse::parse(codec, stored, at, n).map_err(|e| corrupt(format!("plane {j}: {e}")))?;
                at = end;
                PlaneRecord::Sparse(sparse)
            }
            (m, _) => return Err(corrupt(format!("plane {j} has mode {m}, not one of {codec}'s"))),
        };
        records.push(record);
    }
    Ok((records, at))
}

/// Decodes `w` planes at offset `at` of `stored` into `out` (the elements, finished as
/// `finish` says), returning the offset after them.
/// `base`: the base of a chunk in [`PlaneForm::BaseContexts`].
pub fn decode(
    codec: CodecTag,
    stored: &[u8],
    at: usize,
    w: usize,
    finish: Finish,
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
    SCRATCH.with_borrow_mut(|scratch| decode_with(codec, stored, &records, n, finish, base, scratch, out))?;
    Ok(end)
}

#[allow(clippy::too_many_arguments)]
fn decode_with(
    codec: CodecTag,
    stored: &[u8],
    records: &[PlaneRecord],
    n: usize,
    finish: Finish,
    base: Option<BaseElements<'_>>,
    scratch: &mut Vec<u8>,
    out: &mut [u8],
) -> Result<(), CodecError> {
    let corrupt = rans::corrupt(codec);
    // The map of the base-context tables indexed for this chunk, if any (see
    // `contexts::decode_given`).
    let mut indexed: Option<&[u8; 256]> = None;
    let coded = records.iter().filter(|r| !matches!(r, PlaneRecord::Stored(_))).count();
    if scratch.len() < n * coded {
        scratch.resize(n * coded, 0);
    }
    let decoded = &mut scratch[..n * coded];
    let mut free = decoded.chunks_exact_mut(n);
    for record in records {
        if matches!(record, PlaneRecord::Stored(_)) {
            continue;
        }
        let plane = free.next().expect("a buffer per coded plane");
        match record {
            PlaneRecord::Stored(_) => unreachable!("stored planes merge from the chunk"),
            PlaneRecord::Serial(table, stream) => rans::decode(table, &stored[stream.clone()], plane).map(|_| ()),
            PlaneRecord::Lanes(table, layout) => rans::decode_lanes(table, stored, layout, plane),
            PlaneRecord::Contexts(model, layout) => model.decode_lanes(stored, layout, plane),
            PlaneRecord::ContextBlocks(model, layout) => {
                model.decode_neighbour_blocks_with(stored, layout, plane, rans::BlockLoop::Avx512)
            }
            PlaneRecord::Sparse(record) => sparse::decode(record, stored, plane),
            PlaneRecord::Blocks(table, layout) => rans::decode_blocks(table, stored, layout, plane),
            PlaneRecord::BaseContexts(model, layout) => {
                let base = base.ok_or_else(|| corrupt("a base-context record without a base".into()))?;
                contexts::with_base_tables(model, base, &mut indexed, |t| model.decode_given(stored, layout, t, plane))
            }
            PlaneRecord::BaseContextBlocks(model, layout) => {
                let base = base.ok_or_else(|| corrupt("a base-context record without a base".into()))?;
                contexts::with_base_tables(model, base, &mut indexed, |t| {
                    model.decode_given_blocks(stored, layout, t, plane)
                })
            }
        }
        .map_err(&corrupt)?;
    }
    let mut decoded = decoded.chunks_exact(n);
    let planes: Vec<&[u8]> = records
        .iter()
        .map(|r| match r {
            PlaneRecord::Stored(at) => &stored[*at..*at + n],
            _ => decoded.next().expect("one decoded plane per coded record"),
        })
        .collect();
    merge(&planes, out, finish);
    Ok(())
}

/// The spec's bound for `planes`: `decoded_length ≤ 32768 × stored_length`. It holds for every
/// valid encoding because no rANS symbol is free: each costs at least log2(4096/4095) bits, one
/// byte per 22 713 symbols (spec §6.2.2).
pub const MAX_EXPANSION: u64 = 32768;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Dense, DenseOp};
    use tpde_format::DType;

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
                merge(&parts, &mut back, Finish::Keep);
                assert_eq!(back, elements, "w {w}, n {n}");
                // A dense delta applied in the merge is the element the encoder's transform
                // took the delta of, for every op and every dtype of this width.
                let base: Vec<u8> = elements.iter().rev().map(|b| b.wrapping_mul(31)).collect();
                for dtype in DType::ALL.into_iter().filter(|d| d.size() as usize == w) {
                    for op in [DenseOp::Xor, DenseOp::Sub] {
                        let finish = Finish::Delta { op, float: dtype.is_float(), base: &base };
                        merge(&parts, &mut back, finish);
                        assert_eq!(
                            Dense::forward(op, dtype, &back, &base),
                            elements,
                            "w {w}, n {n}, {dtype:?}, {op:?}"
                        );
                    }
                }
                merge(&parts, &mut back, Finish::Unrotate);
                let mut again = Vec::new();
                rotated_into(&back, w, &mut again);
                assert_eq!(again, elements, "w {w}, n {n}, unrotated");
                rotate(&mut back, w, true);
                assert_eq!(back, elements, "w {w}, n {n}, unrotated");
            }
        }
    }
}
