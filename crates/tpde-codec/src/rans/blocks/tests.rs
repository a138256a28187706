//! The block form's tests: every loop and encoder against the scalar reference.
use super::*;

/// Symbols of about `-log2(p)`-bit geometric spread, from a fixed seed.
fn symbols(n: usize, p: f64, seed: u64) -> Vec<u8> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ seed;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            ((1.0 - u).ln() / p.ln()).floor().min(255.0) as u8
        })
        .collect()
}

fn encoded(data: &[u8]) -> (Table, Vec<u8>, BlockLayout) {
    let table = Table::from_histogram(&histogram(data));
    let mut enc = vec![0xEE];
    encode_blocks(&table, data, &mut enc);
    let layout = BlockLayout::read(&enc, 1, data.len()).unwrap();
    (table, enc, layout)
}

/// Every loop this CPU has, and a note of those it lacks (the ISA tests in rans.rs fail
/// on a CPU without them unless told to report them ignored).
fn loops() -> Vec<BlockLoop> {
    [BlockLoop::Scalar, BlockLoop::Avx2, BlockLoop::Avx512].into_iter().filter(|l| l.available()).collect()
}

#[test]
fn every_loop_round_trips_at_every_length_and_entropy() {
    for p in [0.02, 0.5, 0.95, 0.995] {
        for n in [0, 1, 31, 32, 33, 1000, 16_383, 16_384, 16_385, 3 * 16_384 + 31, 70_001, 9 * 16_384] {
            let data = symbols(n, p, n as u64);
            let (table, enc, layout) = encoded(&data);
            assert_eq!(layout.blocks as usize, block_count(n));
            assert_eq!(layout.words.end, enc.len(), "p {p} n {n}");
            for l in loops() {
                let mut out = vec![0u8; n];
                decode_blocks_with(&table, &enc, &layout, &mut out, l).unwrap();
                assert_eq!(out, data, "{l:?}, p {p} n {n}");
            }
        }
    }
}

/// Damage anywhere in a record: every loop gives the same verdict and, where it accepts,
/// the same symbols (a vector loop reads on into the next block's words, a scalar one stops;
/// both must end in an error).
#[test]
fn every_loop_agrees_on_damaged_records() {
    let data = symbols(5 * 16_384 + 77, 0.7, 5);
    let (table, enc, layout) = encoded(&data);
    let mut s = 12345u64;
    let mut rejected = 0;
    for trial in 0..300 {
        let mut bad = enc.clone();
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let at = match trial % 3 {
            0 => layout.ends + (s >> 33) as usize % (layout.words.start - layout.ends),
            _ => layout.words.start + (s >> 33) as usize % layout.words.len(),
        };
        bad[at] ^= 1 << ((s >> 20) % 8);
        let Ok(bad_layout) = BlockLayout::read(&bad, 1, data.len()) else {
            rejected += 1;
            continue;
        };
        let verdicts: Vec<_> = loops()
            .into_iter()
            .map(|l| {
                let mut out = vec![0u8; data.len()];
                decode_blocks_with(&table, &bad, &bad_layout, &mut out, l).map(|()| out).is_ok()
            })
            .collect();
        assert!(verdicts.iter().all(|&v| v == verdicts[0]), "trial {trial}: {verdicts:?}");
        rejected += usize::from(!verdicts[0]);
    }
    assert!(rejected > 250, "{rejected} of 300 damaged records rejected");
}

/// The AVX-512 and AVX2 encoders write exactly the scalar one's bytes (each where the CPU
/// has it: without AVX2 this fails, saying so, rather than pass on the scalar loop alone).
#[test]
#[cfg_attr(feature = "no-avx2-tests", ignore = "built with --features no-avx2-tests: no AVX2 here")]
fn every_encoder_writes_the_same_bytes() {
    crate::rans::require_avx2();
    // p = 0.9999: one symbol's frequency near 2^12 (states near 2^32), the others at 1.
    for p in [0.02, 0.5, 0.95, 0.995, 0.9999] {
        for n in [1, 31, 32, 33, 16_384, 16_385, 70_001] {
            let data = symbols(n, p, 7 + n as u64);
            let table = Table::from_histogram(&histogram(&data));
            let mut scalar = Vec::new();
            encode_blocks_with(&table, &data, &mut scalar, BlockLoop::Scalar);
            for widest in [BlockLoop::Avx2, BlockLoop::Avx512] {
                let mut vector = Vec::new();
                encode_blocks_with(&table, &data, &mut vector, widest);
                assert!(scalar == vector, "{widest:?}: p {p} n {n}");
            }
        }
    }
}

/// Symbols whose spread depends on a context that changes every few symbols, as a delta's
/// on its base's exponents, and each symbol's table: its context's, of `tables`.
fn given(n: usize, tables: u8, seed: u64) -> (Vec<Table>, Vec<u8>, Vec<u8>) {
    let mut s = 0x2545_F491_4F6C_DD1Du64 ^ seed;
    let given: Vec<u8> = (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as usize % usize::from(tables)).min(i / 7 % usize::from(tables)) as u8
        })
        .collect();
    let spread = [0.02, 0.5, 0.9, 0.99, 0.999];
    let data: Vec<u8> = given
        .iter()
        .enumerate()
        .map(|(i, &t)| symbols(1, spread[usize::from(t) % spread.len()], (i as u64) ^ seed)[0])
        .collect();
    (tables_of(&data, &given, tables), data, given)
}

/// Records of several tables, each symbol's given (spec §6.4.2): every encoder writes the
/// scalar one's bytes, every decoder reads them back and, on damaged records, gives the
/// same verdict and symbols.
#[test]
#[cfg_attr(feature = "no-avx2-tests", ignore = "built with --features no-avx2-tests: no AVX2 here")]
fn given_tables_agree_in_every_loop_on_valid_and_damaged_records() {
    crate::rans::require_avx2();
    for n in [0, 1, 33, 65_535, 65_536, 65_537, 3 * 65_536 + 4099, 9 * 65_536] {
        let (tables, data, given) = given(n, 16, n as u64);
        let slots = Table::all_slots(&tables);
        let mut scalar = Vec::new();
        encode_given_blocks_with(&tables, &given, &data, &mut scalar, BlockLoop::Scalar);
        for widest in [BlockLoop::Avx2, BlockLoop::Avx512] {
            let mut vector = Vec::new();
            encode_given_blocks_with(&tables, &given, &data, &mut vector, widest);
            assert!(scalar == vector, "{widest:?} encoder: n {n}");
        }
        let layout = BlockLayout::read_sized(&scalar, 0, n, CONTEXT_BLOCK_SYMBOLS).unwrap();
        assert_eq!(layout.words.end, scalar.len());
        let decode = |stored: &[u8], layout: &BlockLayout, l| {
            let mut out = vec![0u8; n];
            let ranges = block_ranges(n, CONTEXT_BLOCK_SYMBOLS);
            decode_chosen_blocks_with(&slots, Choice::Given(&given), stored, layout, &ranges, &mut out, l).map(|()| out)
        };
        for l in loops() {
            assert_eq!(decode(&scalar, &layout, l).unwrap(), data, "{l:?}, n {n}");
        }
        agree_on_damage(&scalar, &layout, n, |bad, l, loop_| decode(bad, l, loop_));
    }
}

/// One bit flipped at 40 places of a record of 65536-symbol blocks from its states on: where
/// the index still reads, every loop gives the same symbols, or an error (each loop may name
/// another condition).
fn agree_on_damage(
    record: &[u8],
    layout: &BlockLayout,
    n: usize,
    decode: impl Fn(&[u8], &BlockLayout, BlockLoop) -> Result<Vec<u8>, String>,
) {
    let mut s = n as u64 + 1;
    for trial in 0..40 {
        if layout.words.is_empty() {
            break;
        }
        let mut bad = record.to_vec();
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let at = layout.states + (s >> 33) as usize % (bad.len() - layout.states);
        bad[at] ^= 1 << ((s >> 20) % 8);
        let Ok(bad_layout) = BlockLayout::read_sized(&bad, 0, n, CONTEXT_BLOCK_SYMBOLS) else {
            continue;
        };
        let verdicts: Vec<_> = loops().into_iter().map(|l| decode(&bad, &bad_layout, l).ok()).collect();
        assert!(verdicts.iter().all(|v| *v == verdicts[0]), "trial {trial}, n {n}");
    }
}

/// A table for each of `count` indices, from the symbols of `data` that `indices` gives it
/// (and symbols 0 and 255, so that every table has two).
fn tables_of(data: &[u8], indices: &[u8], count: u8) -> Vec<Table> {
    (0..count)
        .map(|t| {
            let mut h = [0u64; 256];
            for (&d, _) in data.iter().zip(indices).filter(|(_, &i)| i == t) {
                h[usize::from(d)] += 1;
            }
            h[0] += 1;
            h[255] += 1;
            Table::from_histogram(&h)
        })
        .collect()
}

/// Records of several tables chosen by the symbol each state decoded before (spec §6.2.7):
/// every loop reads the scalar encoder's bytes back and, on damaged records, gives the same
/// verdict and symbols.
#[test]
#[cfg_attr(feature = "no-avx2-tests", ignore = "built with --features no-avx2-tests: no AVX2 here")]
fn neighbour_tables_agree_in_every_loop_on_valid_and_damaged_records() {
    crate::rans::require_avx2();
    let map: [u8; 256] = std::array::from_fn(|a| (a % 5) as u8 * 3 % 13);
    for n in [0, 1, 33, 65, 65_536, 65_569, 3 * 65_536 + 4099] {
        let (_, data, _) = given(n, 16, n as u64 + 3);
        let mut indices = Vec::new();
        neighbour_tables(&map, &data, &mut indices);
        let tables = tables_of(&data, &indices, 13);
        let slots = Table::all_slots(&tables);
        let mut enc = Vec::new();
        encode_given_blocks_with(&tables, &indices, &data, &mut enc, BlockLoop::Scalar);
        let layout = BlockLayout::read_sized(&enc, 0, n, CONTEXT_BLOCK_SYMBOLS).unwrap();
        let decode = |stored: &[u8], layout: &BlockLayout, l| {
            let mut out = vec![0u8; n];
            let ranges = block_ranges(n, CONTEXT_BLOCK_SYMBOLS);
            decode_chosen_blocks_with(&slots, Choice::Neighbour(&map), stored, layout, &ranges, &mut out, l)
                .map(|()| out)
        };
        for l in loops() {
            assert_eq!(decode(&enc, &layout, l).unwrap(), data, "{l:?}, n {n}");
        }
        agree_on_damage(&enc, &layout, n, |bad, l, loop_| decode(bad, l, loop_));
    }
}

#[test]
fn malformed_indexes_are_rejected_before_decoding() {
    let data = symbols(40_000, 0.5, 1);
    let (_, enc, layout) = encoded(&data);
    let mut low = enc.clone();
    low[layout.states + 4 * 40..layout.states + 4 * 41].copy_from_slice(&0xFFFFu32.to_le_bytes());
    let e = BlockLayout::read(&low, 1, data.len()).unwrap_err();
    assert!(e.contains("block 1 state 8 is 65535, below 2^16"), "{e}");
    let mut back = enc.clone();
    back[layout.ends + 4..layout.ends + 8].copy_from_slice(&0u32.to_le_bytes());
    assert!(BlockLayout::read(&back, 1, data.len()).unwrap_err().contains("before block 0"));
    let e = BlockLayout::read(&enc[..enc.len() - 1], 1, data.len()).unwrap_err();
    assert!(e.contains("run past the chunk"), "{e}");
    assert!(BlockLayout::read(&enc[..100], 1, data.len()).unwrap_err().contains("index of 3 blocks"));
}
