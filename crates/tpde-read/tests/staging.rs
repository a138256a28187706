//! Staged reads (what a device load streams through its ring): every requested byte lands in
//! exactly one piece, pieces cut at chunk boundaries, no stage is longer than its slot, and the
//! stages decode to the bytes a plain read gives.

use proptest::prelude::*;
use tpde_codec::Encoder;
use tpde_format::DType;
use tpde_read::staging::{plan, slot_len};
use tpde_read::Reader;
use tpde_write::{WriteOptions, Writer};

/// A file of tensors of `sizes` bytes (pseudo-random, compressible) in chunks of `chunk` bytes.
fn file(sizes: &[usize], chunk: u64, encoder: Encoder) -> Vec<u8> {
    let mut w = Writer::new(Vec::new(), WriteOptions { encoder, chunk_bytes: chunk, ..Default::default() }).unwrap();
    for (k, &n) in sizes.iter().enumerate() {
        let bytes: Vec<u8> = (0..n).map(|i| ((i * 31 + k * 7) % 251) as u8 & 0x3f).collect();
        w.add_tensor(&format!("t{k}"), DType::U8, &[n as u64], &bytes).unwrap();
    }
    w.finish().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn stages_cover_each_request_once_within_the_slot(
        sizes in prop::collection::vec(0usize..3000, 1..8),
        chunk in 1u64..8,
        slot in 1u64..4000,
        cut in 0.0f64..1.0,
        zstd in any::<bool>(),
    ) {
        let encoder = if zstd { Encoder::Zstd { level: 1 } } else { Encoder::Raw };
        let bytes = file(&sizes, chunk * 64, encoder);
        let r = Reader::from_source(bytes).unwrap();
        // Whole tensors, and one range from inside each (not on a chunk boundary).
        let mut requests = Vec::new();
        for t in r.tensors() {
            requests.push((t, 0..t.byte_length));
            let lo = (t.byte_length as f64 * cut) as u64;
            requests.push((t, lo..t.byte_length - (t.byte_length - lo) / 3));
        }
        let slot = slot_len(&requests, slot);
        let stages = plan(&requests, slot);
        let mut next: Vec<u64> = requests.iter().map(|(_, range)| range.start).collect();
        let mut outs: Vec<Vec<u8>> = requests.iter().map(|(_, range)| Vec::with_capacity((range.end - range.start) as usize)).collect();
        let mut buf = vec![0u8; slot as usize];
        for stage in &stages {
            prop_assert!(stage.len > 0 && stage.len <= slot, "stage of {} bytes, slot {}", stage.len, slot);
            let mut at = 0;
            for p in &stage.pieces {
                prop_assert_eq!(p.at, at, "pieces lie back to back");
                at += p.range.end - p.range.start;
                prop_assert!(p.range.start < p.range.end);
                prop_assert_eq!(p.range.start, next[p.request], "pieces in order, none skipped or repeated");
                next[p.request] = p.range.end;
                let (t, range) = &requests[p.request];
                let boundary = t.chunks.iter().scan(0, |lo, c| { *lo += c.decoded_length; Some(*lo) }).any(|b| b == p.range.end);
                prop_assert!(p.range.end == range.end || boundary, "a piece ends at a chunk boundary or its request's end");
            }
            prop_assert_eq!(at, stage.len);
            r.read_stage(&requests, stage, &mut buf).unwrap();
            for p in &stage.pieces {
                outs[p.request].extend_from_slice(&buf[p.at as usize..(p.at + p.range.end - p.range.start) as usize]);
            }
        }
        for (k, (t, range)) in requests.iter().enumerate() {
            prop_assert_eq!(next[k], range.end, "request {} is whole", k);
            let whole = r.read_tensor(t).unwrap();
            prop_assert_eq!(&outs[k][..], &whole[range.start as usize..range.end as usize]);
        }
    }
}

#[test]
fn the_slot_holds_the_largest_chunk_touched() {
    let r = Reader::from_source(file(&[5000, 100], 1024, Encoder::Raw)).unwrap();
    let t = r.tensors();
    assert_eq!(slot_len(&[(&t[0], 0..5000)], 10), 1024);
    assert_eq!(slot_len(&[(&t[1], 0..100)], 10), 100);
    assert_eq!(slot_len(&[(&t[0], 0..5000)], 1 << 20), 1 << 20);
}

#[test]
fn a_short_buffer_is_an_error_not_a_panic() {
    let r = Reader::from_source(file(&[300], 128, Encoder::Raw)).unwrap();
    let requests = [(&r.tensors()[0], 0..300)];
    let stages = plan(&requests, 1000);
    assert_eq!(stages.len(), 1);
    let err = r.read_stage(&requests, &stages[0], &mut [0u8; 299]).unwrap_err();
    assert!(err.to_string().contains("staging buffer"), "{err}");
}
