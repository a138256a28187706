//! Property tests of every codec: the round trip is bit-exact for every dtype, with and without
//! a base, on data shaped like consecutive checkpoints (a base and a copy with some elements
//! changed, some only in low bits); decoding mutated stored bytes returns an error or bytes of
//! the right length, never a panic.

use proptest::prelude::*;
use tpde_codec::planes::PlaneRecord;
use tpde_codec::{decode, ChunkContext, Encoder};
use tpde_format::{CodecTag, DType, ErrorKind};

const DTYPES: [DType; 8] =
    [DType::U8, DType::BF16, DType::F16, DType::F32, DType::F64, DType::I64, DType::F8E4M3, DType::Bool];

fn encoders() -> Vec<Encoder> {
    let mut e =
        vec![Encoder::Raw, Encoder::Zstd { level: 1 }, Encoder::Zstd { level: 19 }, Encoder::AutoSerial, Encoder::Auto];
    e.extend(
        CodecTag::ALL
            .into_iter()
            .filter(|t| !matches!(t, CodecTag::Raw | CodecTag::Zstd | CodecTag::DeltaPredicted))
            .map(Encoder::Codec),
    );
    e
}

/// A base and a current chunk of `n` elements of `dtype`: `changed` of 256 elements differ,
/// each by a flip of one of its `low_bits` lowest bits or, one time in eight, anywhere.
fn checkpoint_pair() -> impl Strategy<Value = (DType, Vec<u8>, Vec<u8>)> {
    (0usize..DTYPES.len(), 0usize..3000, any::<u64>(), 0u32..=256, 1u32..12).prop_map(
        |(d, n, seed, changed, low_bits)| {
            let dtype = DTYPES[d];
            let w = dtype.size() as usize;
            let mut rng = seed | 1;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let base: Vec<u8> = (0..n * w).map(|_| next() as u8).collect();
            let mut cur = base.clone();
            for e in cur.chunks_exact_mut(w) {
                let r = next();
                if (r & 255) < u64::from(changed) {
                    let bits = (w * 8) as u64;
                    let bit =
                        if r >> 8 & 7 == 0 { (r >> 11) % bits } else { (r >> 11) % u64::from(low_bits).min(bits) };
                    e[(bit / 8) as usize] ^= 1 << (bit % 8);
                }
            }
            (dtype, base, cur)
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn sparse_positions_are_the_changed_elements((dtype, base, cur) in checkpoint_pair()) {
        use tpde_codec::Sparse;
        let w = dtype.size() as usize;
        let changed: Vec<u32> = (0..cur.len() / w).filter(|&i| cur[i * w..][..w] != base[i * w..][..w]).map(|i| i as u32).collect();
        // Twice, on the whole chunk and on its first half: lengths that end inside a block of
        // the 64 elements the positions are found in.
        prop_assert_eq!(&Sparse::positions(&cur, &base, w), &changed);
        let half = cur.len() / w / 2 * w;
        let first: Vec<u32> = changed.iter().copied().filter(|&i| (i as usize) < half / w).collect();
        prop_assert_eq!(Sparse::positions(&cur[..half], &base[..half], w), first);
        prop_assert_eq!(Sparse::count_changed(&cur, &base, w), changed.len());
    }

    #[test]
    fn round_trip_is_bit_exact(
        (dtype, base, cur) in checkpoint_pair(),
        which in any::<prop::sample::Index>(),
        with_base: bool,
        minor in 0u16..=8,
    ) {
        let encoders = encoders();
        let enc = encoders[which.index(encoders.len())];
        let ctx = ChunkContext { dtype, base: with_base.then_some(&base[..]) };
        let mut stored = Vec::new();
        // From 1.8 on, `auto` may write sparse plane records.
        let (tag, params) = enc.encode_in(ctx, &cur, minor, &mut stored).unwrap();
        prop_assert!(with_base || !tag.needs_base(), "{tag} chosen without a base");
        tpde_codec::decoder(tag).check_lengths(stored.len() as u64, cur.len() as u64).unwrap();
        let mut out = vec![0xAB; cur.len()];
        decode(tag, ctx, &params, &stored, &mut out).unwrap();
        prop_assert_eq!(out, cur);
    }

    #[test]
    fn mutated_stored_bytes_never_panic(
        (dtype, base, cur) in checkpoint_pair(),
        which in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let encoders = encoders();
        let enc = encoders[which.index(encoders.len())];
        let ctx = ChunkContext { dtype, base: Some(&base) };
        let mut stored = Vec::new();
        let (tag, params) = enc.encode_in(ctx, &cur, 8, &mut stored).unwrap();
        if !stored.is_empty() {
            for (i, b) in flips {
                let i = i.index(stored.len());
                stored[i] ^= b;
            }
        }
        let cut = cut.index(stored.len() + 1);
        let mut out = vec![0; cur.len()];
        match decode(tag, ctx, &params, &stored[..cut], &mut out) {
            Ok(()) => {}
            Err(e) => prop_assert_eq!(e.kind(), ErrorKind::Malformed),
        }
    }
}

#[test]
fn delta_codecs_need_their_base() {
    let base: Vec<u8> = (0..400u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let mut cur = base.clone();
    cur[40] ^= 1;
    for tag in CodecTag::ALL.into_iter().filter(|t| t.needs_base() && *t != CodecTag::DeltaPredicted) {
        let mut stored = Vec::new();
        let ctx = ChunkContext { dtype: DType::F32, base: Some(&base) };
        let (t, params) = Encoder::Codec(tag).encode(ctx, &cur, &mut stored).unwrap();
        assert_eq!(t, tag);
        let mut out = vec![0u8; cur.len()];
        let e = decode(tag, ChunkContext::keyframe(DType::F32), &params, &stored, &mut out).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BaseMissing, "{tag}");
        let short = ChunkContext { dtype: DType::F32, base: Some(&base[4..]) };
        assert_eq!(decode(tag, short, &params, &stored, &mut out).unwrap_err().kind(), ErrorKind::BaseMismatch);
    }
}

#[test]
fn auto_picks_sparse_for_few_changes_and_dense_for_many() {
    let base: Vec<u8> = (0..100_000u32).flat_map(|i| ((i as f32).sin() * 0.02).to_le_bytes()).collect();
    let mut few = base.clone();
    for i in (0..few.len()).step_by(4 * 997) {
        few[i] ^= 0x10;
    }
    let mut many = base.clone();
    for i in (0..many.len()).step_by(4) {
        many[i] ^= (i as u8 >> 2) & 7;
    }
    let pick = |cur: &[u8]| {
        let mut stored = Vec::new();
        let ctx = ChunkContext { dtype: DType::F32, base: Some(&base) };
        Encoder::AutoSerial.encode(ctx, cur, &mut stored).unwrap().0
    };
    assert!(pick(&few).to_u16() >= CodecTag::SparseEliasDelta.to_u16(), "{}", pick(&few));
    assert!(matches!(pick(&many), CodecTag::DeltaXor | CodecTag::DeltaSub), "{}", pick(&many));
    // Nothing changed: a sparse form listing no element, a few bytes for 400 000.
    let unchanged = pick(&base);
    assert!(unchanged.to_u16() >= CodecTag::SparseEliasDelta.to_u16() && unchanged.needs_base(), "{unchanged}");
    let mut stored = Vec::new();
    let ctx = ChunkContext { dtype: DType::F32, base: Some(&base) };
    Encoder::AutoSerial.encode(ctx, &base, &mut stored).unwrap();
    assert!(stored.len() < 32, "{} bytes for an unchanged chunk", stored.len());
}

#[test]
fn large_chunks_chosen_from_a_sample_round_trip() {
    // 2^17 f32 elements: above the size where auto estimates delta-sub and the keyframe from a
    // sample. Every element changes (so delta-sub and the keyframe are both estimated), by a
    // small signed step, so the sampled choice has to rank close forms.
    let n = 1usize << 17;
    let base: Vec<u8> = (0..n).flat_map(|i| (0.01 * ((i as f32) * 0.37).sin()).to_le_bytes()).collect();
    let cur: Vec<u8> = base
        .chunks_exact(4)
        .enumerate()
        .flat_map(|(i, b)| {
            let x = u32::from_le_bytes(b.try_into().unwrap());
            x.wrapping_add((i as u32 % 7).wrapping_sub(3)).to_le_bytes()
        })
        .collect();
    for with_base in [true, false] {
        let ctx = ChunkContext { dtype: DType::F32, base: with_base.then_some(&base[..]) };
        let mut stored = Vec::new();
        let (tag, params) = Encoder::AutoSerial.encode(ctx, &cur, &mut stored).unwrap();
        assert!(stored.len() < cur.len(), "{tag}: {} of {}", stored.len(), cur.len());
        let mut out = vec![0u8; cur.len()];
        decode(tag, ctx, &params, &stored, &mut out).unwrap();
        assert!(out == cur, "{tag} round trip");
    }
}

/// Weights of many scales, each moved by a small step in value: in bit patterns, the smaller
/// weights move by more units, which the base contexts (spec §6.4.1) see.
fn moved_weights(dtype: DType, n: usize) -> (Vec<u8>, Vec<u8>) {
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f32 / (1u64 << 53) as f32
    };
    let (mut base, mut cur) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let w = (next() - 0.5) * 0.2 * 2f32.powi(-((next() * 10.0) as i32));
        let moved = w + (next() - 0.5) * 2e-4;
        match dtype {
            DType::BF16 => {
                // bf16 by truncation: the top half of the f32.
                base.extend_from_slice(&((w.to_bits() >> 16) as u16).to_le_bytes());
                cur.extend_from_slice(&((moved.to_bits() >> 16) as u16).to_le_bytes());
            }
            _ => {
                base.extend_from_slice(&w.to_le_bytes());
                cur.extend_from_slice(&moved.to_le_bytes());
            }
        }
    }
    (base, cur)
}

#[test]
fn auto_codes_dense_deltas_with_base_contexts_where_they_are_smaller() {
    for dtype in [DType::F32, DType::BF16] {
        let (base, cur) = moved_weights(dtype, 300_000);
        let ctx = ChunkContext { dtype, base: Some(&base) };
        let mut stored = Vec::new();
        let (tag, params) = Encoder::Auto.encode(ctx, &cur, &mut stored).unwrap();
        assert!(matches!(tag, CodecTag::DeltaXorContext | CodecTag::DeltaSubContext), "{dtype}: {tag}");
        let w = dtype.size() as usize;
        let (records, _) = tpde_codec::planes::parse(tag, &stored, 0, w, cur.len() / w).unwrap();
        assert!(records.iter().any(|r| matches!(r, PlaneRecord::BaseContexts(..))), "{dtype}: no base-context record");
        let mut out = vec![0u8; cur.len()];
        decode(tag, ctx, &params, &stored, &mut out).unwrap();
        assert!(out == cur, "{dtype}: round trip");
        // The same delta with one table per plane is larger.
        let lanes = if tag == CodecTag::DeltaXorContext { CodecTag::DeltaXorLanes } else { CodecTag::DeltaSubLanes };
        let mut order0 = Vec::new();
        Encoder::Codec(lanes).encode(ctx, &cur, &mut order0).unwrap();
        assert!(stored.len() < order0.len() * 97 / 100, "{dtype}: {} against {}", stored.len(), order0.len());
        // Decoded against another base, the record fails or gives other bytes.
        let other: Vec<u8> = base.chunks_exact(w).rev().flatten().copied().collect();
        let ctx = ChunkContext { dtype, base: Some(&other) };
        assert!(decode(tag, ctx, &params, &stored, &mut out).is_err() || out != cur);
    }
}

#[test]
fn auto_codes_few_small_changes_by_subtraction() {
    // As bf16 weights trained in bf16: most are unchanged, and a changed one moves by one unit
    // in its last place. Subtraction keeps every move in the low plane as 1 or 2; XOR turns a
    // move across a carry into a longer run of ones.
    let n = 300_000;
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut base, mut cur) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let b = 0x3C00 | (next() as u16 & 0x03FF);
        let r = next() % 100;
        let c = match r {
            0..=6 => b.wrapping_add(1),
            7..=13 => b.wrapping_sub(1),
            _ => b,
        };
        base.extend_from_slice(&b.to_le_bytes());
        cur.extend_from_slice(&c.to_le_bytes());
    }
    let ctx = ChunkContext { dtype: DType::BF16, base: Some(&base) };
    let mut stored = Vec::new();
    let (tag, params) = Encoder::Auto.encode(ctx, &cur, &mut stored).unwrap();
    assert_eq!(tag, CodecTag::DeltaSubContext);
    let mut out = vec![0u8; cur.len()];
    decode(tag, ctx, &params, &stored, &mut out).unwrap();
    assert!(out == cur, "round trip");
    let mut xor = Vec::new();
    Encoder::Codec(CodecTag::DeltaXorContext).encode(ctx, &cur, &mut xor).unwrap();
    assert!(stored.len() < xor.len() * 9 / 10, "{} against XOR's {}", stored.len(), xor.len());
}

#[test]
fn planes_beat_raw_on_float_weights() {
    // Normal-ish weights: the exponent plane is low-entropy.
    let data: Vec<u8> = (0..50_000u32).flat_map(|i| ((i as f32 * 0.37).sin() * 0.05).to_le_bytes()).collect();
    let mut stored = Vec::new();
    Encoder::Codec(CodecTag::Planes).encode(ChunkContext::keyframe(DType::F32), &data, &mut stored).unwrap();
    assert!(stored.len() < data.len() * 95 / 100, "{} of {}", stored.len(), data.len());
}

#[test]
fn wrong_lengths_and_params_are_errors() {
    let ctx = ChunkContext::keyframe(DType::U8);
    for enc in [Encoder::Zstd { level: 3 }, Encoder::Codec(CodecTag::Planes)] {
        let mut stored = Vec::new();
        let (tag, _) = enc.encode(ctx, b"hello hello hello", &mut stored).unwrap();
        let mut short = [0u8; 5];
        assert!(decode(tag, ctx, &[], &stored, &mut short).is_err());
        let mut long = [0u8; 50];
        assert!(decode(tag, ctx, &[], &stored, &mut long).is_err());
        let mut exact = [0u8; 17];
        assert!(decode(tag, ctx, &[1], &stored, &mut exact).is_err());
        decode(tag, ctx, &[], &stored, &mut exact).unwrap();
        assert_eq!(&exact, b"hello hello hello");
    }
    assert!(decode(CodecTag::Raw, ctx, &[], b"abc", &mut [0u8; 4]).is_err());
}

/// Chunks shaped like real checkpoints, at the sizes `tpde pack` writes: weights of a few
/// binades with row-wise scales, their next step (a base correlated with the current tensor),
/// and Adam second moments whose rows differ by orders of magnitude. Up to 2^18 elements, so
/// planes have many lanes, and the default encoder's context records (modes 3 and 4) are
/// reached; the test asserts that they were.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Weights,
    Moments,
}

fn structured(shape: Shape, dtype: DType, n: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut rng = seed | 1;
    let mut unit = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut normal = move || {
        let (u, v) = (unit().max(1e-300), unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    };
    let row = 256;
    let (mut base, mut cur) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut scale = 1.0;
    for i in 0..n {
        if i % row == 0 {
            scale = match shape {
                Shape::Weights => 0.02 * (1.0 + normal().abs()),
                Shape::Moments => 10f64.powf(-12.0 + 6.0 * unit()),
            };
        }
        let b = match shape {
            Shape::Weights => normal() * scale,
            Shape::Moments => scale * (1.0 + 0.3 * normal()).abs(),
        };
        let step = match shape {
            Shape::Weights => 1e-4 * scale * normal(),
            Shape::Moments => 0.01 * b * normal(),
        };
        base.push(b);
        cur.push(b + step);
    }
    let enc = |xs: &[f64]| -> Vec<u8> {
        xs.iter()
            .flat_map(|&x| match dtype {
                DType::F32 => (x as f32).to_le_bytes().to_vec(),
                DType::BF16 => ((x as f32).to_bits() >> 16).to_le_bytes()[..2].to_vec(),
                _ => unreachable!(),
            })
            .collect()
    };
    (enc(&base), enc(&cur))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn structured_chunks_reach_context_records_in_many_lanes(
        weights in any::<bool>(),
        bf16 in any::<bool>(),
        n in prop_oneof![1usize..20_000, 131_072usize..=262_144],
        seed in any::<u64>(),
    ) {
        let shape = if weights { Shape::Weights } else { Shape::Moments };
        let dtype = if bf16 { DType::BF16 } else { DType::F32 };
        prop_assert!(auto_round_trips(shape, dtype, n, seed), "{shape:?} {dtype} n={n}");
    }
}

#[derive(Default)]
struct Seen {
    contexts: u32,
    base_contexts: u32,
    max_lanes: u32,
}

static SEEN: std::sync::Mutex<Seen> = std::sync::Mutex::new(Seen { contexts: 0, base_contexts: 0, max_lanes: 0 });

/// Encodes a structured chunk with `Encoder::Auto`, as a keyframe and against its base, notes
/// its context records, and says whether both decode to it.
fn auto_round_trips(shape: Shape, dtype: DType, n: usize, seed: u64) -> bool {
    let (base, cur) = structured(shape, dtype, n, seed);
    [false, true].into_iter().all(|with_base| {
        let ctx = ChunkContext { dtype, base: with_base.then_some(&base[..]) };
        let mut stored = Vec::new();
        let (tag, params) = Encoder::Auto.encode(ctx, &cur, &mut stored).unwrap();
        let mut out = vec![0u8; cur.len()];
        decode(tag, ctx, &params, &stored, &mut out).unwrap();
        note_records(tag, &stored, dtype.size() as usize, n);
        out == cur
    })
}

/// Counts the context records of a chunk the structured tests encoded, and their most lanes.
fn note_records(tag: CodecTag, stored: &[u8], w: usize, n: usize) {
    if !matches!(tag, CodecTag::PlanesContext | CodecTag::DeltaXorContext | CodecTag::DeltaSubContext) {
        return;
    }
    let (records, _) = tpde_codec::planes::parse(tag, stored, 0, w, n).unwrap();
    let mut seen = SEEN.lock().unwrap();
    for r in records {
        let lanes = match r {
            PlaneRecord::Contexts(_, l) => {
                seen.contexts += 1;
                l.lanes
            }
            PlaneRecord::BaseContexts(_, l) => {
                seen.base_contexts += 1;
                l.lanes
            }
            _ => 0,
        };
        seen.max_lanes = seen.max_lanes.max(lanes);
    }
}

/// The structured cases above, and a fixed set of them, reach what the writer writes by default.
#[test]
fn structured_cases_produce_context_records_and_many_lanes() {
    // Run fixed cases too, so that the assertion does not hang on what the proptest drew.
    for (shape, dtype, n) in [(Shape::Moments, DType::F32, 131_072), (Shape::Weights, DType::BF16, 200_000)] {
        assert!(auto_round_trips(shape, dtype, n, 7), "{shape:?} {dtype} n={n}");
    }
    let seen = SEEN.lock().unwrap();
    assert!(seen.contexts > 0, "no mode 3 context record");
    assert!(seen.base_contexts > 0, "no mode 4 base-context record");
    assert!(seen.max_lanes >= 32, "at most {} lanes in a context record", seen.max_lanes);
}

/// 1.8's sparse plane records (spec §6.2.5): `auto` writes one for a dense delta's top plane
/// when few exponents changed and it is smaller, only in a file of 1.8 or later; it decodes to
/// the same bytes; a constant plane lists no position.
#[test]
fn sparse_plane_records_only_from_1_8_and_only_where_smaller() {
    let n = 100_000usize;
    let base: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 0.02).collect();
    let cur: Vec<f32> = base
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let nudged = f32::from_bits(x.to_bits() ^ (1 + (i as u32).wrapping_mul(2_654_435_761) % 255));
            if i % 97 == 3 {
                nudged * 2.0
            } else {
                nudged
            } // 1% of the exponents move
        })
        .collect();
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let (base, cur) = (bytes(&base), bytes(&cur));
    let ctx = ChunkContext { dtype: DType::F32, base: Some(&base) };
    let top = |stored: &[u8], tag: CodecTag| {
        let (records, _) = tpde_codec::planes::parse(tag, stored, 0, 4, n).unwrap();
        records
    };
    let (mut old, mut new) = (Vec::new(), Vec::new());
    let (old_tag, _) = Encoder::Auto.encode_in(ctx, &cur, 7, &mut old).unwrap();
    let (tag, params) = Encoder::Auto.encode_in(ctx, &cur, 8, &mut new).unwrap();
    assert!(matches!(tag, CodecTag::DeltaXorContext | CodecTag::DeltaSubContext), "{tag}");
    assert!(top(&old, old_tag).iter().all(|r| !matches!(r, PlaneRecord::Sparse(_))), "a 1.7 file has no sparse record");
    let records = top(&new, tag);
    let PlaneRecord::Sparse(s) = &records[3] else { panic!("the top plane is {:?}", records[3]) };
    assert!(s.count > n / 200 && s.count < n / 50, "{} positions", s.count);
    assert!(new.len() < old.len(), "{} bytes against {}", new.len(), old.len());
    let mut out = vec![0u8; cur.len()];
    decode(tag, ctx, &params, &new, &mut out).unwrap();
    assert_eq!(out, cur);
    // No exponent moves: a constant top plane, no position listed.
    let same: Vec<u8> = base
        .chunks_exact(4)
        .flat_map(|b| (f32::from_le_bytes(b.try_into().unwrap()).to_bits() ^ 1).to_le_bytes())
        .collect();
    let mut stored = Vec::new();
    let (tag, params) = Encoder::Auto.encode_in(ctx, &same, 8, &mut stored).unwrap();
    let records = top(&stored, tag);
    assert!(records.iter().any(|r| matches!(r, PlaneRecord::Sparse(s) if s.count == 0)), "{records:?}");
    decode(tag, ctx, &params, &stored, &mut out).unwrap();
    assert_eq!(out, same);
}
