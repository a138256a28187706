//! Context records (spec §6.2.4): the lane form with up to 16 tables, where the table that codes
//! a symbol is the one `map` gives the symbol its lane decoded before it; and base-context records
//! (§6.4.1), the same record whose `map` is read with each element's base context instead.
//!
//! An exponent plane's neighbours are alike: in Adam's second moment the elements of a row share
//! their scale, so a symbol after exponent e is most likely near e. One order-0 table cannot see
//! that; on real f32 `exp_avg_sq` the exponent plane costs 3.45 bits per symbol with one table
//! and 2.85 given the element before it (numpy entropies, 1 Mi-element chunks).
//!
//! ```text
//! context record  u8 map[256]; C = 1 + max(map) frequency tables (C ≤ 16); rANS lanes
//! ```

use super::blocks::{block_ranges, Choice};
use super::unchanged::{self, UNCHANGED};
use super::{
    decode_lanes_with, BlockLayout, BlockLoop, Kernel, LaneLayout, LaneRecord, Slots, Spill, SymbolEncoder, Table,
    CONTEXT_BLOCK_SYMBOLS, L,
};

/// The most tables a context record may have.
pub const MAX_TABLES: usize = 16;

/// Pair counts: `pairs[a][s]` is how often symbol s follows symbol a in its lane (or has base
/// context a). 32 bits, as a plane's histograms: a chunk's plane is under 2^32 symbols.
pub type Pairs = [[u32; 256]; 256];

/// A context or base-context record's tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contexts {
    /// `map[a]`: the table that codes a symbol whose context is a (the symbol before it, or its
    /// base context).
    map: [u8; 256],
    tables: Vec<Table>,
}

thread_local! {
    /// This thread's buffer for the table index of every symbol of a plane being encoded with
    /// neighbour contexts.
    static TABLES: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// This thread's buffers for a mode 7 plane's coded elements: their table indices and
    /// their decoded symbols (padded for the expand).
    static CODED: std::cell::RefCell<(Vec<u8>, Vec<u8>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The tables a map names: one more than its largest entry other than [`UNCHANGED`] (at least
/// one).
fn table_count(map: &[u8; 256]) -> usize {
    usize::from(map.iter().copied().filter(|&t| t != UNCHANGED).max().unwrap_or(0)) + 1
}

/// The symbol lane order puts before symbol `i` of a plane cut into `lanes` lanes (0 before a
/// lane's first): the one before it in its word, or the last of its lane's previous word, `lanes`
/// words back.
fn before(symbols: &[u8], i: usize, lanes: usize) -> u8 {
    if !i.is_multiple_of(4) {
        symbols[i - 1]
    } else if i >= 4 * lanes {
        symbols[i - 4 * lanes + 3]
    } else {
        0
    }
}

/// The table index under `map` of every symbol of a plane in lanes: `map` of the symbol
/// before it, as [`before`] gives it, a word at a time. Every symbol's context is known before
/// encoding, so the indices are given as for a base-context record and the lanes run side by
/// side in vector registers: the same bytes as lane by lane, which measured slow.
fn neighbour_tables(map: &[u8; 256], symbols: &[u8], tables: &mut Vec<u8>) {
    let lanes = super::lane_count(symbols.len());
    // Only growth is zeroed: every index is written below.
    tables.resize(symbols.len(), 0);
    for (q, (t, s)) in tables.chunks_mut(4).zip(symbols.chunks(4)).enumerate() {
        t[0] = map[usize::from(if q >= lanes { symbols[4 * (q - lanes) + 3] } else { 0 })];
        for j in 1..t.len() {
            t[j] = map[usize::from(s[j - 1])];
        }
    }
}

/// Counts the pairs (symbol before, symbol) of `symbols` in lanes of `lanes`, over every word, or
/// with `sampled` over the words of one block of 1024 symbols in eight.
pub fn pair_counts(symbols: &[u8], lanes: usize, sampled: bool) -> Box<Pairs> {
    counts(symbols, sampled, |i| before(symbols, i, lanes))
}

/// Pair counts of (symbol before in its state, symbol) of a plane in blocks with neighbour
/// contexts (spec §6.2.7): the symbol 32 back in its block, 0 at a block's first step; over
/// every symbol or a sample as [`pair_counts`]'s.
pub fn block_pair_counts(symbols: &[u8], sampled: bool) -> Box<Pairs> {
    let size = super::CONTEXT_BLOCK_SYMBOLS;
    counts(symbols, sampled, |i| if i % size < super::BLOCK_STATES { 0 } else { symbols[i - super::BLOCK_STATES] })
}

/// Pair counts of (given context, symbol) (spec §6.4.1), over every symbol or a sample as
/// [`pair_counts`]'s.
pub fn given_pair_counts(symbols: &[u8], contexts: &[u8], sampled: bool) -> Box<Pairs> {
    assert_eq!(symbols.len(), contexts.len());
    counts(symbols, sampled, |i| contexts[i])
}

/// Counts the pairs (`context(i)`, symbol i).
fn counts(symbols: &[u8], sampled: bool, context: impl Fn(usize) -> u8) -> Box<Pairs> {
    let mut pairs: Box<Pairs> = vec![[0u32; 256]; 256].into_boxed_slice().try_into().expect("256 rows");
    let block = if sampled { 1024 } else { symbols.len().max(1) };
    for start in (0..symbols.len()).step_by(if sampled { 8 * block } else { block }) {
        let end = (start + block).min(symbols.len());
        for i in start..end {
            pairs[usize::from(context(i))][usize::from(symbols[i])] += 1;
        }
    }
    pairs
}

impl Contexts {
    /// Groups the symbols before into at most 16 contexts: each of the 16 most frequent has its
    /// own table, and every other symbol shares the table of the nearest of them by value (in an
    /// exponent plane, the nearest scale). `None` when no symbol occurs.
    pub fn group(pairs: &Pairs) -> Option<[u8; 256]> {
        let count: [u64; 256] = std::array::from_fn(|a| pairs[a].iter().copied().map(u64::from).sum());
        let mut top: Vec<usize> = (0..256).filter(|&a| count[a] > 0).collect();
        top.sort_by_key(|&a| std::cmp::Reverse(count[a]));
        top.truncate(MAX_TABLES);
        top.sort_unstable();
        if top.is_empty() {
            return None;
        }
        Some(std::array::from_fn(|a| {
            let nearest = top.iter().enumerate().min_by_key(|(_, &t)| t.abs_diff(a)).expect("one context");
            nearest.0 as u8
        }))
    }

    /// Each context's histogram under `map` (none for the unchanged contexts).
    fn histograms(map: &[u8; 256], pairs: &Pairs) -> Vec<[u64; 256]> {
        let mut hists = vec![[0u64; 256]; table_count(map)];
        for (a, row) in pairs.iter().enumerate().filter(|&(a, _)| map[a] != UNCHANGED) {
            let h = &mut hists[usize::from(map[a])];
            for (c, &p) in h.iter_mut().zip(row) {
                *c += u64::from(p);
            }
        }
        hists
    }

    /// The record's estimated bytes before its lanes (map and tables) plus its symbols', for
    /// symbols with these pair counts, scaled by `scale` (a sample's to the plane's).
    pub fn estimate(map: &[u8; 256], pairs: &Pairs, scale: f64) -> f64 {
        Contexts::histograms(map, pairs)
            .iter()
            .map(|h| {
                let t = Table::from_histogram(h);
                t.encoded_len() as f64 + scale * t.cost_bits(h) / 8.0
            })
            .sum::<f64>()
            + 256.0
    }

    /// The tables for `map`, from the full pair counts of the plane to be coded.
    pub fn new(map: [u8; 256], pairs: &Pairs) -> Contexts {
        let tables = Contexts::histograms(&map, pairs).iter().map(Table::from_histogram).collect();
        Contexts { map, tables }
    }

    /// The tables for `map`, counted from `symbols` and each symbol's table, `tables[i]`
    /// (`map` of its base context). Four histograms per table, one per symbol of a word, so
    /// that a run of one (table, symbol), as a delta plane's zeros, does not wait on its own
    /// stores, as counting one symbol at a time did (measured).
    pub fn count_tables(map: [u8; 256], symbols: &[u8], tables: &[u8]) -> Contexts {
        assert_eq!(symbols.len(), tables.len());
        // A row past the tables for the unchanged elements' index, counted and dropped.
        let count = table_count(&map);
        let mut hists = vec![[[0u32; 256]; 4]; count + 1];
        let row = |t: u8| usize::from(t).min(count);
        let mut words = symbols.chunks_exact(4).zip(tables.chunks_exact(4));
        for (s, t) in &mut words {
            for k in 0..4 {
                hists[row(t[k])][k][usize::from(s[k])] += 1;
            }
        }
        let tail = symbols.len() / 4 * 4;
        for (&s, &t) in symbols[tail..].iter().zip(&tables[tail..]) {
            hists[row(t)][0][usize::from(s)] += 1;
        }
        let tables = hists[..count]
            .iter()
            .map(|h| Table::from_histogram(&std::array::from_fn(|s| h.iter().map(|k| u64::from(k[s])).sum())))
            .collect();
        Contexts { map, tables }
    }

    /// Appends the map, the tables and `symbols` in lanes: the record after its mode byte.
    /// Every symbol must have a frequency in its context's table (as the pair counts of
    /// `symbols` give it).
    pub fn encode_lanes(&self, symbols: &[u8], out: &mut Vec<u8>) {
        TABLES.with_borrow_mut(|tables| {
            neighbour_tables(&self.map, symbols, tables);
            self.encode_by(symbols, |i| usize::from(tables[i]), Some(tables), out);
        })
    }

    /// Codes `symbols` with neighbour contexts grouped by `map`, as [`Contexts::encode_lanes`]
    /// does, with the tables of `pairs` where those are the plane's full pair counts, else
    /// counted here from each symbol's table index, which the encoder needs anyway (counting
    /// by the symbol before, a second pass, measured slower).
    pub fn encode_neighbours(map: [u8; 256], full: Option<&Pairs>, symbols: &[u8], out: &mut Vec<u8>) {
        TABLES.with_borrow_mut(|tables| {
            neighbour_tables(&map, symbols, tables);
            let model = match full {
                Some(pairs) => Contexts::new(map, pairs),
                None => Contexts::count_tables(map, symbols, tables),
            };
            model.encode_by(symbols, |i| usize::from(tables[i]), Some(tables), out);
        })
    }

    /// [`Contexts::encode_lanes`] for a record whose contexts are given (spec §6.4.1):
    /// symbol i is coded with table `tables[i]`, `map` of its context.
    pub fn encode_given(&self, symbols: &[u8], tables: &[u8], out: &mut Vec<u8>) {
        assert_eq!(symbols.len(), tables.len());
        self.encode_by(symbols, |i| usize::from(tables[i]), Some(tables), out);
    }

    /// Appends the map, the tables and `symbols` in lanes, symbol i coded with table
    /// `table_of(i)`; `given`: the same table indices, known before encoding, which lets lanes
    /// run side by side in vector registers.
    fn encode_by(&self, symbols: &[u8], table_of: impl Fn(usize) -> usize, given: Option<&[u8]>, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.map);
        for t in &self.tables {
            t.write(out);
        }
        let encoders: Vec<SymbolEncoder> = self.tables.iter().map(SymbolEncoder::new).collect();
        let n = symbols.len();
        let lanes = super::lane_count(n);
        let words = n.div_ceil(4);
        let mut record = LaneRecord::start(out, lanes);
        let spill = || Spill::new(4 * words.div_ceil(lanes));
        // One lane, last symbol first (the decoder's order reversed), from its word `from` on.
        let encode_lane = |k: usize, from: usize, mut x: u32, spill: &mut Spill| {
            for q in (k + from * lanes..words).step_by(lanes).rev() {
                for i in (4 * q..(4 * q + 4).min(n)).rev() {
                    x = encoders[table_of(i)].put::<true>(x, symbols[i], spill);
                }
            }
            x
        };
        let mut k0 = 0;
        // Given tables: groups of 32 lanes in vector registers, as the order-0 encoder runs them
        // (a real bf16 delta's pack, one core: 1.27 s with every lane scalar, 0.91 s). Each
        // lane's words past the rounds all 32 have in full go first, one lane at a time.
        #[cfg(target_arch = "x86_64")]
        if let Some(given) =
            given.filter(|_| super::simd::avx2::available() && lanes >= super::simd::avx2::ENCODE_WIDTH)
        {
            use super::simd::avx2::ENCODE_WIDTH;
            let info: Vec<u32> = encoders.iter().flat_map(|e| e.info).collect();
            let mut spills: [Spill; ENCODE_WIDTH] = std::array::from_fn(|_| spill());
            let whole = n / 4;
            while k0 + ENCODE_WIDTH <= lanes {
                let full = (whole - (k0 + ENCODE_WIDTH - 1).min(whole)).div_ceil(lanes);
                let mut x = [L; ENCODE_WIDTH];
                for (j, (xj, spill)) in x.iter_mut().zip(spills.iter_mut()).enumerate() {
                    spill.at = spill.buf.len();
                    *xj = encode_lane(k0 + j, full, L, spill);
                }
                if full > 0 {
                    super::simd::avx2::encode_rounds(&info, Some(given), symbols, k0, lanes, full, &mut x, &mut spills);
                }
                for (&xj, spill) in x.iter().zip(&spills) {
                    record.push(out, xj, spill);
                }
                k0 += ENCODE_WIDTH;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = given;
        // The rest one lane at a time. (For a neighbour-context record, two or four lanes side
        // by side, as the order-0 loop runs them, measured slower: the states and spill
        // positions no longer fit in registers.)
        let mut spill = spill();
        for k in k0..lanes {
            spill.at = spill.buf.len();
            let x = encode_lane(k, 0, L, &mut spill);
            record.push(out, x, &spill);
        }
        record.finish(out);
    }

    /// Reads the map and tables from the front of `input`, returning them and the bytes after.
    pub fn read(input: &[u8]) -> Result<(Contexts, &[u8]), String> {
        Contexts::read_with(input, false)
    }

    /// [`Contexts::read`] for a mode 7 record (spec §6.4.2), whose map may also hold
    /// [`UNCHANGED`] (but not only that).
    pub fn read_base_blocks(input: &[u8]) -> Result<(Contexts, &[u8]), String> {
        Contexts::read_with(input, true)
    }

    fn read_with(input: &[u8], unchanged: bool) -> Result<(Contexts, &[u8]), String> {
        let map: [u8; 256] = input.get(..256).ok_or("context map is cut short")?.try_into().expect("256 bytes");
        let allowed = |t: u8| usize::from(t) < MAX_TABLES || (unchanged && t == UNCHANGED);
        if let Some(a) = map.iter().position(|&t| !allowed(t)) {
            return Err(format!("context map sends symbol {a} to table {}, past the 16 allowed", map[a]));
        }
        if map.iter().all(|&t| t == UNCHANGED) {
            return Err("context map sends every context to unchanged: no table".into());
        }
        let mut rest = &input[256..];
        let count = table_count(&map);
        let mut tables = Vec::with_capacity(count);
        for _ in 0..count {
            let (t, after) = Table::read(rest)?;
            tables.push(t);
            rest = after;
        }
        Ok((Contexts { map, tables }, rest))
    }

    /// Decodes `out.len()` symbols from the lanes laid out as `layout` in `stored`.
    pub fn decode_lanes(&self, stored: &[u8], layout: &LaneLayout, out: &mut [u8]) -> Result<(), String> {
        decode_lanes_with(&Slots::contexts(&self.map, &self.tables), stored, layout, out, None, Kernel::Best)
    }

    /// Decodes `out.len()` symbols from the lanes laid out as `layout` in `stored`, symbol i
    /// with table `tables[i]`: `map[c]` for its base context c (spec §6.4.1).
    pub fn decode_given(
        &self,
        stored: &[u8],
        layout: &LaneLayout,
        tables: &[u8],
        out: &mut [u8],
    ) -> Result<(), String> {
        assert_eq!(tables.len(), out.len());
        decode_lanes_with(&Slots::given(&self.tables), stored, layout, out, Some(tables), Kernel::Best)
    }

    /// Appends the map, the tables and `symbols` in blocks of 65536 (spec §6.4.2), symbol i
    /// coded with table `tables[i]`, `map` of its base context; where that is [`UNCHANGED`],
    /// symbol i is 0 and not coded.
    pub fn encode_given_blocks(&self, symbols: &[u8], tables: &[u8], out: &mut Vec<u8>) {
        self.encode_given_blocks_with(symbols, tables, out, BlockLoop::Avx512);
    }

    /// [`Contexts::encode_given_blocks`] on the loops up to `widest` that the CPU has.
    pub fn encode_given_blocks_with(&self, symbols: &[u8], tables: &[u8], out: &mut Vec<u8>, widest: BlockLoop) {
        assert_eq!(symbols.len(), tables.len());
        out.extend_from_slice(&self.map);
        for t in &self.tables {
            t.write(out);
        }
        if !self.has_unchanged() {
            return super::blocks::encode_given_blocks_with(&self.tables, tables, symbols, out, widest);
        }
        // The coded elements' symbols and table indices, each block of elements' share.
        debug_assert!(symbols.iter().zip(tables).all(|(&s, &t)| t != UNCHANGED || s == 0), "an unchanged byte is 0");
        let (mut coded, mut kept) = (Vec::new(), Vec::new());
        let ranges = unchanged::leave_out(tables, CONTEXT_BLOCK_SYMBOLS, &mut coded);
        unchanged::leave_out_of(tables, symbols, CONTEXT_BLOCK_SYMBOLS, &mut kept);
        let n = unchanged::coded_count(&ranges);
        super::blocks::encode_given_ranges_with(&self.tables, &coded[..n], &kept[..n], &ranges, out, widest);
    }

    /// Decodes `out.len()` symbols from blocks laid out as `layout` in `stored`, symbol i with
    /// table `tables[i]`: `map[c]` for its base context c (spec §6.4.2).
    pub fn decode_given_blocks(
        &self,
        stored: &[u8],
        layout: &BlockLayout,
        tables: &[u8],
        out: &mut [u8],
    ) -> Result<(), String> {
        self.decode_given_blocks_with(stored, layout, tables, out, BlockLoop::Avx512)
    }

    /// [`Contexts::decode_given_blocks`] on the loops up to `widest` that the CPU has.
    pub fn decode_given_blocks_with(
        &self,
        stored: &[u8],
        layout: &BlockLayout,
        tables: &[u8],
        out: &mut [u8],
        widest: BlockLoop,
    ) -> Result<(), String> {
        assert_eq!(tables.len(), out.len());
        let slots = Table::all_slots(&self.tables);
        if !self.has_unchanged() {
            let ranges = block_ranges(out.len(), layout.size);
            return super::blocks::decode_chosen_blocks_with(
                &slots,
                Choice::Given(tables),
                stored,
                layout,
                &ranges,
                out,
                widest,
            );
        }
        // Leave the unchanged elements out, decode the others, put them back among zeros.
        CODED.with_borrow_mut(|(coded, decoded)| {
            let ranges = unchanged::leave_out(tables, layout.size, coded);
            let n = unchanged::coded_count(&ranges);
            // Grown as needed, never shortened (zeroing it afresh each plane showed in profiles).
            if decoded.len() < n + unchanged::PADDING {
                decoded.resize(n + unchanged::PADDING, 0);
            }
            let given = Choice::Given(&coded[..n]);
            super::blocks::decode_chosen_blocks_with(
                &slots,
                given,
                stored,
                layout,
                &ranges,
                &mut decoded[..n],
                widest,
            )?;
            unchanged::expand(tables, decoded, out);
            Ok(())
        })
    }

    /// Appends the map, the tables and `symbols` in blocks of 65536 with neighbour contexts
    /// (spec §6.2.7): each symbol coded with table `map` of the symbol its state codes one step
    /// before it. `full`: the plane's pair counts at lag 32, if counted in full; else the
    /// tables are counted here from each symbol's table index.
    pub fn encode_neighbour_blocks(map: [u8; 256], full: Option<&Pairs>, symbols: &[u8], out: &mut Vec<u8>) {
        TABLES.with_borrow_mut(|tables| {
            super::blocks::neighbour_tables(&map, symbols, tables);
            let model = match full {
                Some(pairs) => Contexts::new(map, pairs),
                None => Contexts::count_tables(map, symbols, tables),
            };
            model.encode_given_blocks(symbols, tables, out);
        })
    }

    /// Decodes `out.len()` symbols from blocks with neighbour contexts (spec §6.2.7) laid out
    /// as `layout` in `stored`, on the loops up to `widest` that the CPU has.
    pub fn decode_neighbour_blocks_with(
        &self,
        stored: &[u8],
        layout: &BlockLayout,
        out: &mut [u8],
        widest: BlockLoop,
    ) -> Result<(), String> {
        let slots = Table::all_slots(&self.tables);
        let ranges = block_ranges(out.len(), layout.size);
        super::blocks::decode_chosen_blocks_with(
            &slots,
            Choice::Neighbour(&self.map),
            stored,
            layout,
            &ranges,
            out,
            widest,
        )
    }

    /// Whether the map holds [`UNCHANGED`] (a mode 7 record's, spec §6.4.2).
    pub fn has_unchanged(&self) -> bool {
        self.map.contains(&UNCHANGED)
    }

    /// The map: the table of a symbol in each context.
    pub fn map(&self) -> &[u8; 256] {
        &self.map
    }

    /// The tables, in order.
    pub fn tables(&self) -> &[Table] {
        &self.tables
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rans::lane_count;
    use crate::rans::tests::{both_loops, xorshift};

    /// Each symbol's table in its given context: `map[contexts[i]]`.
    fn tables_of(model: &Contexts, contexts: &[u8]) -> Vec<u8> {
        contexts.iter().map(|&c| model.map[usize::from(c)]).collect()
    }

    /// Runs of slowly drifting symbols, as an exponent plane's.
    fn drifting(n: usize) -> Vec<u8> {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut level = 120i32;
        (0..n)
            .map(|_| {
                let s = xorshift(&mut s);
                if s.is_multiple_of(64) {
                    level = (level + (s >> 8) as i32 % 9 - 4).clamp(100, 140);
                }
                (level + ((s >> 20) % 3) as i32 - 1) as u8
            })
            .collect()
    }

    #[test]
    fn round_trips_at_every_length_and_codes_neighbours_smaller_than_one_table() {
        for n in [0, 1, 3, 4, 5, 4095, 4096, 4097, 40_000, 300_001] {
            let data = drifting(n);
            let lanes = lane_count(n);
            let pairs = pair_counts(&data, lanes, false);
            let Some(map) = Contexts::group(&pairs) else {
                assert_eq!(n, 0);
                continue;
            };
            let model = Contexts::new(map, &pairs);
            let mut enc = vec![0xEE];
            model.encode_lanes(&data, &mut enc);
            // The lanes run side by side in vector registers from 32 lanes on (n = 300 001 has
            // 74): the bytes of the lane-by-lane loop.
            let mut one_by_one = vec![0xEE];
            let map = model.map.map(usize::from);
            model.encode_by(&data, |i| map[usize::from(before(&data, i, lanes))], None, &mut one_by_one);
            assert!(enc == one_by_one, "n {n}: the vector and lane-by-lane encoders differ");
            let (read, rest) = Contexts::read(&enc[1..]).unwrap();
            assert_eq!(read, model);
            let at = enc.len() - rest.len();
            let layout = LaneLayout::read(&enc, at, n).unwrap();
            assert_eq!(layout.bytes.end, enc.len());
            let mut out = vec![0u8; n];
            read.decode_lanes(&enc, &layout, &mut out).unwrap();
            assert_eq!(out, data, "n {n}");
            if n == 300_001 {
                let mut order0 = Vec::new();
                let table = Table::from_histogram(&crate::rans::histogram(&data));
                crate::rans::encode_lanes(&table, &data, &mut order0);
                assert!(enc.len() < order0.len() * 9 / 10, "{} against {}", enc.len(), order0.len());
            }
        }
    }

    #[test]
    fn damaged_records_are_errors() {
        let data = drifting(20_000);
        let pairs = pair_counts(&data, lane_count(data.len()), false);
        let model = Contexts::new(Contexts::group(&pairs).unwrap(), &pairs);
        let mut enc = Vec::new();
        model.encode_lanes(&data, &mut enc);
        let mut bad = enc.clone();
        bad[7] = 16;
        assert!(Contexts::read(&bad).unwrap_err().contains("table 16"));
        assert!(Contexts::read(&enc[..255]).is_err());
        // Another valid map reads, but its tables no longer match the lanes.
        let (_, rest) = Contexts::read(&enc).unwrap();
        let at = enc.len() - rest.len();
        let layout = LaneLayout::read(&enc, at, data.len()).unwrap();
        let mut other = model.clone();
        other.map.swap(data[0].into(), data[1].into());
        other.map[0] = other.map[0].wrapping_add(1) % other.tables.len() as u8;
        let mut out = vec![0u8; data.len()];
        assert!(other.decode_lanes(&enc, &layout, &mut out).is_err() || out != data);
        let mut cut = enc.clone();
        cut[layout.bytes.start + 5] ^= 0x55;
        assert!(model.decode_lanes(&cut, &layout, &mut out).is_err() || out != data);
    }

    #[test]
    #[cfg_attr(feature = "no-avx2-tests", ignore = "built with --features no-avx2-tests: no AVX2 here")]
    fn vector_and_scalar_loops_agree_on_valid_and_damaged_records() {
        crate::rans::require_avx2();
        // 45 lanes: a group of 32, one of 8 and a register part-filled with 5.
        let n = 45 * 4096 + 3;
        let data = drifting(n);
        let pairs = pair_counts(&data, lane_count(n), false);
        let model = Contexts::new(Contexts::group(&pairs).unwrap(), &pairs);
        let mut enc = Vec::new();
        model.encode_lanes(&data, &mut enc);
        let (_, rest) = Contexts::read(&enc).unwrap();
        let layout = LaneLayout::read(&enc, enc.len() - rest.len(), n).unwrap();
        let slots = Slots::contexts(&model.map, &model.tables);
        let both = |stored: &[u8]| both_loops(&slots, stored, &layout, n, None);
        assert_eq!(both(&enc).unwrap(), data);
        for at in (layout.bytes.start..layout.bytes.end).step_by(997) {
            let mut bad = enc.clone();
            bad[at] ^= 0x5A;
            assert!(both(&bad).is_err());
        }
    }

    /// Symbols in runs of two kinds: near 10, followed by more near 10; or alternating between
    /// near 138 and near 202. Symbols 128 apart (10 and 138) then have different tables next,
    /// so a loop that looks a high symbol's table up as the low one's decodes wrongly.
    fn high_and_low(n: usize) -> Vec<u8> {
        let mut s = 0x0DDB_1A5E_5BAD_5EEDu64;
        let mut high = false;
        (0..n)
            .map(|i| {
                let s = xorshift(&mut s);
                if s.is_multiple_of(64) {
                    high = !high;
                }
                let r = ((s >> 20) % 5) as u8;
                match (high, i % 2) {
                    (false, _) => 8 + r,
                    (true, 0) => 136 + r,
                    (true, _) => 200 + r,
                }
            })
            .collect()
    }

    #[test]
    #[cfg_attr(feature = "no-avx2-tests", ignore = "built with --features no-avx2-tests: no AVX2 here")]
    fn vector_and_scalar_loops_agree_where_symbols_128_apart_have_different_tables() {
        crate::rans::require_avx2();
        let n = 45 * 4096 + 3;
        let data = high_and_low(n);
        let pairs = pair_counts(&data, lane_count(n), false);
        let model = Contexts::new(Contexts::group(&pairs).unwrap(), &pairs);
        assert!((8..13).any(|s| model.map[s] != model.map[s + 128]), "the test needs tables that differ");
        let mut enc = Vec::new();
        model.encode_lanes(&data, &mut enc);
        let (_, rest) = Contexts::read(&enc).unwrap();
        let layout = LaneLayout::read(&enc, enc.len() - rest.len(), n).unwrap();
        let slots = Slots::contexts(&model.map, &model.tables);
        assert_eq!(both_loops(&slots, &enc, &layout, n, None).unwrap(), data);
    }

    /// Symbols whose spread follows a context byte, as a delta plane's follows its base's
    /// exponent: symbol i is drawn from a range as wide as context i says. Returns (symbols,
    /// contexts).
    fn given(n: usize) -> (Vec<u8>, Vec<u8>) {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        (0..n)
            .map(|_| {
                let s = xorshift(&mut s);
                let c = 118 + (s % 12) as u8;
                (((s >> 8) % (1u64 << (c - 118))) as u8, c)
            })
            .unzip()
    }

    fn given_record(symbols: &[u8], contexts: &[u8]) -> (Contexts, Vec<u8>, LaneLayout) {
        let pairs = given_pair_counts(symbols, contexts, false);
        let model = Contexts::new(Contexts::group(&pairs).unwrap(), &pairs);
        let mut enc = vec![0xEE];
        model.encode_given(symbols, &tables_of(&model, contexts), &mut enc);
        let (read, rest) = Contexts::read(&enc[1..]).unwrap();
        assert_eq!(read, model);
        let layout = LaneLayout::read(&enc, enc.len() - rest.len(), symbols.len()).unwrap();
        assert_eq!(layout.bytes.end, enc.len());
        (model, enc, layout)
    }

    #[test]
    fn given_contexts_round_trip_at_every_length_and_code_smaller_than_one_table() {
        for n in [1, 3, 4, 5, 4095, 4097, 40_000, 45 * 4096 + 3] {
            let (data, contexts) = given(n);
            let (model, enc, layout) = given_record(&data, &contexts);
            let mut out = vec![0u8; n];
            model.decode_given(&enc, &layout, &tables_of(&model, &contexts), &mut out).unwrap();
            assert_eq!(out, data, "n {n}");
            if n > 100_000 {
                let mut order0 = Vec::new();
                crate::rans::encode_lanes(&Table::from_histogram(&crate::rans::histogram(&data)), &data, &mut order0);
                assert!(enc.len() < order0.len() * 9 / 10, "{} against {}", enc.len(), order0.len());
            }
        }
    }

    #[test]
    #[cfg_attr(feature = "no-avx2-tests", ignore = "built with --features no-avx2-tests: no AVX2 here")]
    fn given_contexts_decode_alike_in_vector_and_scalar_loops_on_valid_and_damaged_records() {
        crate::rans::require_avx2();
        // 45 lanes: a group of 32, one of 8 and a register part-filled with 5.
        let n = 45 * 4096 + 3;
        let (data, contexts) = given(n);
        let (model, enc, layout) = given_record(&data, &contexts);
        let slots = Slots::given(&model.tables);
        let indices = tables_of(&model, &contexts);
        let both = |stored: &[u8], indices: &[u8]| both_loops(&slots, stored, &layout, n, Some(indices));
        assert_eq!(both(&enc, &indices).unwrap(), data);
        for at in (layout.bytes.start..layout.bytes.end).step_by(997) {
            let mut bad = enc.clone();
            bad[at] ^= 0x5A;
            // A changed byte fails the lane's end checks or decodes other symbols (rANS cannot
            // always tell: a context with one likely symbol takes almost no bits).
            assert!(both(&bad, &indices).map_or(true, |out| out != data), "byte {at} changed, same symbols");
        }
        // Against another base: the same record, other contexts.
        let mut other = contexts.clone();
        other.rotate_left(1);
        let mut out = vec![0u8; n];
        let wrong = model.decode_given(&enc, &layout, &tables_of(&model, &other), &mut out);
        assert!(wrong.is_err() || out != data);
    }
}
