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

use crate::rans::blocks::{Block, BlockLoop, BLOCK_STATES, BLOCK_SYMBOLS};
use crate::rans::SCALE_BITS;

/// Decodes every whole step the vector loops can of `blocks` (block b's symbols are
/// `out[16384·b..]`), advancing their states, word positions and steps; the scalar loop
/// goes on from there. Does nothing on a CPU with neither loop.
/// `widest`: the widest loop to use ([`BlockLoop::Scalar`] uses none).
pub(in crate::rans) fn decode(slots: &[u32], words: &[u8], blocks: &mut [Block], out: &mut [u8], widest: BlockLoop) {
    assert_eq!(slots.len(), 1 << SCALE_BITS);
    let avx512 = widest == BlockLoop::Avx512 && BlockLoop::Avx512.available();
    let avx2 = widest != BlockLoop::Scalar && BlockLoop::Avx2.available();
    let mut b = 0;
    while b < blocks.len() {
        // Four blocks a group on AVX-512, two on AVX2, then one.
        let g = match (avx512, avx2) {
            (true, _) => 4,
            (false, true) => 2,
            _ => return,
        }
        .min(blocks.len() - b);
        let end = ((b + g) * BLOCK_SYMBOLS).min(out.len());
        let region = &mut out[b * BLOCK_SYMBOLS..end];
        let outs: Vec<&mut [u8]> = region.chunks_mut(BLOCK_SYMBOLS).collect();
        let group = &mut blocks[b..b + g];
        // SAFETY: the CPU has the features each loop is compiled for (checked above).
        unsafe {
            match (avx512, g) {
                (true, 4) => steps512::<4>(slots, words, group, outs),
                (true, 2) => steps512::<2>(slots, words, group, outs),
                (true, 3) => steps512::<3>(slots, words, group, outs),
                (true, _) => steps512::<1>(slots, words, group, outs),
                (false, 2) => steps256::<2>(slots, words, group, outs),
                (false, _) => steps256::<1>(slots, words, group, outs),
            }
        }
        b += g;
    }
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
unsafe fn steps512<const G: usize>(slots: &[u32], words: &[u8], group: &mut [Block], mut outs: Vec<&mut [u8]>) {
    assert_eq!(group.len(), G);
    let n_words = words.len() / 2;
    let steps = whole_steps(group, &outs);
    let mask12 = _mm512_set1_epi32((1 << SCALE_BITS) - 1);
    let lower = _mm512_set1_epi32(1 << 16);
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
                // SAFETY: slots has 4096 entries (asserted by `decode`) and slot < 4096.
                let e = unsafe { _mm512_i32gather_epi32::<4>(slot, slots.as_ptr().cast()) };
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
                let at = t * BLOCK_STATES + 16 * r;
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

/// [`steps512`] on AVX2: eight states a register, four a block.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
unsafe fn steps256<const G: usize>(slots: &[u32], words: &[u8], group: &mut [Block], mut outs: Vec<&mut [u8]>) {
    assert_eq!(group.len(), G);
    let n_words = words.len() / 2;
    let steps = whole_steps(group, &outs);
    let mask12 = _mm256_set1_epi32((1 << SCALE_BITS) - 1);
    let mask8 = _mm256_set1_epi32(0xFF);
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
            for (r, xr) in x[g].iter_mut().enumerate() {
                let xv = *xr;
                let slot = _mm256_and_si256(xv, mask12);
                // SAFETY: slots has 4096 entries and slot < 4096.
                let e = unsafe { _mm256_i32gather_epi32::<4>(slots.as_ptr().cast(), slot) };
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
            let at = (first[g] + done) * BLOCK_STATES;
            let dst = &mut outs[g][at..at + 32];
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
}
