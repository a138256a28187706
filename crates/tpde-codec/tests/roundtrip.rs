//! Property tests of every codec: the round trip is bit-exact, and decoding mutated stored
//! bytes returns an error or some bytes of the right length, never a panic.

use proptest::prelude::*;
use tpde_codec::{decode, ChunkContext, Encoder};
use tpde_format::DType;

const ENCODERS: [Encoder; 3] = [Encoder::Raw, Encoder::Zstd { level: 1 }, Encoder::Zstd { level: 19 }];

fn ctx() -> ChunkContext {
    ChunkContext { dtype: DType::U8 }
}

proptest! {
    #[test]
    fn round_trip_is_bit_exact(data in prop::collection::vec(any::<u8>(), 0..20_000), which in 0usize..3) {
        let enc = ENCODERS[which];
        let mut stored = Vec::new();
        let params = enc.codec().encode(ctx(), &data, &mut stored).unwrap();
        let mut out = vec![0xAB; data.len()];
        decode(enc.tag(), ctx(), &params, &stored, &mut out).unwrap();
        prop_assert_eq!(out, data);
    }

    #[test]
    fn mutated_stored_bytes_never_panic(
        data in prop::collection::vec(0u8..4, 1..5_000),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        which in 0usize..3,
    ) {
        let enc = ENCODERS[which];
        let mut stored = Vec::new();
        let params = enc.codec().encode(ctx(), &data, &mut stored).unwrap();
        for (i, b) in flips {
            let i = i.index(stored.len());
            stored[i] ^= b;
        }
        let cut = cut.index(stored.len() + 1);
        let mut out = vec![0; data.len()];
        match decode(enc.tag(), ctx(), &params, &stored[..cut], &mut out) {
            Ok(()) => {}
            Err(e) => prop_assert_eq!(e.kind(), tpde_format::ErrorKind::Malformed),
        }
    }
}

#[test]
fn wrong_lengths_and_params_are_errors() {
    let mut stored = Vec::new();
    Encoder::Zstd { level: 3 }.codec().encode(ctx(), b"hello hello hello", &mut stored).unwrap();
    let mut short = [0u8; 5];
    assert!(decode(tpde_format::CodecTag::Zstd, ctx(), &[], &stored, &mut short).is_err());
    let mut long = [0u8; 50];
    assert!(decode(tpde_format::CodecTag::Zstd, ctx(), &[], &stored, &mut long).is_err());
    let mut exact = [0u8; 17];
    assert!(decode(tpde_format::CodecTag::Zstd, ctx(), &[1], &stored, &mut exact).is_err());
    decode(tpde_format::CodecTag::Zstd, ctx(), &[], &stored, &mut exact).unwrap();
    assert_eq!(&exact, b"hello hello hello");
    assert!(decode(tpde_format::CodecTag::Raw, ctx(), &[], b"abc", &mut [0u8; 4]).is_err());
}
