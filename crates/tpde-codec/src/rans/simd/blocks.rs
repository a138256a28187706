//! The block form's decode loops (spec §6.2.6) on AVX-512 and AVX2.
//!
//! Written by hand: this is the format's hot loop, and no crate decodes this layout. A block's
//! 32 states sit in two AVX-512 registers (four AVX2 ones); several blocks run side by side so
//! that their gathers overlap. Each step pops a symbol from every state, then hands the block's
//! next words to the states below 2^16 in state order: `vpexpandd` on AVX-512, a permutation
//! chosen by the mask on AVX2. They produce exactly what the scalar loop does (the tests
//! compare them), and leave the end conditions and any partial step to it.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use crate::rans::blocks::{max_index, Block, BlockLoop, Choice, BLOCK_STATES};
use crate::rans::SCALE_BITS;

/// Decodes every whole step the vector loops can of `blocks` (block b's symbols are
/// `out[ranges[b]]`, the ranges one after another from 0), advancing their states, word
/// positions and steps; the scalar loop goes on from there. Does nothing on a CPU with neither
/// loop.
/// `slots`: 4096 a table; `choice`: how each symbol's table is chosen, where there are several.
/// `widest`: the widest loop to use ([`BlockLoop::Scalar`] uses none).
pub(in crate::rans) fn decode(
    slots: &[u32],
    choice: Choice<'_>,
    words: &[u8],
    blocks: &mut [Block],
    ranges: &[Range<usize>],
    out: &mut [u8],
    widest: BlockLoop,
) {
    // Every gather stays inside `slots`: its slot is below 4096 and its table below the count
    // (checked here, so that this function alone is sound).
    let tables = slots.len() >> SCALE_BITS;
    assert!(tables > 0 && slots.len() == tables << SCALE_BITS);
    match choice {
        Choice::One => {}
        Choice::Given(g) => assert!(g.len() == out.len() && usize::from(max_index(g)) < tables),
        Choice::Neighbour(map) => assert!(usize::from(max_index(map)) < tables),
    }
    // A neighbour-context symbol's table offset, by the symbol its state decoded before.
    let next: Option<[u32; 256]> = match choice {
        Choice::Neighbour(map) => Some(map.map(|t| u32::from(t) << SCALE_BITS)),
        _ => None,
    };
    let avx512 = widest == BlockLoop::Avx512 && BlockLoop::Avx512.available();
    let avx2 = widest != BlockLoop::Scalar && BlockLoop::Avx2.available();
    // Neighbour contexts look up the table after each symbol in registers where the CPU has
    // VBMI's byte permutations, instead of a second gather (which halved the loop's speed).
    let vbmi = avx512 && matches!(choice, Choice::Neighbour(_)) && crate::isa::avx512(false, true);
    // Four blocks a group on AVX-512, two on AVX2.
    let width = match (avx512, avx2) {
        (true, _) => 4,
        (false, true) => 2,
        _ => return,
    };
    let mut outs: Vec<&mut [u8]> = Vec::with_capacity(ranges.len());
    let mut rest = out;
    for r in ranges {
        let (block, after) = std::mem::take(&mut rest).split_at_mut(r.len());
        outs.push(block);
        rest = after;
    }
    let tables: Option<Vec<&[u8]>> = match choice {
        Choice::Given(t) => Some(ranges.iter().map(|r| &t[r.clone()]).collect()),
        _ => None,
    };
    // A group runs as long as its shortest block, so the blocks with whole steps left regroup
    // until none has (a plane's last block is short: grouped once, the others' rest went to
    // the scalar loop). A group that takes no step has met the end of the words: stop.
    loop {
        // (A plane of no symbol has one block and no chunk of `out`.)
        let left: Vec<usize> = (0..outs.len().min(blocks.len()))
            .filter(|&b| outs[b].len() / BLOCK_STATES > blocks[b].step)
            .take(width)
            .collect();
        if left.is_empty() {
            return;
        }
        let g = left.len();
        let mut group: Vec<Block> = left.iter().map(|&b| blocks[b].clone()).collect();
        let group_outs: Vec<&mut [u8]> = left.iter().map(|&b| std::mem::take(&mut outs[b])).collect();
        let group_tables: Option<Vec<&[u8]>> = tables.as_ref().map(|t| left.iter().map(|&b| t[b]).collect());
        let choice = match (&group_tables, &next, choice) {
            (Some(t), _, _) => StepChoice::Given(t),
            (None, Some(next), Choice::Neighbour(map)) => StepChoice::Neighbour { map, next },
            _ => StepChoice::One,
        };
        let at = Steps { slots, choice, words };
        // SAFETY: the CPU has the features each loop is compiled for (checked above).
        let group_outs = unsafe {
            match (avx512, g) {
                (true, 4) if vbmi => steps512_vbmi::<4>(at, &mut group, group_outs),
                (true, 2) if vbmi => steps512_vbmi::<2>(at, &mut group, group_outs),
                (true, 3) if vbmi => steps512_vbmi::<3>(at, &mut group, group_outs),
                (true, _) if vbmi => steps512_vbmi::<1>(at, &mut group, group_outs),
                (true, 4) => steps512::<4>(at, &mut group, group_outs),
                (true, 2) => steps512::<2>(at, &mut group, group_outs),
                (true, 3) => steps512::<3>(at, &mut group, group_outs),
                (true, _) => steps512::<1>(at, &mut group, group_outs),
                (false, 2) => steps256::<2>(at, &mut group, group_outs),
                (false, _) => steps256::<1>(at, &mut group, group_outs),
            }
        };
        let mut moved = false;
        for ((&b, block), o) in left.iter().zip(group).zip(group_outs) {
            moved |= block.step > blocks[b].step;
            blocks[b] = block;
            outs[b] = o;
        }
        if !moved {
            return;
        }
    }
}

/// What a group's steps read: the tables' slots, how a symbol's table is chosen, the record's
/// words.
#[derive(Clone, Copy)]
struct Steps<'a> {
    slots: &'a [u32],
    choice: StepChoice<'a>,
    words: &'a [u8],
}

/// [`Choice`] for a group: each block's table indices where given, or the map of the table
/// that follows each symbol and its tables' offsets (index << 12).
#[derive(Clone, Copy)]
enum StepChoice<'a> {
    One,
    Given(&'a [&'a [u8]]),
    Neighbour { map: &'a [u8; 256], next: &'a [u32; 256] },
}

/// The whole steps all of `group` can take with every block's next 32 words inside `words`
/// (two 16-word loads a step, the second from where the first left off).
fn whole_steps(group: &[Block], outs: &[&mut [u8]]) -> usize {
    group.iter().zip(outs).map(|(b, o)| (o.len() / BLOCK_STATES).saturating_sub(b.step)).min().unwrap_or(0)
}

/// Decodes up to [`whole_steps`] steps of `G` blocks, sixteen states a register.
///
/// # Safety
/// The CPU must have AVX-512 F and BW.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn steps512<'o, const G: usize>(
    at: Steps<'_>,
    group: &mut [Block],
    outs: Vec<&'o mut [u8]>,
) -> Vec<&'o mut [u8]> {
    // SAFETY: the caller's CPU has the features, and VBMI is not used.
    unsafe { steps512_body::<G, false>(at, group, outs) }
}

/// [`steps512`], with neighbour contexts looked up by VBMI's byte permutations.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VBMI.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn steps512_vbmi<'o, const G: usize>(
    at: Steps<'_>,
    group: &mut [Block],
    outs: Vec<&'o mut [u8]>,
) -> Vec<&'o mut [u8]> {
    // SAFETY: the caller's CPU has the features.
    unsafe { steps512_body::<G, true>(at, group, outs) }
}

/// The loop of [`steps512`], inlined into each of its two callers so that it is compiled with
/// their features.
///
/// # Safety
/// The CPU must have AVX-512 F and BW, and VBMI if `VBMI`.
#[inline(always)]
unsafe fn steps512_body<'o, const G: usize, const VBMI: bool>(
    at: Steps<'_>,
    group: &mut [Block],
    mut outs: Vec<&'o mut [u8]>,
) -> Vec<&'o mut [u8]> {
    let Steps { slots, choice, words } = at;
    assert_eq!(group.len(), G);
    let n_words = words.len() / 2;
    let steps = whole_steps(group, &outs);
    let mask12 = _mm512_set1_epi32((1 << SCALE_BITS) - 1);
    let mask8 = _mm512_set1_epi32(0xFF);
    let lower = _mm512_set1_epi32(1 << 16);
    // The neighbour map's 256 table indices as four registers of 64 bytes (for VBMI).
    let quarters: [__m512i; 4] = match choice {
        // SAFETY: loads of 64 bytes from 256.
        StepChoice::Neighbour { map, .. } => {
            std::array::from_fn(|q| unsafe { _mm512_loadu_si512(map[64 * q..].as_ptr().cast()) })
        }
        _ => [_mm512_setzero_si512(); 4],
    };
    // Neighbour contexts: each state's table offset for its next symbol, from the symbol it
    // decoded one step before (symbol 0 before a block's first step).
    let mut offset: [[__m512i; 2]; G] = std::array::from_fn(|g| {
        std::array::from_fn(|r| match choice {
            StepChoice::Neighbour { next, .. } => {
                let t = group[g].step;
                let before = match t {
                    0 => _mm512_setzero_si512(),
                    // SAFETY: a load of 16 bytes from the step before, inside the block's symbols.
                    _ => _mm512_cvtepu8_epi32(unsafe {
                        _mm_loadu_si128(outs[g][(t - 1) * BLOCK_STATES + 16 * r..][..16].as_ptr().cast())
                    }),
                };
                // SAFETY: symbols are below 256, the table's length.
                unsafe { _mm512_i32gather_epi32::<4>(before, next.as_ptr().cast()) }
            }
            _ => _mm512_setzero_si512(),
        })
    });
    // SAFETY: loads of 64 bytes from sixteen of a block's 32 states.
    let mut x: [[__m512i; 2]; G] = std::array::from_fn(|g| {
        std::array::from_fn(|r| unsafe { _mm512_loadu_si512(group[g].x[16 * r..].as_ptr().cast()) })
    });
    let mut pos: [usize; G] = std::array::from_fn(|g| group[g].pos);
    let first: [usize; G] = std::array::from_fn(|g| group[g].step);
    let mut done = 0;
    while done < steps {
        // Each block takes at most 32 words a step; stop while they are all inside the words
        // (a damaged block may run into the next block's, which its end check then finds).
        if pos.iter().any(|&p| p + 32 > n_words) {
            break;
        }
        for g in 0..G {
            let t = first[g] + done;
            for (r, xr) in x[g].iter_mut().enumerate() {
                let xv = *xr;
                let slot = _mm512_and_si512(xv, mask12);
                let at = t * BLOCK_STATES + 16 * r;
                // The symbols' tables, 4096 slots each (spec §6.2.7, §6.4.2).
                let index = match choice {
                    // SAFETY: a load of 16 bytes from the block's table indices, as many as its
                    // symbols, of which this step's 32 lie at `t · 32`.
                    StepChoice::Given(tables) => _mm512_add_epi32(
                        slot,
                        _mm512_slli_epi32::<{ SCALE_BITS }>(_mm512_cvtepu8_epi32(unsafe {
                            _mm_loadu_si128(tables[g][at..at + 16].as_ptr().cast())
                        })),
                    ),
                    StepChoice::Neighbour { .. } => _mm512_add_epi32(slot, offset[g][r]),
                    StepChoice::One => slot,
                };
                // SAFETY: slots has 4096 entries a table (asserted by `decode`), slot < 4096,
                // and every table index names a table (asserted there too).
                let e = unsafe { _mm512_i32gather_epi32::<4>(index, slots.as_ptr().cast()) };
                if let StepChoice::Neighbour { next, .. } = choice {
                    offset[g][r] = if VBMI {
                        // map[symbol] from four 64-byte quarters of the map, by the symbol's
                        // low byte (the other bytes' lookups are masked off), shifted to a
                        // table's first slot.
                        let low = _mm512_permutex2var_epi8(quarters[0], e, quarters[1]);
                        let high = _mm512_permutex2var_epi8(quarters[2], e, quarters[3]);
                        let t = _mm512_mask_blend_epi8(_mm512_movepi8_mask(e), low, high);
                        _mm512_slli_epi32::<{ SCALE_BITS }>(_mm512_and_si512(t, mask8))
                    } else {
                        // SAFETY: symbols are below 256, the table's length.
                        unsafe { _mm512_i32gather_epi32::<4>(_mm512_and_si512(e, mask8), next.as_ptr().cast()) }
                    };
                }
                let freq = _mm512_and_si512(_mm512_srli_epi32::<8>(e), mask12);
                let start = _mm512_srli_epi32::<20>(e);
                let y = _mm512_sub_epi32(
                    _mm512_add_epi32(_mm512_mullo_epi32(freq, _mm512_srli_epi32::<{ SCALE_BITS }>(xv)), slot),
                    start,
                );
                let take = _mm512_cmplt_epu32_mask(y, lower);
                // SAFETY: pos + 16 ≤ n_words: the step began with pos + 32 ≤ n_words and the
                // first register took at most 16.
                let next = unsafe { _mm256_loadu_si256(words.as_ptr().add(2 * pos[g]).cast()) };
                let w = _mm512_maskz_expand_epi32(take, _mm512_cvtepu16_epi32(next));
                *xr = _mm512_mask_or_epi32(y, take, _mm512_slli_epi32::<16>(y), w);
                pos[g] += take.count_ones() as usize;
                let sym = &mut outs[g][at..at + 16];
                // SAFETY: a store of 16 bytes into a slice of 16.
                unsafe { _mm_storeu_si128(sym.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(e)) };
            }
        }
        done += 1;
    }
    for (g, block) in group.iter_mut().enumerate() {
        for (r, xr) in x[g].iter().enumerate() {
            // SAFETY: stores of 64 bytes into sixteen of the block's 32 states.
            unsafe { _mm512_storeu_si512(block.x[16 * r..].as_mut_ptr().cast(), *xr) };
        }
        block.pos = pos[g];
        block.step += done;
    }
    outs
}

/// For each 8-bit mask m, lane j's index among the set bits of m: the permutation that moves
/// word k of eight loaded to the k-th state that takes one.
const RANKS: [u64; 256] = {
    let mut ranks = [0u64; 256];
    let mut m = 0;
    while m < 256 {
        let mut j = 0;
        let mut k = 0u64;
        while j < 8 {
            ranks[m] |= k << (8 * j);
            if m & (1 << j) != 0 {
                k += 1;
            }
            j += 1;
        }
        m += 1;
    }
    ranks
};

/// For each 8-bit mask m of c set bits, the lanes of its set bits in order in the top c of
/// eight (zeros below): the permutation that packs the states that spill against the top, for
/// the AVX2 encoder, which stores eight words a register ending where its own end.
const PACKS: [u64; 256] = {
    let mut packs = [0u64; 256];
    let mut m = 0;
    while m < 256 {
        let mut k = 8 - (m as u32).count_ones() as u64;
        let mut j = 0;
        while j < 8 {
            if m & (1 << j) != 0 {
                packs[m] |= (j as u64) << (8 * k);
                k += 1;
            }
            j += 1;
        }
        m += 1;
    }
    packs
};

/// [`steps512`] on AVX2: eight states a register, four a block.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
unsafe fn steps256<'o, const G: usize>(
    at: Steps<'_>,
    group: &mut [Block],
    mut outs: Vec<&'o mut [u8]>,
) -> Vec<&'o mut [u8]> {
    let Steps { slots, choice, words } = at;
    assert_eq!(group.len(), G);
    let n_words = words.len() / 2;
    let steps = whole_steps(group, &outs);
    let mask12 = _mm256_set1_epi32((1 << SCALE_BITS) - 1);
    let mask8 = _mm256_set1_epi32(0xFF);
    // As in `steps512`.
    let mut offset: [[__m256i; 4]; G] = std::array::from_fn(|g| {
        std::array::from_fn(|r| match choice {
            StepChoice::Neighbour { next, .. } => {
                let t = group[g].step;
                let before = match t {
                    0 => _mm256_setzero_si256(),
                    // SAFETY: a load of 8 bytes from the step before, inside the block's symbols.
                    _ => _mm256_cvtepu8_epi32(unsafe {
                        _mm_loadl_epi64(outs[g][(t - 1) * BLOCK_STATES + 8 * r..][..8].as_ptr().cast())
                    }),
                };
                // SAFETY: symbols are below 256, the table's length.
                unsafe { _mm256_i32gather_epi32::<4>(next.as_ptr().cast(), before) }
            }
            _ => _mm256_setzero_si256(),
        })
    });
    let zero = _mm256_setzero_si256();
    // After two packs, 32-bit groups of symbols in the order 0 2 4 6 1 3 5 7 of the 8 wanted.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    // SAFETY: loads of 32 bytes from eight of a block's 32 states.
    let mut x: [[__m256i; 4]; G] = std::array::from_fn(|g| {
        std::array::from_fn(|r| unsafe { _mm256_loadu_si256(group[g].x[8 * r..].as_ptr().cast()) })
    });
    let mut pos: [usize; G] = std::array::from_fn(|g| group[g].pos);
    let first: [usize; G] = std::array::from_fn(|g| group[g].step);
    let mut done = 0;
    while done < steps {
        if pos.iter().any(|&p| p + 32 > n_words) {
            break;
        }
        for g in 0..G {
            let mut sym = [zero; 4];
            let step = (first[g] + done) * BLOCK_STATES;
            for (r, xr) in x[g].iter_mut().enumerate() {
                let xv = *xr;
                let slot = _mm256_and_si256(xv, mask12);
                let index = match choice {
                    // SAFETY: a load of 8 bytes from the block's table indices (as `steps512`).
                    StepChoice::Given(tables) => _mm256_add_epi32(
                        slot,
                        _mm256_slli_epi32::<{ SCALE_BITS as i32 }>(_mm256_cvtepu8_epi32(unsafe {
                            _mm_loadl_epi64(tables[g][step + 8 * r..step + 8 * r + 8].as_ptr().cast())
                        })),
                    ),
                    StepChoice::Neighbour { .. } => _mm256_add_epi32(slot, offset[g][r]),
                    StepChoice::One => slot,
                };
                // SAFETY: as in `steps512`: slot < 4096 and the table index names a table.
                let e = unsafe { _mm256_i32gather_epi32::<4>(slots.as_ptr().cast(), index) };
                if let StepChoice::Neighbour { next, .. } = choice {
                    // SAFETY: symbols are below 256, the table's length.
                    offset[g][r] =
                        unsafe { _mm256_i32gather_epi32::<4>(next.as_ptr().cast(), _mm256_and_si256(e, mask8)) };
                }
                let freq = _mm256_and_si256(_mm256_srli_epi32::<8>(e), mask12);
                let start = _mm256_srli_epi32::<20>(e);
                let y = _mm256_sub_epi32(
                    _mm256_add_epi32(_mm256_mullo_epi32(freq, _mm256_srli_epi32::<{ SCALE_BITS as i32 }>(xv)), slot),
                    start,
                );
                let take = _mm256_cmpeq_epi32(_mm256_srli_epi32::<16>(y), zero);
                let m = _mm256_movemask_ps(_mm256_castsi256_ps(take)) as usize;
                // SAFETY: pos + 8 ≤ n_words, as in `steps512`.
                let next = unsafe { _mm_loadu_si128(words.as_ptr().add(2 * pos[g]).cast()) };
                let rank = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(RANKS[m] as i64));
                let w = _mm256_permutevar8x32_epi32(_mm256_cvtepu16_epi32(next), rank);
                *xr = _mm256_blendv_epi8(y, _mm256_or_si256(_mm256_slli_epi32::<16>(y), w), take);
                pos[g] += m.count_ones() as usize;
                sym[r] = _mm256_and_si256(e, mask8);
            }
            let bytes = _mm256_packus_epi16(_mm256_packus_epi32(sym[0], sym[1]), _mm256_packus_epi32(sym[2], sym[3]));
            let dst = &mut outs[g][step..step + 32];
            // SAFETY: a store of 32 bytes into a slice of 32.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), _mm256_permutevar8x32_epi32(bytes, order)) };
        }
        done += 1;
    }
    for (g, block) in group.iter_mut().enumerate() {
        for (r, xr) in x[g].iter().enumerate() {
            // SAFETY: stores of 32 bytes into eight of the block's 32 states.
            unsafe { _mm256_storeu_si256(block.x[8 * r..].as_mut_ptr().cast(), *xr) };
        }
        block.pos = pos[g];
        block.step += done;
    }
    outs
}

/// Whether this CPU runs [`encode_steps`] on AVX-512.
pub(in crate::rans) fn encode_available() -> bool {
    crate::isa::avx512(true, false)
}

/// [`encode_steps`] on AVX2, for the CPUs without AVX-512 (many cloud CPUs): four registers of
/// eight states, the spills compacted by a scalar walk of each register's mask. Written by hand
/// for the same reason: the scalar loop made an AVX2 machine's keyframes encode slower than the
/// lane form's vector encoder did (issue 68).
pub(in crate::rans) fn encode_steps_avx2(
    info: &[u32],
    given: Option<&[u8]>,
    steps: &[u8],
    x: &mut [u32; BLOCK_STATES],
    spill: &mut [u16],
    at: &mut usize,
) {
    assert!(crate::isa::avx2() && steps.len().is_multiple_of(BLOCK_STATES));
    // Each symbol spills at most one word; the eight more below are the stores' slack.
    assert!(*at >= steps.len() + 8 && *at <= spill.len());
    check_tables(info, given, steps);
    // SAFETY: the CPU has AVX2 (asserted above), and the gathers stay in `info` (checked).
    unsafe { encode_steps256(info, given, steps, x, spill, at) }
}

/// Asserts what the encoders' gathers need: 256 entries a table, and every symbol's table index
/// (0 where none is given) naming one.
fn check_tables(info: &[u32], given: Option<&[u8]>, steps: &[u8]) {
    let tables = info.len() / 256;
    assert!(tables > 0 && info.len() == 256 * tables);
    assert!(given.is_none_or(|g| g.len() == steps.len() && usize::from(max_index(g)) < tables));
}

/// # Safety
/// The CPU must have AVX2; `*at ≥ steps.len() + 8` and `*at ≤ spill.len()`; [`check_tables`]
/// holds.
#[target_feature(enable = "avx2")]
unsafe fn encode_steps256(
    info: &[u32],
    given: Option<&[u8]>,
    steps: &[u8],
    x: &mut [u32; BLOCK_STATES],
    spill: &mut [u16],
    at: &mut usize,
) {
    let mask12 = _mm256_set1_epi32((1 << SCALE_BITS) - 1);
    let (low16, two16, one) = (_mm256_set1_epi32(0xFFFF), _mm256_set1_ps(65_536.0), _mm256_set1_epi32(1));
    // SAFETY: loads of 32 bytes from eight of the 32 states.
    let mut xs: [__m256i; 4] = std::array::from_fn(|r| unsafe { _mm256_loadu_si256(x[8 * r..].as_ptr().cast()) });
    // The low 16 bits of each 32-bit lane, packed into a register's low 8 u16 (within each
    // 128-bit half, then the halves' low quadwords together).
    let low_halves = _mm256_setr_epi8(
        0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1,
        -1,
    );
    for (t, step) in steps.chunks_exact(BLOCK_STATES).enumerate().rev() {
        // The step's words below *at in state order, as the scalar encoder writes them: the last
        // register's first, each stored as eight words ending at its own end (the words below
        // them are the next register's to overwrite, or below the step: not yet written).
        for r in (0..4).rev() {
            // SAFETY: a load of 8 bytes from a step of 32.
            let s = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(step[8 * r..].as_ptr().cast()) });
            let i = t * BLOCK_STATES + 8 * r;
            let index = match given {
                // SAFETY: a load of 8 bytes from the step's 32 table indices.
                Some(g) => _mm256_add_epi32(
                    s,
                    _mm256_slli_epi32::<8>(_mm256_cvtepu8_epi32(unsafe {
                        _mm_loadl_epi64(g[i..i + 8].as_ptr().cast())
                    })),
                ),
                None => s,
            };
            // SAFETY: symbols are below 256 and every table index names a table of 256.
            let e = unsafe { _mm256_i32gather_epi32::<4>(info.as_ptr().cast(), index) };
            let f = _mm256_and_si256(e, mask12);
            let start = _mm256_srli_epi32::<12>(e);
            // x ≥ x_max = 2^20·f (unsigned) spills its low 16 bits.
            let out = _mm256_cmpeq_epi32(_mm256_max_epu32(xs[r], _mm256_slli_epi32::<20>(f)), xs[r]);
            let m = _mm256_movemask_ps(_mm256_castsi256_ps(out)) as usize;
            let top = _mm256_permutevar8x32_epi32(xs[r], _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(PACKS[m] as i64)));
            let words = _mm256_permute4x64_epi64::<0b1000>(_mm256_shuffle_epi8(top, low_halves));
            // SAFETY: 8 ≤ *at ≤ spill.len(): *at stays at least the words still to come plus 8.
            unsafe { _mm_storeu_si128(spill.as_mut_ptr().add(*at - 8).cast(), _mm256_castsi256_si128(words)) };
            *at -= m.count_ones() as usize;
            let y = _mm256_blendv_epi8(xs[r], _mm256_srli_epi32::<16>(xs[r]), out);
            // ⌊y / f⌋ in single precision, as the lane form's encoder divides (eight lanes a
            // division; doubles, four, measured slower): y, up to 2^32, converted unsigned as
            // hi·2^16 + lo (one rounding), then divided (another): the quotient, below 2^20
            // (y < 2^20·f), is within 2^20·2^-23 = 1/8 of y / f, so its truncation is off by at
            // most one, which the remainder's sign and size correct.
            let yf = _mm256_add_ps(
                _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32::<16>(y)), two16),
                _mm256_cvtepi32_ps(_mm256_and_si256(y, low16)),
            );
            let q = _mm256_cvttps_epi32(_mm256_div_ps(yf, _mm256_cvtepi32_ps(f)));
            let rem = _mm256_sub_epi32(y, _mm256_mullo_epi32(q, f));
            let under = _mm256_cmpgt_epi32(_mm256_setzero_si256(), rem);
            let over = _mm256_cmpgt_epi32(rem, _mm256_sub_epi32(f, one));
            // The masks are -1 where true.
            let rem = _mm256_sub_epi32(_mm256_add_epi32(rem, _mm256_and_si256(under, f)), _mm256_and_si256(over, f));
            let q = _mm256_sub_epi32(_mm256_add_epi32(q, under), over);
            xs[r] = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32::<{ SCALE_BITS as i32 }>(q), rem), start);
        }
    }
    for r in 0..4 {
        // SAFETY: stores of 32 bytes into eight of the 32 states.
        unsafe { _mm256_storeu_si256(x[8 * r..].as_mut_ptr().cast(), xs[r]) };
    }
}

/// Encodes the whole steps `steps` (32 symbols each, the block's first ones) last step first,
/// onto the states `x`, spilling words into `spill` below `*at` as the scalar encoder does:
/// within a step the words of the states that spill, in state order. `info[s]` is
/// `freq | start << 12`. Written by hand: the scalar encoder, one state after another, made
/// keyframes encode a fifth slower than the lane form's vector encoder.
pub(in crate::rans) fn encode_steps(
    info: &[u32],
    given: Option<&[u8]>,
    steps: &[u8],
    x: &mut [u32; BLOCK_STATES],
    spill: &mut [u16],
    at: &mut usize,
) {
    assert!(encode_available() && steps.len().is_multiple_of(BLOCK_STATES));
    // Each symbol spills at most one word, and the buffer has room for one a symbol.
    assert!(*at >= steps.len() && *at <= spill.len());
    check_tables(info, given, steps);
    // SAFETY: the CPU has the features (asserted above), and the gathers stay in `info`.
    unsafe { encode_steps512(info, given, steps, x, spill, at) }
}

/// # Safety
/// The CPU must have AVX-512 F, BW and VL; `*at ≥ steps.len()` and `*at ≤ spill.len()`;
/// [`check_tables`] holds.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn encode_steps512(
    info: &[u32],
    given: Option<&[u8]>,
    steps: &[u8],
    x: &mut [u32; BLOCK_STATES],
    spill: &mut [u16],
    at: &mut usize,
) {
    let mask12 = _mm512_set1_epi32((1 << SCALE_BITS) - 1);
    // SAFETY: loads of 64 bytes from sixteen of the 32 states.
    let mut xs: [__m512i; 2] = std::array::from_fn(|r| unsafe { _mm512_loadu_si512(x[16 * r..].as_ptr().cast()) });
    for (t, step) in steps.chunks_exact(BLOCK_STATES).enumerate().rev() {
        // SAFETY: a load of 32 bytes from a step of 32.
        let sym = unsafe { _mm256_loadu_si256(step.as_ptr().cast()) };
        let mut s = [
            _mm512_cvtepu8_epi32(_mm256_castsi256_si128(sym)),
            _mm512_cvtepu8_epi32(_mm256_extracti128_si256::<1>(sym)),
        ];
        if let Some(g) = given {
            // Table k's entries start at 256·k.
            // SAFETY: a load of 32 bytes from the step's 32 table indices.
            let t = unsafe { _mm256_loadu_si256(g[t * BLOCK_STATES..(t + 1) * BLOCK_STATES].as_ptr().cast()) };
            let t = [
                _mm512_cvtepu8_epi32(_mm256_castsi256_si128(t)),
                _mm512_cvtepu8_epi32(_mm256_extracti128_si256::<1>(t)),
            ];
            s = std::array::from_fn(|r| _mm512_add_epi32(s[r], _mm512_slli_epi32::<8>(t[r])));
        }
        let mut words = [_mm256_setzero_si256(); 2];
        let mut spills = [0u16; 2];
        for r in 0..2 {
            // SAFETY: symbols are below 256 and every table index names a table of 256.
            let e = unsafe { _mm512_i32gather_epi32::<4>(s[r], info.as_ptr().cast()) };
            let f = _mm512_and_si512(e, mask12);
            let start = _mm512_srli_epi32::<12>(e);
            // x ≥ x_max = 2^20·f spills its low 16 bits.
            let out = _mm512_cmpge_epu32_mask(xs[r], _mm512_slli_epi32::<20>(f));
            words[r] = _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(out, xs[r]));
            spills[r] = out;
            let y = _mm512_mask_srli_epi32(xs[r], out, xs[r], 16);
            // y / f in double precision is exact once floored: y < 2^32 and f < 2^12, so a
            // quotient that is not an integer is at least 2^-12 from one, far above the
            // division's rounding error (at most 2^-21).
            let half = |v: __m256i, g: __m256i| {
                let q = _mm512_div_pd(_mm512_cvtepu32_pd(v), _mm512_cvtepu32_pd(g));
                _mm512_cvttpd_epu32(_mm512_roundscale_pd::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(q))
            };
            let q = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(half(_mm512_castsi512_si256(y), _mm512_castsi512_si256(f))),
                half(_mm512_extracti64x4_epi64::<1>(y), _mm512_extracti64x4_epi64::<1>(f)),
            );
            let rem = _mm512_sub_epi32(y, _mm512_mullo_epi32(q, f));
            xs[r] = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32::<{ SCALE_BITS }>(q), rem), start);
        }
        let counts = spills.map(|m| m.count_ones() as usize);
        *at -= counts[0] + counts[1];
        // Register 0's words, then register 1's, each store masked to its own words.
        let mut to = *at;
        for r in 0..2 {
            let keep = ((1u32 << counts[r]) - 1) as __mmask16;
            // SAFETY: `to + counts[r] ≤ spill.len()`: the step's words fill [*at, old *at).
            unsafe { _mm256_mask_storeu_epi16(spill.as_mut_ptr().add(to).cast(), keep, words[r]) };
            to += counts[r];
        }
    }
    for r in 0..2 {
        // SAFETY: stores of 64 bytes into sixteen of the 32 states.
        unsafe { _mm512_storeu_si512(x[16 * r..].as_mut_ptr().cast(), xs[r]) };
    }
}
