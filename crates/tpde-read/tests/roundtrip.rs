//! Writer → reader round trips: bit-exact over dtypes, shapes, names, metadata and codecs.

mod common;

use proptest::prelude::*;
use std::borrow::Cow;
use tpde_codec::Encoder;
use tpde_format::{DType, MetadataValue};
use tpde_read::Reader;
use tpde_write::{WriteOptions, Writer};

#[derive(Debug, Clone)]
struct TensorCase {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    data: Vec<u8>,
}

fn tensor_case() -> impl Strategy<Value = TensorCase> {
    let dtype = prop::sample::select(common::all_dtypes());
    // Shapes include scalars (rank 0) and zero-size dimensions.
    let shape = prop::collection::vec(0u64..6, 0..4);
    let name = "[a-z0-9_./]{1,12}|\\PC{1,8}";
    (name, dtype, shape).prop_flat_map(|(name, dtype, shape)| {
        let n = shape.iter().product::<u64>() * dtype.size();
        prop::collection::vec(any::<u8>(), n as usize).prop_map(move |data| TensorCase {
            name: name.clone(),
            dtype,
            shape: shape.clone(),
            data,
        })
    })
}

fn metadata_value() -> impl Strategy<Value = MetadataValue> {
    prop_oneof![
        any::<bool>().prop_map(MetadataValue::Bool),
        any::<u64>().prop_map(MetadataValue::U64),
        any::<i64>().prop_map(MetadataValue::I64),
        any::<u64>().prop_map(|b| MetadataValue::F64(f64::from_bits(b))),
        "\\PC{0,20}".prop_map(MetadataValue::String),
        prop::collection::vec(any::<u8>(), 0..20).prop_map(MetadataValue::Bytes),
    ]
}

/// Every keyframe encoder: raw, zstd at several levels, the two automatic choices and each
/// keyframe codec tag (planes, planes-lanes, planes-context).
fn encoder() -> impl Strategy<Value = Encoder> {
    let tags: Vec<Encoder> = tpde_format::CodecTag::ALL
        .into_iter()
        .filter(|t| !t.needs_base() && *t != tpde_format::CodecTag::Raw && *t != tpde_format::CodecTag::Zstd)
        .map(Encoder::Codec)
        .collect();
    prop_oneof![
        Just(Encoder::Raw),
        (1i32..6).prop_map(|level| Encoder::Zstd { level }),
        Just(Encoder::Auto),
        Just(Encoder::AutoSerial),
        prop::sample::select(tags),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn round_trip_is_bit_exact(
        tensors in prop::collection::vec(tensor_case(), 0..6),
        metadata in prop::collection::btree_map("[a-z]{1,6}|\\PC{1,6}", metadata_value(), 0..5),
        encoder in encoder(),
        chunk_bytes in prop::sample::select(vec![64u64, 128, 4096]),
    ) {
        let mut tensors = tensors;
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        tensors.dedup_by(|a, b| a.name == b.name);
        let opts = WriteOptions { encoder, chunk_bytes, ..WriteOptions::default() };
        let mut w = Writer::new(Vec::new(), opts).unwrap();
        for (k, v) in &metadata {
            if k.starts_with("tpde.") { continue; }
            w.add_metadata(k.clone(), v.clone()).unwrap();
        }
        for t in &tensors {
            w.add_tensor(&t.name, t.dtype, &t.shape, &t.data).unwrap();
        }
        let file = w.finish().unwrap();

        let r = Reader::from_source(file.as_slice()).unwrap();
        prop_assert_eq!(r.tensors().len(), tensors.len());
        for t in &tensors {
            let e = r.tensor(&t.name).unwrap();
            prop_assert_eq!(e.dtype, t.dtype);
            prop_assert_eq!(&e.shape, &t.shape);
            prop_assert_eq!(&*r.read(&t.name).unwrap(), t.data.as_slice());
            let mut buf = vec![0xEE; t.data.len()];
            r.read_into(e, &mut buf).unwrap();
            prop_assert_eq!(&buf, &t.data);
        }
        for (k, v) in &metadata {
            if k.starts_with("tpde.") { continue; }
            prop_assert!(r.metadata(k).unwrap().same_bits(v));
        }
        let report = r.verify().unwrap();
        prop_assert_eq!(report.tensors, tensors.len() as u64);
    }

    #[test]
    fn content_digest_ignores_codec_and_chunking(tensors in prop::collection::vec(tensor_case(), 1..4)) {
        let mut tensors = tensors;
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        tensors.dedup_by(|a, b| a.name == b.name);
        let write = |encoder, chunk_bytes, reverse: bool| {
            let mut w = Writer::new(Vec::new(), WriteOptions { encoder, chunk_bytes, ..WriteOptions::default() }).unwrap();
            let mut order: Vec<&TensorCase> = tensors.iter().collect();
            if reverse { order.reverse(); }
            for t in order { w.add_tensor(&t.name, t.dtype, &t.shape, &t.data).unwrap(); }
            Reader::from_source(w.finish().unwrap()).unwrap().content_digest()
        };
        prop_assert_eq!(write(Encoder::Raw, 64, false), write(Encoder::Zstd { level: 3 }, 4096, true));
    }
}

#[test]
fn raw_tensors_are_borrowed_from_the_source() {
    let file = common::small_file(Encoder::Raw);
    let r = Reader::from_source(file.as_slice()).unwrap();
    let t = r.tensor("ramp").unwrap();
    assert!(t.chunks.len() > 1, "the tensor spans several chunks");
    assert!(r.is_zero_copy(t));
    let data = r.read("ramp").unwrap();
    let Cow::Borrowed(slice) = data else { panic!("raw tensor was copied") };
    let file_range = file.as_ptr_range();
    assert!(file_range.contains(&slice.as_ptr()), "the slice points into the file's bytes");

    let z = common::small_file(Encoder::Zstd { level: 3 });
    let rz = Reader::from_source(z.as_slice()).unwrap();
    assert!(matches!(rz.read("ramp").unwrap(), Cow::Owned(_)));
    assert_eq!(rz.read("ramp").unwrap(), r.read("ramp").unwrap());
}

#[test]
fn streamed_and_in_memory_tensors_write_the_same_file() {
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
    let opts = || WriteOptions { encoder: Encoder::Zstd { level: 3 }, chunk_bytes: 1024, ..WriteOptions::default() };
    let mut a = Writer::new(Vec::new(), opts()).unwrap();
    a.add_tensor("t", DType::U8, &[100, 100], &data).unwrap();
    let mut b = Writer::new(Vec::new(), opts()).unwrap();
    b.add_tensor_from("t", DType::U8, &[100, 100], data.as_slice()).unwrap();
    assert_eq!(a.finish().unwrap(), b.finish().unwrap());

    let mut c = Writer::new(Vec::new(), opts()).unwrap();
    let short = c.add_tensor_from("t", DType::U8, &[100, 100], &data[..9_999]);
    assert_eq!(short.unwrap_err().kind(), tpde_format::ErrorKind::InvalidArgument);
    let long = c.add_tensor_from("u", DType::U8, &[10], data.as_slice());
    assert_eq!(long.unwrap_err().kind(), tpde_format::ErrorKind::InvalidArgument);
}

#[test]
fn writer_rejects_inconsistent_input() {
    let mut w = Writer::new(Vec::new(), WriteOptions::default()).unwrap();
    w.add_tensor("a", DType::F32, &[2], &[0; 8]).unwrap();
    assert!(w.add_tensor("a", DType::F32, &[2], &[0; 8]).is_err(), "duplicate name");
    assert!(w.add_tensor("b", DType::F32, &[3], &[0; 8]).is_err(), "length does not match shape");
    assert!(w.add_tensor("", DType::U8, &[0], &[]).is_err(), "empty name");
    assert!(w.add_tensor("c", DType::U8, &[u64::MAX, 2], &[]).is_err(), "shape overflows");
    assert!(w.add_metadata("tpde.step", MetadataValue::String("x".into())).is_err(), "reserved key type");
    w.add_metadata("k", MetadataValue::Bool(true)).unwrap();
    assert!(w.add_metadata("k", MetadataValue::Bool(false)).is_err(), "duplicate key");
    assert!(Writer::new(Vec::new(), WriteOptions { alignment: 48, ..WriteOptions::default() }).is_err());
}

#[test]
fn not_found_is_its_own_category() {
    let file = common::small_file(Encoder::Raw);
    let r = Reader::from_source(file).unwrap();
    assert_eq!(r.read("missing").unwrap_err().kind(), tpde_format::ErrorKind::NotFound);
}

#[test]
fn a_tensor_that_fails_part_way_stops_the_writer() {
    /// Yields `ok` bytes, then fails.
    struct Failing {
        ok: usize,
    }
    impl std::io::Read for Failing {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.ok == 0 {
                return Err(std::io::Error::other("disk on fire"));
            }
            let n = buf.len().min(self.ok);
            buf[..n].fill(7);
            self.ok -= n;
            Ok(n)
        }
    }
    let opts = WriteOptions { chunk_bytes: 64, ..WriteOptions::default() };
    let mut w = Writer::new(Vec::new(), opts.clone()).unwrap();
    w.add_tensor("a", DType::U8, &[4], &[1, 2, 3, 4]).unwrap();
    // A failure before any byte is written leaves the writer usable.
    assert!(w.add_tensor("a", DType::U8, &[1], &[0]).is_err());
    w.add_tensor("b", DType::U8, &[1], &[0]).unwrap();
    // The batch is several chunks: the source fails after the first batch is written.
    let batch = 64 * 2 * rayon_threads();
    let err = w.add_tensor_from("c", DType::U8, &[batch as u64 * 3], Failing { ok: batch + 10 }).unwrap_err();
    assert!(err.to_string().contains("disk on fire"), "{err}");
    assert!(w.add_tensor("d", DType::U8, &[1], &[0]).is_err(), "no more tensors after a part-written one");
    assert!(w.finish().is_err(), "a file with orphaned payload bytes is never finished");
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
