//! Deltas end to end: written against a base, read back bit-exact through the base; wrong,
//! missing and looping bases rejected with their categories; chains followed through path
//! hints; tied tensors stored once; the writer's per-chunk choice on checkpoint-like data.

use std::sync::Arc;
use tpde_testkit::{digest_of, f32s, write, Checkpoint};

use proptest::prelude::*;
use tpde_codec::Encoder;
use tpde_format::digest::to_hex;
use tpde_format::{BaseRef, CodecTag, DType, ErrorKind};
use tpde_read::{open_chain, Reader};
use tpde_write::{FileWriter, WriteOptions, Writer};

/// A step of "training": weights nudged by a small step, the step counter incremented.
fn step(ck: &Checkpoint, k: u32) -> Checkpoint {
    ck.iter()
        .map(|(n, d, s, b)| {
            let b = match d {
                DType::F32 => f32s(b.chunks_exact(4).enumerate().map(|(i, c)| {
                    let x = f32::from_le_bytes(c.try_into().unwrap());
                    if (i as u32 + k).is_multiple_of(5) {
                        x
                    } else {
                        x + 1e-4 * ((i as f32 + k as f32).sin())
                    }
                })),
                DType::I64 => (i64::from_le_bytes(b[..8].try_into().unwrap()) + 1).to_le_bytes().to_vec(),
                _ => b.clone(),
            };
            (n.clone(), *d, s.clone(), b)
        })
        .collect()
}

fn first() -> Checkpoint {
    vec![
        ("w".into(), DType::F32, vec![40, 50], f32s((0..2000).map(|i| (i as f32 * 0.01).cos() * 0.05))),
        ("step".into(), DType::I64, vec![], 0i64.to_le_bytes().to_vec()),
        ("mask".into(), DType::U8, vec![64], (0..64).collect()),
    ]
}

fn assert_decodes_to<S: tpde_read::Source + Send>(r: &Reader<S>, ck: &Checkpoint) {
    assert_eq!(r.tensors().len(), ck.len());
    for (name, dtype, shape, bytes) in ck {
        let t = r.tensor(name).unwrap();
        assert_eq!((t.dtype, &t.shape), (*dtype, shape));
        assert_eq!(&*r.read(name).unwrap(), &bytes[..], "{name}");
        // Chunk by chunk, each into a buffer of its own length, the same bytes.
        let chunks = r.tensor_chunks(t).unwrap();
        let mut joined = Vec::new();
        for (i, c) in t.chunks.iter().enumerate() {
            let mut part = vec![0xA5; c.decoded_length as usize];
            chunks.decode_into(i, &mut part).unwrap();
            joined.extend_from_slice(&part);
        }
        assert_eq!(joined, *bytes, "{name}, chunk by chunk");
        let e = chunks.decode_into(0, &mut vec![0; t.chunks[0].decoded_length as usize + 1]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        let e = chunks.decode_into(t.chunks.len(), &mut []).unwrap_err();
        assert!(e.to_string().contains(&format!("{name}[chunk {}]", t.chunks.len())), "{e}");
    }
    // All at once, in one parallel pass, in any order: the same bytes.
    let mut bufs: Vec<Vec<u8>> = ck.iter().rev().map(|t| vec![0xA5; t.3.len()]).collect();
    let entries: Vec<_> = ck.iter().rev().map(|t| r.tensor(&t.0).unwrap()).collect();
    r.read_many_into(entries.iter().copied().zip(bufs.iter_mut().map(|b| &mut b[..])).collect()).unwrap();
    assert!(bufs.iter().zip(ck.iter().rev()).all(|(b, t)| *b == t.3), "read_many_into");
    r.verify().unwrap();
}

#[test]
fn every_delta_codec_round_trips_through_its_base() {
    let a = first();
    let b = step(&a, 1);
    let base = Arc::new(Reader::from_source(write(&a, None, Encoder::AutoSerial, 1024)).unwrap());
    let mut encoders = vec![Encoder::AutoSerial, Encoder::Auto];
    encoders.extend(
        CodecTag::ALL.into_iter().filter(|t| t.needs_base() && *t != CodecTag::DeltaPredicted).map(Encoder::Codec),
    );
    for enc in encoders {
        let file = write(&b, Some((&a, "a.tpde")), enc, 1024);
        let r = Reader::from_source(file).unwrap();
        assert_eq!(r.header().minor_version, enc.since_minor(true));
        if let Encoder::Codec(tag) = enc {
            assert!(r.tensor("w").unwrap().chunks.iter().all(|c| c.codec == tag), "{tag}");
        }
        let e = r.read("w").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BaseMissing, "{e}");
        assert!(e.to_string().contains(&to_hex(&digest_of(&a))), "{e}");
        let r = r.with_base(base.clone()).unwrap();
        assert_decodes_to(&r, &b);
    }
}

#[test]
fn wrong_base_is_rejected_naming_both_digests() {
    let a = first();
    let b = step(&a, 1);
    let c = step(&b, 2);
    let delta = Reader::from_source(write(&c, Some((&b, "")), Encoder::AutoSerial, 1024)).unwrap();
    let wrong = Arc::new(Reader::from_source(write(&a, None, Encoder::AutoSerial, 1024)).unwrap());
    let e = delta.with_base(wrong).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::BaseMismatch);
    let msg = e.to_string();
    assert!(msg.contains(&to_hex(&digest_of(&b))) && msg.contains(&to_hex(&digest_of(&a))), "{msg}");
    // A keyframe takes no base.
    let key = Reader::from_source(write(&a, None, Encoder::AutoSerial, 1024)).unwrap();
    let e = key.with_base(Arc::new(Reader::from_source(write(&a, None, Encoder::Raw, 1024)).unwrap()));
    assert_eq!(e.err().unwrap().kind(), ErrorKind::InvalidArgument);
}

#[test]
fn added_removed_reshaped_and_retyped_tensors() {
    let a = first();
    let mut b = step(&a, 1);
    b.retain(|t| t.0 != "mask"); // removed
    b.push(("new".into(), DType::F32, vec![3], f32s([1.0, 2.0, 3.0]))); // added
    b[0].2 = vec![50, 40]; // reshaped
    b[1].1 = DType::U64; // retyped
    let file = write(&b, Some((&a, "")), Encoder::AutoSerial, 1024);
    let r = Reader::from_source(file).unwrap();
    // Nothing in the file uses the base: every tensor is a keyframe inside the delta.
    assert!(!r.uses_base());
    assert_decodes_to(&r, &b);
}

#[test]
fn tied_tensors_are_stored_once() {
    let a = first();
    let mut tied = a.clone();
    tied.push(("w_tied".into(), DType::F32, vec![2000], a[0].3.clone()));
    let file = write(&tied, None, Encoder::AutoSerial, 1024);
    let r = Reader::from_source(file).unwrap();
    let (w, t) = (r.tensor("w").unwrap(), r.tensor("w_tied").unwrap());
    let offsets = |e: &tpde_format::TensorEntry| e.chunks.iter().map(|c| c.offset).collect::<Vec<_>>();
    assert_eq!(offsets(w), offsets(t));
    assert_decodes_to(&r, &tied);
    let untied = Reader::from_source(write(&a, None, Encoder::AutoSerial, 1024)).unwrap();
    let stored = w.stored_length();
    assert!(r.file_len() - untied.file_len() < stored / 2, "the copy costs only its directory entry");
}

#[test]
fn chains_follow_path_hints_and_loops_are_caught() {
    let dir = tempfile::tempdir().unwrap();
    let cks: Vec<Checkpoint> = (0..4u32).fold(vec![first()], |mut v, k| {
        let next = step(v.last().unwrap(), k);
        v.push(next);
        v
    });
    for (i, ck) in cks.iter().enumerate() {
        let base = (i > 0).then(|| (&cks[i - 1], format!("{}.tpde", i - 1)));
        let bytes = write(ck, base.as_ref().map(|(b, h)| (*b, h.as_str())), Encoder::AutoSerial, 1024);
        std::fs::write(dir.path().join(format!("{i}.tpde")), bytes).unwrap();
    }
    let last = open_chain(dir.path().join("4.tpde")).unwrap();
    assert_decodes_to(&last, &cks[4]);

    // A hint that points a file at itself: the digest even matches when nothing changed.
    let same = write(&cks[0], Some((&cks[0], "self.tpde")), Encoder::Codec(CodecTag::SparseRice), 1024);
    std::fs::write(dir.path().join("self.tpde"), same).unwrap();
    assert_eq!(open_chain(dir.path().join("self.tpde")).err().unwrap().kind(), ErrorKind::BaseChain);

    // A hint to a file that is not there.
    std::fs::remove_file(dir.path().join("2.tpde")).unwrap();
    let e = open_chain(dir.path().join("4.tpde")).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::BaseMissing, "{e}");
}

#[test]
fn file_writer_records_the_base_flag_and_hint() {
    let dir = tempfile::tempdir().unwrap();
    let a = first();
    let opts = WriteOptions {
        encoder: Encoder::AutoSerial,
        base: Some(BaseRef { digest: digest_of(&a), path_hint: "a.tpde".into() }),
        ..WriteOptions::default()
    };
    let mut w = FileWriter::create(dir.path().join("b.tpde"), opts).unwrap();
    let b = step(&a, 3);
    w.add_tensor_delta("w", DType::F32, &[40, 50], &b[0].3, &a[0].3).unwrap();
    assert!(w.add_tensor_delta("x", DType::F32, &[1], &[0; 4], &[0; 8]).is_err(), "base of another length");
    w.finish().unwrap();
    let r = Reader::open(dir.path().join("b.tpde")).unwrap();
    assert_eq!(r.header().required_features & tpde_format::RequiredFeatures::BASE, 1);
    assert_eq!(r.directory().base.as_ref().unwrap().path_hint, "a.tpde");
    let mut plain = Writer::new(Vec::new(), WriteOptions::default()).unwrap();
    assert!(plain.add_tensor_delta("w", DType::F32, &[1], &[0; 4], &[0; 4]).is_err(), "no base reference");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random checkpoints and random changes, every encoder, several chunk sizes: the delta
    /// decodes bit-exact through its base.
    #[test]
    fn random_deltas_round_trip(
        seed in any::<u64>(),
        n in 0usize..3000,
        changed in 0u32..=100,
        chunk_pow in 6u32..12,
    ) {
        let mut rng = seed | 1;
        let mut next = move || { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; rng };
        let a: Checkpoint = vec![
            ("f".into(), DType::F32, vec![n as u64], (0..n * 4).map(|_| next() as u8).collect()),
            ("h".into(), DType::BF16, vec![n as u64], (0..n * 2).map(|_| next() as u8).collect()),
        ];
        let mut b = a.clone();
        for t in &mut b {
            for byte in t.3.iter_mut() {
                if next() % 100 < u64::from(changed) {
                    *byte ^= 1 << (next() % 8);
                }
            }
        }
        // Every case through every delta encoder: the two automatic ones (`Auto` is what
        // `tpde pack --base` writes) and each base codec tag.
        let mut encoders = vec![Encoder::Auto, Encoder::AutoSerial];
        encoders.extend(CodecTag::ALL.into_iter().filter(|t| t.needs_base() && *t != CodecTag::DeltaPredicted).map(Encoder::Codec));
        prop_assert_eq!(encoders.len(), 2 + 11);
        let base = Arc::new(Reader::from_source(write(&a, None, Encoder::AutoSerial, 1 << chunk_pow)).unwrap());
        for enc in encoders {
            let file = write(&b, Some((&a, "")), enc, 1 << chunk_pow);
            let r = Reader::from_source(file).unwrap().with_base(base.clone()).unwrap();
            for (name, _, _, bytes) in &b {
                prop_assert_eq!(&*r.read(name).unwrap(), &bytes[..], "{:?}", enc);
            }
        }
    }
}

/// A checkpoint pair shaped like two training steps, at the size `tpde pack` writes: f32 and
/// bf16 weights with row scales, Adam second moments whose rows span orders of magnitude, each
/// moved a little; 2^17 elements per tensor, so every plane has many lanes. Through every delta
/// encoder, in the writer's default 4 MiB chunks and in small ones.
#[test]
fn structured_deltas_round_trip_through_every_encoder() {
    let n = 1usize << 17;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut unit = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let (mut w, mut w2, mut v, mut v2) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut ws, mut vs) = (0.02, 1e-8);
    for i in 0..n {
        if i % 512 == 0 {
            ws = 0.01 + 0.05 * unit();
            vs = 10f64.powf(-12.0 + 6.0 * unit());
        }
        let a = (unit() - 0.5) * ws;
        w.push(a as f32);
        w2.push((a + (unit() - 0.5) * ws * 1e-3) as f32);
        let b = vs * (0.5 + unit());
        v.push(b as f32);
        v2.push((b * (1.0 + 0.02 * (unit() - 0.5))) as f32);
    }
    let f32s = |xs: &[f32]| xs.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let bf16s = |xs: &[f32]| xs.iter().flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes()).collect::<Vec<u8>>();
    let ck = |w: &[f32], v: &[f32]| -> Checkpoint {
        vec![
            ("w.f32".into(), DType::F32, vec![n as u64], f32s(w)),
            ("w.bf16".into(), DType::BF16, vec![n as u64], bf16s(w)),
            ("exp_avg_sq".into(), DType::F32, vec![n as u64], f32s(v)),
        ]
    };
    let (a, b) = (ck(&w, &v), ck(&w2, &v2));
    let mut encoders = vec![Encoder::Auto, Encoder::AutoSerial];
    encoders.extend(
        CodecTag::ALL.into_iter().filter(|t| t.needs_base() && *t != CodecTag::DeltaPredicted).map(Encoder::Codec),
    );
    for chunk in [4 << 20, 1 << 16] {
        let base = Arc::new(Reader::from_source(write(&a, None, Encoder::Auto, chunk)).unwrap());
        for &enc in &encoders {
            let r =
                Reader::from_source(write(&b, Some((&a, "")), enc, chunk)).unwrap().with_base(base.clone()).unwrap();
            for (name, _, _, bytes) in &b {
                assert!(*r.read(name).unwrap() == bytes[..], "{enc:?}, chunks of {chunk}: {name}");
            }
        }
    }
}

/// A source that counts the bytes read from it.
struct Counting {
    bytes: Vec<u8>,
    read: std::sync::atomic::AtomicU64,
}

impl tpde_read::Source for Counting {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn get(&self, range: std::ops::Range<u64>) -> std::io::Result<std::borrow::Cow<'_, [u8]>> {
        self.read.fetch_add(range.end - range.start, std::sync::atomic::Ordering::Relaxed);
        tpde_read::Source::get(self.bytes.as_slice(), range)
    }
}

/// A slice of a tensor at the end of a chain (keyframe, delta, delta) decodes only the chunks
/// that cover it, in every file of the chain: each file gives its delta the base bytes of that
/// chunk alone. Whole reads through the chain give the same bytes.
#[test]
fn a_slice_of_a_delta_reads_only_its_chunks_through_the_chain() {
    let n = 1usize << 16; // 256 KiB of f32, 64 chunks of 4 KiB
    let mut x = 0x1234_5678_9abc_def1u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let a: Checkpoint = vec![("w".into(), DType::F32, vec![n as u64], (0..n * 4).map(|_| next() as u8).collect())];
    let mut b = a.clone();
    let mut c = a.clone();
    for i in (0..n * 4).step_by(37) {
        b[0].3[i] ^= 1;
        c[0].3[i] = b[0].3[i] ^ 2;
    }
    let chunk = 4096;
    let open = |bytes: Vec<u8>| Reader::from_source(Counting { bytes, read: 0.into() }).unwrap();
    let ra = Arc::new(open(write(&a, None, Encoder::Auto, chunk)));
    let rb = Arc::new(open(write(&b, Some((&a, "")), Encoder::Auto, chunk)).with_base(ra.clone()).unwrap());
    let rc = open(write(&c, Some((&b, "")), Encoder::Auto, chunk)).with_base(rb.clone()).unwrap();
    let before = |r: &Reader<Counting>| r.source().read.load(std::sync::atomic::Ordering::Relaxed);
    let (a0, b0, c0) = (before(&ra), before(&rb), before(&rc));
    // Bytes 10 000..10 100: inside chunk 2 of every file.
    let t = rc.tensor("w").unwrap().clone();
    let mut out = vec![0u8; 100];
    rc.read_range_into(&t, 10_000..10_100, &mut out).unwrap();
    assert_eq!(out, c[0].3[10_000..10_100]);
    let most = |r: &Reader<Counting>| r.tensor("w").unwrap().chunks.iter().map(|c| c.stored_length).max().unwrap();
    for (name, r, at) in [("keyframe", &*ra, a0), ("delta 1", &*rb, b0), ("delta 2", &rc, c0)] {
        let read = before(r) - at;
        assert!(read > 0 && read <= most(r), "{name}: {read} bytes read for one chunk of at most {}", most(r));
    }
    assert_eq!(&*rc.read("w").unwrap(), &c[0].3[..]);
}
