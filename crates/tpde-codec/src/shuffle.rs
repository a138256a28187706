//! Byte shuffling for planes (spec §6.2): elements of `w` bytes split into `w` byte planes and
//! merged back, float bit patterns rotated by one bit on the way. The plane record format is
//! [`crate::planes`]'; this module is only the data movement, with its one vector kernel
//! (`split_avx2`) behind a safe, feature-detected function.

/// Runs `$body` with `$T` the unsigned integer type of width `$w` bytes (1, 2, 4 or 8).
macro_rules! with_word {
    ($w:expr, $T:ident => $body:expr) => {
        match $w {
            1 => {
                type $T = u8;
                $body
            }
            2 => {
                type $T = u16;
                $body
            }
            4 => {
                type $T = u32;
                $body
            }
            8 => {
                type $T = u64;
                $body
            }
            w => unreachable!("no dtype is {w} bytes wide"),
        }
    };
}
pub(crate) use with_word;

use tpde_format::DType;

use crate::DenseOp;

/// Whether the dtype's bit patterns are rotated before planing.
pub fn rotates(dtype: DType) -> bool {
    dtype.is_float()
}

/// Rotates every element of `bytes` left (`left`) or right by one bit.
pub fn rotate(bytes: &mut [u8], w: usize, left: bool) {
    with_word!(w, T => {
        for c in bytes.chunks_exact_mut(w) {
            let x = T::from_le_bytes(c.try_into().expect("w bytes"));
            let y = if left { x.rotate_left(1) } else { x.rotate_right(1) };
            c.copy_from_slice(&y.to_le_bytes());
        }
    })
}

/// `bytes` with every element rotated left by one bit, into `out` (whose contents are all
/// overwritten): one pass, where a copy and then [`rotate`] in place were two.
pub fn rotated_into(bytes: &[u8], w: usize, out: &mut Vec<u8>) {
    // Only growth is zeroed: every byte is written below.
    out.resize(bytes.len(), 0);
    with_word!(w, T => {
        for (o, c) in out.chunks_exact_mut(w).zip(bytes.chunks_exact(w)) {
            let x = T::from_le_bytes(c.try_into().expect("w bytes"));
            o.copy_from_slice(&x.rotate_left(1).to_le_bytes());
        }
    });
    // Bytes past the last whole element, as `rotate` leaves them.
    let whole = bytes.len() / w * w;
    out[whole..].copy_from_slice(&bytes[whole..]);
}

/// Splits elements of `w` bytes into `w` planes of `n` bytes each, plane after plane.
#[cfg(test)]
pub(crate) fn split(elements: &[u8], w: usize) -> Vec<u8> {
    let mut planes = Vec::new();
    split_into(elements, w, &mut planes);
    planes
}

/// [`split`] into `planes`, a buffer of any length and content, which ends `n · w` bytes long.
pub(crate) fn split_into(elements: &[u8], w: usize, planes: &mut Vec<u8>) {
    planes.resize(elements.len() / w * w, 0);
    match w {
        1 => planes.copy_from_slice(elements),
        2 => split_fixed::<2>(elements, planes),
        4 => split_fixed::<4>(elements, planes),
        8 => split_fixed::<8>(elements, planes),
        w => unreachable!("no dtype is {w} bytes wide"),
    }
}

/// Elements [`split_blocks`] splits at a time.
const SPLIT_BLOCK: usize = 64;

fn split_fixed<const W: usize>(elements: &[u8], planes: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx2() {
        // SAFETY: the CPU has AVX2.
        #[allow(unsafe_code)]
        unsafe {
            split_avx2::<W>(elements, planes)
        };
        return;
    }
    split_blocks::<W>(elements, planes)
}

/// [`split_blocks`] compiled for AVX2, whose byte shuffles the compiler's deinterleaving uses
/// (measured faster than the W×W transpose [`merge`] uses, and than this loop without AVX2).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(unsafe_code)]
unsafe fn split_avx2<const W: usize>(elements: &[u8], planes: &mut [u8]) {
    split_blocks::<W>(elements, planes)
}

/// Replaces every byte b of `bytes` by `map[b]`: a base-context record's table indices from
/// its contexts. On AVX2, 32 bytes at a time, by 16 byte shuffles (one per row of 16 entries)
/// and a tree of 15 blends on the high nibble: written by hand because the compiler keeps a
/// 256-entry lookup scalar, and that loop was 8% of a one-core bf16 delta decode.
pub(crate) fn map_bytes(map: &[u8; 256], bytes: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx512(false, true) {
        // SAFETY: the CPU has AVX-512 F, BW and VBMI.
        #[allow(unsafe_code)]
        unsafe {
            map_bytes_vbmi(map, bytes)
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx2() {
        // SAFETY: the CPU has AVX2.
        #[allow(unsafe_code)]
        unsafe {
            map_bytes_avx2(map, bytes)
        };
        return;
    }
    map_bytes_scalar(map, bytes)
}

fn map_bytes_scalar(map: &[u8; 256], bytes: &mut [u8]) {
    for b in bytes {
        *b = map[usize::from(*b)];
    }
}

/// [`map_bytes`] on AVX2, 32 bytes at a time: each distinct row of the map (16 entries, chosen
/// by a byte's high nibble) looked up by the low nibble with a byte shuffle, then a tree of
/// blends on the row's number. Written by hand because the compiler keeps a 256-entry lookup
/// scalar, and that loop was 8% of a one-core bf16 delta decode. Real maps have at most four
/// distinct rows (a chunk's contexts span few exponents; the other rows are alike), so two
/// rounds of blends, where sixteen rows took four.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(unsafe_code)]
unsafe fn map_bytes_avx2(map: &[u8; 256], bytes: &mut [u8]) {
    let mut rows: Vec<&[u8]> = Vec::with_capacity(16);
    let ids: [u8; 16] = std::array::from_fn(|h| {
        let row = &map[16 * h..16 * h + 16];
        let k = rows.iter().position(|r| *r == row).unwrap_or_else(|| {
            rows.push(row);
            rows.len() - 1
        });
        k as u8
    });
    match rows.len() {
        1 => map_rows_avx2::<0>(&rows, &ids, bytes),
        2 => map_rows_avx2::<1>(&rows, &ids, bytes),
        3 | 4 => map_rows_avx2::<2>(&rows, &ids, bytes),
        5..=8 => map_rows_avx2::<3>(&rows, &ids, bytes),
        _ => map_rows_avx2::<4>(&rows, &ids, bytes),
    }
    map_bytes_scalar(map, bytes.chunks_exact_mut(32).into_remainder());
}

/// [`map_bytes_avx2`] over whole 32-byte blocks, with `rows` (at most 2^`L`) and each high
/// nibble's row number `ids`.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(unsafe_code)]
unsafe fn map_rows_avx2<const L: u32>(rows: &[&[u8]], ids: &[u8; 16], bytes: &mut [u8]) {
    use std::arch::x86_64::*;
    // Each row, and the row numbers, in both 128-bit halves (vpshufb looks up within a half).
    // SAFETY: 16 bytes read from each row and from `ids`.
    let broadcast = |p: *const u8| unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast())) };
    let table: [__m256i; 16] = std::array::from_fn(|k| broadcast(rows.get(k).unwrap_or(&rows[0]).as_ptr()));
    let ids = broadcast(ids.as_ptr());
    let low = _mm256_set1_epi8(0x0F);
    for block in bytes.chunks_exact_mut(32) {
        // SAFETY: the block is 32 bytes.
        let c = unsafe { _mm256_loadu_si256(block.as_ptr().cast()) };
        let lo = _mm256_and_si256(c, low);
        let id = _mm256_shuffle_epi8(ids, _mm256_and_si256(_mm256_srli_epi16::<4>(c), low));
        let mut v: [__m256i; 16] =
            std::array::from_fn(|k| if k < 1 << L { _mm256_shuffle_epi8(table[k], lo) } else { lo });
        // Pairs of rows chosen by bit 0 of the row number, pairs of those by bit 1, ...:
        // vpblendvb reads each byte's top bit, so bit b is shifted up to bit 7 (a number is
        // under 16, so a 16-bit shift moves none of its bits into another byte's bit 7).
        let mut live = 1 << L;
        for b in 0..L {
            let bit = _mm256_sll_epi16(id, _mm_cvtsi32_si128(7 - b as i32));
            live /= 2;
            for i in 0..live {
                v[i] = _mm256_blendv_epi8(v[2 * i], v[2 * i + 1], bit);
            }
        }
        // SAFETY: the block is 32 bytes.
        unsafe { _mm256_storeu_si256(block.as_mut_ptr().cast(), v[0]) };
    }
}

/// [`map_bytes`] on AVX-512 VBMI, 64 bytes at a time: two 128-entry lookups (`vpermi2b`, by
/// each byte's low 7 bits) and a blend by its top bit. About a quarter of the AVX2 loop's time
/// (which was 5.8% of a one-core bf16 delta unpack).
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VBMI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[allow(unsafe_code)]
unsafe fn map_bytes_vbmi(map: &[u8; 256], bytes: &mut [u8]) {
    use std::arch::x86_64::*;
    // SAFETY: four 64-byte loads inside the 256-byte map.
    let [t0, t1, t2, t3]: [__m512i; 4] =
        std::array::from_fn(|q| unsafe { _mm512_loadu_si512(map.as_ptr().add(64 * q).cast()) });
    let mut blocks = bytes.chunks_exact_mut(64);
    for block in &mut blocks {
        // SAFETY: the block is 64 bytes.
        let c = unsafe { _mm512_loadu_si512(block.as_ptr().cast()) };
        let low = _mm512_permutex2var_epi8(t0, c, t1);
        let high = _mm512_permutex2var_epi8(t2, c, t3);
        let v = _mm512_mask_blend_epi8(_mm512_movepi8_mask(c), low, high);
        // SAFETY: the block is 64 bytes.
        unsafe { _mm512_storeu_si512(block.as_mut_ptr().cast(), v) };
    }
    map_bytes_scalar(map, blocks.into_remainder());
}

/// Splits elements of W bytes into W planes, [`SPLIT_BLOCK`] elements at a time: byte j of
/// element i goes to byte i of plane j. Fixed-size blocks let the compiler vectorise the
/// strided reads.
#[inline(always)]
fn split_blocks<const W: usize>(elements: &[u8], planes: &mut [u8]) {
    let n = planes.len() / W;
    let mut p = planes.chunks_exact_mut(n.max(1));
    let mut p: [&mut [u8]; W] = std::array::from_fn(|_| p.next().unwrap_or_default());
    let whole = n / SPLIT_BLOCK * SPLIT_BLOCK;
    for (k, e) in elements[..W * whole].chunks_exact(W * SPLIT_BLOCK).enumerate() {
        for (j, plane) in p.iter_mut().enumerate() {
            let out: &mut [u8; SPLIT_BLOCK] =
                (&mut plane[SPLIT_BLOCK * k..][..SPLIT_BLOCK]).try_into().expect("a block");
            for (i, o) in out.iter_mut().enumerate() {
                *o = e[W * i + j];
            }
        }
    }
    for i in whole..n {
        for (j, plane) in p.iter_mut().enumerate() {
            plane[i] = elements[W * i + j];
        }
    }
}

/// What [`merge`] does to each element as it writes it out.
#[derive(Clone, Copy, Debug)]
pub enum Finish<'a> {
    /// Nothing: the elements as the planes hold them.
    Keep,
    /// Each rotated right by one bit, undoing `planes`' rotation of floats (spec §6.2).
    Unrotate,
    /// Each a dense delta's element, applied to its base element (spec §6.4's decoding) in the
    /// merge's pass, where it was a second pass over the chunk (issue 68, item 5).
    Delta {
        /// The delta's transform.
        op: DenseOp,
        /// Whether the dtype is a float's, whose `delta-xor` elements are rotated.
        float: bool,
        /// The base elements, at least as many bytes as the merge writes.
        base: &'a [u8],
    },
}

impl Finish<'_> {
    /// A keyframe's: floats rotated back, other dtypes as they are.
    pub fn keyframe(dtype: DType) -> Finish<'static> {
        if rotates(dtype) {
            Finish::Unrotate
        } else {
            Finish::Keep
        }
    }
}

// [`Finish`] as the const parameter of the merge loops, so that each is compiled without a
// branch per element.
const KEEP: u8 = 0;
const UNROTATE: u8 = 1;
const XOR_ROTATED: u8 = 2;
const XOR: u8 = 3;
const SUB: u8 = 4;

/// Interleaves planes of `n` bytes each into elements of `planes.len()` bytes, finishing each
/// as `finish` says. A [`Finish::Delta`]'s base holds at least as many bytes as `out`.
pub(crate) fn merge(planes: &[&[u8]], out: &mut [u8], finish: Finish) {
    match finish {
        Finish::Keep => merge_width::<KEEP>(planes, out, &[]),
        Finish::Unrotate => merge_width::<UNROTATE>(planes, out, &[]),
        Finish::Delta { op: DenseOp::Xor, float: true, base } => merge_width::<XOR_ROTATED>(planes, out, base),
        Finish::Delta { op: DenseOp::Xor, float: false, base } => merge_width::<XOR>(planes, out, base),
        Finish::Delta { op: DenseOp::Sub, base, .. } => merge_width::<SUB>(planes, out, base),
    }
}

fn merge_width<const F: u8>(planes: &[&[u8]], out: &mut [u8], base: &[u8]) {
    match planes {
        [p0] if F == KEEP => out.copy_from_slice(p0),
        [p0] => merge_fixed::<u8, 1, F>([p0], out, base),
        [p0, p1] => merge_fixed::<u16, 2, F>([p0, p1], out, base),
        [p0, p1, p2, p3] => merge_fixed::<u32, 4, F>([p0, p1, p2, p3], out, base),
        _ => merge_fixed::<u64, 8, F>(planes.try_into().expect("element widths are 1, 2, 4 or 8"), out, base),
    }
}

fn merge_fixed<T: Word, const W: usize, const F: u8>(planes: [&[u8]; W], out: &mut [u8], base: &[u8]) {
    let whole = out.len() / W / W * W;
    // Two loops, so that the one without a base reads none, and the one with walks it in step
    // with `out` (an index into it per element kept the compiler from vectorising the loop).
    if F >= XOR_ROTATED {
        let blocks = out.chunks_exact_mut(W * W).zip(base.chunks_exact(W * W));
        for (k, (o, b)) in blocks.enumerate() {
            merge_block::<T, W, F>(&planes, k, o, b);
        }
    } else {
        for (k, o) in out.chunks_exact_mut(W * W).enumerate() {
            merge_block::<T, W, F>(&planes, k, o, &[]);
        }
    }
    for (i, o) in out[W * whole..].chunks_exact_mut(W).enumerate() {
        for j in 0..W {
            o[j] = planes[j][whole + i];
        }
        let e = T::load(o);
        let b = if F >= XOR_ROTATED { T::load(&base[W * (whole + i)..][..W]) } else { e };
        finish::<T, F>(e, b).store(o);
    }
}

/// Elements `W·k … W·k + W − 1`: W bytes of each plane transposed into `o`, finished with the
/// base elements `b` where `F` has them.
#[inline(always)]
fn merge_block<T: Word, const W: usize, const F: u8>(planes: &[&[u8]; W], k: usize, o: &mut [u8], b: &[u8]) {
    let mut rows: [T; W] = std::array::from_fn(|j| T::load(&planes[j][W * k..][..W]));
    transpose(&mut rows);
    for (i, row) in rows.into_iter().enumerate() {
        let base = if F >= XOR_ROTATED { T::load(&b[W * i..][..W]) } else { row };
        finish::<T, F>(row, base).store(&mut o[W * i..][..W]);
    }
}

/// Element `e` finished as `F` says, `b` its base element where `F` has one.
#[inline(always)]
fn finish<T: Word, const F: u8>(e: T, b: T) -> T {
    match F {
        KEEP => e,
        UNROTATE => e.rotate_right(1),
        XOR_ROTATED => e.rotate_right(1) ^ b,
        XOR => e ^ b,
        // zigzag undone: (d >> 1) XOR (all ones if bit 0 of d is set), then added to the base.
        _ => ((e >> 1) ^ (e & T::truncate(1)).wrapping_neg()).wrapping_add(b),
    }
}

/// Transposes the W×W bytes of `rows`, each a little-endian word of W bytes: byte j of row i
/// becomes byte i of row j, so W bytes of each of W planes become W elements. Done in log2(W)
/// rounds of swapping half-blocks between rows with masks, which the compiler vectorises
/// across blocks when merging, but not when splitting, where [`split_blocks`] is faster.
#[inline(always)]
fn transpose<T: Word, const W: usize>(rows: &mut [T; W]) {
    // The low `s` bytes of every 2·s-byte block, for s = 1, 2, 4.
    const LOW: [u64; 5] = [0, 0x00FF_00FF_00FF_00FF, 0x0000_FFFF_0000_FFFF, 0, 0x0000_0000_FFFF_FFFF];
    let mut s = W / 2;
    while s > 0 {
        let (mask, shift) = (T::truncate(LOW[s]), 8 * s as u32);
        for a in (0..W).filter(|a| a & s == 0) {
            let b = a + s;
            let t = ((rows[a] >> shift) ^ rows[b]) & mask;
            rows[b] = rows[b] ^ t;
            rows[a] = rows[a] ^ (t << shift);
        }
        s /= 2;
    }
}

/// The unsigned words [`transpose`] works on, one element wide.
trait Word:
    Copy
    + std::ops::BitAnd<Output = Self>
    + std::ops::BitXor<Output = Self>
    + std::ops::Shl<u32, Output = Self>
    + std::ops::Shr<u32, Output = Self>
{
    fn truncate(x: u64) -> Self;
    fn rotate_right(self, n: u32) -> Self;
    fn wrapping_neg(self) -> Self;
    fn wrapping_add(self, other: Self) -> Self;
    fn load(bytes: &[u8]) -> Self;
    fn store(self, bytes: &mut [u8]);
}

macro_rules! word {
    ($($t:ty),*) => {$(
        impl Word for $t {
            #[inline(always)]
            fn truncate(x: u64) -> Self {
                x as $t
            }
            #[inline(always)]
            fn rotate_right(self, n: u32) -> Self {
                <$t>::rotate_right(self, n)
            }
            #[inline(always)]
            fn wrapping_neg(self) -> Self {
                <$t>::wrapping_neg(self)
            }
            #[inline(always)]
            fn wrapping_add(self, other: Self) -> Self {
                <$t>::wrapping_add(self, other)
            }
            #[inline(always)]
            fn load(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("one word"))
            }
            #[inline(always)]
            fn store(self, bytes: &mut [u8]) {
                bytes.copy_from_slice(&self.to_le_bytes())
            }
        }
    )*};
}
word!(u8, u16, u32, u64);

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 and AVX-512 lookups give what the scalar one gives, for every byte under random
    /// maps (and the map of the identity, and maps of 1 to 16 distinct rows), at lengths around
    /// the 32- and 64-byte blocks.
    #[test]
    fn map_bytes_is_the_scalar_lookup() {
        let mut x = 0x9E37_79B9u32;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for round in 0..40 {
            let mut map: [u8; 256] =
                std::array::from_fn(|i| if round == 0 { i as u8 } else { (next() >> (8 * (round % 4))) as u8 });
            // From round 20, 1 to 20 distinct rows (as real maps have few), each used by some
            // high nibbles (the first `distinct` rows of the random map, spread over the others).
            if round >= 20 {
                let distinct = round - 19;
                for h in 0..16 {
                    let from = if h < distinct { h } else { next() as usize % distinct.min(16) };
                    map.copy_within(16 * from..16 * from + 16, 16 * h);
                }
            }
            for len in (0..100).chain([256, 1000, 4099]) {
                let bytes: Vec<u8> = (0..len).map(|i| if len == 256 { i as u8 } else { next() as u8 }).collect();
                let mut want = bytes.clone();
                map_bytes_scalar(&map, &mut want);
                let mut got = bytes.clone();
                map_bytes(&map, &mut got);
                assert_eq!(got, want, "round {round}, {len} bytes");
                #[cfg(target_arch = "x86_64")]
                if crate::isa::avx2() {
                    let mut got = bytes.clone();
                    // SAFETY: the CPU has AVX2.
                    #[allow(unsafe_code)]
                    unsafe {
                        map_bytes_avx2(&map, &mut got)
                    };
                    assert_eq!(got, want, "AVX2, round {round}, {len} bytes");
                }
            }
        }
    }
}
