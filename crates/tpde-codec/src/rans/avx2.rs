//! The lane form's decode loop on AVX2: sixteen lanes side by side, eight per register, two
//! registers interleaved so one's table lookup overlaps the other's arithmetic.
//!
//! Written by hand because it is the format's hot loop: on one Zen 3 core it decodes the
//! lane form 2.x as fast as the scalar loop (see `decode_lanes`), which is instruction-bound
//! at about seven instructions' worth of cycles per symbol. It decodes exactly what the scalar
//! loop does; the scalar loop finishes every lane and checks how it ends.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::{Lane, L, SCALE_BITS};

/// Lanes per register.
pub(super) const REG: usize = 8;

/// Whether this CPU runs [`rounds`].
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2")
}

/// Decodes whole words for the sixteen lanes `group`, starting at their next word, for as many
/// of the `rounds` as every lane has at least ten bytes left when its round starts (a word
/// takes at most eight, and each refill reads four). Lane `j`'s round-`t` word is word
/// `k0 + j + t·stride` of `out`. Returns the rounds decoded; the lanes' states and positions
/// are updated to match. `bytes` is the region every lane's bytes lie in, at `begin`.
///
/// # Safety
/// The CPU must have AVX2 ([`available`]).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn rounds<const REGS: usize>(
    slots: &[u32],
    bytes: &[u8],
    group: &mut [Lane<'_>],
    k0: usize,
    stride: usize,
    rounds: usize,
    out: &mut [u8],
) -> usize {
    assert_eq!(slots.len(), 1 << SCALE_BITS);
    assert_eq!(group.len(), REG * REGS);
    // Gather offsets are i32, and the compares below are signed: past 2^31 bytes, or from an
    // initial state of 2^31 or more (only a damaged record has one; a state below 2^31 stays
    // below), the scalar loop decodes.
    if bytes.len() > i32::MAX as usize || group.iter().any(|lane| lane.x >= 1 << 31) {
        return 0;
    }
    let base = bytes.as_ptr();
    let lane_offsets = |part: &[Lane<'_>]| {
        let mut off = [0i32; 8];
        let mut end = [0i32; 8];
        for (j, lane) in part.iter().enumerate() {
            // Each lane's bytes are a slice of `bytes`.
            let begin = lane.own.as_ptr() as usize - base as usize;
            off[j] = (begin + lane.pos) as i32;
            end[j] = (begin + lane.own.len()) as i32;
        }
        // SAFETY: loads of 32 bytes from arrays of eight i32.
        unsafe { (_mm256_loadu_si256(off.as_ptr().cast()), _mm256_loadu_si256(end.as_ptr().cast())) }
    };
    let load_states = |part: &[Lane<'_>]| {
        let x: [u32; 8] = std::array::from_fn(|j| part[j].x);
        // SAFETY: a load of 32 bytes from an array of eight u32.
        unsafe { _mm256_loadu_si256(x.as_ptr().cast()) }
    };
    let mut off = [_mm256_setzero_si256(); REGS];
    let mut end = [_mm256_setzero_si256(); REGS];
    let mut x = [_mm256_setzero_si256(); REGS];
    for r in 0..REGS {
        (off[r], end[r]) = lane_offsets(&group[8 * r..8 * r + 8]);
        x[r] = load_states(&group[8 * r..8 * r + 8]);
    }

    let mask12 = _mm256_set1_epi32((1 << SCALE_BITS) - 1);
    let mask8 = _mm256_set1_epi32(0xFF);
    let lower = _mm256_set1_epi32(L as i32);
    let lower2 = _mm256_set1_epi32((L >> 8) as i32);
    let nine = _mm256_set1_epi32(9);
    // Bytes b0 b1 of each 32-bit element to b1 | b0 << 8: the two refill bytes in the order
    // the state takes them.
    let swap2 = _mm256_setr_epi8(
        1, 0, -1, -1, 5, 4, -1, -1, 9, 8, -1, -1, 13, 12, -1, -1, 1, 0, -1, -1, 5, 4, -1, -1, 9, 8, -1, -1, 13, 12, -1,
        -1,
    );

    // One symbol of eight lanes: pop, then refill up to two bytes. Returns the symbols.
    // SAFETY (of the gathers): slot indices are below 4096 = slots.len(); the caller has
    // checked that each lane has four bytes at `off` (see the round check below).
    let step = |x: &mut __m256i, off: &mut __m256i| -> __m256i {
        let slot = _mm256_and_si256(*x, mask12);
        let e = unsafe { _mm256_i32gather_epi32::<4>(slots.as_ptr().cast(), slot) };
        let w = unsafe { _mm256_i32gather_epi32::<1>(base.cast(), *off) };
        let sym = _mm256_and_si256(e, mask8);
        let freq = _mm256_and_si256(_mm256_srli_epi32::<8>(e), mask12);
        let start = _mm256_srli_epi32::<20>(e);
        let y = _mm256_sub_epi32(
            _mm256_add_epi32(_mm256_mullo_epi32(freq, _mm256_srli_epi32::<{ SCALE_BITS as i32 }>(*x)), slot),
            start,
        );
        // y < 2^31 (see above), so signed compares are unsigned ones.
        let one = _mm256_cmpgt_epi32(lower, y);
        let two = _mm256_cmpgt_epi32(lower2, y);
        let by_one = _mm256_or_si256(_mm256_slli_epi32::<8>(y), _mm256_and_si256(w, mask8));
        let by_two = _mm256_or_si256(_mm256_slli_epi32::<16>(y), _mm256_shuffle_epi8(w, swap2));
        *x = _mm256_blendv_epi8(_mm256_blendv_epi8(y, by_one, one), by_two, two);
        // The masks are -1 where a byte was taken.
        *off = _mm256_sub_epi32(*off, _mm256_add_epi32(one, two));
        sym
    };

    let mut done = 0;
    while done < rounds {
        // Every lane needs ten bytes left: end - off > 9.
        let mut short = _mm256_setzero_si256();
        for r in 0..REGS {
            short = _mm256_or_si256(short, _mm256_cmpgt_epi32(nine, _mm256_sub_epi32(end[r], off[r])));
        }
        if _mm256_movemask_epi8(short) != 0 {
            break;
        }
        let mut w = [_mm256_setzero_si256(); REGS];
        for i in 0..4 {
            let shift = _mm_cvtsi32_si128(8 * i);
            for r in 0..REGS {
                let s = step(&mut x[r], &mut off[r]);
                w[r] = _mm256_or_si256(w[r], _mm256_sll_epi32(s, shift));
            }
        }
        // The lanes' words are consecutive words of the output.
        let q0 = k0 + done * stride;
        let dst = &mut out[4 * q0..4 * q0 + 4 * REG * REGS];
        for (part, wr) in dst.chunks_exact_mut(32).zip(w) {
            // SAFETY: a store of 32 bytes into a 32-byte slice.
            unsafe { _mm256_storeu_si256(part.as_mut_ptr().cast(), wr) };
        }
        done += 1;
    }

    let mut xs = [[0u32; 8]; REGS];
    let mut offs = [[0i32; 8]; REGS];
    for (((xs, offs), x), off) in xs.iter_mut().zip(&mut offs).zip(x).zip(off) {
        // SAFETY: stores of 32 bytes into arrays of eight 32-bit integers.
        unsafe {
            _mm256_storeu_si256(xs.as_mut_ptr().cast(), x);
            _mm256_storeu_si256(offs.as_mut_ptr().cast(), off);
        }
    }
    for (j, lane) in group.iter_mut().enumerate() {
        let begin = lane.own.as_ptr() as usize - base as usize;
        lane.x = xs[j / 8][j % 8];
        lane.pos = offs[j / 8][j % 8] as usize - begin;
    }
    done
}
