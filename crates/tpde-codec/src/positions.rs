//! Position coders for the sparse path (spec §6.5.1): the indices of changed elements, strictly
//! increasing, as gaps. The first gap counts from position −1, so every gap is at least 1 and
//! no coder adds one: `p[0] = g[0] − 1`, `p[k] = p[k−1] + g[k]`. A decoded gap of 0 or a
//! position at or past the chunk's element count is malformed. The number of positions is
//! stored by the caller, never inferred from padding; bits after the last code, to the byte
//! boundary, are zero.
//!
//! The three variable-length coders write MSB-first bit streams through bitstream-io, which
//! also reads Elias-delta and Fibonacci codes; Golomb-Rice and packed positions, the ones `auto`
//! writes, are read by [`Msb`], 64 bits at a time. The packed form cuts the positions into
//! blocks of 128 whose headers give an absolute start and a bit width, so each block decodes
//! on its own (one GPU thread per block).

use bitstream_io::{BigEndian, BitRead, BitReader, BitWrite, BitWriter};
use tpde_format::CodecTag;

/// Positions per block of the packed form.
pub const PACKED_BLOCK: usize = 128;

/// A position coder, each with its own codec tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PositionCoder {
    /// Elias-delta codes of the gaps.
    EliasDelta,
    /// Fibonacci (Zeckendorf) codes of the gaps.
    Fibonacci,
    /// Golomb-Rice codes of the gaps, parameter `k` in the stream's first byte.
    Rice,
    /// Bit-packed blocks of 128 positions.
    Packed,
}

impl PositionCoder {
    /// Every coder.
    pub const ALL: [PositionCoder; 4] =
        [PositionCoder::EliasDelta, PositionCoder::Fibonacci, PositionCoder::Rice, PositionCoder::Packed];

    /// The sparse codec tag that uses this coder.
    pub fn tag(self) -> CodecTag {
        match self {
            PositionCoder::EliasDelta => CodecTag::SparseEliasDelta,
            PositionCoder::Fibonacci => CodecTag::SparseFibonacci,
            PositionCoder::Rice => CodecTag::SparseRice,
            PositionCoder::Packed => CodecTag::SparsePacked,
        }
    }

    /// The coder a sparse codec tag uses.
    pub fn of(tag: CodecTag) -> Option<PositionCoder> {
        if tag == CodecTag::SparsePackedLanes {
            return Some(PositionCoder::Packed);
        }
        PositionCoder::ALL.into_iter().find(|c| c.tag() == tag)
    }

    /// Appends the coded `positions` (strictly increasing).
    pub fn encode(self, positions: &[u32], out: &mut Vec<u8>) {
        if self == PositionCoder::Packed {
            return encode_packed(positions, out);
        }
        let k = rice_parameter(positions);
        if self == PositionCoder::Rice {
            out.push(k);
        }
        let mut w = BitWriter::endian(std::mem::take(out), BigEndian);
        let mut prev: i64 = -1;
        for &p in positions {
            let gap = (i64::from(p) - prev) as u64;
            prev = i64::from(p);
            match self {
                PositionCoder::EliasDelta => write_elias_delta(&mut w, gap),
                PositionCoder::Fibonacci => write_fibonacci(&mut w, gap),
                PositionCoder::Rice => write_rice(&mut w, gap, k),
                PositionCoder::Packed => unreachable!(),
            }
            .expect("writing to a Vec cannot fail");
        }
        w.byte_align().expect("writing to a Vec cannot fail");
        *out = w.into_writer();
    }

    /// Decodes `count` positions, each below `limit`, from all of `input`.
    pub fn decode(self, input: &[u8], count: usize, limit: u64, out: &mut Vec<u32>) -> Result<(), String> {
        out.clear();
        if self == PositionCoder::Packed {
            return decode_packed(input, count, limit, out);
        }
        let (k, bits) = match self {
            PositionCoder::Rice => {
                let (&k, rest) = input.split_first().ok_or("Rice parameter is missing")?;
                if k > 31 {
                    return Err(format!("Rice parameter {k} is over 31"));
                }
                (u32::from(k), rest)
            }
            _ => (0, input),
        };
        // Every code takes at least one bit: a count the stream cannot hold is rejected before
        // anything is allocated for it.
        if count as u64 > bits.len() as u64 * 8 {
            return Err(format!("{count} positions cannot fit in {} bytes", bits.len()));
        }
        out.reserve(count);
        if self == PositionCoder::Rice {
            return decode_rice(bits, k, count, limit, out);
        }
        let mut r = BitReader::endian(bits, BigEndian);
        let mut prev: i64 = -1;
        for _ in 0..count {
            let gap = match self {
                PositionCoder::EliasDelta => read_elias_delta(&mut r),
                PositionCoder::Fibonacci => read_fibonacci(&mut r),
                PositionCoder::Rice | PositionCoder::Packed => unreachable!(),
            };
            let gap = gap.map_err(|e| ends(e, out.len(), count))?;
            prev = push_gap(gap, prev, limit, out)?;
        }
        check_tail(&mut r)
    }

    /// Exact bits the coded positions take (for choosing a coder before encoding).
    pub fn cost_bits(self, positions: &[u32]) -> u64 {
        let gaps = gaps(positions);
        match self {
            PositionCoder::EliasDelta => gaps.map(elias_delta_len).sum(),
            PositionCoder::Fibonacci => gaps.map(fibonacci_len).sum(),
            PositionCoder::Rice => 8 + rice_cost(positions, rice_parameter(positions)),
            PositionCoder::Packed => packed_len(positions) * 8,
        }
    }
}

fn gaps(positions: &[u32]) -> impl Iterator<Item = u64> + '_ {
    let mut prev: i64 = -1;
    positions.iter().map(move |&p| {
        let g = (i64::from(p) - prev) as u64;
        prev = i64::from(p);
        g
    })
}

enum GapError {
    Eof,
    Bad(String),
}

impl From<std::io::Error> for GapError {
    fn from(_: std::io::Error) -> Self {
        GapError::Eof
    }
}

type Bits<'a> = BitReader<&'a [u8], BigEndian>;

/// Padding after the last code must be zero bits up to the byte boundary, and nothing after.
fn check_tail(r: &mut Bits<'_>) -> Result<(), String> {
    while !r.byte_aligned() {
        if r.read_bit().map_err(|_| "position stream is cut short")? {
            return Err("padding after the last position code is not zero".into());
        }
    }
    let mut b = [0u8; 1];
    match r.read_bytes(&mut b) {
        Ok(()) => Err("bytes follow the last position code".into()),
        Err(_) => Ok(()),
    }
}

/// The error for a gap that could not be read, the `read`th of `count`.
fn ends(e: GapError, read: usize, count: usize) -> String {
    match e {
        GapError::Eof => format!("position stream ends after {read} of {count} gaps"),
        GapError::Bad(d) => d,
    }
}

/// Appends the position `gap` after `prev`, checked; returns it.
#[inline(always)]
fn push_gap(gap: u64, prev: i64, limit: u64, out: &mut Vec<u32>) -> Result<i64, String> {
    if gap == 0 {
        return Err(format!("gap {} is 0", out.len()));
    }
    let p = prev + gap as i64;
    if p as u64 >= limit {
        return Err(format!("position {p} is past the chunk's {limit} elements"));
    }
    out.push(p as u32);
    Ok(p)
}

/// An MSB-first bit reader that keeps up to 64 bits of the stream in a register and refills it
/// with one 8-byte load. Written by hand because the Rice and packed decoders spend their time
/// here: through bitstream-io (a call and a bounds check per bit or field), a Rice position took
/// about 15 ns on one Zen 3 core; measured in `docs/measurements.md`.
struct Msb<'a> {
    bytes: &'a [u8],
    /// The next byte not yet in `buf`.
    next: usize,
    /// The stream's next bits, from the top; bits below the `held` ones are the stream's
    /// following bits or zero, never anything else.
    buf: u64,
    held: u32,
}

impl<'a> Msb<'a> {
    fn new(bytes: &'a [u8]) -> Msb<'a> {
        Msb { bytes, next: 0, buf: 0, held: 0 }
    }

    /// Tops `buf` up to at least 56 held bits, or to the end of the stream.
    #[inline(always)]
    fn refill(&mut self) {
        if let Some(word) = self.bytes.get(self.next..self.next + 8) {
            // `held` < 64 here: only the byte loop below fills all 64, at the stream's end.
            self.buf |= u64::from_be_bytes(word.try_into().expect("8 bytes")) >> self.held;
            self.next += ((63 - self.held) >> 3) as usize;
            self.held |= 56;
        } else {
            while self.held <= 56 && self.next < self.bytes.len() {
                self.buf |= u64::from(self.bytes[self.next]) << (56 - self.held);
                self.next += 1;
                self.held += 8;
            }
        }
    }

    #[inline(always)]
    fn consume(&mut self, n: u32) {
        self.buf = self.buf.checked_shl(n).unwrap_or(0);
        self.held -= n;
    }

    /// The next `n` ≤ 32 bits.
    #[inline(always)]
    fn read(&mut self, n: u32) -> Result<u64, GapError> {
        if self.held < n {
            self.refill();
            if self.held < n {
                return Err(GapError::Eof);
            }
        }
        let v = self.buf.checked_shr(64 - n).unwrap_or(0);
        self.consume(n);
        Ok(v)
    }

    /// Bits read so far.
    fn position(&self) -> usize {
        8 * self.next - self.held as usize
    }

    /// As [`check_tail`]: zero bits to the byte boundary, then nothing.
    fn check_tail(mut self) -> Result<(), String> {
        let pad = ((8 - self.position() % 8) % 8) as u32;
        match self.read(pad) {
            Ok(0) => {}
            Ok(_) => return Err("padding after the last position code is not zero".into()),
            Err(_) => return Err("position stream is cut short".into()),
        }
        if self.position() < 8 * self.bytes.len() {
            return Err("bytes follow the last position code".into());
        }
        Ok(())
    }
}

// Elias-delta: with N = bit length of g and L = bit length of N minus 1: L zero bits, N in L+1
// bits, then the N−1 low bits of g.

fn bit_len(x: u64) -> u32 {
    64 - x.leading_zeros()
}

fn elias_delta_len(g: u64) -> u64 {
    let n = bit_len(g);
    let l = bit_len(u64::from(n)) - 1;
    u64::from(2 * l + n)
}

fn write_elias_delta(w: &mut BitWriter<Vec<u8>, BigEndian>, g: u64) -> std::io::Result<()> {
    let n = bit_len(g);
    let l = bit_len(u64::from(n)) - 1;
    w.write_var::<u32>(l, 0)?;
    w.write_var::<u32>(l + 1, n)?;
    w.write_var::<u64>(n - 1, g & ((1u64 << (n - 1)) - 1))
}

fn read_elias_delta(r: &mut Bits<'_>) -> Result<u64, GapError> {
    let l = r.read_unary::<1>()?; // the zeros; the stop bit is N's leading 1
    if l > 5 {
        return Err(GapError::Bad(format!("Elias-delta length prefix of {l} zeros is over 5")));
    }
    let n = (1u32 << l) | r.read_var::<u32>(l)?;
    if n > 33 {
        return Err(GapError::Bad(format!("Elias-delta gap of {n} bits is over 33")));
    }
    Ok((1u64 << (n - 1)) | r.read_var::<u64>(n - 1)?)
}

// Fibonacci: the Zeckendorf representation of g over 1, 2, 3, 5, 8, ..., least term first,
// then a 1 that, with the last term's 1, ends the code.

const FIBS: [u64; 48] = {
    let mut f = [0u64; 48];
    f[0] = 1;
    f[1] = 2;
    let mut i = 2;
    while i < 48 {
        f[i] = f[i - 1] + f[i - 2];
        i += 1;
    }
    f
};

fn fibonacci_len(g: u64) -> u64 {
    FIBS.iter().take_while(|&&f| f <= g).count() as u64 + 1
}

fn write_fibonacci(w: &mut BitWriter<Vec<u8>, BigEndian>, g: u64) -> std::io::Result<()> {
    let top = FIBS.iter().take_while(|&&f| f <= g).count();
    let mut bits = [false; 48];
    let mut rest = g;
    for i in (0..top).rev() {
        if FIBS[i] <= rest {
            bits[i] = true;
            rest -= FIBS[i];
        }
    }
    for &b in &bits[..top] {
        w.write_bit(b)?;
    }
    w.write_bit(true)
}

fn read_fibonacci(r: &mut Bits<'_>) -> Result<u64, GapError> {
    let mut g = 0u64;
    let mut prev = false;
    for &f in FIBS.iter() {
        let bit = r.read_bit()?;
        if bit && prev {
            return Ok(g);
        }
        if bit {
            g += f;
        }
        prev = bit;
    }
    Err(GapError::Bad("Fibonacci code is longer than 48 bits".into()))
}

// Golomb-Rice with parameter k: q = g >> k as q one bits and a zero, then the k low bits of g.

fn rice_parameter(positions: &[u32]) -> u8 {
    if positions.is_empty() {
        return 0;
    }
    let mean = (u64::from(*positions.last().expect("not empty")) + 1) / positions.len() as u64;
    let guess = bit_len(mean).saturating_sub(1);
    (guess.saturating_sub(2)..=(guess + 2).min(31)).min_by_key(|&k| rice_cost(positions, k as u8)).unwrap_or(0) as u8
}

fn rice_cost(positions: &[u32], k: u8) -> u64 {
    gaps(positions).map(|g| (g >> k) + 1 + u64::from(k)).sum()
}

fn write_rice(w: &mut BitWriter<Vec<u8>, BigEndian>, g: u64, k: u8) -> std::io::Result<()> {
    let q = g >> k;
    for _ in 0..q {
        w.write_bit(true)?;
    }
    w.write_bit(false)?;
    w.write_var::<u64>(u32::from(k), g & ((1u64 << k) - 1))
}

/// Decodes `count` Golomb-Rice positions with parameter `k` from all of `bits`.
fn decode_rice(bits: &[u8], k: u32, count: usize, limit: u64, out: &mut Vec<u32>) -> Result<(), String> {
    let mut r = Msb::new(bits);
    let mut prev: i64 = -1;
    for _ in 0..count {
        let gap = read_rice(&mut r, k, limit).map_err(|e| ends(e, out.len(), count))?;
        prev = push_gap(gap, prev, limit, out)?;
    }
    r.check_tail()
}

fn read_rice(r: &mut Msb<'_>, k: u32, limit: u64) -> Result<u64, GapError> {
    // The quotient: the run of one bits before a zero, counted a register at a time.
    let mut q = 0u64;
    loop {
        if r.held == 0 {
            r.refill();
            if r.held == 0 {
                return Err(GapError::Eof);
            }
        }
        let ones = (!r.buf).leading_zeros().min(r.held);
        q += u64::from(ones);
        if q << k > limit {
            return Err(GapError::Bad(format!("Rice quotient {q} puts the gap past the chunk")));
        }
        if ones < r.held {
            r.consume(ones + 1);
            break;
        }
        r.consume(ones);
    }
    Ok((q << k) | r.read(k)?)
}

// Packed: per block of up to 128 positions a header (u32 LE first position, u8 bit width),
// all headers first; then per block its gaps after the first, `width` bits each, MSB first,
// the block padded with zero bits to a byte.

fn packed_blocks(positions: &[u32]) -> impl Iterator<Item = (&[u32], u32)> {
    positions.chunks(PACKED_BLOCK).map(|b| {
        let width = b.windows(2).map(|p| bit_len(u64::from(p[1] - p[0]))).max().unwrap_or(0);
        (b, width)
    })
}

fn packed_len(positions: &[u32]) -> u64 {
    packed_blocks(positions).map(|(b, w)| 5 + ((b.len() as u64 - 1) * u64::from(w)).div_ceil(8)).sum()
}

fn encode_packed(positions: &[u32], out: &mut Vec<u8>) {
    for (b, width) in packed_blocks(positions) {
        out.extend_from_slice(&b[0].to_le_bytes());
        out.push(width as u8);
    }
    let mut w = BitWriter::endian(std::mem::take(out), BigEndian);
    for (b, width) in packed_blocks(positions) {
        for p in b.windows(2) {
            w.write_var::<u32>(width, p[1] - p[0]).expect("writing to a Vec cannot fail");
        }
        w.byte_align().expect("writing to a Vec cannot fail");
    }
    *out = w.into_writer();
}

fn decode_packed(input: &[u8], count: usize, limit: u64, out: &mut Vec<u32>) -> Result<(), String> {
    let blocks = count.div_ceil(PACKED_BLOCK);
    let headers = input.get(..blocks * 5).ok_or_else(|| format!("{blocks} block headers do not fit the stream"))?;
    out.reserve(count);
    let mut data = &input[blocks * 5..];
    let mut prev: i64 = -1;
    for (b, h) in headers.chunks_exact(5).enumerate() {
        let first = u32::from_le_bytes(h[..4].try_into().expect("4 bytes"));
        let width = u32::from(h[4]);
        let len = PACKED_BLOCK.min(count - b * PACKED_BLOCK);
        if width > 32 || (width == 0 && len > 1) {
            return Err(format!("block {b} has bit width {width} for {len} positions"));
        }
        let bytes = ((len as u64 - 1) * u64::from(width)).div_ceil(8) as usize;
        let block = data.get(..bytes).ok_or_else(|| format!("block {b} runs past the stream"))?;
        data = &data[bytes..];
        let mut r = Msb::new(block);
        let mut p = i64::from(first);
        if p <= prev {
            return Err(format!("block {b} starts at {p}, not after position {prev}"));
        }
        if p as u64 >= limit {
            return Err(format!("position {p} is past the chunk's {limit} elements"));
        }
        out.push(p as u32);
        for _ in 1..len {
            let gap = r.read(width).map_err(|_| format!("block {b} is cut short"))?;
            p = push_gap(gap, p, limit, out)?;
        }
        prev = p;
        r.check_tail()?;
    }
    if !data.is_empty() {
        return Err("bytes follow the last packed block".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test vectors of spec §6.5.1: positions 0, 3, 4, 10 of a 16-element chunk, gaps
    /// 1, 3, 1, 6.
    const POSITIONS: [u32; 4] = [0, 3, 4, 10];

    #[test]
    fn spec_test_vectors() {
        let cases: [(PositionCoder, &[u8]); 4] = [
            (PositionCoder::EliasDelta, &[0xAD, 0xC0]),
            (PositionCoder::Fibonacci, &[0xCF, 0x98]),
            (PositionCoder::Rice, &[0x01, 0x6B, 0xC0]),
            (PositionCoder::Packed, &[0x00, 0x00, 0x00, 0x00, 0x03, 0x67, 0x00]),
        ];
        for (coder, bytes) in cases {
            let mut out = Vec::new();
            coder.encode(&POSITIONS, &mut out);
            assert_eq!(out, bytes, "{coder:?}");
            assert_eq!(coder.cost_bits(&POSITIONS).div_ceil(8), bytes.len() as u64, "{coder:?}");
            let mut back = Vec::new();
            coder.decode(bytes, 4, 16, &mut back).unwrap();
            assert_eq!(back, POSITIONS, "{coder:?}");
        }
    }

    /// The Rice and packed decoders as they were written over bitstream-io, bit by bit and field
    /// by field: the reference [`Msb`]'s decoders are compared with.
    fn reference(coder: PositionCoder, input: &[u8], count: usize, limit: u64) -> Result<Vec<u32>, String> {
        let mut out = Vec::new();
        let mut prev: i64 = -1;
        if coder == PositionCoder::Rice {
            let (&k, bits) = input.split_first().ok_or("no k")?;
            let k = u32::from(k);
            if k > 31 || count as u64 > bits.len() as u64 * 8 {
                return Err("header".into());
            }
            let mut r = BitReader::endian(bits, BigEndian);
            for _ in 0..count {
                let mut q = 0u64;
                while r.read_bit().map_err(|_| "eof")? {
                    q += 1;
                    if q << k > limit {
                        return Err("quotient".into());
                    }
                }
                let gap = (q << k) | r.read_var::<u64>(k).map_err(|_| "eof")?;
                prev = push_gap(gap, prev, limit, &mut out)?;
            }
            check_tail(&mut r)?;
            return Ok(out);
        }
        let blocks = count.div_ceil(PACKED_BLOCK);
        let headers = input.get(..blocks * 5).ok_or("headers")?;
        let mut data = &input[blocks * 5..];
        for (b, h) in headers.chunks_exact(5).enumerate() {
            let first = i64::from(u32::from_le_bytes(h[..4].try_into().unwrap()));
            let width = u32::from(h[4]);
            let len = PACKED_BLOCK.min(count - b * PACKED_BLOCK);
            if width > 32 || (width == 0 && len > 1) || first <= prev {
                return Err("block header".into());
            }
            let bytes = ((len as u64 - 1) * u64::from(width)).div_ceil(8) as usize;
            let block = data.get(..bytes).ok_or("block")?;
            data = &data[bytes..];
            let mut r = BitReader::endian(block, BigEndian);
            prev = push_gap((first - prev) as u64, prev, limit, &mut out)?;
            for _ in 1..len {
                let gap = r.read_var::<u32>(width).map_err(|_| "eof")?;
                prev = push_gap(u64::from(gap), prev, limit, &mut out)?;
            }
            check_tail(&mut r)?;
        }
        if !data.is_empty() {
            return Err("trailing".into());
        }
        Ok(out)
    }

    proptest::proptest! {
        /// Rice and packed positions decode as the bit-by-bit reference decodes them: the same
        /// positions from valid streams, and an error exactly where it errs on damaged ones
        /// (a flipped bit, a cut, a byte appended).
        #[test]
        fn fast_readers_agree_with_the_reference(
            density in 1u32..64,
            n in 1u32..20_000,
            seed in proptest::prelude::any::<u64>(),
            damage in 0usize..4,
            at in proptest::prelude::any::<usize>(),
        ) {
            let mut x = seed | 1;
            let mut next = || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x };
            let positions: Vec<u32> = (0..n).filter(|_| next() % u64::from(density) == 0).collect();
            for coder in [PositionCoder::Rice, PositionCoder::Packed] {
                let mut coded = Vec::new();
                coder.encode(&positions, &mut coded);
                match damage {
                    1 if !coded.is_empty() => { let i = at % coded.len(); coded[i] ^= 1 << (at % 8); }
                    2 => { coded.truncate(coded.len().saturating_sub(1 + at % 3)); }
                    3 => coded.push((at % 256) as u8),
                    _ => {}
                }
                let mut fast = Vec::new();
                let got = coder.decode(&coded, positions.len(), u64::from(n), &mut fast).map(|()| fast);
                let want = reference(coder, &coded, positions.len(), u64::from(n));
                proptest::prop_assert_eq!(got.is_ok(), want.is_ok(), "{:?} {:?} {:?}", coder, got, want);
                if let (Ok(g), Ok(w)) = (&got, &want) {
                    proptest::prop_assert_eq!(g, w);
                }
                if damage == 0 {
                    proptest::prop_assert_eq!(got.unwrap(), positions.clone());
                }
            }
        }
    }

    #[test]
    fn rice_quotients_longer_than_a_register() {
        // k = 0, one gap of 149 (position 148): 149 one bits and a zero, a quotient that spans
        // three refills.
        let positions = [148u32];
        let mut coded = vec![0u8];
        coded.extend([0xFF; 18]);
        coded.push(0b1111_1000);
        let mut back = Vec::new();
        PositionCoder::Rice.decode(&coded, 1, 1000, &mut back).unwrap();
        assert_eq!(back, positions);
        assert_eq!(reference(PositionCoder::Rice, &coded, 1, 1000).unwrap(), positions);
        // The same quotient over a limit it passes: refused, as the reference refuses it.
        assert!(PositionCoder::Rice.decode(&coded, 1, 100, &mut back).is_err());
        assert!(reference(PositionCoder::Rice, &coded, 1, 100).is_err());
    }

    #[test]
    fn rejects_zero_gap_past_end_and_padding() {
        let mut back = Vec::new();
        // Packed, gap of 0 in a block of two: header first=5 width=1, bits "0".
        let e = PositionCoder::Packed.decode(&[5, 0, 0, 0, 1, 0x00], 2, 16, &mut back).unwrap_err();
        assert!(e.contains("is 0"), "{e}");
        // Elias-delta "1" then "0101": positions 0, 3; limit 3 puts 3 past the end.
        let e = PositionCoder::EliasDelta.decode(&[0xA8], 2, 3, &mut back).unwrap_err();
        assert!(e.contains("past the chunk"), "{e}");
        // A set padding bit.
        let e = PositionCoder::EliasDelta.decode(&[0xA9], 2, 16, &mut back).unwrap_err();
        assert!(e.contains("padding"), "{e}");
        // More codes than the stream holds.
        assert!(PositionCoder::Fibonacci.decode(&[0xCF], 1000, 1 << 20, &mut back).is_err());
    }
}
