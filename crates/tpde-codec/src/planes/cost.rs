//! What `auto` weighs beside bytes (issue 68): each plane record's measured decode cost, and
//! the one rule that chooses between records by it.
//!
//! **The rule.** Of two records a plane may take, the writer writes the one that decodes
//! faster, unless the slower saves more than a [`Margin`] of the faster's bytes. The margin
//! depends on the file's role: a keyframe is what a resume reads, and a delta file is written
//! every step and must not grow.
//!
//! **The costs**, ns a symbol on one core of this project's AMD EPYC (Zen 4; AVX2 by
//! `TPDE_ISA=avx2`), best of 15 decodes with the record in cache, on the planes of a real
//! fine-tune (`tools/finetune_checkpoints.py` on all-MiniLM-L6-v2: f32 Adam moments at step 40,
//! pure-bf16 weights at steps 40 and 50), docs/measurements.md:
//!
//! ```text
//! cargo run --release -p tpde --example context_blocks -- m40.safetensors            modes 6, 3, 8
//! cargo run --release -p tpde --example context_blocks -- --deltas w50.safetensors w40.safetensors
//!                                                                                      modes 4, 7
//! cargo run --release -p tpde --example constant_contexts -- w50.safetensors w40.safetensors
//!                                                               the contexts left out of mode 7
//! cargo run --release -p tpde --example plane_records -- w50.safetensors w40.safetensors
//!                                                                                 modes 2 and 5
//! ```
//!
//! Mode 4 (base contexts in lanes) measured as fast as mode 2 (1.010 against 1.045 ns on the
//! same planes), within this machine's noise: it is not ranked against it, and keeps the margin
//! 1.8's writer had ([`saves`]), so that a 1.8-1.10 file written today is what those writers
//! wrote.
//!
//! Records are ranked by the AVX2 column: a file's bytes must not depend on the CPU that wrote
//! it, and AVX2 is what most readers have (issue 68: many cloud CPUs lack AVX-512). AVX-512
//! ranks the records the same way, except that its byte compress makes leaving contexts out of
//! mode 7 pay from a smaller share.

use super::Records;

/// A record's decode cost in ns a symbol of its plane on one core: AVX2, AVX-512.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Cost {
    avx2: f64,
    avx512: f64,
}

/// Mode 2, one table in lanes (AVX2's gathers; AVX-512 has no lane loop of its own).
pub(super) const LANES: Cost = Cost { avx2: 1.076, avx512: 1.076 };
/// Mode 6, one table in blocks.
pub(super) const BLOCKS: Cost = Cost { avx2: 0.595, avx512: 0.554 };
/// Mode 3, the symbol before in lanes.
pub(super) const CONTEXT_LANES: Cost = Cost { avx2: 1.454, avx512: 1.454 };
/// Mode 8, the state's symbol before in blocks.
pub(super) const CONTEXT_BLOCKS: Cost = Cost { avx2: 1.211, avx512: 0.730 };
/// Mode 4, base contexts in lanes (the same planes as mode 7).
pub(super) const BASE_CONTEXT_LANES: Cost = Cost { avx2: 1.010, avx512: 1.010 };
/// Mode 7, base contexts in blocks, a coded symbol (the top planes of the f32 Adam moments'
/// delta from step 40 to 50, 1.54 bits a symbol).
const BASE_CONTEXT_BLOCKS: Cost = Cost { avx2: 0.924, avx512: 0.821 };
/// Mode 7's two passes over every symbol of a plane whose unchanged contexts are left out
/// (spec §6.4.2): the coded symbols' table indices listed, the decoded symbols put back among
/// zeros (byte shuffles on AVX2, VBMI2's compress and expand on AVX-512; bf16 weights' delta
/// from step 40 to 50, 79% of it left out).
const LEFT_OUT: Cost = Cost { avx2: 0.326, avx512: 0.077 };
/// Mode 5, a listed symbol: its position, its byte (the fill is a memset). 2.12 ms for the
/// 331 000 listed of 22.7 M symbols.
const SPARSE_LISTED: Cost = Cost { avx2: 6.4, avx512: 6.4 };

impl Cost {
    /// Mode 7 where `left_out` of the plane's symbols lie in unchanged contexts (0 where none is
    /// left out: then no pass is made either).
    pub(super) fn base_context_blocks(left_out: f64) -> Cost {
        if left_out == 0.0 {
            return BASE_CONTEXT_BLOCKS;
        }
        let coded = 1.0 - left_out;
        Cost {
            avx2: LEFT_OUT.avx2 + coded * BASE_CONTEXT_BLOCKS.avx2,
            avx512: LEFT_OUT.avx512 + coded * BASE_CONTEXT_BLOCKS.avx512,
        }
    }

    /// Mode 5 where `listed` of the plane's symbols differ from its fill.
    pub(super) fn sparse(listed: f64) -> Cost {
        Cost { avx2: listed * SPARSE_LISTED.avx2, avx512: listed * SPARSE_LISTED.avx512 }
    }

    /// The order-0 record the writer would write for a plane of `n` symbols in a file that may
    /// hold `records`: blocks (spec §6.2.6) from one whole block on, else lanes.
    pub(super) fn order0(records: Records, n: usize) -> Cost {
        if records.blocks && super::blocks::worth_it(n) {
            BLOCKS
        } else {
            LANES
        }
    }

    /// Whether this decodes faster than `other`, by the ranking column (AVX2).
    fn faster_than(self, other: Cost) -> bool {
        self.avx2 < other.avx2
    }
}

/// The share of the faster record's bytes that a slower record must save to be written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Margin(f64);

impl Margin {
    /// Keyframe chunks of 4- and 8-byte elements in files that may hold block records: 7%. An
    /// order-0 block decodes about twice as fast as a context record (three times a context
    /// lane); on real fp32 and mixed-precision fine-tunes this made keyframe chunks decode
    /// 1.7-1.8x as fast for 0.29-0.37% more bytes than 1.9's (`examples/block_records`), and
    /// under 1.11 the f32 Adam moments' keyframe is 0.6% smaller than 1.10's and decodes as fast.
    pub(super) const WIDE_KEYFRAME: Margin = Margin(0.07);
    /// The same in files without block records (1.9's writer): 5%. At 2% the top planes of f32
    /// Adam moments took 81 ms of a 121 ms keyframe decode, at 5% 63 ms, for 0.27% more bytes
    /// at most (issue 38: a keyframe may grow by 0.3% for speed; `examples/keyframe_planes`).
    pub(super) const WIDE_KEYFRAME_LANES: Margin = Margin(0.05);
    /// Keyframes of 1- and 2-byte elements and a delta file's keyframe chunks: 2%. A 2-byte
    /// element's top plane is about twice the share of its chunk a 4-byte one's is, so the same
    /// plane margin grows the file twice as much: at 5%, bf16 Adam moments' keyframes grew by
    /// 0.45-0.9%. Coding a plane at all (against storing it) takes the same 2%.
    pub(super) const KEYFRAME: Margin = Margin(0.02);
    /// A delta's planes in files that may hold context block records (1.11): 1%. At 0% the
    /// lanes left in a real f32 Adam-moments delta took 12% of its unpack; at 1% the delta is
    /// 0.10% larger and its own decode 6-12% shorter (`tools/bench/delta_decode.py`); 2% gained
    /// nothing more.
    pub(super) const DELTA: Margin = Margin(0.01);
    /// A delta's base-context records in lanes (mode 4) against one table: 5%, 1.8's writer's
    /// margin, when mode 4 was measured 1.45 times slower than mode 2 (issue 38).
    pub(super) const DELTA_LANES: Margin = Margin(0.05);

    /// The margin of a keyframe chunk of `w`-byte elements in a file that may hold `records`.
    pub(super) fn keyframe(w: usize, records: Records) -> Margin {
        match (w >= 4, records.blocks) {
            (true, true) => Margin::WIDE_KEYFRAME,
            (true, false) => Margin::WIDE_KEYFRAME_LANES,
            (false, _) => Margin::KEYFRAME,
        }
    }
}

/// Whether a record of `bytes` costing `cost` is written rather than one of `than_bytes`
/// costing `than`: the faster one, unless the slower saves more than `margin` of its bytes.
pub(super) fn chosen(bytes: f64, cost: Cost, than_bytes: f64, than: Cost, margin: Margin) -> bool {
    if cost.faster_than(than) {
        !saves(than_bytes, bytes, margin)
    } else {
        saves(bytes, than_bytes, margin)
    }
}

/// Whether a record of `bytes` saves more than `margin` of `than_bytes`: the rule for a record
/// not ranked by cost (mode 4 against one table).
pub(super) fn saves(bytes: f64, than_bytes: f64, margin: Margin) -> bool {
    bytes < than_bytes * (1.0 - margin.0)
}

/// Whether leaving out the unchanged contexts, `left_out` of a mode-7 record's symbols, makes
/// it decode faster: from 0.35 of them on AVX2 (0.09 on AVX-512). Never larger, so cost alone
/// decides (`examples/constant_contexts`: 1.07-1.2 times faster at 0.42-0.50, 10% slower at
/// 0.25).
pub(super) fn leave_out(left_out: f64) -> bool {
    Cost::base_context_blocks(left_out).faster_than(BASE_CONTEXT_BLOCKS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The margins reproduce the thresholds they replaced: a context record in a keyframe
    /// under 0.93 of the order-0 block record, a delta's order-0 blocks within about 1% of its
    /// lanes.
    #[test]
    fn the_slower_record_must_save_the_margin() {
        let m = Margin::WIDE_KEYFRAME;
        assert!(chosen(92.9, CONTEXT_BLOCKS, 100.0, BLOCKS, m));
        assert!(!chosen(93.0, CONTEXT_BLOCKS, 100.0, BLOCKS, m));
        assert!(chosen(101.0, BLOCKS, 100.0, LANES, Margin::DELTA));
        assert!(!chosen(101.2, BLOCKS, 100.0, LANES, Margin::DELTA));
    }

    /// AVX-512 ranks the records that compete for a plane as AVX2 does: a keyframe's order-0
    /// and context records, a delta's order-0 blocks, lanes and base-context blocks.
    #[test]
    fn both_columns_rank_competing_records_alike() {
        let pairs = [(BLOCKS, CONTEXT_BLOCKS), (BLOCKS, CONTEXT_LANES), (LANES, CONTEXT_LANES), (BLOCKS, LANES)];
        for (a, b) in pairs.into_iter().chain([(BLOCKS, BASE_CONTEXT_BLOCKS)]) {
            assert!(a.faster_than(b) && a.avx512 < b.avx512, "{a:?} {b:?}");
        }
    }

    /// Leaving contexts out pays from about a third of the symbols on AVX2; mode 7 beats an
    /// order-0 block from about two thirds.
    #[test]
    fn leaving_out_pays_from_a_third() {
        assert!(!leave_out(0.0) && !leave_out(0.3) && leave_out(0.4) && leave_out(0.9));
        assert!(!Cost::base_context_blocks(0.6).faster_than(BLOCKS));
        assert!(Cost::base_context_blocks(0.75).faster_than(BLOCKS));
    }
}
