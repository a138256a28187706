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

pub mod blocks;
pub mod context;
mod lanes;
mod serial;
#[cfg(target_arch = "x86_64")]
mod simd;
mod symbol;
mod table;
pub mod unchanged;

pub use blocks::{
    block_count, decode_blocks, decode_blocks_with, encode_blocks, BlockLayout, BlockLoop, BLOCK_STATES, BLOCK_SYMBOLS,
    CONTEXT_BLOCK_SYMBOLS,
};
pub use context::Contexts;
pub use lanes::{decode_lanes, encode_lanes, lane_count, lane_loop, LaneLayout};
pub use serial::{decode, encode};
pub use table::{histogram, Table};

pub(crate) use lanes::*;
#[cfg(all(test, target_arch = "x86_64"))]
use simd::avx512;
pub(crate) use symbol::*;
pub(crate) use table::*;

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
