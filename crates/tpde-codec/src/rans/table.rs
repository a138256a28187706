//! A normalised frequency table (spec §6.2.2): its stored form, its slots for decoding, and
//! the byte histograms it is built from.

use super::*;

/// A normalised frequency table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub(crate) freq: [u16; 256],
}

impl Table {
    /// Normalises a histogram of `n > 0` symbols to frequencies summing to 4096, each present
    /// symbol 1..=4095. A histogram with a single symbol gets a second one of frequency 1.
    pub fn from_histogram(hist: &[u64; 256]) -> Table {
        let total: u64 = hist.iter().sum();
        let mut freq = [0u16; 256];
        let mut present: Vec<usize> = (0..256).filter(|&s| hist[s] > 0).collect();
        if present.is_empty() {
            present.push(0);
        }
        if present.len() == 1 {
            present.push(present[0] ^ 1);
        }
        for &s in &present {
            let f = (hist[s] as u128 * SCALE as u128 / total.max(1) as u128) as u32;
            freq[s] = f.clamp(1, MAX_FREQ) as u16;
        }
        let mut sum: i64 = freq.iter().map(|&f| i64::from(f)).sum();
        // Give or take the rounding error from the most frequent symbols, keeping 1..=4095.
        while sum != i64::from(SCALE) {
            let pick = if sum < i64::from(SCALE) {
                present.iter().copied().filter(|&s| u32::from(freq[s]) < MAX_FREQ).max_by_key(|&s| hist[s])
            } else {
                present.iter().copied().filter(|&s| freq[s] > 1).max_by_key(|&s| freq[s])
            };
            let s = pick.expect("256 symbols of 1..=4095 can reach any sum in 2..=4096");
            if sum < i64::from(SCALE) {
                let add = (i64::from(SCALE) - sum).min(i64::from(MAX_FREQ - u32::from(freq[s])));
                freq[s] += add as u16;
                sum += add;
            } else {
                freq[s] -= 1;
                sum -= 1;
            }
        }
        Table { freq }
    }

    /// Bytes the encoded table takes.
    pub fn encoded_len(&self) -> usize {
        32 + 2 * self.freq.iter().filter(|&&f| f > 0).count()
    }

    /// Estimated stream bytes for symbols with this histogram under this table.
    pub fn cost_bytes(&self, hist: &[u64; 256]) -> f64 {
        self.cost_bits(hist) / 8.0 + 4.0 * LANES as f64 + 4.0
    }

    /// Bits of symbols with this histogram under this table (none for an absent symbol: the
    /// histogram is the table's own).
    pub fn cost_bits(&self, hist: &[u64; 256]) -> f64 {
        (0..256)
            .filter(|&s| hist[s] > 0 && self.freq[s] > 0)
            .map(|s| hist[s] as f64 * (f64::from(SCALE) / f64::from(self.freq[s])).log2())
            .sum()
    }

    /// Appends the table.
    pub fn write(&self, out: &mut Vec<u8>) {
        let mut bitmap = [0u8; 32];
        for s in 0..256 {
            if self.freq[s] > 0 {
                bitmap[s / 8] |= 1 << (s % 8);
            }
        }
        out.extend_from_slice(&bitmap);
        for &f in self.freq.iter().filter(|&&f| f > 0) {
            out.extend_from_slice(&f.to_le_bytes());
        }
    }

    /// Reads a table from the front of `input`, returning it and the bytes after it.
    pub fn read(input: &[u8]) -> Result<(Table, &[u8]), String> {
        let bitmap = input.get(..32).ok_or("rANS table is cut short")?;
        let mut rest = &input[32..];
        let mut freq = [0u16; 256];
        let mut sum = 0u32;
        for s in 0..256 {
            if bitmap[s / 8] & (1 << (s % 8)) != 0 {
                let b = rest.get(..2).ok_or("rANS table is cut short")?;
                let f = u16::from_le_bytes([b[0], b[1]]);
                if f == 0 || u32::from(f) > MAX_FREQ {
                    return Err(format!("rANS table gives symbol {s} frequency {f}, outside 1..=4095"));
                }
                freq[s] = f;
                sum += u32::from(f);
                rest = &rest[2..];
            }
        }
        if sum != SCALE {
            return Err(format!("rANS table frequencies sum to {sum}, not 4096"));
        }
        Ok((Table { freq }, rest))
    }

    /// The frequency of every symbol (0 for absent ones).
    pub fn freqs(&self) -> &[u16; 256] {
        &self.freq
    }

    /// The slot → (symbol, frequency, start) lookup both decoders use: `s | f << 8 | start << 20`.
    pub fn slots(&self) -> Vec<u32> {
        let mut slots = Vec::with_capacity(SCALE as usize);
        self.push_slots(&mut slots);
        slots
    }

    /// Appends [`Table::slots`] to `slots`.
    pub(crate) fn push_slots(&self, slots: &mut Vec<u32>) {
        let start = self.starts();
        for (s, (&f, &st)) in self.freq.iter().zip(&start).enumerate() {
            let e = (s as u32) | (u32::from(f) << 8) | (st << 20);
            slots.extend(std::iter::repeat_n(e, usize::from(f)));
        }
    }

    /// The slots of `tables`, one table after another.
    pub(crate) fn all_slots(tables: &[Table]) -> Vec<u32> {
        let mut slots = Vec::with_capacity(tables.len() * SCALE as usize);
        for t in tables {
            t.push_slots(&mut slots);
        }
        slots
    }

    /// `start[s]`, the sum of the frequencies below s.
    pub fn starts(&self) -> [u32; 256] {
        let mut start = [0u32; 256];
        let mut acc = 0;
        for (st, &f) in start.iter_mut().zip(&self.freq) {
            *st = acc;
            acc += u32::from(f);
        }
        start
    }
}

/// Whether renormalisation should be branchless for symbols coded with `freq`: a symbol's
/// byte count is data, and a branch on it mispredicts unless nearly every symbol takes none,
/// as in a plane of under a bit per symbol, where branches measured faster.
pub(crate) fn branchless(freq: &[u16; 256]) -> bool {
    let bits: f64 =
        freq.iter().filter(|&&f| f > 0).map(|&f| f64::from(f) * (f64::from(SCALE) / f64::from(f)).log2()).sum();
    bits >= f64::from(SCALE)
}

/// The histogram of `bytes`.
pub fn histogram(bytes: &[u8]) -> [u64; 256] {
    let mut counts = [[0u32; 256]; GROUP];
    count(bytes, &mut counts);
    std::array::from_fn(|s| counts.iter().map(|t| u64::from(t[s])).sum())
}

/// Bytes [`count`] reads at a time, one table each.
pub(crate) const GROUP: usize = 16;

/// Adds byte k of every 16 bytes of `bytes` to table k: many tables break the store-to-load
/// dependency on runs of one byte value (an exponent plane's), and for elements of 1, 2, 4 or
/// 8 bytes table k counts plane k mod w (measured faster than four tables read byte by byte).
pub(crate) fn count(bytes: &[u8], counts: &mut [[u32; 256]; GROUP]) {
    let mut groups = bytes.chunks_exact(GROUP);
    for g in &mut groups {
        let lo = u64::from_le_bytes(g[..8].try_into().expect("eight bytes"));
        let hi = u64::from_le_bytes(g[8..].try_into().expect("eight bytes"));
        let (low, high) = counts.split_at_mut(8);
        for k in 0..8 {
            low[k][((lo >> (8 * k)) & 0xFF) as usize] += 1;
            high[k][((hi >> (8 * k)) & 0xFF) as usize] += 1;
        }
    }
    for (k, &b) in groups.remainder().iter().enumerate() {
        counts[k][usize::from(b)] += 1;
    }
}
