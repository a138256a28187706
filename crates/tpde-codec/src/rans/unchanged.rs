//! Mode 7's unchanged contexts (spec §6.4.2, since 1.11). A map entry of [`UNCHANGED`] says that
//! the elements of that base context hold byte 0 in the plane and are not coded: in a
//! fine-tune's bf16 weights most elements lie in such contexts (a weight whose exponent is large
//! moves by less than its last place). Block b of the record codes only the other elements of
//! its 65536, in order; the decoder leaves the unchanged elements' table indices out (a
//! compress), decodes the rest, and puts the symbols back among zeros (an expand).
//!
//! The two passes are written by hand: no crate compresses bytes by a mask, and the passes
//! decide whether leaving elements out pays (`examples/constant_contexts`: 0.07 ns an element
//! with AVX-512 VBMI2's byte compress and expand, 0.31 with byte shuffles from a table on AVX2,
//! 0.7 with BMI2's pext/pdep, which ate the whole gain).

use std::ops::Range;

use super::blocks::block_ranges;

/// A map entry of a mode 7 record: the context's elements hold 0 in the plane, not coded.
pub const UNCHANGED: u8 = 0xFF;

/// Bytes past the coded symbols that [`expand`] may read.
pub(crate) const PADDING: usize = 64;

/// The table indices of the coded elements of `tables` (those not [`UNCHANGED`]), in order,
/// into the start of `coded` (of any length and content, grown as needed and not shortened: a
/// thread's buffer zeroed afresh for every plane was 1.5% of a bf16 delta's unpack), and where
/// each block of `size` elements has its share of them: one range a block, one after another
/// from 0, so the last range's end is how many were coded.
pub(crate) fn leave_out(tables: &[u8], size: usize, coded: &mut Vec<u8>) -> Vec<Range<usize>> {
    leave_out_of(tables, tables, size, coded)
}

/// [`leave_out`] of `values` (the encoder's symbols, one per element of `tables`).
pub(crate) fn leave_out_of(tables: &[u8], values: &[u8], size: usize, coded: &mut Vec<u8>) -> Vec<Range<usize>> {
    assert_eq!(tables.len(), values.len());
    // Room for a whole vector's store past the last kept byte.
    if coded.len() < tables.len() + PADDING {
        coded.resize(tables.len() + PADDING, 0);
    }
    let mut at = 0;
    block_ranges(tables.len(), size)
        .into_iter()
        .map(|block| {
            let start = at;
            at = compress(&tables[block.clone()], &values[block], coded, at);
            start..at
        })
        .collect()
}

/// How many elements `ranges` (from [`leave_out`]) say were coded.
pub(crate) fn coded_count(ranges: &[Range<usize>]) -> usize {
    ranges.last().map_or(0, |r| r.end)
}

/// Appends the bytes of `values` whose byte of `tables` is not [`UNCHANGED`] to `coded` at
/// `at` (which has [`PADDING`] bytes past room for them all), returning where they end.
#[allow(unsafe_code)]
fn compress(tables: &[u8], values: &[u8], coded: &mut [u8], at: usize) -> usize {
    assert!(values.len() == tables.len() && coded.len() >= at + tables.len() + PADDING);
    #[cfg(target_arch = "x86_64")]
    {
        if crate::isa::avx512_vbmi2() {
            // SAFETY: the CPU has AVX-512 BW and VBMI2; `coded` has room (asserted).
            return unsafe { simd::compress512(tables, values, coded, at) };
        }
        if crate::isa::avx2() {
            // SAFETY: the CPU has AVX2; `coded` has room (asserted).
            return unsafe { simd::compress_shuffles(tables, values, coded, at) };
        }
    }
    compress_scalar(tables, values, coded, at)
}

fn compress_scalar(tables: &[u8], values: &[u8], coded: &mut [u8], mut at: usize) -> usize {
    for (&t, &v) in tables.iter().zip(values) {
        // Branchless: written either way, kept if coded.
        coded[at] = v;
        at += usize::from(t != UNCHANGED);
    }
    at
}

/// Puts `symbols` (the coded elements' decoded symbols, in order, then [`PADDING`] bytes, which
/// let the vector loops run to the end) at the elements of `out` whose table index in `tables` is not [`UNCHANGED`], and 0
/// at the others.
#[allow(unsafe_code)]
pub(crate) fn expand(tables: &[u8], symbols: &[u8], out: &mut [u8]) {
    assert_eq!(tables.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    {
        if crate::isa::avx512_vbmi2() {
            // SAFETY: the CPU has AVX-512 BW and VBMI2.
            return unsafe { simd::expand512(tables, symbols, out) };
        }
        if crate::isa::avx2() {
            // SAFETY: the CPU has AVX2.
            return unsafe { simd::expand_shuffles(tables, symbols, out) };
        }
    }
    expand_scalar(tables, symbols, out, 0);
}

fn expand_scalar(tables: &[u8], symbols: &[u8], out: &mut [u8], mut at: usize) {
    for (o, &t) in out.iter_mut().zip(tables) {
        let coded = t != UNCHANGED;
        *o = if coded { symbols[at] } else { 0 };
        at += usize::from(coded);
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod simd {
    use std::arch::x86_64::*;

    use super::{compress_scalar, expand_scalar, UNCHANGED};

    /// For each mask of 8 kept bytes: the byte shuffle that packs the kept ones to the front.
    static PACK: [[u8; 16]; 256] = shuffles(true);
    /// For each mask of 8 kept bytes: the byte shuffle that spreads packed bytes to the kept
    /// places, and zero to the others.
    static SPREAD: [[u8; 16]; 256] = shuffles(false);

    const fn shuffles(pack: bool) -> [[u8; 16]; 256] {
        let mut t = [[0x80u8; 16]; 256];
        let mut m = 0;
        while m < 256 {
            let (mut i, mut r) = (0, 0);
            while i < 8 {
                if m >> i & 1 == 1 {
                    if pack {
                        t[m][r] = i as u8;
                    } else {
                        t[m][i] = r as u8;
                    }
                    r += 1;
                }
                i += 1;
            }
            m += 1;
        }
        t
    }

    /// Which of the low 8 bytes of `x` are kept (not [`UNCHANGED`]), as a bit mask.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline(always)]
    unsafe fn kept8(x: __m128i) -> usize {
        (!_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8(UNCHANGED as i8))) & 0xFF) as usize
    }

    /// [`super::compress`] eight bytes at a time by a byte shuffle from [`PACK`].
    ///
    /// # Safety
    /// The CPU must have AVX2; `values` must be as long as `tables`, and `coded` must have 16
    /// bytes past room for every byte of them.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn compress_shuffles(tables: &[u8], values: &[u8], coded: &mut [u8], mut at: usize) -> usize {
        let whole = tables.len() / 8 * 8;
        for (c, v) in tables.chunks_exact(8).zip(values.chunks_exact(8)) {
            // SAFETY: 8 bytes read from `c` and `v`; 8 written at `at`, within `coded`.
            let m = kept8(_mm_loadl_epi64(c.as_ptr().cast()));
            let x = _mm_loadl_epi64(v.as_ptr().cast());
            let packed = _mm_shuffle_epi8(x, _mm_loadu_si128(PACK[m].as_ptr().cast()));
            _mm_storel_epi64(coded.as_mut_ptr().add(at).cast(), packed);
            at += m.count_ones() as usize;
        }
        compress_scalar(&tables[whole..], &values[whole..], coded, at)
    }

    /// [`super::expand`] eight bytes at a time by a byte shuffle from [`SPREAD`], while 8
    /// symbols are left to read (the scalar loop does the rest, and fails on too few).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn expand_shuffles(tables: &[u8], symbols: &[u8], out: &mut [u8]) {
        let mut at = 0;
        let mut whole = 0;
        for (o, c) in out.chunks_exact_mut(8).zip(tables.chunks_exact(8)) {
            if at + 8 > symbols.len() {
                break;
            }
            whole += 8;
            // SAFETY: 8 bytes read from `c`, 8 at `at` (checked above), 8 written to `o`.
            let m = kept8(_mm_loadl_epi64(c.as_ptr().cast()));
            let v = _mm_loadl_epi64(symbols.as_ptr().add(at).cast());
            _mm_storel_epi64(o.as_mut_ptr().cast(), _mm_shuffle_epi8(v, _mm_loadu_si128(SPREAD[m].as_ptr().cast())));
            at += m.count_ones() as usize;
        }
        expand_scalar(&tables[whole..], symbols, &mut out[whole..], at);
    }

    /// [`super::compress`] 64 bytes at a time by AVX-512 VBMI2's byte compress.
    ///
    /// # Safety
    /// The CPU must have AVX-512 BW and VBMI2; `values` must be as long as `tables`, and
    /// `coded` must have 64 bytes past room for every byte of them.
    #[target_feature(enable = "avx512bw,avx512vbmi2")]
    pub(super) unsafe fn compress512(tables: &[u8], values: &[u8], coded: &mut [u8], mut at: usize) -> usize {
        let skip = _mm512_set1_epi8(UNCHANGED as i8);
        let whole = tables.len() / 64 * 64;
        for (c, v) in tables.chunks_exact(64).zip(values.chunks_exact(64)) {
            // SAFETY: 64 bytes read from `c` and `v`; 64 written at `at`, within `coded`.
            let k = _mm512_cmpneq_epi8_mask(_mm512_loadu_si512(c.as_ptr().cast()), skip);
            let x = _mm512_loadu_si512(v.as_ptr().cast());
            _mm512_storeu_si512(coded.as_mut_ptr().add(at).cast(), _mm512_maskz_compress_epi8(k, x));
            at += k.count_ones() as usize;
        }
        compress_scalar(&tables[whole..], &values[whole..], coded, at)
    }

    /// [`super::expand`] 64 bytes at a time by AVX-512 VBMI2's byte expand, while 64 symbols
    /// are left to read (the scalar loop does the rest, and fails on too few).
    ///
    /// # Safety
    /// The CPU must have AVX-512 BW and VBMI2.
    #[target_feature(enable = "avx512bw,avx512vbmi2")]
    pub(super) unsafe fn expand512(tables: &[u8], symbols: &[u8], out: &mut [u8]) {
        let skip = _mm512_set1_epi8(UNCHANGED as i8);
        let mut at = 0;
        let mut whole = 0;
        for (o, c) in out.chunks_exact_mut(64).zip(tables.chunks_exact(64)) {
            if at + 64 > symbols.len() {
                break;
            }
            whole += 64;
            // SAFETY: 64 bytes read from `c`, 64 at `at` (checked above), 64 written to `o`.
            let k = _mm512_cmpneq_epi8_mask(_mm512_loadu_si512(c.as_ptr().cast()), skip);
            let v = _mm512_loadu_si512(symbols.as_ptr().add(at).cast());
            _mm512_storeu_si512(o.as_mut_ptr().cast(), _mm512_maskz_expand_epi8(k, v));
            at += k.count_ones() as usize;
        }
        expand_scalar(&tables[whole..], symbols, &mut out[whole..], at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vector loop pair under test: its name, whether the CPU has it, compress and expand.
    #[cfg(target_arch = "x86_64")]
    type VectorLoops =
        (&'static str, bool, unsafe fn(&[u8], &[u8], &mut [u8], usize) -> usize, unsafe fn(&[u8], &[u8], &mut [u8]));

    /// Every loop the CPU has leaves out and puts back what the scalar ones do, at lengths
    /// around the vectors' and blocks' sizes, with none, few, half, most and all elements
    /// unchanged.
    #[test]
    fn every_loop_leaves_out_and_expands_as_the_scalar_one() {
        let mut x = 0x9E37_79B9u32;
        for n in [0, 1, 7, 8, 9, 63, 64, 65, 1000, 70_000] {
            for unchanged in [0u32, 1, 128, 250, 256] {
                let tables: Vec<u8> = (0..n)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        if x % 256 < unchanged {
                            UNCHANGED
                        } else {
                            (x >> 8) as u8 % 16
                        }
                    })
                    .collect();
                let case = format!("n {n}, {unchanged}/256 unchanged");
                let kept: Vec<u8> = tables.iter().copied().filter(|&t| t != UNCHANGED).collect();
                let mut coded = Vec::new();
                let ranges = leave_out(&tables, 65_536, &mut coded);
                assert_eq!(coded[..coded_count(&ranges)], kept, "{case}");
                assert_eq!(
                    ranges,
                    block_ranges(n, 65_536)
                        .iter()
                        .scan(0, |at, b| {
                            let start = *at;
                            *at += tables[b.clone()].iter().filter(|&&t| t != UNCHANGED).count();
                            Some(start..*at)
                        })
                        .collect::<Vec<_>>(),
                    "{case}"
                );
                // Symbols: the kept indices plus one, so that none is an unchanged element's 0.
                let mut symbols: Vec<u8> = kept.iter().map(|t| t + 1).collect();
                symbols.resize(kept.len() + PADDING, 0xEE);
                let want: Vec<u8> = tables.iter().map(|&t| if t == UNCHANGED { 0 } else { t + 1 }).collect();
                let mut got = vec![0x55u8; n];
                expand_scalar(&tables, &symbols, &mut got, 0);
                assert_eq!(got, want, "scalar, {case}");
                let mut packed = vec![0u8; n + PADDING];
                let end = compress_scalar(&tables, &tables, &mut packed, 0);
                assert_eq!(&packed[..end], &kept[..], "scalar, {case}");
                #[cfg(target_arch = "x86_64")]
                #[allow(unsafe_code)]
                {
                    // SAFETY: each loop runs only where the CPU has what it is compiled for.
                    let loops: [VectorLoops; 2] = [
                        ("avx2", crate::isa::avx2(), simd::compress_shuffles, simd::expand_shuffles),
                        ("vbmi2", crate::isa::avx512_vbmi2(), simd::compress512, simd::expand512),
                    ];
                    for (name, has, compress, expand) in loops {
                        if !has {
                            continue;
                        }
                        let mut packed = vec![0u8; n + PADDING];
                        let end = unsafe { compress(&tables, &tables, &mut packed, 0) };
                        assert_eq!(&packed[..end], &kept[..], "{name}, {case}");
                        let mut got = vec![0x55u8; n];
                        unsafe { expand(&tables, &symbols, &mut got) };
                        assert_eq!(got, want, "{name}, {case}");
                    }
                }
            }
        }
    }

    /// Records whose map leaves contexts out (spec §6.4.2): every encoder writes the scalar
    /// one's bytes, every block loop reads them back and, on damaged records, gives the same
    /// verdict and symbols; blocks with none, some and all elements coded.
    #[test]
    fn records_leaving_contexts_out_agree_in_every_loop() {
        use crate::rans::{BlockLayout, BlockLoop, Contexts, CONTEXT_BLOCK_SYMBOLS};
        let loops: Vec<BlockLoop> =
            [BlockLoop::Scalar, BlockLoop::Avx2, BlockLoop::Avx512].into_iter().filter(|l| l.available()).collect();
        let mut x = 0x2545_F491u32;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for n in [1, 33, 65_536, 65_537, 2 * 65_536 + 4099] {
            // Contexts 0-7 change (by more, the smaller); 8-15 never do; the second block's
            // elements all lie in 8-15.
            let contexts: Vec<u8> = (0..n)
                .map(|i| if (65_536..131_072).contains(&i) { 8 + next() as u8 % 8 } else { next() as u8 % 16 })
                .collect();
            let plane: Vec<u8> =
                contexts.iter().map(|&k| if k >= 8 { 0 } else { (next() % (1 << (8 - k))) as u8 }).collect();
            let map: [u8; 256] = std::array::from_fn(|k| if (8..16).contains(&k) { UNCHANGED } else { (k % 4) as u8 });
            let tables: Vec<u8> = contexts.iter().map(|&k| map[usize::from(k)]).collect();
            let model = Contexts::count_tables(map, &plane, &tables);
            assert!(model.has_unchanged());
            let mut scalar = Vec::new();
            model.encode_given_blocks_with(&plane, &tables, &mut scalar, BlockLoop::Scalar);
            for &widest in &loops {
                let mut other = Vec::new();
                model.encode_given_blocks_with(&plane, &tables, &mut other, widest);
                assert!(other == scalar, "{widest:?} encoder, n {n}");
            }
            let (read, rest) = Contexts::read_base_blocks(&scalar).unwrap();
            assert_eq!(read, model);
            let at = scalar.len() - rest.len();
            let decode = |stored: &[u8], l| {
                let layout = BlockLayout::read_sized(stored, at, n, CONTEXT_BLOCK_SYMBOLS)?;
                let mut out = vec![0x55u8; n];
                read.decode_given_blocks_with(stored, &layout, &tables, &mut out, l).map(|()| out)
            };
            for &l in &loops {
                assert_eq!(decode(&scalar, l).unwrap(), plane, "{l:?}, n {n}");
            }
            assert!(Contexts::read(&scalar).is_err(), "mode 4's and 8's maps allow no 0xFF");
            for trial in 0..40u32 {
                let mut bad = scalar.clone();
                let i = at + next() as usize % (bad.len() - at);
                bad[i] ^= 1 << (trial % 8);
                let verdicts: Vec<_> = loops.iter().map(|&l| decode(&bad, l).ok()).collect();
                assert!(verdicts.iter().all(|v| *v == verdicts[0]), "trial {trial}, n {n}");
            }
        }
    }
}
