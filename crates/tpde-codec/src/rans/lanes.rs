//! The lane form (spec §6.2.3): every lane of 1024 four-symbol words with its own state and
//! bytes; its record layout, the scalar decode loop, and the dispatch to the vector loops.

#[cfg(target_arch = "x86_64")]
use super::simd::{avx2, avx512};
use super::*;

/// The number of lanes the encoder gives `n` symbols: one per [`LANE_WORDS`] words, at least 1.
pub fn lane_count(n: usize) -> usize {
    n.div_ceil(4).div_ceil(LANE_WORDS).max(1)
}

/// Encodes `symbols` in the lane form (spec §6.2.3) and appends it.
pub fn encode_lanes(table: &Table, symbols: &[u8], out: &mut Vec<u8>) {
    encode_lanes_with(table, symbols, out, true);
}

/// [`encode_lanes`], with or without the vector loop (the tests compare the two).
pub(crate) fn encode_lanes_with(table: &Table, symbols: &[u8], out: &mut Vec<u8>, vectors: bool) {
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
    // Every table: the vector loop measured at least as fast as the scalar one's branches, even
    // on planes under a bit per symbol.
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
pub(crate) struct LaneRecord {
    pub(crate) header: usize,
    pub(crate) bytes_start: usize,
    pub(crate) states: Vec<u32>,
    pub(crate) ends: Vec<u32>,
}

impl LaneRecord {
    pub(crate) fn start(out: &mut Vec<u8>, lanes: usize) -> LaneRecord {
        let header = out.len();
        out.resize(header + 4 + 8 * lanes, 0);
        let (states, ends) = (Vec::with_capacity(lanes), Vec::with_capacity(lanes));
        LaneRecord { header, bytes_start: out.len(), states, ends }
    }

    /// Appends the next lane: its final encoder state and its spilled bytes.
    pub(crate) fn push(&mut self, out: &mut Vec<u8>, state: u32, spill: &Spill) {
        self.states.push(state);
        out.extend_from_slice(spill.bytes());
        self.ends.push((out.len() - self.bytes_start) as u32);
    }

    pub(crate) fn finish(self, out: &mut [u8]) {
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
pub(crate) fn pop(slots: &[u32], x: u32) -> (u8, u32) {
    let e = slots[(x & (SCALE - 1)) as usize];
    (e as u8, ((e >> 8) & 0xFFF) * (x >> SCALE_BITS) + (x & (SCALE - 1)) - (e >> 20))
}

/// Feeds `x` bytes from `bytes[*pos..]` until it is back in [L, 256·L); `None` if they run out.
#[inline(always)]
pub(crate) fn refill(mut x: u32, bytes: &[u8], pos: &mut usize) -> Option<u32> {
    while x < L {
        x = (x << 8) | u32::from(*bytes.get(*pos)?);
        *pos += 1;
    }
    Some(x)
}

/// [`refill`] for a state left by [`pop`] when at least two bytes are left: two bytes always
/// suffice, and both rounds are branchless (see [`branchless`]).
#[inline(always)]
pub(crate) fn refill_two(mut x: u32, bytes: &[u8], pos: &mut usize) -> u32 {
    for _ in 0..2 {
        let take = x < L;
        let fed = (x << 8) | u32::from(bytes[*pos]);
        x = if take { fed } else { x };
        *pos += usize::from(take);
    }
    x
}

/// One lane's decoder: its state and its own renormalisation bytes.
pub(crate) struct Lane<'a> {
    pub(crate) x: u32,
    /// Where the table for the lane's next symbol starts in the record's slots: always 0 in an
    /// order-0 record; in a context record (spec §6.2.4) set by the symbol before.
    pub(crate) ctx: usize,
    pub(crate) own: &'a [u8],
    /// Where `own` starts in the record's renormalisation bytes.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) begin: usize,
    pub(crate) pos: usize,
}

/// A group of lanes' state as the vector loops hold it, one array per field: place j runs lane
/// j mod the group's size (a group smaller than its register repeats its lanes there, whose
/// copies' symbols are never stored). A loop loads these into its registers and stores them back.
#[cfg(target_arch = "x86_64")]
pub(crate) struct LaneStates {
    pub(crate) x: [u32; LaneStates::PLACES],
    /// Where each lane is in the record's renormalisation bytes.
    pub(crate) off: [u32; LaneStates::PLACES],
    pub(crate) ctx: [u32; LaneStates::PLACES],
}

#[cfg(target_arch = "x86_64")]
impl LaneStates {
    /// The widest group a vector loop decodes.
    pub(crate) const PLACES: usize = 32;

    pub(crate) fn of(group: &[Lane<'_>]) -> LaneStates {
        let lane = |j: usize| &group[j % group.len()];
        LaneStates {
            x: std::array::from_fn(|j| lane(j).x),
            off: std::array::from_fn(|j| (lane(j).begin + lane(j).pos) as u32),
            ctx: std::array::from_fn(|j| lane(j).ctx as u32),
        }
    }

    /// Hands the lanes of `group` their state from places 0, 1, ...
    pub(crate) fn store(&self, group: &mut [Lane<'_>]) {
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
    pub(crate) fn step<const FAST: bool>(&mut self, slots: &Slots, lane: usize) -> Result<u8, String> {
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
    pub(crate) fn word(
        &mut self,
        slots: &Slots,
        lane: usize,
        out: &mut [u8],
        given: Option<&[u8]>,
    ) -> Result<(), String> {
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
pub(crate) const PADDING: usize = 16;

/// Lanes the CPU decoder runs side by side: independent states keep the core's pipelines full
/// where one lane is a chain of dependent steps.
pub(crate) const CPU_LANES: usize = 4;

/// A lane record's tables as the decoders look them up: every table's slots (see
/// [`Table::slots`]), one table after another, and for a context record where each symbol sends
/// its lane next. A record whose tables are given per symbol (spec §6.4.1) has no `next`: the
/// decoder is handed each symbol's table index instead.
pub(crate) struct Slots {
    pub(crate) slots: Vec<u32>,
    /// `next[s]`: the offset in `slots` of the table for a symbol after `s` (context records).
    pub(crate) next: Option<Box<[u32; 256]>>,
    /// Whether the rounds renormalise branchlessly (see [`branchless`]).
    pub(crate) fast: bool,
}

impl Slots {
    pub(crate) fn order0(table: &Table) -> Slots {
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
    pub(crate) fn first(&self) -> usize {
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
            let done = if wide && width == avx512::WIDTH {
                avx512::rounds(slots, readable, group, k0, lanes, rounds, given, out)
            } else if width == 4 * avx2::REG {
                avx2::rounds::<4>(slots, readable, group, k0, lanes, rounds, given, out)
            } else {
                avx2::rounds::<1>(slots, readable, group, k0, lanes, rounds, given, out)
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
