//! Static order-0 rANS over bytes (spec §6.2.2): one frequency table per byte plane, four
//! interleaved 32-bit states, byte-wise renormalisation.
//!
//! Written here rather than taken from a crate: the table layout and the stream layout are the
//! spec's own, and no maintained crate exposes rANS with a serialised table we could pin.
//!
//! ```text
//! table   [u8; 32] bitmap of present symbols (symbol s: byte s/8, bit s%8, LSB first)
//!         u16 freq per present symbol, ascending; each 1..=4095, summing to 4096
//! stream  u32 len; len bytes: four u32 LE initial states x0..x3, then renormalisation bytes
//! lanes   u32 L; u32 state[L]; u32 end[L] (cumulative); the lanes' renormalisation bytes
//! ```
//!
//! The serial stream interleaves four states over one byte stream, so it decodes on one core.
//! The lane form (spec §6.2.3) gives every lane of 1024 four-symbol words its own state and
//! bytes, so thousands of lanes decode at once on a GPU; word `q` belongs to lane `q mod L`,
//! so neighbouring lanes write neighbouring words.

use crate::CodecError;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod context;

pub use context::Contexts;

/// Frequencies are scaled to `1 << SCALE_BITS`.
pub const SCALE_BITS: u32 = 12;
const SCALE: u32 = 1 << SCALE_BITS;
/// The largest frequency a symbol may have: below the scale, so every symbol costs some bits and
/// the stored form bounds the decoded length (spec §6.2.2).
pub const MAX_FREQ: u32 = SCALE - 1;
/// Lower bound of the normalised state interval [L, 256·L).
const L: u32 = 1 << 23;
const LANES: usize = 4;
/// Four-symbol words per lane that the encoder aims for in the lane form.
pub const LANE_WORDS: usize = 1024;

/// A normalised frequency table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    freq: [u16; 256],
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
    fn push_slots(&self, slots: &mut Vec<u32>) {
        let start = self.starts();
        for (s, (&f, &st)) in self.freq.iter().zip(&start).enumerate() {
            let e = (s as u32) | (u32::from(f) << 8) | (st << 20);
            slots.extend(std::iter::repeat_n(e, usize::from(f)));
        }
    }

    /// The slots of `tables`, one table after another.
    fn all_slots(tables: &[Table]) -> Vec<u32> {
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
/// as in a plane of under a bit per symbol. (Measured on 0.6-1 MiB planes, real fp32 delta
/// planes and geometric ones, one core, best of 15: from 2 to 6 bits per symbol branchless
/// encodes 1.6-1.7x and decodes 1.6-2.0x as fast as with branches; at 0.1 bits branches are
/// 1.4x faster.)
fn branchless(freq: &[u16; 256]) -> bool {
    let bits: f64 =
        freq.iter().filter(|&&f| f > 0).map(|&f| f64::from(f) * (f64::from(SCALE) / f64::from(f)).log2()).sum();
    bits >= f64::from(SCALE)
}

/// Encodes `symbols` with `table` (which must give every symbol in them a frequency) and
/// appends `u32 len` and the stream.
pub fn encode(table: &Table, symbols: &[u8], out: &mut Vec<u8>) {
    let enc = SymbolEncoder::new(table);
    let mut spill = Spill::new(symbols.len());
    let x = if branchless(&table.freq) {
        enc.serial::<true>(symbols, &mut spill)
    } else {
        enc.serial::<false>(symbols, &mut spill)
    };
    let bytes = spill.bytes();
    out.extend_from_slice(&((4 * LANES + bytes.len()) as u32).to_le_bytes());
    for xi in x {
        out.extend_from_slice(&xi.to_le_bytes());
    }
    out.extend_from_slice(bytes);
}

/// The renormalisation bytes an encoder spills, written from the back of a buffer forward so
/// that they end up in the order the decoder reads them, with no reversal pass.
struct Spill {
    buf: Vec<u8>,
    at: usize,
}

impl Spill {
    /// Room for `n` symbols: a symbol spills at most two bytes (the state is below 2^31 and
    /// the smallest bound x_max is 2^19).
    fn new(n: usize) -> Spill {
        Spill { buf: vec![0; 2 * n + 2], at: 2 * n + 2 }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[self.at..]
    }
}

/// The encoder's per-symbol step, shared by the serial and the lane form.
struct SymbolEncoder {
    freq: [u32; 256],
    start: [u32; 256],
    rcp: [u64; 256],
    /// For the vector loop: `freq | start << 12`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    info: [u32; 256],
}

impl SymbolEncoder {
    fn new(table: &Table) -> SymbolEncoder {
        // Division by the frequency as a multiply: with m = floor(2^44 / f) + 1, (x·m) >> 44 is
        // x / f for every x < 2^31, and the state before encoding is always below
        // x_max = 2^19·f < 2^31. (Measured: encode 1.6x faster than with `/`.)
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
    fn serial<const BRANCHLESS: bool>(&self, symbols: &[u8], spill: &mut Spill) -> [u32; LANES] {
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
    fn lanes<const BRANCHLESS: bool, const G: usize>(
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
                // SAFETY: the caller asks for the vector loop only where the CPU has AVX2.
                #[allow(unsafe_code)]
                unsafe {
                    avx2::encode_rounds(&self.info, None, symbols, k0, lanes, full, x32, spills32)
                };
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
    fn put<const BRANCHLESS: bool>(&self, mut x: u32, s: u8, spill: &mut Spill) -> u32 {
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

/// The number of lanes the encoder gives `n` symbols: one per [`LANE_WORDS`] words, at least 1.
pub fn lane_count(n: usize) -> usize {
    n.div_ceil(4).div_ceil(LANE_WORDS).max(1)
}

/// Encodes `symbols` in the lane form (spec §6.2.3) and appends it.
pub fn encode_lanes(table: &Table, symbols: &[u8], out: &mut Vec<u8>) {
    encode_lanes_with(table, symbols, out, true);
}

/// [`encode_lanes`], with or without the vector loop (the tests compare the two).
fn encode_lanes_with(table: &Table, symbols: &[u8], out: &mut Vec<u8>, vectors: bool) {
    let enc = SymbolEncoder::new(table);
    let lanes = lane_count(symbols.len());
    let mut record = LaneRecord::start(out, lanes);
    let spill = || Spill::new(4 * symbols.len().div_ceil(4).div_ceil(lanes));
    let fast = branchless(&table.freq);
    let mut push = |x: &[u32], spills: &[Spill]| {
        for (&xj, spill) in x.iter().zip(spills) {
            record.push(out, xj, spill);
        }
    };
    let mut k0 = 0;
    // Groups of 32 lanes in vector registers where the CPU has AVX2, the rest four at a time.
    // Every table: measured on one Zen 3 core, the vector loop is as fast as the scalar one's
    // branches on planes under a bit per symbol (real delta planes at 0.16-0.18 bits:
    // 607-638 MB/s scalar, 723-727 vector; sparse ones at 0.02-0.07 bits: 680-690 and 691-695).
    #[cfg(target_arch = "x86_64")]
    if vectors && avx2::available() && lanes >= avx2::ENCODE_WIDTH {
        let mut spills: [Spill; avx2::ENCODE_WIDTH] = std::array::from_fn(|_| spill());
        while k0 + avx2::ENCODE_WIDTH <= lanes {
            let x = enc.lanes::<true, { avx2::ENCODE_WIDTH }>(symbols, k0, lanes, &mut spills, true);
            push(&x, &spills);
            k0 += avx2::ENCODE_WIDTH;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = vectors;
    let mut spills: [Spill; CPU_LANES] = std::array::from_fn(|_| spill());
    for k0 in (k0..lanes).step_by(CPU_LANES) {
        let x = if fast {
            enc.lanes::<true, CPU_LANES>(symbols, k0, lanes, &mut spills, false)
        } else {
            enc.lanes::<false, CPU_LANES>(symbols, k0, lanes, &mut spills, false)
        };
        let n = CPU_LANES.min(lanes - k0);
        push(&x[..n], &spills[..n]);
    }
    record.finish(out);
}

/// A lane-form record (spec §6.2.3) being appended to a buffer: the lane count, states and ends
/// are reserved first and filled in once known, and each lane's bytes go straight after them
/// (a buffer of their own cost a copy, and growing it another).
struct LaneRecord {
    header: usize,
    bytes_start: usize,
    states: Vec<u32>,
    ends: Vec<u32>,
}

impl LaneRecord {
    fn start(out: &mut Vec<u8>, lanes: usize) -> LaneRecord {
        let header = out.len();
        out.resize(header + 4 + 8 * lanes, 0);
        let (states, ends) = (Vec::with_capacity(lanes), Vec::with_capacity(lanes));
        LaneRecord { header, bytes_start: out.len(), states, ends }
    }

    /// Appends the next lane: its final encoder state and its spilled bytes.
    fn push(&mut self, out: &mut Vec<u8>, state: u32, spill: &Spill) {
        self.states.push(state);
        out.extend_from_slice(spill.bytes());
        self.ends.push((out.len() - self.bytes_start) as u32);
    }

    fn finish(self, out: &mut [u8]) {
        let lanes = self.states.len() as u32;
        let words = std::iter::once(lanes).chain(self.states).chain(self.ends);
        for (x, at) in words.zip((self.header..self.bytes_start).step_by(4)) {
            out[at..at + 4].copy_from_slice(&x.to_le_bytes());
        }
    }
}

/// Where a lane-form record's parts lie, as offsets into the chunk's stored bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneLayout {
    /// Lanes L.
    pub lanes: u32,
    /// Offset of `u32 state[L]`.
    pub states: usize,
    /// Offset of `u32 end[L]`.
    pub ends: usize,
    /// The renormalisation bytes of all lanes.
    pub bytes: std::ops::Range<usize>,
}

impl LaneLayout {
    /// Reads the lane header at `at` in `stored` for `n` symbols and checks its structure: the
    /// lane count, and ends that never decrease and stay inside `stored`.
    pub fn read(stored: &[u8], at: usize, n: usize) -> Result<LaneLayout, String> {
        let word = |i: usize| stored.get(i..i + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
        let lanes = word(at).ok_or("rANS lane count is cut short")?;
        let most = n.div_ceil(4).max(1);
        if lanes == 0 || lanes as usize > most {
            return Err(format!("{lanes} rANS lanes for {n} symbols (1..={most} allowed)"));
        }
        let l = lanes as usize;
        let (states, ends) = (at + 4, at + 4 + 4 * l);
        let begin = ends + 4 * l;
        if stored.len() < begin {
            return Err(format!("rANS lane table of {l} lanes runs past the chunk"));
        }
        let mut prev = 0;
        for k in 0..l {
            let end = word(ends + 4 * k).expect("inside the table");
            if end < prev {
                return Err(format!("rANS lane {k} ends at byte {end}, before lane {} does ({prev})", k - 1));
            }
            prev = end;
        }
        let stop = begin.checked_add(prev as usize).filter(|&e| e <= stored.len());
        let stop = stop.ok_or_else(|| format!("rANS lanes' {prev} bytes run past the chunk"))?;
        Ok(LaneLayout { lanes, states, ends, bytes: begin..stop })
    }
}

/// One decode step before renormalisation: state `x`'s symbol and the state it leaves, which
/// is at least 2^11 (x ≥ L, and every frequency is at least 1).
#[inline(always)]
fn pop(slots: &[u32], x: u32) -> (u8, u32) {
    let e = slots[(x & (SCALE - 1)) as usize];
    (e as u8, ((e >> 8) & 0xFFF) * (x >> SCALE_BITS) + (x & (SCALE - 1)) - (e >> 20))
}

/// Feeds `x` bytes from `bytes[*pos..]` until it is back in [L, 256·L); `None` if they run out.
#[inline(always)]
fn refill(mut x: u32, bytes: &[u8], pos: &mut usize) -> Option<u32> {
    while x < L {
        x = (x << 8) | u32::from(*bytes.get(*pos)?);
        *pos += 1;
    }
    Some(x)
}

/// [`refill`] for a state left by [`pop`] when at least two bytes are left: two bytes always
/// suffice, and both rounds are branchless (see [`branchless`]).
#[inline(always)]
fn refill_two(mut x: u32, bytes: &[u8], pos: &mut usize) -> u32 {
    for _ in 0..2 {
        let take = x < L;
        let fed = (x << 8) | u32::from(bytes[*pos]);
        x = if take { fed } else { x };
        *pos += usize::from(take);
    }
    x
}

/// One lane's decoder: its state and its own renormalisation bytes.
struct Lane<'a> {
    x: u32,
    /// Where the table for the lane's next symbol starts in the record's slots: always 0 in an
    /// order-0 record; in a context record (spec §6.2.4) set by the symbol before.
    ctx: usize,
    own: &'a [u8],
    /// Where `own` starts in the record's renormalisation bytes.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    begin: usize,
    pos: usize,
}

/// A group of lanes' state as the vector loops hold it, one array per field: place j runs lane
/// j mod the group's size (a group smaller than its register repeats its lanes there, whose
/// copies' symbols are never stored). A loop loads these into its registers and stores them back.
#[cfg(target_arch = "x86_64")]
struct LaneStates {
    x: [u32; LaneStates::PLACES],
    /// Where each lane is in the record's renormalisation bytes.
    off: [u32; LaneStates::PLACES],
    ctx: [u32; LaneStates::PLACES],
}

#[cfg(target_arch = "x86_64")]
impl LaneStates {
    /// The widest group a vector loop decodes.
    const PLACES: usize = 32;

    fn of(group: &[Lane<'_>]) -> LaneStates {
        let lane = |j: usize| &group[j % group.len()];
        LaneStates {
            x: std::array::from_fn(|j| lane(j).x),
            off: std::array::from_fn(|j| (lane(j).begin + lane(j).pos) as u32),
            ctx: std::array::from_fn(|j| lane(j).ctx as u32),
        }
    }

    /// Hands the lanes of `group` their state from places 0, 1, ...
    fn store(&self, group: &mut [Lane<'_>]) {
        for (j, lane) in group.iter_mut().enumerate() {
            lane.x = self.x[j];
            lane.pos = self.off[j] as usize - lane.begin;
            lane.ctx = self.ctx[j] as usize;
        }
    }
}

impl Lane<'_> {
    /// Decodes one symbol. With `FAST`, the caller has checked that two bytes are left, and the
    /// renormalisation is branchless (a symbol's byte count is data: a branch on it mispredicts).
    #[inline(always)]
    fn step<const FAST: bool>(&mut self, slots: &Slots, lane: usize) -> Result<u8, String> {
        let (s, x) = pop(&slots.slots[self.ctx..self.ctx + SCALE as usize], self.x);
        if let Some(next) = &slots.next {
            self.ctx = next[usize::from(s)] as usize;
        }
        self.x = if FAST {
            refill_two(x, self.own, &mut self.pos)
        } else {
            refill(x, self.own, &mut self.pos).ok_or_else(|| format!("rANS lane {lane} ends before its symbols do"))?
        };
        Ok(s)
    }

    /// Decodes one word of up to four symbols into `out`; `given`: the word's table indices in
    /// a record whose tables are given per symbol.
    #[inline(always)]
    fn word(&mut self, slots: &Slots, lane: usize, out: &mut [u8], given: Option<&[u8]>) -> Result<(), String> {
        let fast = slots.fast && out.len() == 4 && self.pos + 8 <= self.own.len();
        for (i, o) in out.iter_mut().enumerate() {
            if let Some(g) = given {
                self.ctx = usize::from(g[i]) << SCALE_BITS;
            }
            *o = if fast { self.step::<true>(slots, lane)? } else { self.step::<false>(slots, lane)? };
        }
        Ok(())
    }
}

/// Bytes the vector loop needs past a lane's position to decode a word (see `avx2::rounds`).
#[cfg(target_arch = "x86_64")]
const PADDING: usize = 16;

/// Lanes the CPU decoder runs side by side: independent states keep the core's pipelines full
/// where one lane is a chain of dependent steps.
const CPU_LANES: usize = 4;

/// A lane record's tables as the decoders look them up: every table's slots (see
/// [`Table::slots`]), one table after another, and for a context record where each symbol sends
/// its lane next. A record whose tables are given per symbol (spec §6.4.1) has no `next`: the
/// decoder is handed each symbol's table index instead.
pub(crate) struct Slots {
    slots: Vec<u32>,
    /// `next[s]`: the offset in `slots` of the table for a symbol after `s` (context records).
    next: Option<Box<[u32; 256]>>,
    /// Whether the rounds renormalise branchlessly (see [`branchless`]).
    fast: bool,
}

impl Slots {
    fn order0(table: &Table) -> Slots {
        Slots { slots: table.slots(), next: None, fast: branchless(&table.freq) }
    }

    pub(crate) fn contexts(map: &[u8; 256], tables: &[Table]) -> Slots {
        Slots {
            slots: Table::all_slots(tables),
            next: Some(Box::new(map.map(|t| u32::from(t) * SCALE))),
            fast: tables.iter().any(|t| branchless(&t.freq)),
        }
    }

    /// Several tables, one per symbol as the decoder is told (spec §6.4.1).
    pub(crate) fn given(tables: &[Table]) -> Slots {
        Slots { slots: Table::all_slots(tables), next: None, fast: tables.iter().any(|t| branchless(&t.freq)) }
    }

    /// Where a lane's first symbol's table starts: the table for a symbol after symbol 0.
    fn first(&self) -> usize {
        self.next.as_ref().map_or(0, |next| next[0] as usize)
    }
}

/// Decodes `out.len()` symbols from lanes laid out as `layout` in `stored`. Every lane must end
/// exactly at its last byte in the encoder's initial state.
pub fn decode_lanes(table: &Table, stored: &[u8], layout: &LaneLayout, out: &mut [u8]) -> Result<(), String> {
    decode_lanes_with(&Slots::order0(table), stored, layout, out, None, Kernel::Best)
}

/// The loop this CPU decodes lane records with: `"AVX-512"`, `"AVX2"` or `"scalar"` (chosen at
/// run time; benchmarks name it, since it changes decode speed about twofold).
pub fn lane_loop() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        return if avx512::available() { "AVX-512" } else { "AVX2" };
    }
    "scalar"
}

/// Which loop decodes a lane record's groups of lanes: the tests run each and compare them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// Lane by lane (a few side by side), in scalar code.
    Scalar,
    /// Eight lanes per AVX2 register where the CPU has AVX2 (only the tests ask for it alone).
    #[cfg_attr(not(test), allow(dead_code))]
    Avx2,
    /// The fastest the CPU has: sixteen lanes per AVX-512 register in groups of 32 where it has
    /// AVX-512 with VBMI (`rans/avx512.rs`), else AVX2, else scalar.
    Best,
}

/// [`decode_lanes`] for any record's tables, with the loop `kernel` (the tests compare them).
/// `given`: for a record whose tables are given per symbol, symbol i's table index
/// (each below the record's table count), one per symbol of `out`.
pub(crate) fn decode_lanes_with(
    slots: &Slots,
    stored: &[u8],
    layout: &LaneLayout,
    out: &mut [u8],
    given: Option<&[u8]>,
    kernel: Kernel,
) -> Result<(), String> {
    let lanes = layout.lanes as usize;
    let n = out.len();
    // Given indices come from a checked map, so each names a table: the scalar loop's slices
    // are bounds-checked and the vector loop clamps them, so none is checked here.
    assert!(given.is_none_or(|g| g.len() == n), "a given table index per symbol");
    let word_given = |q: usize| given.map(|g| &g[4 * q..(4 * q + 4).min(n)]);
    let words = n.div_ceil(4);
    let word = |i: usize| u32::from_le_bytes(stored[i..i + 4].try_into().expect("inside the layout"));
    let bytes = &stored[layout.bytes.clone()];
    let mut begin = 0usize;
    let mut all: Vec<Lane<'_>> = (0..lanes)
        .map(|k| {
            let end = word(layout.ends + 4 * k) as usize;
            let x = word(layout.states + 4 * k);
            let lane = Lane { x, ctx: slots.first(), own: &bytes[begin..end], begin, pos: 0 };
            begin = end;
            lane
        })
        .collect();
    // Rounds of whole words that every lane has: lane k's t-th word is word k + t·L.
    let rounds = n / 4 / lanes;
    // Rounds the vector loop decoded, per group of CPU_LANES lanes.
    let mut started = vec![0usize; lanes.div_ceil(CPU_LANES)];
    #[cfg(not(target_arch = "x86_64"))]
    let _ = kernel;
    #[cfg(target_arch = "x86_64")]
    if kernel != Kernel::Scalar && avx2::available() {
        let wide = kernel == Kernel::Best && avx512::available();
        // Groups of 32 lanes (four AVX2 registers, or two AVX-512 ones where `wide`), then one
        // AVX2 register of eight, then one for the last lanes past a multiple of eight (a 384×384 f32 matrix's planes have 36 lanes): the vector loop is
        // branchless, so it suits every table. Its reads may run on past the lanes' bytes to
        // the end of the chunk (into later planes), which only a damaged lane consumes.
        let readable = &stored[layout.bytes.start..];
        // A record at the end of its chunk, its lanes' bytes padded so that the vector loop
        // runs to their ends: a delta's top plane, near zero and last, has lanes of no byte at
        // all, which the scalar loop decoded (a tenth of an f32 delta's rANS time).
        let padded;
        let readable = if readable.len() < layout.bytes.len() + PADDING {
            padded = [readable, &[0; PADDING]].concat();
            &padded[..]
        } else {
            readable
        };
        let mut k0 = 0;
        while k0 < lanes {
            let width = if lanes - k0 >= 4 * avx2::REG { 4 * avx2::REG } else { (lanes - k0).min(avx2::REG) };
            let group = &mut all[k0..k0 + width];
            // SAFETY: the CPU has AVX2, and AVX-512 with VBMI where `wide`.
            #[allow(unsafe_code)]
            let done = unsafe {
                if wide && width == avx512::WIDTH {
                    avx512::rounds(slots, readable, group, k0, lanes, rounds, given, out)
                } else if width == 4 * avx2::REG {
                    avx2::rounds::<4>(slots, readable, group, k0, lanes, rounds, given, out)
                } else {
                    avx2::rounds::<1>(slots, readable, group, k0, lanes, rounds, given, out)
                }
            };
            started[k0 / CPU_LANES..(k0 + width).div_ceil(CPU_LANES)].fill(done);
            k0 += width;
        }
        // Only a damaged record's lane takes bytes past its own there (see `avx2::rounds`).
        if let Some(k) = all.iter().position(|lane| lane.pos > lane.own.len()) {
            return Err(format!("rANS lane {k} ends before its symbols do"));
        }
    }
    for (g, group) in all.chunks_mut(CPU_LANES).enumerate() {
        let k0 = g * CPU_LANES;
        for t in started[g]..rounds {
            let q0 = k0 + t * lanes;
            match <&mut [Lane<'_>; CPU_LANES]>::try_from(&mut *group) {
                // The fast round: symbol by symbol across the lanes, so their steps overlap.
                Ok(group) if slots.fast && group.iter().all(|l| l.pos + 8 <= l.own.len()) => {
                    for i in 0..4 {
                        for (j, lane) in group.iter_mut().enumerate() {
                            let at = 4 * (q0 + j) + i;
                            if let Some(g) = given {
                                lane.ctx = usize::from(g[at]) << SCALE_BITS;
                            }
                            out[at] = lane.step::<true>(slots, k0 + j)?;
                        }
                    }
                }
                _ => {
                    for (j, lane) in group.iter_mut().enumerate() {
                        let q = q0 + j;
                        lane.word(slots, k0 + j, &mut out[4 * q..4 * q + 4], word_given(q))?;
                    }
                }
            }
        }
    }
    for (k, lane) in all.iter_mut().enumerate() {
        for q in (k + rounds * lanes..words).step_by(lanes) {
            lane.word(slots, k, &mut out[4 * q..(4 * q + 4).min(n)], word_given(q))?;
        }
        if lane.pos != lane.own.len() || lane.x != L {
            return Err(format!("rANS lane {k} does not end where its symbols do"));
        }
    }
    Ok(())
}

/// Decodes `out.len()` symbols from the stream at the front of `input` (starting with its
/// `u32 len`), returning the bytes after it. The stream must be consumed exactly and end in
/// the encoder's initial state.
pub fn decode<'a>(table: &Table, input: &'a [u8], out: &mut [u8]) -> Result<&'a [u8], String> {
    let len = input.get(..4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize);
    let len = len.ok_or("rANS stream length is cut short")?;
    let stream = input.get(4..4 + len).ok_or_else(|| format!("rANS stream of {len} bytes runs past the chunk"))?;
    if len < 4 * LANES {
        return Err(format!("rANS stream of {len} bytes is shorter than its states"));
    }
    // slot -> (symbol, freq, start), one u32 lookup per symbol.
    let slots = table.slots();
    let mut x = [0u32; LANES];
    for (lane, xi) in x.iter_mut().enumerate() {
        *xi = u32::from_le_bytes(stream[4 * lane..4 * lane + 4].try_into().expect("4 bytes"));
    }
    let bytes = &stream[4 * LANES..];
    let mut pos = 0usize;
    // Fast path, four symbols (one per state) per step while at least 8 renormalisation bytes
    // are left (at most two per symbol). The checked loop below finishes the stream and finds
    // every error.
    let mut quads = out.chunks_exact_mut(LANES);
    let mut done = 0;
    let fast = branchless(&table.freq);
    for q in quads.by_ref().take_while(|_| fast) {
        if pos + 2 * LANES > bytes.len() {
            break;
        }
        for (o, xi) in q.iter_mut().zip(x.iter_mut()) {
            let (s, y) = pop(&slots, *xi);
            *o = s;
            *xi = refill_two(y, bytes, &mut pos);
        }
        done += LANES;
    }
    let corrupt = || "rANS stream ends before its symbols do".to_string();
    for (i, o) in out.iter_mut().enumerate().skip(done) {
        let (s, y) = pop(&slots, x[i % LANES]);
        *o = s;
        x[i % LANES] = refill(y, bytes, &mut pos).ok_or_else(corrupt)?;
    }
    if pos != bytes.len() || x.iter().any(|&xi| xi != L) {
        return Err("rANS stream does not end where its symbols do".into());
    }
    Ok(&input[4 + len..])
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
/// 8 bytes table k counts plane k mod w. (Measured on a real 1 MiB delta plane of 0.16 bits
/// per symbol, one core: 1740 MB/s with four tables read byte by byte, 2420 with these.)
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

/// Wraps a rANS failure as a corrupt-chunk error of `codec`.
pub fn corrupt(codec: tpde_format::CodecTag) -> impl Fn(String) -> CodecError {
    move |detail| CodecError::Corrupt { codec, detail }
}

/// For the tests that compare the AVX2 loops with the scalar ones: on a CPU without AVX2 they
/// would compare the scalar loop with itself and pass, so they fail there instead, saying so.
/// `cargo test --features no-avx2-tests` reports them as ignored on such a machine.
#[cfg(test)]
pub(crate) fn require_avx2() {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        return;
    }
    panic!("this CPU has no AVX2, so the vector loops cannot be compared with the scalar ones; test with --features no-avx2-tests to report these tests as ignored");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The comparisons of the loops (`both_loops`) cover the AVX-512 loop only on a CPU that
    /// has it: elsewhere this fails, saying so, rather than let them pass without it.
    /// `cargo test --features no-avx512-tests` reports it as ignored on such a machine.
    #[test]
    #[cfg_attr(feature = "no-avx512-tests", ignore = "built with --features no-avx512-tests: no AVX-512 VBMI here")]
    fn the_avx512_loop_runs_here() {
        #[cfg(target_arch = "x86_64")]
        if avx512::available() {
            return;
        }
        panic!("this CPU has no AVX-512 with VBMI, so the AVX-512 loop is not compared with the others; test with --features no-avx512-tests to report this test as ignored");
    }

    #[test]
    fn round_trip_skewed_and_uniform() {
        for data in [vec![0u8; 1000], (0..=255u8).cycle().take(5000).collect(), vec![7, 7, 7, 200, 7, 7], vec![]] {
            let table = Table::from_histogram(&histogram(&data));
            let mut enc = Vec::new();
            encode(&table, &data, &mut enc);
            let mut out = vec![0u8; data.len()];
            let rest = decode(&table, &enc, &mut out).unwrap();
            assert!(rest.is_empty());
            assert_eq!(out, data);
        }
    }

    #[test]
    fn lanes_round_trip() {
        let mixed: Vec<u8> = (0..50_000u32).map(|i| (i.wrapping_mul(2654435761) >> 29) as u8).collect();
        for data in [vec![0u8; 1000], mixed, vec![7, 7, 7, 200, 7], vec![1], vec![]] {
            let table = Table::from_histogram(&histogram(&data));
            let mut enc = vec![0xEE];
            encode_lanes(&table, &data, &mut enc);
            let layout = LaneLayout::read(&enc, 1, data.len()).unwrap();
            assert_eq!(layout.lanes as usize, lane_count(data.len()));
            assert_eq!(layout.bytes.end, enc.len());
            let mut out = vec![0u8; data.len()];
            decode_lanes(&table, &enc, &layout, &mut out).unwrap();
            assert_eq!(out, data);
        }
    }

    /// Symbols of about `bits` bits each (a geometric distribution), from a fixed seed.
    fn symbols(n: usize, p: f64) -> Vec<u8> {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        (0..n)
            .map(|_| {
                let s = xorshift(&mut s);
                let u = (s >> 11) as f64 / (1u64 << 53) as f64;
                ((1.0 - u).ln() / p.ln()).floor().min(255.0) as u8
            })
            .collect()
    }

    #[test]
    fn fast_and_checked_paths_agree_at_every_length_and_entropy() {
        // p = 0.02 codes under a bit per symbol (the branchy paths), the others over (the
        // branchless ones); lengths cross the ends of quads, fast rounds and lanes.
        for p in [0.02, 0.5, 0.95, 0.995] {
            for n in [0, 1, 3, 4, 5, 7, 8, 9, 31, 32, 33, 4095, 4096, 4097, 16_385, 70_001] {
                let data = symbols(n, p);
                let table = Table::from_histogram(&histogram(&data));
                let mut enc = Vec::new();
                encode(&table, &data, &mut enc);
                let mut out = vec![0u8; n];
                assert!(decode(&table, &enc, &mut out).unwrap().is_empty(), "p {p} n {n}");
                assert_eq!(out, data, "serial, p {p} n {n}");
                // A stream one byte short, or with its last byte changed, is an error.
                if enc.len() > 20 {
                    let mut short = enc[..enc.len() - 1].to_vec();
                    short[..4].copy_from_slice(&((enc.len() - 5) as u32).to_le_bytes());
                    assert!(decode(&table, &short, &mut out).is_err(), "short serial, p {p} n {n}");
                }
                let mut lanes = Vec::new();
                encode_lanes(&table, &data, &mut lanes);
                let layout = LaneLayout::read(&lanes, 0, n).unwrap();
                out.fill(0);
                decode_lanes(&table, &lanes, &layout, &mut out).unwrap();
                assert_eq!(out, data, "lanes, p {p} n {n}");
                if !layout.bytes.is_empty() {
                    let mut cut = layout.clone();
                    cut.bytes.end -= 1;
                    let last = layout.ends + 4 * (layout.lanes as usize - 1);
                    let mut bad = lanes.clone();
                    let end = u32::from_le_bytes(bad[last..last + 4].try_into().unwrap()) - 1;
                    bad[last..last + 4].copy_from_slice(&end.to_le_bytes());
                    assert!(decode_lanes(&table, &bad, &cut, &mut out).is_err(), "short lane, p {p} n {n}");
                }
            }
        }
    }

    /// The next of a xorshift64 sequence from state `s`: the tests' reproducible data.
    pub(super) fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// Decodes with and without the vector loop, which must both succeed with the same bytes or
    /// both fail (a damaged record may fail at another lane: the vector loop checks lanes'
    /// bounds after its rounds, the scalar one at each step).
    fn both_paths(table: &Table, stored: &[u8], layout: &LaneLayout, n: usize) -> Result<Vec<u8>, String> {
        both_loops(&Slots::order0(table), stored, layout, n, None)
    }

    /// [`both_paths`] for any record's tables (and given table indices).
    pub(super) fn both_loops(
        slots: &Slots,
        stored: &[u8],
        layout: &LaneLayout,
        n: usize,
        given: Option<&[u8]>,
    ) -> Result<Vec<u8>, String> {
        let run = |kernel| {
            let mut out = vec![0u8; n];
            decode_lanes_with(slots, stored, layout, &mut out, given, kernel).map(|()| out)
        };
        let a = run(Kernel::Scalar);
        // AVX2, then AVX-512 where the CPU has it (see `the_avx512_loop_runs_here`).
        for kernel in [Kernel::Avx2, Kernel::Best] {
            let b = run(kernel);
            match (&a, &b) {
                (Ok(a), Ok(b)) => assert!(a == b, "the {kernel:?} and scalar loops decode different bytes"),
                (Err(_), Err(_)) => {}
                _ => panic!(
                    "one loop fails and the other does not: scalar {:?}, {kernel:?} {:?}",
                    a.as_ref().err(),
                    b.as_ref().err()
                ),
            }
        }
        a
    }

    #[test]
    #[cfg_attr(feature = "no-avx2-tests", ignore = "built with --features no-avx2-tests: no AVX2 here")]
    fn vector_and_scalar_lanes_agree_on_encoding_and_on_valid_and_damaged_records() {
        super::require_avx2();
        // Enough lanes for groups of 32 and of 8 and a part-filled register (n / 4096 lanes),
        // at entropies near zero (a delta's top plane, whose lanes have almost no bytes), under
        // and over a bit per symbol; the records end their buffers, as the last plane of a
        // chunk does. Then every kind of damage the loops can meet: changed and cut bytes,
        // states out of the normalised range, lanes with no bytes.
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || xorshift(&mut rng);
        for p in [1e-4, 0.02, 0.5, 0.95] {
            for n in [45 * 4096 + 3, 41 * 4096, 8 * 4096 + 1] {
                let data = symbols(n, p);
                let table = Table::from_histogram(&histogram(&data));
                let mut lanes = Vec::new();
                encode_lanes(&table, &data, &mut lanes);
                let mut scalar = Vec::new();
                encode_lanes_with(&table, &data, &mut scalar, false);
                assert!(lanes == scalar, "vector and scalar encoders differ, p {p} n {n}");
                let layout = LaneLayout::read(&lanes, 0, n).unwrap();
                assert_eq!(both_paths(&table, &lanes, &layout, n).unwrap(), data, "p {p} n {n}");
                let l = layout.lanes as usize;
                for trial in 0..24 {
                    let mut bad = lanes.clone();
                    match trial % 4 {
                        // A renormalisation byte changed.
                        0 if !layout.bytes.is_empty() => {
                            let at = layout.bytes.start + next() as usize % layout.bytes.len();
                            bad[at] ^= 1 + (next() % 255) as u8;
                        }
                        // A state anywhere in u32, the top half included.
                        1 => {
                            let at = layout.states + 4 * (next() as usize % l);
                            bad[at..at + 4].copy_from_slice(&(next() as u32).to_le_bytes());
                        }
                        // Two neighbouring lanes' boundary moved.
                        2 if l > 1 => {
                            let k = next() as usize % (l - 1);
                            let at = layout.ends + 4 * k;
                            let lo = if k == 0 { 0 } else { u32::from_le_bytes(bad[at - 4..at].try_into().unwrap()) };
                            let hi = u32::from_le_bytes(bad[at + 4..at + 8].try_into().unwrap());
                            let end = lo + (next() as u32) % (hi - lo + 1);
                            bad[at..at + 4].copy_from_slice(&end.to_le_bytes());
                        }
                        // A lane's bytes all moved to its neighbour: it has none.
                        _ if l > 1 => {
                            let k = next() as usize % (l - 1);
                            let at = layout.ends + 4 * k;
                            let lo = if k == 0 { 0 } else { u32::from_le_bytes(bad[at - 4..at].try_into().unwrap()) };
                            bad[at..at + 4].copy_from_slice(&lo.to_le_bytes());
                        }
                        _ => continue,
                    }
                    let layout = LaneLayout::read(&bad, 0, n).unwrap();
                    let _ = both_paths(&table, &bad, &layout, n);
                }
            }
        }
    }

    #[test]
    fn every_symbol_costs_bits() {
        // 1 MiB of one byte value still takes bytes: the stored form bounds the decoded length.
        let data = vec![0u8; 1 << 20];
        let table = Table::from_histogram(&histogram(&data));
        let mut enc = Vec::new();
        encode(&table, &data, &mut enc);
        assert!(enc.len() > 40 && enc.len() < 100, "{}", enc.len());
    }
}
