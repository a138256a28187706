//! The lane form's decode loop on AVX-512 (with VBMI): sixteen lanes per register, two
//! registers interleaved, the same 32-lane groups as [`super::avx2::rounds`] decodes.
//!
//! Written by hand for what the AVX2 loop cannot do without a gather: a context record's lane
//! finds its next table from the symbol it just decoded. The AVX2 loop gathers that offset
//! from a 256-entry array, a third of the gathers of a neighbour-context plane (the exponent
//! plane of every float keyframe), and gathers bound that loop on AMD Zen 4. Here the table
//! number of each of the 256 symbols sits in four registers and `vpermi2b` looks it up. Mask
//! registers also replace the AVX2 loop's blends. It produces exactly what the scalar loop does
//! (the tests compare the three).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::rans::{Lane, LaneStates, Slots, L, SCALE_BITS};

/// Lanes per register.
const REG: usize = 16;
/// Registers run side by side: a group is `REG · REGS` lanes.
const REGS: usize = 2;
/// The lanes [`rounds`] decodes at once.
pub(in crate::rans) const WIDTH: usize = REG * REGS;

/// Whether this CPU runs [`rounds`].
pub(in crate::rans) fn available() -> bool {
    crate::isa::avx512(false, true)
}

/// [`rounds_of`] as a safe function: the CPU's features are checked (callers choose this loop
/// only where [`available`] says so, so the check never fails in use).
#[allow(clippy::too_many_arguments)]
pub(in crate::rans) fn rounds(
    tables: &Slots,
    bytes: &[u8],
    group: &mut [Lane<'_>],
    k0: usize,
    stride: usize,
    rounds: usize,
    given: Option<&[u8]>,
    out: &mut [u8],
) -> usize {
    assert!(available(), "the AVX-512 loop on a CPU without AVX-512");
    // One loop per kind of record, as in the AVX2 loop: each keeps only its own registers live
    // and tests no mode inside the loop.
    // SAFETY: the CPU has the features the loop is compiled for (asserted above).
    unsafe {
        match (tables.next.is_some(), given.is_some()) {
            (false, false) => rounds_of::<false, false>(tables, bytes, group, k0, stride, rounds, given, out),
            (true, false) => rounds_of::<true, false>(tables, bytes, group, k0, stride, rounds, given, out),
            (_, true) => rounds_of::<false, true>(tables, bytes, group, k0, stride, rounds, given, out),
        }
    }
}

/// Decodes whole words for the [`WIDTH`] lanes `group`, as `super::avx2::rounds::<4>` does
/// (same arguments, same results, same conditions for stopping early): lane `j`'s round-`t`
/// word is word `k0 + j + t·stride` of `out`; returns the rounds decoded. For one kind of
/// record: `FOLLOW`, a context record (its tables follow the symbol before); `GIVEN`, tables
/// given per symbol; neither, order 0.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VBMI ([`available`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[allow(clippy::too_many_arguments)]
unsafe fn rounds_of<const FOLLOW: bool, const GIVEN: bool>(
    tables: &Slots,
    bytes: &[u8],
    group: &mut [Lane<'_>],
    k0: usize,
    stride: usize,
    rounds: usize,
    given: Option<&[u8]>,
    out: &mut [u8],
) -> usize {
    let slots = &tables.slots;
    assert!(!slots.is_empty() && slots.len().is_multiple_of(1 << SCALE_BITS));
    assert_eq!(group.len(), WIDTH);
    // Gather offsets are i32: past 2^31 bytes, or from a state of 2^31 or more (only a damaged
    // record has one), the scalar loop decodes.
    if bytes.len() > i32::MAX as usize || group.iter().any(|lane| lane.x >= 1 << 31) {
        return 0;
    }
    // The table number of a symbol's successor: `next` holds table offsets, multiples of 4096
    // below slots.len(), so of at most 256 tables (a map byte names each). Bytes 0-127 and
    // 128-255, two registers each, for vpermi2b.
    assert_eq!((FOLLOW, GIVEN), (tables.next.is_some() && given.is_none(), given.is_some()));
    let number: [u8; 256] = match &tables.next {
        Some(next) => {
            assert!(next.iter().all(|&t| (t as usize) < slots.len() && t % (1 << SCALE_BITS) == 0));
            std::array::from_fn(|s| (next[s] >> SCALE_BITS) as u8)
        }
        None => [0; 256],
    };
    // SAFETY: loads of 64 bytes from a 256-byte array.
    let number = unsafe {
        let p = number.as_ptr().cast::<__m512i>();
        [
            _mm512_loadu_si512(p),
            _mm512_loadu_si512(p.add(1)),
            _mm512_loadu_si512(p.add(2)),
            _mm512_loadu_si512(p.add(3)),
        ]
    };
    if let Some(g) = given {
        assert_eq!(g.len(), out.len());
    }
    let base = bytes.as_ptr();
    let mut states = LaneStates::of(group);
    let load = |places: &[u32; LaneStates::PLACES], k: usize| {
        // SAFETY: a load of 64 bytes from sixteen of the 32-bit integers of `places`.
        unsafe { _mm512_loadu_si512(places[REG * k..REG * (k + 1)].as_ptr().cast()) }
    };
    let mut off: [__m512i; REGS] = std::array::from_fn(|k| load(&states.off, k));
    let mut x: [__m512i; REGS] = std::array::from_fn(|k| load(&states.x, k));
    let mut ctx: [__m512i; REGS] = std::array::from_fn(|k| load(&states.ctx, k));
    // Given indices are below the table count (the caller checks); this clamp keeps every
    // gather in bounds regardless.
    let last_table = _mm512_set1_epi32((slots.len() - (1 << SCALE_BITS)) as i32);
    let end = _mm512_set1_epi32(bytes.len() as i32);
    let mask12 = _mm512_set1_epi32((1 << SCALE_BITS) - 1);
    let mask8 = _mm512_set1_epi32(0xFF);
    let lower = _mm512_set1_epi32(L as i32);
    let lower2 = _mm512_set1_epi32((L >> 8) as i32);
    let one = _mm512_set1_epi32(1);
    let nine = _mm512_set1_epi32(9);
    // Bytes b0 b1 of each 32-bit element to b1 | b0 << 8: the two bytes a state takes, in the
    // order the decoder reads them (the shuffle works within each 128-bit block).
    let swap2 = _mm512_set4_epi32(
        0x8080_0C0D_u32 as i32,
        0x8080_0809_u32 as i32,
        0x8080_0405_u32 as i32,
        0x8080_0001_u32 as i32,
    );

    // One symbol of sixteen lanes: pop, then refill up to two bytes. Returns the symbols.
    // SAFETY (of the gathers): slot indices are below 4096 and table offsets are multiples of
    // 4096 below slots.len() (from `next`, asserted above, or clamped), so their sums index
    // `slots`; the caller has checked that each lane has four bytes at `off` (the round check).
    let step = |x: &mut __m512i, off: &mut __m512i, ctx: &mut __m512i| -> __m512i {
        let slot = _mm512_and_si512(*x, mask12);
        let at = if FOLLOW || GIVEN { _mm512_add_epi32(*ctx, slot) } else { slot };
        let e = unsafe { _mm512_i32gather_epi32::<4>(at, slots.as_ptr().cast()) };
        let w = unsafe { _mm512_i32gather_epi32::<1>(*off, base.cast()) };
        let sym = _mm512_and_si512(e, mask8);
        if FOLLOW {
            // Each symbol's byte (0-255; the other bytes of its element are 0) looks up its
            // table number: bit 7 chooses between the two halves.
            let low = _mm512_permutex2var_epi8(number[0], sym, number[1]);
            let high = _mm512_permutex2var_epi8(number[2], sym, number[3]);
            let t = _mm512_mask_blend_epi8(_mm512_movepi8_mask(sym), low, high);
            *ctx = _mm512_slli_epi32::<{ SCALE_BITS }>(_mm512_and_si512(t, mask8));
        }
        let freq = _mm512_and_si512(_mm512_srli_epi32::<8>(e), mask12);
        let start = _mm512_srli_epi32::<20>(e);
        let y = _mm512_sub_epi32(
            _mm512_add_epi32(_mm512_mullo_epi32(freq, _mm512_srli_epi32::<{ SCALE_BITS }>(*x)), slot),
            start,
        );
        let take1 = _mm512_cmplt_epu32_mask(y, lower);
        let take2 = _mm512_cmplt_epu32_mask(y, lower2);
        let by_one = _mm512_or_si512(_mm512_slli_epi32::<8>(y), _mm512_and_si512(w, mask8));
        let by_two = _mm512_or_si512(_mm512_slli_epi32::<16>(y), _mm512_shuffle_epi8(w, swap2));
        *x = _mm512_mask_mov_epi32(_mm512_mask_mov_epi32(y, take1, by_one), take2, by_two);
        // A lane moves on a byte per byte taken (a lane taking two is in both masks).
        let past_one = _mm512_mask_add_epi32(*off, take1, *off, one);
        *off = _mm512_mask_add_epi32(past_one, take2, past_one, one);
        sym
    };

    let mut done = 0;
    while done < rounds {
        // Ten bytes past every lane's position: end - off > 9.
        let short = off.iter().fold(0u16, |m, o| m | _mm512_cmpgt_epi32_mask(nine, _mm512_sub_epi32(end, *o)));
        if short != 0 {
            break;
        }
        let q0 = k0 + done * stride;
        let mut gw = [_mm512_setzero_si512(); REGS];
        if GIVEN {
            let g = given.expect("GIVEN");
            let words = &g[4 * q0..4 * q0 + 4 * WIDTH];
            for (k, gk) in gw.iter_mut().enumerate() {
                // SAFETY: a load of 64 bytes from the 64·REGS bytes of `words`.
                *gk = unsafe { _mm512_loadu_si512(words[64 * k..].as_ptr().cast()) };
            }
        }
        let mut w = [_mm512_setzero_si512(); REGS];
        for i in 0..4 {
            let shift = _mm_cvtsi32_si128(8 * i);
            for k in 0..REGS {
                if GIVEN {
                    let t = _mm512_and_si512(_mm512_srl_epi32(gw[k], shift), mask8);
                    ctx[k] = _mm512_min_epu32(_mm512_slli_epi32::<{ SCALE_BITS }>(t), last_table);
                }
                let s = step(&mut x[k], &mut off[k], &mut ctx[k]);
                w[k] = _mm512_or_si512(w[k], _mm512_sll_epi32(s, shift));
            }
        }
        let dst = &mut out[4 * q0..4 * q0 + 4 * WIDTH];
        for (part, wk) in dst.chunks_exact_mut(64).zip(w) {
            // SAFETY: a store of 64 bytes into a 64-byte slice.
            unsafe { _mm512_storeu_si512(part.as_mut_ptr().cast(), wk) };
        }
        done += 1;
    }

    for k in 0..REGS {
        let place = REG * k..REG * (k + 1);
        // SAFETY: stores of 64 bytes into sixteen 32-bit integers each.
        unsafe {
            _mm512_storeu_si512(states.x[place.clone()].as_mut_ptr().cast(), x[k]);
            _mm512_storeu_si512(states.off[place.clone()].as_mut_ptr().cast(), off[k]);
            _mm512_storeu_si512(states.ctx[place].as_mut_ptr().cast(), ctx[k]);
        }
    }
    states.store(group);
    done
}
