//! The block form (spec §6.2.6, since 1.10): a plane cut into blocks of [`BLOCK_SYMBOLS`]
//! symbols, each decoded by 32 interleaved states over one shared stream of 16-bit words.
//!
//! The layout a SIMD core and a GPU warp both want: a block starts on its own from the index
//! (no block depends on another), its 32 states step together, and a state takes at most one
//! word a symbol, so renormalisation is a mask, not a loop. Within a step the words go to the
//! states that need one in state order: a CPU finds each state's word by a mask and a popcount
//! (`vpexpandd`, or a permutation in AVX2), a GPU by a ballot.
//!
//! ```text
//! blocks  u32 end[K] (cumulative word counts); u32 state[32·K]; u16 word[end[K-1]]
//! ```
//! K = ⌈n / 16384⌉. Block b holds symbols 16384·b.. of the plane; its symbol i goes to state
//! i mod 32 at step ⌊i / 32⌋. States lie in [2^16, 2^32).

use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use super::simd::blocks as simd;
use super::*;

/// Symbols a block of an order-0 record holds (the last holds the rest).
pub const BLOCK_SYMBOLS: usize = 16384;
/// Symbols a block of a base-context record holds (spec §6.4.2, since 1.11): four times an
/// order-0 block's, so that the index costs what the lanes' did (132 bytes a 65536 symbols,
/// 8 a 4096), which on a delta's near-empty plane is a tenth of its bytes at 16384.
pub const CONTEXT_BLOCK_SYMBOLS: usize = 65536;
/// Interleaved states a block: a GPU subgroup's width, two AVX-512 registers.
pub const BLOCK_STATES: usize = 32;
/// Lower bound of a block state's interval [2^16, 2^32): one 16-bit word renormalises it.
pub(crate) const BLOCK_L: u32 = 1 << 16;

/// The number of blocks of `n` symbols, [`BLOCK_SYMBOLS`] each: at least one.
pub fn block_count(n: usize) -> usize {
    blocks_of(n, BLOCK_SYMBOLS)
}

/// The number of blocks of `n` symbols, `size` each: at least one.
pub(crate) fn blocks_of(n: usize, size: usize) -> usize {
    n.div_ceil(size).max(1)
}

/// Where a block-form record's parts lie, as offsets into the chunk's stored bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockLayout {
    /// Blocks K.
    pub blocks: u32,
    /// Symbols a block holds: [`BLOCK_SYMBOLS`] or [`CONTEXT_BLOCK_SYMBOLS`].
    pub size: usize,
    /// Offset of `u32 end[K]`.
    pub ends: usize,
    /// Offset of `u32 state[32·K]`.
    pub states: usize,
    /// The words of all blocks (2 bytes each).
    pub words: std::ops::Range<usize>,
}

impl BlockLayout {
    /// Reads the index at `at` in `stored` for `n` symbols and checks what it can without
    /// decoding: ends that never decrease and stay inside `stored`, every state ≥ 2^16.
    pub fn read(stored: &[u8], at: usize, n: usize) -> Result<BlockLayout, String> {
        BlockLayout::read_sized(stored, at, n, BLOCK_SYMBOLS)
    }

    /// [`BlockLayout::read`] for blocks of `size` symbols.
    pub fn read_sized(stored: &[u8], at: usize, n: usize, size: usize) -> Result<BlockLayout, String> {
        let word = |i: usize| u32::from_le_bytes(stored[i..i + 4].try_into().expect("4 bytes"));
        let k = blocks_of(n, size);
        let (ends, states) = (at, at + 4 * k);
        let begin = states + 4 * BLOCK_STATES * k;
        if stored.len() < begin {
            return Err(format!("rANS block index of {k} blocks runs past the chunk"));
        }
        let mut prev = 0;
        for b in 0..k {
            let end = word(ends + 4 * b);
            if end < prev {
                return Err(format!("rANS block {b} ends at word {end}, before block {} does ({prev})", b - 1));
            }
            prev = end;
        }
        for i in 0..BLOCK_STATES * k {
            let x = word(states + 4 * i);
            if x < BLOCK_L {
                let (b, j) = (i / BLOCK_STATES, i % BLOCK_STATES);
                return Err(format!("rANS block {b} state {j} is {x}, below 2^16"));
            }
        }
        let stop = (prev as usize).checked_mul(2).and_then(|l| begin.checked_add(l)).filter(|&e| e <= stored.len());
        let stop = stop.ok_or_else(|| format!("rANS blocks' {prev} words run past the chunk"))?;
        Ok(BlockLayout { blocks: k as u32, size, ends, states, words: begin..stop })
    }

    /// Block `b`'s words, as indices into the record's words, and its 32 initial states.
    pub(crate) fn block(&self, stored: &[u8], b: usize) -> (std::ops::Range<usize>, [u32; BLOCK_STATES]) {
        let word = |i: usize| u32::from_le_bytes(stored[i..i + 4].try_into().expect("4 bytes"));
        let begin = if b == 0 { 0 } else { word(self.ends + 4 * (b - 1)) as usize };
        let x = std::array::from_fn(|j| word(self.states + 4 * (BLOCK_STATES * b + j)));
        (begin..word(self.ends + 4 * b) as usize, x)
    }
}

/// Encodes `symbols` in the block form and appends it (index, then words).
pub fn encode_blocks(table: &Table, symbols: &[u8], out: &mut Vec<u8>) {
    encode_blocks_with(table, symbols, out, BlockLoop::Avx512);
}

/// [`encode_blocks`] on the loops up to `widest` that the CPU has (the tests compare them).
pub(crate) fn encode_blocks_with(table: &Table, symbols: &[u8], out: &mut Vec<u8>, widest: BlockLoop) {
    let ranges = block_ranges(symbols.len(), BLOCK_SYMBOLS);
    encode_by(&BlockEncoder::new(std::slice::from_ref(table)), None, symbols, &ranges, out, widest);
}

/// Encodes `symbols` in blocks of [`CONTEXT_BLOCK_SYMBOLS`], symbol i with table `given[i]` of
/// `tables` (spec §6.4.2), and appends the index and the words, on the loops up to `widest`
/// that the CPU has.
pub(crate) fn encode_given_blocks_with(
    tables: &[Table],
    given: &[u8],
    symbols: &[u8],
    out: &mut Vec<u8>,
    widest: BlockLoop,
) {
    let ranges = block_ranges(symbols.len(), CONTEXT_BLOCK_SYMBOLS);
    encode_given_ranges_with(tables, given, symbols, &ranges, out, widest);
}

/// [`encode_given_blocks_with`] for blocks of the symbols at `ranges` of `symbols`, which
/// follow one another from 0 (mode 7's coded symbols, a block's share of each block of
/// elements, spec §6.4.2).
pub(crate) fn encode_given_ranges_with(
    tables: &[Table],
    given: &[u8],
    symbols: &[u8],
    ranges: &[Range<usize>],
    out: &mut Vec<u8>,
    widest: BlockLoop,
) {
    assert_eq!(given.len(), symbols.len());
    assert!(usize::from(max_index(given)) < tables.len(), "a table index past the tables");
    encode_by(&BlockEncoder::new(tables), Some(given), symbols, ranges, out, widest);
}

/// The table index of every symbol of a plane in blocks of [`CONTEXT_BLOCK_SYMBOLS`] with
/// neighbour contexts (spec §6.2.7): `map` of the symbol its state decodes one step before it
/// (32 symbols back in its block), `map[0]` at a block's first step.
pub(crate) fn neighbour_tables(map: &[u8; 256], symbols: &[u8], tables: &mut Vec<u8>) {
    tables.resize(symbols.len(), 0);
    for (t, s) in tables.chunks_mut(CONTEXT_BLOCK_SYMBOLS).zip(symbols.chunks(CONTEXT_BLOCK_SYMBOLS)) {
        let first = t.len().min(BLOCK_STATES);
        t[..first].fill(map[0]);
        for (ti, &si) in t[first..].iter_mut().zip(s) {
            *ti = map[usize::from(si)];
        }
    }
}

/// Appends the index and the words of the blocks of `symbols` at `ranges` (one after another
/// from 0), symbol i with table `given[i]` where given.
fn encode_by(
    enc: &BlockEncoder,
    given: Option<&[u8]>,
    symbols: &[u8],
    ranges: &[Range<usize>],
    out: &mut Vec<u8>,
    widest: BlockLoop,
) {
    #[cfg(target_arch = "x86_64")]
    let vectors = match widest {
        BlockLoop::Avx512 if simd::encode_available() => BlockLoop::Avx512,
        BlockLoop::Avx512 | BlockLoop::Avx2 if BlockLoop::Avx2.available() => BlockLoop::Avx2,
        _ => BlockLoop::Scalar,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let vectors = {
        let _ = widest;
        BlockLoop::Scalar
    };
    let k = ranges.len();
    let index = out.len();
    out.resize(index + 4 * k + 4 * BLOCK_STATES * k, 0);
    let words_at = out.len();
    // Room for the most words a block can take, one a symbol, written back to front, and eight
    // below them (the AVX2 loop stores eight words at a time).
    let mut spill = vec![0u16; ranges.iter().map(|r| r.len()).max().unwrap_or(0) + 8];
    for (b, range) in ranges.iter().cloned().enumerate() {
        let (x, words) = enc.block(&symbols[range.clone()], given.map(|g| &g[range]), &mut spill, vectors);
        for w in words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        let end = ((out.len() - words_at) / 2) as u32;
        out[index + 4 * b..index + 4 * b + 4].copy_from_slice(&end.to_le_bytes());
        for (j, xj) in x.iter().enumerate() {
            let at = index + 4 * k + 4 * (BLOCK_STATES * b + j);
            out[at..at + 4].copy_from_slice(&xj.to_le_bytes());
        }
    }
}

/// The block form's encoder: the lane form's per-symbol tables ([`SymbolEncoder`]), one per
/// table, with a step for 32-bit states and 16-bit words.
struct BlockEncoder {
    /// Frequencies, starts and reciprocals of each table. The reciprocal m = ⌊2^44 / f⌋ + 1
    /// also serves 32-bit states: (x·m) >> 44 is x / f for every x < 2^32, and x·m stays below
    /// 2^64 for x < x_max = 2^20·f, f < 2^12.
    syms: Vec<SymbolEncoder>,
    /// The vector loops' `freq | start << 12`: 256 entries a table, table after table.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    info: Vec<u32>,
}

impl BlockEncoder {
    fn new(tables: &[Table]) -> BlockEncoder {
        let syms: Vec<SymbolEncoder> = tables.iter().map(SymbolEncoder::new).collect();
        let info = syms.iter().flat_map(|s| s.info).collect();
        BlockEncoder { syms, info }
    }

    /// Encodes one block, last symbol first, symbol i with table `given[i]` (or the one
    /// table), returning its 32 final states and its words in the order the decoder reads them
    /// (a slice of `spill`, filled from the back).
    fn block<'s>(
        &self,
        symbols: &[u8],
        given: Option<&[u8]>,
        spill: &'s mut [u16],
        vectors: BlockLoop,
    ) -> ([u32; BLOCK_STATES], &'s [u16]) {
        let mut x = [BLOCK_L; BLOCK_STATES];
        let mut at = spill.len();
        let table = |i: usize| given.map_or(0, |g| usize::from(g[i]));
        let mut put = |xj: &mut u32, s: u8, t: usize| {
            let sym = &self.syms[t];
            let s = usize::from(s);
            let f = sym.freq[s];
            debug_assert!(f > 0, "symbol {s} is not in the table");
            // Branchless: the word is written either way and kept only if the state spills it.
            let out = *xj >= ((BLOCK_L >> SCALE_BITS) << 16) * f;
            spill[at - 1] = *xj as u16;
            at -= usize::from(out);
            let y = if out { *xj >> 16 } else { *xj };
            let q = ((u64::from(y) * sym.rcp[s]) >> 44) as u32;
            *xj = (q << SCALE_BITS) + (y - q * f) + sym.start[s];
        };
        let whole = symbols.len() / BLOCK_STATES * BLOCK_STATES;
        for (j, &s) in symbols[whole..].iter().enumerate().rev() {
            put(&mut x[j], s, table(whole + j));
        }
        #[cfg(target_arch = "x86_64")]
        {
            let (steps, given) = (&symbols[..whole], given.map(|g| &g[..whole]));
            match vectors {
                BlockLoop::Avx512 => {
                    simd::encode_steps(&self.info, given, steps, &mut x, spill, &mut at);
                    return (x, &spill[at..]);
                }
                BlockLoop::Avx2 => {
                    simd::encode_steps_avx2(&self.info, given, steps, &mut x, spill, &mut at);
                    return (x, &spill[at..]);
                }
                BlockLoop::Scalar => {}
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = vectors;
        for (t, step) in symbols[..whole].chunks_exact(BLOCK_STATES).enumerate().rev() {
            for j in (0..BLOCK_STATES).rev() {
                put(&mut x[j], step[j], table(t * BLOCK_STATES + j));
            }
        }
        (x, &spill[at..])
    }
}

/// Decodes a block-form record (its table given) into `out`, which holds the plane's n
/// symbols: every block, on the widest loop the CPU has.
pub fn decode_blocks(table: &Table, stored: &[u8], layout: &BlockLayout, out: &mut [u8]) -> Result<(), String> {
    decode_blocks_with(table, stored, layout, out, BlockLoop::Avx512)
}

/// The decode loops of the block form, narrowest first (for tests and benchmarks that compare
/// them; [`decode_blocks`] takes the widest the CPU has).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum BlockLoop {
    /// One state at a time: the reference.
    Scalar,
    /// Two blocks side by side, eight states a register.
    Avx2,
    /// Four blocks side by side, sixteen states a register.
    Avx512,
}

impl BlockLoop {
    /// Whether this CPU runs the loop.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return match self {
            BlockLoop::Scalar => true,
            BlockLoop::Avx2 => crate::isa::avx2(),
            BlockLoop::Avx512 => crate::isa::avx512(false, false),
        };
        #[cfg(not(target_arch = "x86_64"))]
        return self == BlockLoop::Scalar;
    }
}

/// [`decode_blocks`] on the loops up to `widest` that the CPU has.
pub fn decode_blocks_with(
    table: &Table,
    stored: &[u8],
    layout: &BlockLayout,
    out: &mut [u8],
    widest: BlockLoop,
) -> Result<(), String> {
    let ranges = block_ranges(out.len(), layout.size);
    decode_chosen_blocks_with(&table.slots(), Choice::One, stored, layout, &ranges, out, widest)
}

/// How a block record's symbols choose their table among the record's.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Choice<'a> {
    /// One table (spec §6.2.6).
    One,
    /// Symbol i's table is `given[i]`, from its base context (§6.4.2).
    Given(&'a [u8]),
    /// A symbol's table is `map` of the symbol its state decoded one step before, `map[0]` at a
    /// block's first step (§6.2.7).
    Neighbour(&'a [u8; 256]),
}

/// Decodes a block-form record of several tables (`slots`, 4096 a table, table after table)
/// into `out`, block b's symbols at `ranges[b]` (one after another from 0, one range a block),
/// each symbol's table chosen by `choice`, on the loops up to `widest`. Every index that
/// `choice` gives must name one of the tables.
pub(crate) fn decode_chosen_blocks_with(
    slots: &[u32],
    choice: Choice<'_>,
    stored: &[u8],
    layout: &BlockLayout,
    ranges: &[Range<usize>],
    out: &mut [u8],
    widest: BlockLoop,
) -> Result<(), String> {
    assert_eq!(ranges.len(), layout.blocks as usize);
    // The vector loops gather `slots[(table << 12) + slot]`: every table index must name a
    // table (the readers' maps send every context to one; `simd::decode` checks it).
    let words = &stored[layout.words.clone()];
    let mut blocks: Vec<Block> = (0..layout.blocks as usize).map(|b| Block::of(stored, layout, b)).collect();
    // The vector loops decode the whole steps they can; the scalar loop the rest, and checks.
    // They stop 32 words before the record's end (a step may take 32), which on a near-empty
    // plane is a tenth of its last blocks: so they read a copy with 32 zero words after it. A
    // block that takes them has run past its end, which its end check finds.
    #[cfg(target_arch = "x86_64")]
    PADDED.with_borrow_mut(|padded| {
        padded.clear();
        padded.extend_from_slice(words);
        padded.resize(words.len() + 2 * BLOCK_STATES, 0);
        simd::decode(slots, choice, padded, &mut blocks, ranges, out, widest);
    });
    #[cfg(not(target_arch = "x86_64"))]
    let _ = widest;
    for (b, (block, range)) in blocks.iter_mut().zip(ranges.iter().cloned()).enumerate() {
        let choice = match choice {
            Choice::Given(g) => Choice::Given(&g[range.clone()]),
            other => other,
        };
        decode_tail(slots, choice, words, block, &mut out[range]).map_err(|e| format!("rANS block {b}: {e}"))?;
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// This thread's copy of a record's words with 32 zero words after them, for the vector
    /// loops.
    static PADDED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The largest of `indices` (0 for none): a loop the compiler vectorises.
pub(crate) fn max_index(indices: &[u8]) -> u8 {
    indices.iter().fold(0, |m, &t| m.max(t))
}

/// The symbols of each block, `size` a block, of a plane of `n`: at least one block.
pub(crate) fn block_ranges(n: usize, size: usize) -> Vec<Range<usize>> {
    (0..blocks_of(n, size)).map(|b| (b * size).min(n)..((b + 1) * size).min(n)).collect()
}

/// One block's decoder: its states, where it is in the record's words and its own end there,
/// and the next step to decode.
#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub(crate) x: [u32; BLOCK_STATES],
    pub(crate) pos: usize,
    pub(crate) end: usize,
    pub(crate) step: usize,
}

impl Block {
    pub(crate) fn of(stored: &[u8], layout: &BlockLayout, b: usize) -> Block {
        let (words, x) = layout.block(stored, b);
        Block { x, pos: words.start, end: words.end, step: 0 }
    }
}

/// The word at `i` of a record's words (2 bytes each, little-endian).
#[inline(always)]
fn word(words: &[u8], i: usize) -> u32 {
    u32::from(u16::from_le_bytes([words[2 * i], words[2 * i + 1]]))
}

/// Decodes `block` from its step on to the end of `out` (the block's symbols), one state at a
/// time, each symbol's table chosen by `choice` (`Given` holds the block's indices), then checks
/// the end conditions: every word read, every state back at 2^16.
pub(crate) fn decode_tail(
    slots: &[u32],
    choice: Choice<'_>,
    words: &[u8],
    block: &mut Block,
    out: &mut [u8],
) -> Result<(), String> {
    let steps = out.len().div_ceil(BLOCK_STATES);
    for t in block.step..steps {
        for j in 0..BLOCK_STATES.min(out.len() - t * BLOCK_STATES) {
            let i = t * BLOCK_STATES + j;
            let table = match choice {
                Choice::One => 0,
                Choice::Given(g) => g[i],
                Choice::Neighbour(map) => map[if t == 0 { 0 } else { usize::from(out[i - BLOCK_STATES]) }],
            };
            let (sym, mut y) = pop(&slots[usize::from(table) << SCALE_BITS..], block.x[j]);
            out[i] = sym;
            if y < BLOCK_L {
                if block.pos >= block.end {
                    return Err(format!("out of words at symbol {}", t * BLOCK_STATES + j));
                }
                y = (y << 16) | word(words, block.pos);
                block.pos += 1;
            }
            block.x[j] = y;
        }
    }
    block.step = steps;
    finish(block)
}

/// A decoded block's end conditions (spec §6.2.6).
pub(crate) fn finish(block: &Block) -> Result<(), String> {
    if block.pos != block.end {
        return Err(match block.pos < block.end {
            true => format!("{} words left over", block.end - block.pos),
            false => "out of words".to_owned(),
        });
    }
    match block.x.iter().position(|&x| x != BLOCK_L) {
        Some(j) => Err(format!("state {j} ends at {}, not 2^16", block.x[j])),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
