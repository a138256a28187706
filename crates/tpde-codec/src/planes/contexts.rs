//! Modes 3, 4, 7 and 8 (spec §6.2.4, §6.4.1, §6.4.2, §6.2.7): rANS with tables chosen by
//! context, the symbol before (keyframes: mode 3 in lanes, mode 8 in blocks, where it is the
//! symbol its state decoded one step before) or the element's base (dense deltas: mode 4 in
//! lanes, mode 7 in blocks).

use tpde_format::DType;

use super::cost::{self, Cost, Margin};
use super::estimate::SAMPLE_FROM;
use super::{
    rotates, with_word, Records, RANS_BASE_CONTEXTS, RANS_BASE_CONTEXT_BLOCKS, RANS_CONTEXTS, RANS_CONTEXT_BLOCKS,
};
use crate::rans::unchanged::UNCHANGED;
use crate::rans::{self, context, BlockLayout, Contexts, LaneLayout, CONTEXT_BLOCK_SYMBOLS};
use crate::shuffle::map_bytes;

/// The minor version of format 1 that defines context block records (modes 7 and 8, spec
/// §6.4.2, §6.2.7): a writer writes them only into files that declare it.
pub const CONTEXT_BLOCKS_SINCE_MINOR: u16 = 11;

thread_local! {
    /// This thread's buffer for the table index of every element of a chunk with base-context
    /// records.
    static INDICES: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// For a plane about to be coded with one table, at `order0` estimated bytes: writes it as a
/// context record where [`cost::chosen`] takes it by `margin` (16 tables decode more slowly
/// than one), returning its cost if it did: in blocks (mode 8) where `records` allows them and
/// the plane fills half a block, else in lanes (mode 3). Chosen from a sample of the pairs, as
/// the forms are.
pub(super) fn write_contexts(
    plane: &[u8],
    order0: f64,
    margin: Margin,
    records: Records,
    out: &mut Vec<u8>,
) -> Option<Cost> {
    let n = plane.len();
    let sampled = n >= SAMPLE_FROM;
    let chosen = |cost: Cost| move |bytes: f64| cost::chosen(bytes, cost, order0, Cost::order0(records, n), margin);
    if records.context_blocks && n >= CONTEXT_BLOCK_SYMBOLS / 2 {
        // Mode 8's lag of 32 codes smaller than mode 3's lag of 1 (blocks are long): f32 Adam
        // moments' keyframe is 0.6% smaller than 1.10's and decodes as fast or faster
        // (docs/measurements.md).
        let pairs = context::block_pair_counts(plane, sampled);
        let map = worth(&pairs, n, chosen(cost::CONTEXT_BLOCKS))?;
        out.push(RANS_CONTEXT_BLOCKS);
        Contexts::encode_neighbour_blocks(map, (!sampled).then_some(&*pairs), plane, out);
        return Some(cost::CONTEXT_BLOCKS);
    }
    let lanes = rans::lane_count(n);
    let pairs = context::pair_counts(plane, lanes, sampled);
    let map = worth(&pairs, n, chosen(cost::CONTEXT_LANES))?;
    out.push(RANS_CONTEXTS);
    Contexts::encode_neighbours(map, (!sampled).then_some(&*pairs), plane, out);
    Some(cost::CONTEXT_LANES)
}

/// [`write_contexts`] for a base-context record (spec §6.4.1), with the plane's base contexts
/// in place of the symbols before: in blocks (mode 7) where `records` allows them and the plane
/// fills half a block, else in lanes (mode 4). `indexed`: the map whose table indices INDICES
/// holds for these contexts, if any (a chunk's planes share their contexts, so the maps
/// grouping them by how often each occurs are alike, and the indices are computed once).
pub(super) fn write_base_contexts(
    plane: &[u8],
    contexts: &[u8],
    order0: f64,
    records: Records,
    indexed: &mut Option<[u8; 256]>,
    out: &mut Vec<u8>,
) -> Option<Cost> {
    let n = plane.len();
    let sampled = n >= SAMPLE_FROM;
    let mut pairs = context::given_pair_counts(plane, contexts, sampled);
    let blocks = records.context_blocks && n >= CONTEXT_BLOCK_SYMBOLS / 2;
    // In blocks, the contexts whose bytes are all 0 may be left out (spec §6.4.2): their
    // rows leave the pair counts, and the map sends them to UNCHANGED.
    let all = counted(&pairs);
    let (unchanged, left_out) = if blocks { unchanged_contexts(&mut pairs, all) } else { ([false; 256], 0.0) };
    let cost = Cost::base_context_blocks(left_out);
    let grouped = if blocks {
        let order0_cost = Cost::order0(records, n);
        worth_of(&pairs, n, all, |bytes| cost::chosen(bytes, cost, order0, order0_cost, Margin::DELTA))?
    } else {
        worth_of(&pairs, n, all, |bytes| cost::saves(bytes, order0, Margin::DELTA_LANES))?
    };
    let mut map = grouped;
    for (m, _) in map.iter_mut().zip(unchanged).filter(|&(_, u)| u) {
        *m = UNCHANGED;
    }
    INDICES.with_borrow_mut(|tables| {
        let mut index = |map: &[u8; 256], tables: &mut Vec<u8>| {
            if *indexed != Some(*map) {
                tables.clear();
                tables.extend_from_slice(contexts);
                map_bytes(map, tables);
                *indexed = Some(*map);
            }
        };
        index(&map, tables);
        // A sample may have missed a changed byte of a context it saw unchanged: such contexts
        // go back to their tables (one more pass, only then).
        if sampled && map != grouped && !left_out_are_zero(plane, tables) {
            for (&c, &p) in contexts.iter().zip(plane) {
                if p != 0 && map[usize::from(c)] == UNCHANGED {
                    map[usize::from(c)] = grouped[usize::from(c)];
                }
            }
            index(&map, tables);
        }
        let model = if sampled { Contexts::count_tables(map, plane, tables) } else { Contexts::new(map, &pairs) };
        if blocks {
            out.push(RANS_BASE_CONTEXT_BLOCKS);
            model.encode_given_blocks(plane, tables, out);
        } else {
            out.push(RANS_BASE_CONTEXTS);
            model.encode_given(plane, tables, out);
        }
    });
    Some(if blocks { cost } else { cost::BASE_CONTEXT_LANES })
}

/// The contexts of `pairs` (counts of (base context, byte), `total` in all) whose bytes are all
/// 0, and the share of the symbols counted they hold, where leaving them out makes the record
/// decode faster ([`cost::leave_out`]) and they are not all of them: their rows are cleared
/// from `pairs`.
fn unchanged_contexts(pairs: &mut context::Pairs, total: u64) -> ([bool; 256], f64) {
    let count = |row: &[u32; 256]| row.iter().copied().map(u64::from).sum::<u64>();
    let unchanged: [bool; 256] = std::array::from_fn(|a| pairs[a][0] > 0 && count(&pairs[a]) == u64::from(pairs[a][0]));
    let left_out: u64 = pairs.iter().zip(unchanged).filter(|&(_, u)| u).map(|(row, _)| count(row)).sum();
    let share = left_out as f64 / total.max(1) as f64;
    if !cost::leave_out(share) || left_out == total {
        return ([false; 256], 0.0);
    }
    for (row, _) in pairs.iter_mut().zip(unchanged).filter(|&(_, u)| u) {
        *row = [0; 256];
    }
    (unchanged, share)
}

/// Whether every byte of `plane` whose table index is UNCHANGED is 0: one pass the compiler
/// vectorises.
fn left_out_are_zero(plane: &[u8], tables: &[u8]) -> bool {
    plane.iter().zip(tables).fold(0u8, |acc, (&p, &t)| acc | (p & u8::from(t == UNCHANGED).wrapping_neg())) == 0
}

/// The map grouping these pair counts (of a plane of `n` symbols, or a sample of it) when its
/// record's estimated bytes are `chosen`.
fn worth(pairs: &context::Pairs, n: usize, chosen: impl Fn(f64) -> bool) -> Option<[u8; 256]> {
    worth_of(pairs, n, counted(pairs), chosen)
}

/// The symbols `pairs` counts.
fn counted(pairs: &context::Pairs) -> u64 {
    pairs.iter().flatten().copied().map(u64::from).sum()
}

/// [`worth`] for pair counts of `counted` symbols, some of whose rows may have been cleared
/// (the unchanged contexts', which cost nothing).
fn worth_of(pairs: &context::Pairs, n: usize, counted: u64, chosen: impl Fn(f64) -> bool) -> Option<[u8; 256]> {
    let map = Contexts::group(pairs)?;
    let bytes = Contexts::estimate(&map, pairs, n as f64 / counted.max(1) as f64) + 8.0 * rans::lane_count(n) as f64;
    chosen(bytes).then_some(map)
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

/// Reads a mode-3 or mode-4 record after its mode byte, at `at`, for a plane of `n` symbols:
/// its context map and tables, and its lanes.
pub(super) fn parse(stored: &[u8], at: usize, n: usize) -> Result<(Contexts, LaneLayout), String> {
    let (model, after) = Contexts::read(&stored[at..])?;
    let layout = LaneLayout::read(stored, stored.len() - after.len(), n)?;
    Ok((model, layout))
}

/// Reads a mode-7 (`base`) or mode-8 record after its mode byte, at `at`, for a plane of `n`
/// symbols: its context map and tables, and its blocks of 65536 symbols.
pub(super) fn parse_blocks(stored: &[u8], at: usize, n: usize, base: bool) -> Result<(Contexts, BlockLayout), String> {
    let read = if base { Contexts::read_base_blocks } else { Contexts::read };
    let (model, after) = read(&stored[at..])?;
    let layout = BlockLayout::read_sized(stored, stored.len() - after.len(), n, CONTEXT_BLOCK_SYMBOLS)?;
    Ok((model, layout))
}

/// Runs `decode` (a mode-4 or mode-7 record's) with the table index `model`'s map gives each
/// element by `base`'s contexts. `indexed`: the map the table indices in INDICES were computed
/// with, for this chunk: the planes of one chunk share their contexts, so the writer gives them
/// the same map, and the indices are computed once.
pub(super) fn with_base_tables<'m>(
    model: &'m Contexts,
    base: BaseElements<'_>,
    indexed: &mut Option<&'m [u8; 256]>,
    decode: impl FnOnce(&[u8]) -> Result<(), String>,
) -> Result<(), String> {
    INDICES.with_borrow_mut(|tables| {
        if *indexed != Some(model.map()) {
            base_tables(base.dtype, base.elements, model.map(), tables);
            *indexed = Some(model.map());
        }
        decode(tables)
    })
}

#[cfg(test)]
mod tests {
    use super::super::{encode, encode_against_base, encode_keyframe, PlaneForm, Records, RANS_LANES, STORED};
    use super::*;

    /// A base-context block record leaves out its unchanged contexts only where that makes it
    /// decode faster by the cost table: a quarter of the symbols is too few, a half enough.
    #[test]
    fn contexts_are_left_out_only_where_that_decodes_faster() {
        let n = 1 << 17;
        let mut x = 0x9E37_79B9u32;
        let contexts: Vec<u8> = (0..n).map(|i| (i % 64) as u8).collect();
        for (unchanged, left_out) in [(16, false), (32, true)] {
            // Contexts below `unchanged` hold 0; the others never do.
            let plane: Vec<u8> = contexts
                .iter()
                .map(|&c| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    if c < unchanged {
                        0
                    } else {
                        1 + (x >> 8).trailing_zeros().min(12) as u8
                    }
                })
                .collect();
            let mut out = Vec::new();
            encode_against_base(&plane, 1, &contexts, Records::of(CONTEXT_BLOCKS_SINCE_MINOR), &mut out);
            assert_eq!(out[0], RANS_BASE_CONTEXT_BLOCKS);
            let (model, _) = parse_blocks(&out, 1, n, true).unwrap();
            assert_eq!(model.has_unchanged(), left_out, "{unchanged} of 64 contexts unchanged");
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
                    encode_keyframe(elements, w, PlaneForm::Contexts, Records::FIRST, &mut out);
                } else {
                    encode(elements, w, PlaneForm::Contexts, Records::FIRST, &mut out);
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
}
