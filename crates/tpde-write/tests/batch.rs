//! `add_tensors` writes the file that adding the same tensors one by one writes, and a batch
//! that is refused writes nothing.

use tpde_codec::Encoder;
use tpde_format::digest::tensor_digest;
use tpde_format::{BaseRef, DType};
use tpde_write::{TensorInput, WriteOptions, Writer};

fn bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 24) as u8 & 0x3f
        })
        .collect()
}

fn options(encoder: Encoder) -> WriteOptions {
    WriteOptions {
        encoder,
        chunk_bytes: 1024,
        base: Some(BaseRef { digest: [7; 32], path_hint: "base.tpde".into() }),
        ..WriteOptions::default()
    }
}

#[test]
fn a_batch_writes_what_one_by_one_writes() {
    // Several chunks, one chunk, no bytes, a tie inside the batch, a keyframe among deltas, and
    // more chunks than the writer keeps in flight.
    let (a, b, c, long) = (bytes(5000, 1), bytes(512, 2), Vec::new(), bytes(100_000, 5));
    let (base_a, base_b) = (bytes(5000, 3), bytes(512, 4));
    let d = |x: &[u8]| tensor_digest(x);
    let tensors = [
        TensorInput {
            name: "a",
            dtype: DType::F32,
            shape: &[1250],
            data: &a,
            base: Some((&base_a, d(&base_a))),
            predict: None,
        },
        TensorInput {
            name: "b",
            dtype: DType::BF16,
            shape: &[256],
            data: &b,
            base: Some((&base_b, d(&base_b))),
            predict: None,
        },
        TensorInput { name: "empty", dtype: DType::F16, shape: &[0, 3], data: &c, base: None, predict: None },
        TensorInput {
            name: "a.tied",
            dtype: DType::F32,
            shape: &[1250],
            data: &a,
            base: Some((&base_a, d(&base_a))),
            predict: None,
        },
        TensorInput { name: "key", dtype: DType::U8, shape: &[5000], data: &a, base: None, predict: None },
        TensorInput {
            name: "b.tied",
            dtype: DType::BF16,
            shape: &[256],
            data: &b,
            base: Some((&base_b, d(&base_b))),
            predict: None,
        },
        TensorInput { name: "long", dtype: DType::U8, shape: &[100_000], data: &long, base: None, predict: None },
    ];
    for encoder in [Encoder::Auto, Encoder::AutoSerial, Encoder::Raw, Encoder::Zstd { level: 1 }] {
        let mut one = Writer::new(Vec::new(), options(encoder)).unwrap();
        for t in &tensors {
            match t.base {
                Some((base, _)) => one.add_tensor_delta(t.name, t.dtype, t.shape, t.data, base).unwrap(),
                None => one.add_tensor(t.name, t.dtype, t.shape, t.data).unwrap(),
            };
        }
        let mut batch = Writer::new(Vec::new(), options(encoder)).unwrap();
        batch.add_tensors(&tensors[..2]).unwrap();
        batch.add_tensors(&tensors[2..]).unwrap();
        assert_eq!(batch.tensors(), one.tensors(), "{encoder:?}");
        let tied = &batch.tensors()[3];
        assert_eq!(tied.chunks, batch.tensors()[0].chunks, "the tie shares the first one's chunks");
        assert_eq!(batch.tensors()[5].chunks, batch.tensors()[1].chunks);
        assert_eq!(batch.finish().unwrap(), one.finish().unwrap(), "{encoder:?}");
    }
}

#[test]
fn a_refused_batch_writes_nothing() {
    let a = bytes(4096, 1);
    let mut w = Writer::new(Vec::new(), options(Encoder::AutoSerial)).unwrap();
    w.add_tensor("first", DType::U8, &[16], &a[..16]).unwrap();
    let before = w.tensors().to_vec();
    let ok = TensorInput { name: "x", dtype: DType::U8, shape: &[4096], data: &a, base: None, predict: None };
    let cases = [
        (vec![ok, TensorInput { name: "y", shape: &[4095], ..ok }], "needs 4095"),
        (vec![ok, TensorInput { name: "x", ..ok }], "the batch names it twice"),
        (vec![ok, TensorInput { name: "first", ..ok }], "already written"),
        (vec![ok, TensorInput { name: "z", base: Some((&a[..8], [0; 32])), ..ok }], "8 base bytes"),
    ];
    for (batch, why) in cases {
        let e = w.add_tensors(&batch).unwrap_err().to_string();
        assert!(e.contains(why), "{e}");
        assert_eq!(w.tensors(), &before[..]);
    }
    // Still usable, and the file holds only what was accepted.
    w.add_tensors(&[ok]).unwrap();
    assert_eq!(w.tensors().len(), 2);
    let file = w.finish().unwrap();
    let r = tpde_read::Reader::from_source(file).unwrap();
    assert_eq!(r.read("x").unwrap().as_ref(), &a[..]);
}

#[test]
fn a_batch_written_from_inside_a_one_thread_pool_finishes() {
    // `tpde bench` packs inside `ThreadPool::install`: the writer's own thread is the pool's
    // only one, so it must run the chunks it waits for.
    fn write(data: &[u8]) -> Vec<u8> {
        let input = [TensorInput { name: "t", dtype: DType::U8, shape: &[100_000], data, base: None, predict: None }];
        let mut w = Writer::new(Vec::new(), options(Encoder::Zstd { level: 1 })).unwrap();
        w.add_tensors(&input).unwrap();
        w.finish().unwrap()
    }
    let data = bytes(100_000, 6);
    let (done, finished) = std::sync::mpsc::channel();
    let in_thread = data.clone();
    std::thread::spawn(move || {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let _ = done.send(pool.install(|| write(&in_thread)));
    });
    // A liveness bound, not a speed one: this takes milliseconds unless it deadlocks.
    let in_pool = finished.recv_timeout(std::time::Duration::from_secs(120)).expect("deadlocked in the pool");
    assert_eq!(in_pool, write(&data));
}

/// Spec §11: a reserved key defined in a later minor version needs a header that declares it;
/// the writer refuses it otherwise, rather than write a file that breaks the writer rule.
#[test]
fn metadata_of_a_later_minor_version_needs_the_header_to_declare_it() {
    use tpde_format::metadata::{since_minor, KEY_MAX_REL_ERROR};
    use tpde_format::MetadataValue;
    let raw = WriteOptions { encoder: tpde_codec::Encoder::Raw, ..WriteOptions::default() };
    let mut w = Writer::new(Vec::new(), raw.clone()).unwrap();
    let e = w.add_metadata(KEY_MAX_REL_ERROR, MetadataValue::F64(1e-3)).unwrap_err().to_string();
    assert!(e.contains("needs format 1.5"), "{e}");
    let at_5 = WriteOptions { min_minor_version: since_minor(KEY_MAX_REL_ERROR), ..raw };
    let mut w = Writer::new(Vec::new(), at_5).unwrap();
    w.add_metadata(KEY_MAX_REL_ERROR, MetadataValue::F64(1e-3)).unwrap();
    let file = w.finish().unwrap();
    assert_eq!(u16::from_le_bytes([file[10], file[11]]), 5, "the header declares 1.5");
}
