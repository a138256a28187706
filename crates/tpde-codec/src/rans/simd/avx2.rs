//! The lane form's decode and encode loops on AVX2: eight lanes per register, four registers
//! interleaved so one's table lookups overlap the others' arithmetic.
//!
//! Written by hand because they are the format's hot loops, measured several times as fast as
//! the scalar loops (which are instruction-bound). Both produce exactly what the scalar loops
//! do, which finish every lane (and, decoding, check how it ends).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::rans::{Lane, LaneStates, Slots, Spill, L, SCALE_BITS};

/// Lanes per register.
pub(in crate::rans) const REG: usize = 8;

/// The shuffle taking bytes b0 b1 of each 32-bit element to b1 | b0 << 8: the two bytes a
/// state takes or spills, in the order the decoder reads them.
#[target_feature(enable = "avx2")]
fn swap_low_pair() -> __m256i {
    _mm256_setr_epi8(
        1, 0, -1, -1, 5, 4, -1, -1, 9, 8, -1, -1, 13, 12, -1, -1, 1, 0, -1, -1, 5, 4, -1, -1, 9, 8, -1, -1, 13, 12, -1,
        -1,
    )
}

/// Whether this CPU runs [`rounds`].
pub(in crate::rans) fn available() -> bool {
    crate::isa::avx2()
}

/// Decodes whole words for the `REG·REGS` lanes `group` (or, with one register, for its 1 to 8
/// lanes: a plane's last lanes past a multiple of eight), starting at their next word, for as many
/// of the `rounds` as `bytes` has at least ten bytes left past every lane's position when the
/// round starts (a word takes at most eight, and each refill reads four). Lane `j`'s round-`t`
/// word is word `k0 + j + t·stride` of `out`. Returns the rounds decoded; the lanes' states and
/// positions are updated to match. `bytes` holds every lane's bytes (lane `j`'s from its
/// `begin`) and may go on past them. Only its end bounds the rounds, not each lane's, so that
/// the lanes of a plane under a bit per symbol (a few dozen bytes each) decode here almost to
/// their ends: a lane of a damaged record may then take bytes past its own, which the caller
/// checks. `given`: each symbol's table index, for a record whose tables are given per symbol
/// (one per byte of `out`). Callers choose this loop only where [`available`] says so; it
/// checks again, which makes it safe to call.
#[allow(clippy::too_many_arguments)]
pub(in crate::rans) fn rounds<const REGS: usize>(
    tables: &Slots,
    bytes: &[u8],
    group: &mut [Lane<'_>],
    k0: usize,
    stride: usize,
    rounds: usize,
    given: Option<&[u8]>,
    out: &mut [u8],
) -> usize {
    assert!(available(), "the AVX2 loop on a CPU without AVX2");
    // One loop per kind of record, so that each keeps only its own registers live and tests
    // no mode inside the loop.
    // SAFETY: the CPU has AVX2 (asserted above).
    unsafe {
        match (tables.next.is_some(), given.is_some()) {
            (false, false) => rounds_of::<REGS, false, false>(tables, bytes, group, k0, stride, rounds, given, out),
            (true, false) => rounds_of::<REGS, true, false>(tables, bytes, group, k0, stride, rounds, given, out),
            (_, true) => rounds_of::<REGS, false, true>(tables, bytes, group, k0, stride, rounds, given, out),
        }
    }
}

/// [`rounds`] for one kind of record: `FOLLOW`, a context record; `GIVEN`, tables given per
/// symbol.
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn rounds_of<const REGS: usize, const FOLLOW: bool, const GIVEN: bool>(
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
    assert!(group.len() == REG * REGS || (REGS == 1 && (1..REG).contains(&group.len())));
    // A register of fewer lanes fills its other places with copies of them (place j runs lane
    // j mod r), which take the same words and bytes and whose symbols are never stored.
    let r = group.len();
    let source = |j: usize| j % r;
    // A context record's lanes each start their next symbol's table at `ctx` (an offset into
    // `slots`), set from the symbol before through `next`; an order-0 record's stay at 0.
    let next: &[u32; 256] = tables.next.as_deref().unwrap_or(&[0; 256]);
    assert!(next.iter().all(|&t| (t as usize) < slots.len()));
    // Gather offsets are i32, and the compares below are signed: past 2^31 bytes, or from an
    // initial state of 2^31 or more (only a damaged record has one; a state below 2^31 stays
    // below), the scalar loop decodes.
    if bytes.len() > i32::MAX as usize || group.iter().any(|lane| lane.x >= 1 << 31) {
        return 0;
    }
    let base = bytes.as_ptr();
    let mut states = LaneStates::of(group);
    let load = |places: &[u32; LaneStates::PLACES], k: usize| {
        // SAFETY: a load of 32 bytes from eight of the 32-bit integers of `places`.
        unsafe { _mm256_loadu_si256(places[REG * k..REG * (k + 1)].as_ptr().cast()) }
    };
    let mut off: [__m256i; REGS] = std::array::from_fn(|k| load(&states.off, k));
    let mut x: [__m256i; REGS] = std::array::from_fn(|k| load(&states.x, k));
    let mut ctx: [__m256i; REGS] = std::array::from_fn(|k| load(&states.ctx, k));
    // For fewer lanes: the places that are lanes' own (all -1 bits), and each place's lane.
    let partial = r < REG;
    let own = _mm256_cmpgt_epi32(_mm256_set1_epi32(r as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    let places: [i32; REG] = std::array::from_fn(|j| source(j) as i32);
    // SAFETY: a load of 32 bytes from an array of eight i32.
    let places = unsafe { _mm256_loadu_si256(places.as_ptr().cast()) };
    // Lanes look their table up at `ctx`: set through `next` from the symbol before (context
    // records), or from `given` before every symbol.
    if let Some(g) = given {
        assert_eq!(g.len(), out.len());
    }
    // Given indices are below the table count (the caller checks), and this clamp keeps every
    // gather in bounds regardless.
    let last_table = _mm256_set1_epi32((slots.len() - (1 << SCALE_BITS)) as i32);
    let end = _mm256_set1_epi32(bytes.len() as i32);

    let mask12 = _mm256_set1_epi32((1 << SCALE_BITS) - 1);
    let mask8 = _mm256_set1_epi32(0xFF);
    let lower = _mm256_set1_epi32(L as i32);
    let lower2 = _mm256_set1_epi32((L >> 8) as i32);
    let nine = _mm256_set1_epi32(9);
    let swap2 = swap_low_pair();

    // One symbol of eight lanes: pop, then refill up to two bytes. Returns the symbols.
    // SAFETY (of the gathers): slot indices are below 4096 and table offsets are entries of
    // `next` (or the lanes' own, also taken from `next`), or clamped to the last table, so
    // their sums are below slots.len() (asserted above); symbols index the 256 of `next`; the
    // caller has checked that each lane has four bytes at `off` (see the round check below).
    let step = |x: &mut __m256i, off: &mut __m256i, ctx: &mut __m256i| -> __m256i {
        let slot = _mm256_and_si256(*x, mask12);
        let at = if FOLLOW || GIVEN { _mm256_add_epi32(*ctx, slot) } else { slot };
        let e = unsafe { _mm256_i32gather_epi32::<4>(slots.as_ptr().cast(), at) };
        let w = unsafe { _mm256_i32gather_epi32::<1>(base.cast(), *off) };
        let sym = _mm256_and_si256(e, mask8);
        if FOLLOW {
            *ctx = unsafe { _mm256_i32gather_epi32::<4>(next.as_ptr().cast(), sym) };
        }
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
        // Ten bytes past every lane's position: end - off > 9.
        let mut short = _mm256_setzero_si256();
        for off in &off {
            short = _mm256_or_si256(short, _mm256_cmpgt_epi32(nine, _mm256_sub_epi32(end, *off)));
        }
        if _mm256_movemask_epi8(short) != 0 {
            break;
        }
        // The lanes' words are consecutive words of the output.
        let q0 = k0 + done * stride;
        // Their given table indices: the same words of `given`, a lane's word in each 32 bits.
        let mut gw = [_mm256_setzero_si256(); REGS];
        if GIVEN {
            let g = given.expect("GIVEN");
            let words = &g[4 * q0..4 * q0 + 4 * r];
            if partial {
                // SAFETY: a masked load of the r words of `words`; the others are not read.
                let mine = unsafe { _mm256_maskload_epi32(words.as_ptr().cast(), own) };
                gw[0] = _mm256_permutevar8x32_epi32(mine, places);
            } else {
                for (k, gk) in gw.iter_mut().enumerate() {
                    // SAFETY: a load of 32 bytes from the 32·REGS bytes of `words`.
                    *gk = unsafe { _mm256_loadu_si256(words[32 * k..].as_ptr().cast()) };
                }
            }
        }
        let mut w = [_mm256_setzero_si256(); REGS];
        for i in 0..4 {
            let shift = _mm_cvtsi32_si128(8 * i);
            for k in 0..REGS {
                if GIVEN {
                    let t = _mm256_and_si256(_mm256_srl_epi32(gw[k], shift), mask8);
                    ctx[k] = _mm256_min_epu32(_mm256_slli_epi32::<{ SCALE_BITS as i32 }>(t), last_table);
                }
                let s = step(&mut x[k], &mut off[k], &mut ctx[k]);
                w[k] = _mm256_or_si256(w[k], _mm256_sll_epi32(s, shift));
            }
        }
        let dst = &mut out[4 * q0..4 * q0 + 4 * r];
        if partial {
            // SAFETY: a masked store of the lanes' r words into the 4·r bytes of `dst`.
            unsafe { _mm256_maskstore_epi32(dst.as_mut_ptr().cast(), own, w[0]) };
        } else {
            for (part, wk) in dst.chunks_exact_mut(32).zip(w) {
                // SAFETY: a store of 32 bytes into a 32-byte slice.
                unsafe { _mm256_storeu_si256(part.as_mut_ptr().cast(), wk) };
            }
        }
        done += 1;
    }

    for k in 0..REGS {
        let place = REG * k..REG * (k + 1);
        // SAFETY: stores of 32 bytes into eight 32-bit integers each.
        unsafe {
            _mm256_storeu_si256(states.x[place.clone()].as_mut_ptr().cast(), x[k]);
            _mm256_storeu_si256(states.off[place.clone()].as_mut_ptr().cast(), off[k]);
            _mm256_storeu_si256(states.ctx[place].as_mut_ptr().cast(), ctx[k]);
        }
    }
    states.store(group);
    done
}

/// Quotient and remainder of `x / f`, for `0 < f < 2^12` and `x < 2^19·f` (an encoder's state
/// after renormalisation), so `x / f < 2^19`. The single-precision quotient is within
/// `2^19·2^-23 = 1/16` of the true one (two roundings of 2^-24 each), so its truncation is
/// q - 1, q or q + 1, which the remainder's sign and size correct. (Two gathers of 1/f as
/// doubles, the earlier way, measured slower.)
#[target_feature(enable = "avx2")]
#[inline]
fn divide(x: __m256i, f: __m256i) -> (__m256i, __m256i) {
    let q = _mm256_cvttps_epi32(_mm256_div_ps(_mm256_cvtepi32_ps(x), _mm256_cvtepi32_ps(f)));
    let rem = _mm256_sub_epi32(x, _mm256_mullo_epi32(q, f));
    let under = _mm256_cmpgt_epi32(_mm256_setzero_si256(), rem);
    let over = _mm256_cmpgt_epi32(rem, _mm256_sub_epi32(f, _mm256_set1_epi32(1)));
    // The masks are -1 where true.
    let rem = _mm256_sub_epi32(_mm256_add_epi32(rem, _mm256_and_si256(under, f)), _mm256_and_si256(over, f));
    (_mm256_sub_epi32(_mm256_add_epi32(q, under), over), rem)
}

/// Lanes the vector encoder runs side by side: four registers of eight.
pub(in crate::rans) const ENCODE_WIDTH: usize = 32;

/// [`encode_rounds_unchecked`] as a safe function: the CPU's features are checked (callers choose
/// this loop only where [`available`] says so, so the check never fails in use).
#[allow(clippy::too_many_arguments)]
pub(in crate::rans) fn encode_rounds(
    info: &[u32],
    given: Option<&[u8]>,
    symbols: &[u8],
    k0: usize,
    stride: usize,
    full: usize,
    x: &mut [u32; ENCODE_WIDTH],
    spills: &mut [Spill; ENCODE_WIDTH],
) {
    assert!(available(), "the AVX2 loop on a CPU without AVX2");
    // SAFETY: the CPU has the features the loop is compiled for (asserted above).
    unsafe { encode_rounds_unchecked(info, given, symbols, k0, stride, full, x, spills) }
}

/// Encodes rounds `full - 1` down to 0 of the 32 lanes `k0..k0 + 32` (their words
/// `k0 + j + t·stride`, all whole), continuing from states `x` and the spill buffers, exactly
/// as the scalar loop of `SymbolEncoder::lanes` does. `info`: each table's `SymbolEncoder::info`, one after
/// another; symbol i is coded with table `given[i]`, or the first without `given`.
///
/// # Safety
/// The CPU must have AVX2 ([`available`]).
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn encode_rounds_unchecked(
    info: &[u32],
    given: Option<&[u8]>,
    symbols: &[u8],
    k0: usize,
    stride: usize,
    full: usize,
    x: &mut [u32; ENCODE_WIDTH],
    spills: &mut [Spill; ENCODE_WIDTH],
) {
    const REGS: usize = ENCODE_WIDTH / REG;
    assert!(!info.is_empty() && info.len().is_multiple_of(256) && given.is_none_or(|g| g.len() == symbols.len()));
    // Table indices are clamped to the last table, so every gather is in bounds.
    let last_table = _mm256_set1_epi32((info.len() / 256 - 1) as i32);
    let mask8 = _mm256_set1_epi32(0xFF);
    let mask12 = _mm256_set1_epi32((1 << SCALE_BITS) - 1);
    let ones = _mm256_set1_epi32(1);
    let swap2 = swap_low_pair();
    // Each of the 4·full symbols moves a lane down by at most two bytes and writes the two
    // bytes just below its position: with this much room, every write below is in bounds.
    // (Spill buffers hold two bytes per symbol of a lane, ~32 KiB: positions fit an i32.)
    for spill in spills.iter() {
        assert!(spill.at <= spill.buf.len() && spill.at >= 8 * full + 2 && spill.buf.len() < 1 << 30);
    }
    let bufs: [*mut u8; ENCODE_WIDTH] = std::array::from_fn(|j| spills[j].buf.as_mut_ptr());
    let mut xs = [_mm256_setzero_si256(); REGS];
    let mut ats = [_mm256_setzero_si256(); REGS];
    for r in 0..REGS {
        let at: [i32; REG] = std::array::from_fn(|j| spills[REG * r + j].at as i32);
        // SAFETY: loads of 32 bytes from eight u32 / i32.
        xs[r] = unsafe { _mm256_loadu_si256(x[REG * r..].as_ptr().cast()) };
        ats[r] = unsafe { _mm256_loadu_si256(at.as_ptr().cast()) };
    }
    // One symbol of every lane: all four registers' table gathers first, so that their
    // latencies overlap, then renormalisation, spills and the state update.
    // SAFETY (gathers): a symbol plus 256 times a clamped table index is inside `info`.
    let step = |xs: &mut [__m256i; REGS], ats: &mut [__m256i; REGS], s: [__m256i; REGS]| {
        let info: [__m256i; REGS] =
            std::array::from_fn(|r| unsafe { _mm256_i32gather_epi32::<4>(info.as_ptr().cast(), s[r]) });
        let f: [__m256i; REGS] = std::array::from_fn(|r| _mm256_and_si256(info[r], mask12));
        let mut pairs = [0u32; ENCODE_WIDTH];
        let mut at = [0i32; ENCODE_WIDTH];
        let mut x2 = [_mm256_setzero_si256(); REGS];
        for r in 0..REGS {
            // x ≥ x_max = 2^19·f spills a byte, at most twice (x < 2^31, so signed compares do).
            let x_max_less1 = _mm256_sub_epi32(_mm256_slli_epi32::<19>(f[r]), ones);
            let one = _mm256_cmpgt_epi32(xs[r], x_max_less1);
            let x1 = _mm256_blendv_epi8(xs[r], _mm256_srli_epi32::<8>(xs[r]), one);
            let two = _mm256_cmpgt_epi32(x1, x_max_less1);
            x2[r] = _mm256_blendv_epi8(x1, _mm256_srli_epi32::<8>(x1), two);
            // SAFETY: stores of 32 bytes into eight u32 / i32.
            unsafe {
                _mm256_storeu_si256(pairs[REG * r..].as_mut_ptr().cast(), _mm256_shuffle_epi8(xs[r], swap2));
                _mm256_storeu_si256(at[REG * r..].as_mut_ptr().cast(), ats[r]);
            }
            // The masks are -1 where a byte was spilled.
            ats[r] = _mm256_add_epi32(ats[r], _mm256_add_epi32(one, two));
        }
        // Each lane writes its low two bytes, in the order the decoder reads them, just below
        // its position, then moves down by the bytes it spilled (0, 1 or 2): a byte not
        // spilled lies below the lane's bytes until a later spill overwrites it.
        for j in 0..ENCODE_WIDTH {
            // SAFETY: 2 ≤ at[j] - 2 + 2 ≤ buf.len() by the room check above.
            unsafe { bufs[j].add(at[j] as usize - 2).cast::<u16>().write_unaligned(pairs[j] as u16) };
        }
        for r in 0..REGS {
            let start = _mm256_srli_epi32::<{ SCALE_BITS as i32 }>(info[r]);
            let (q, rem) = divide(x2[r], f[r]);
            xs[r] = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32::<{ SCALE_BITS as i32 }>(q), rem), start);
        }
    };
    for t in (0..full).rev() {
        let q0 = k0 + t * stride;
        let words = &symbols[4 * q0..4 * (q0 + ENCODE_WIDTH)];
        let mut w = [_mm256_setzero_si256(); REGS];
        let tables = given.map(|g| &g[4 * q0..4 * (q0 + ENCODE_WIDTH)]);
        let mut tw = [_mm256_setzero_si256(); REGS];
        for r in 0..REGS {
            // SAFETY: loads of 32 bytes from the 128 bytes of `words` and of `tables`.
            w[r] = unsafe { _mm256_loadu_si256(words[32 * r..].as_ptr().cast()) };
            if let Some(tables) = tables {
                tw[r] = unsafe { _mm256_loadu_si256(tables[32 * r..].as_ptr().cast()) };
            }
        }
        for i in (0..4).rev() {
            let shift = _mm_cvtsi32_si128(8 * i);
            step(
                &mut xs,
                &mut ats,
                std::array::from_fn(|r| {
                    let s = _mm256_and_si256(_mm256_srl_epi32(w[r], shift), mask8);
                    if given.is_none() {
                        return s;
                    }
                    let t = _mm256_min_epu32(_mm256_and_si256(_mm256_srl_epi32(tw[r], shift), mask8), last_table);
                    _mm256_or_si256(s, _mm256_slli_epi32::<8>(t))
                }),
            );
        }
    }
    for r in 0..REGS {
        let mut at = [0i32; REG];
        // SAFETY: stores of 32 bytes into eight u32 / i32.
        unsafe {
            _mm256_storeu_si256(x[REG * r..].as_mut_ptr().cast(), xs[r]);
            _mm256_storeu_si256(at.as_mut_ptr().cast(), ats[r]);
        }
        for (spill, a) in spills[REG * r..REG * (r + 1)].iter_mut().zip(at) {
            spill.at = a as usize;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`divide`] at every frequency, for the quotients where single precision errs the most
    /// (the largest) and at both sides of every multiple of f there.
    #[test]
    #[cfg_attr(feature = "no-avx2-tests", ignore = "built with --features no-avx2-tests: no AVX2 here")]
    fn divide_is_exact() {
        crate::rans::require_avx2();
        let check = |xs: [u32; REG], f: u32| {
            // SAFETY: AVX2 checked above; loads and stores of eight u32.
            let (q, r) = unsafe {
                let (q, r) = divide(_mm256_loadu_si256(xs.as_ptr().cast()), _mm256_set1_epi32(f as i32));
                let (mut qs, mut rs) = ([0u32; REG], [0u32; REG]);
                _mm256_storeu_si256(qs.as_mut_ptr().cast(), q);
                _mm256_storeu_si256(rs.as_mut_ptr().cast(), r);
                (qs, rs)
            };
            for j in 0..REG {
                assert_eq!((q[j], r[j]), (xs[j] / f, xs[j] % f), "{} / {f}", xs[j]);
            }
        };
        for f in 1..1u32 << SCALE_BITS {
            let top = (1u32 << 19) * f;
            for k in (1u32 << 19) - 64..1 << 19 {
                let at = k * f;
                check([at - 1, at, at + 1, at + f - 1, at.wrapping_sub(f / 2), top - 1, k, k * (f / 3 + 1) - 1], f);
            }
        }
    }
}
