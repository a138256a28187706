//! The encoder's per-symbol step and its spill buffer, shared by the serial and the lane form.

#[cfg(target_arch = "x86_64")]
use super::simd::avx2;
use super::*;

/// The renormalisation bytes an encoder spills, written from the back of a buffer forward so
/// that they end up in the order the decoder reads them, with no reversal pass.
pub(crate) struct Spill {
    pub(crate) buf: Vec<u8>,
    pub(crate) at: usize,
}

impl Spill {
    /// Room for `n` symbols: a symbol spills at most two bytes (the state is below 2^31 and
    /// the smallest bound x_max is 2^19).
    pub(crate) fn new(n: usize) -> Spill {
        Spill { buf: vec![0; 2 * n + 2], at: 2 * n + 2 }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[self.at..]
    }
}

/// The encoder's per-symbol step, shared by the serial and the lane form.
pub(crate) struct SymbolEncoder {
    pub(crate) freq: [u32; 256],
    pub(crate) start: [u32; 256],
    pub(crate) rcp: [u64; 256],
    /// For the vector loop: `freq | start << 12`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) info: [u32; 256],
}

impl SymbolEncoder {
    pub(crate) fn new(table: &Table) -> SymbolEncoder {
        // Division by the frequency as a multiply: with m = floor(2^44 / f) + 1, (x·m) >> 44 is
        // x / f for every x < 2^31, and the state before encoding is always below
        // x_max = 2^19·f < 2^31. (Measured faster than `/`.)
        let mut rcp = [0u64; 256];
        let freq = table.freq.map(u32::from);
        for (r, &f) in rcp.iter_mut().zip(&freq) {
            if f > 0 {
                *r = (1u64 << 44) / u64::from(f) + 1;
            }
        }
        let start = table.starts();
        let info = std::array::from_fn(|s| freq[s] | start[s] << SCALE_BITS);
        SymbolEncoder { freq, start, rcp, info }
    }

    /// Encodes `symbols` as one serial stream, returning the final states.
    pub(crate) fn serial<const BRANCHLESS: bool>(&self, symbols: &[u8], spill: &mut Spill) -> [u32; LANES] {
        let mut x = [L; LANES];
        // Symbol i goes to state i mod 4, last symbol first: the partial quad, then whole quads.
        let whole = symbols.len() / LANES * LANES;
        for (k, &s) in symbols[whole..].iter().enumerate().rev() {
            x[k] = self.put::<BRANCHLESS>(x[k], s, spill);
        }
        for quad in symbols[..whole].chunks_exact(LANES).rev() {
            for k in (0..LANES).rev() {
                x[k] = self.put::<BRANCHLESS>(x[k], quad[k], spill);
            }
        }
        x
    }

    /// Encodes lanes `k0..k0 + G` (those below `lanes`) of the lane form side by side,
    /// each into its own spill buffer, returning their final states: independent states keep
    /// the core's pipelines full where one lane is a chain of dependent steps.
    pub(crate) fn lanes<const BRANCHLESS: bool, const G: usize>(
        &self,
        symbols: &[u8],
        k0: usize,
        lanes: usize,
        spills: &mut [Spill; G],
        vector: bool,
    ) -> [u32; G] {
        let mut x = [L; G];
        for spill in spills.iter_mut() {
            spill.at = spill.buf.len();
        }
        let words = symbols.len().div_ceil(4);
        // Lane k has words k, k + lanes, ...; the rounds every lane of the group has in full
        // run side by side, the rest (a last round, a partial word) one lane at a time.
        let whole = symbols.len() / 4;
        let full = if k0 + G <= lanes { (whole - (k0 + G - 1).min(whole)).div_ceil(lanes) } else { 0 };
        for (j, (xj, spill)) in x.iter_mut().zip(spills.iter_mut()).enumerate().take(lanes.saturating_sub(k0)) {
            for q in (k0 + j + full * lanes..words).step_by(lanes).rev() {
                for &s in symbols[4 * q..(4 * q + 4).min(symbols.len())].iter().rev() {
                    *xj = self.put::<BRANCHLESS>(*xj, s, spill);
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if vector && full > 0 {
            let (x32, spills32) = ((&mut x[..]).try_into(), (&mut spills[..]).try_into());
            if let (Ok(x32), Ok(spills32)) = (x32, spills32) {
                // The caller asks for the vector loop only where the CPU has AVX2.
                avx2::encode_rounds(&self.info, None, symbols, k0, lanes, full, x32, spills32);
                return x;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = vector;
        for t in (0..full).rev() {
            let q0 = k0 + t * lanes;
            let word = &symbols[4 * q0..4 * (q0 + G)];
            for i in (0..4).rev() {
                for (j, (xj, spill)) in x.iter_mut().zip(spills.iter_mut()).enumerate() {
                    *xj = self.put::<BRANCHLESS>(*xj, word[4 * j + i], spill);
                }
            }
        }
        x
    }

    /// Pushes symbol `s` onto state `x`, spilling renormalisation bytes. `BRANCHLESS`: see
    /// [`branchless`].
    #[inline(always)]
    pub(crate) fn put<const BRANCHLESS: bool>(&self, mut x: u32, s: u8, spill: &mut Spill) -> u32 {
        let s = usize::from(s);
        let f = self.freq[s];
        debug_assert!(f > 0, "symbol {s} is not in the table");
        let x_max = ((L >> SCALE_BITS) << 8) * f;
        if BRANCHLESS {
            // At most two bytes; the spill buffer has room for both.
            for _ in 0..2 {
                let out = x >= x_max;
                spill.buf[spill.at - 1] = x as u8;
                spill.at -= usize::from(out);
                x = if out { x >> 8 } else { x };
            }
        } else {
            while x >= x_max {
                spill.at -= 1;
                spill.buf[spill.at] = x as u8;
                x >>= 8;
            }
        }
        let q = ((u64::from(x) * self.rcp[s]) >> 44) as u32;
        (q << SCALE_BITS) + (x - q * f) + self.start[s]
    }
}
