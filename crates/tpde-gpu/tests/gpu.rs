//! The GPU decoder against the CPU reader, bit for bit: random tensors of every dtype through
//! every codec (keyframes and deltas on a device-resident base), batches split small, chains
//! followed through hints, the layer loader, and bases rejected as the CPU reader rejects them.
//!
//! Needs a GPU adapter; CI has Mesa's lavapipe (`mesa-vulkan-drivers`). On a machine with none,
//! `cargo test --features skip-gpu-tests` reports these tests as ignored (never as passed).

use std::sync::OnceLock;
use tpde_testkit::{write, write_in, Checkpoint};

use proptest::prelude::*;
use tpde_codec::Encoder;
use tpde_format::{CodecTag, DType, ErrorKind};
use tpde_gpu::{layer_key, Gpu, LayerLoader};
use tpde_read::{open_chain, Reader};

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        Gpu::new().unwrap_or_else(|e| {
            panic!("{e}: install a Vulkan driver (Debian: mesa-vulkan-drivers), or test with --features skip-gpu-tests")
        })
    })
}

/// A `Gpu` of the test's own, for tests that count its uploads while other tests run.
fn own_gpu() -> Gpu {
    Gpu::new().unwrap_or_else(|e| panic!("{e}: install a Vulkan driver, or test with --features skip-gpu-tests"))
}

/// A `Gpu` that times its kernels, or none where the adapter has no timestamp queries (which it
/// says by name; the benchmark skips its rows).
fn timed_gpu() -> Option<Gpu> {
    match Gpu::with_kernel_timing() {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            assert!(e.to_string().contains("timestamp"), "{e}");
            None
        }
    }
}

/// Every tensor decoded on the device and read back equals `want`, and the CPU reader's.
fn assert_same(gpu: &Gpu, ck: &tpde_gpu::DeviceCheckpoint, cpu: &Reader<Vec<u8>>, want: &Checkpoint) {
    assert_eq!(ck.tensors().len(), want.len());
    for (d, (name, dtype, shape, data)) in ck.tensors().iter().zip(want) {
        assert_eq!((&d.name, d.dtype, &d.shape), (name, *dtype, shape));
        let back = gpu.read_back(d).unwrap();
        assert!(back == *data, "{name} ({dtype}, {} bytes) differs from what was written", data.len());
        assert!(back == *cpu.read(name).unwrap(), "{name}: GPU and CPU readers differ");
    }
}

fn keyframe_encoders() -> Vec<Encoder> {
    let mut e = vec![Encoder::Raw, Encoder::Zstd { level: 1 }, Encoder::AutoSerial, Encoder::Auto];
    e.extend(CodecTag::ALL.into_iter().filter(|t| !t.needs_base() && *t != CodecTag::Raw).map(Encoder::Codec));
    e
}

fn delta_encoders() -> Vec<Encoder> {
    let mut e = vec![Encoder::AutoSerial, Encoder::Auto, Encoder::Raw];
    e.extend(
        CodecTag::ALL.into_iter().filter(|t| t.needs_base() && *t != CodecTag::DeltaPredicted).map(Encoder::Codec),
    );
    e
}

/// Bytes of `n` elements of `dtype`: random bit patterns (NaNs, infinities, subnormals
/// included), or weight-like when `smooth` (so the entropy coders have work to do).
fn tensor_bytes(dtype: DType, n: usize, seed: u64, smooth: bool) -> Vec<u8> {
    let w = dtype.size() as usize;
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(n * w);
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let v = if smooth && dtype == DType::F32 {
            u64::from(((i as f32 * 0.001).sin() * 0.05 + (x % 1000) as f32 * 1e-6).to_bits())
        } else if smooth {
            x % 7
        } else {
            x
        };
        out.extend_from_slice(&v.to_le_bytes()[..w]);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    #[cfg_attr(feature = "skip-gpu-tests", ignore = "built with --features skip-gpu-tests: no GPU adapter")]
    fn random_tensors_decode_bit_identical_to_the_cpu_reader(
        dtype_i in 0..DType::ALL.len(),
        n in 0usize..6000,
        seed in any::<u64>(),
        smooth in any::<bool>(),
        key_i in 0usize..16,
        delta_i in 0usize..16,
        share in 0u32..100,
        chunk in 1u64..64,
    ) {
        let gpu = gpu();
        let dtype = DType::ALL[dtype_i];
        let w = dtype.size() as usize;
        let shape = vec![n as u64];
        let base_data = tensor_bytes(dtype, n, seed, smooth);
        // The current checkpoint: `share`% of the elements changed in random bits.
        let mut cur = base_data.clone();
        let mut x = seed.rotate_left(17) | 1;
        for e in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if (x % 100) < u64::from(share) {
                cur[e * w] ^= (x >> 8) as u8 | 1;
            }
        }
        let base: Checkpoint = vec![
            ("t".into(), dtype, shape.clone(), base_data),
            ("step".into(), DType::I64, vec![], 7i64.to_le_bytes().to_vec()),
        ];
        let current: Checkpoint = vec![
            ("t".into(), dtype, shape, cur),
            ("step".into(), DType::I64, vec![], 8i64.to_le_bytes().to_vec()),
        ];
        let keys = keyframe_encoders();
        let deltas = delta_encoders();
        let key_file = write(&base, None, keys[key_i % keys.len()], chunk * 64);
        let delta_file = write(&current, Some((&base, "base.tpde")), deltas[delta_i % deltas.len()], chunk * 64);

        let base_cpu = Reader::from_source(key_file).unwrap();
        let base_gpu = gpu.load(&base_cpu, None).unwrap();
        assert_same(gpu, &base_gpu, &base_cpu, &base);
        let cpu = Reader::from_source(delta_file).unwrap().with_base(std::sync::Arc::new(base_cpu)).unwrap();
        let cur_gpu = gpu.load(&cpu, Some(&base_gpu)).unwrap();
        assert_same(gpu, &cur_gpu, &cpu, &current);
    }
}

#[test]
#[cfg_attr(feature = "skip-gpu-tests", ignore = "built with --features skip-gpu-tests: no GPU adapter")]
fn a_tensor_split_over_many_batches_decodes_the_same() {
    let gpu = gpu();
    let mut small = Gpu::new().unwrap();
    small.limit_batches(64 << 10);
    let n = 50_000;
    let base: Checkpoint = vec![("w".into(), DType::BF16, vec![n as u64], tensor_bytes(DType::BF16, n, 3, true))];
    let mut cur = base.clone();
    for (i, b) in cur[0].3.iter_mut().enumerate() {
        if i % 37 == 0 {
            *b ^= 0x10;
        }
    }
    for (encoder, chunk) in
        [(Encoder::Auto, 4096), (Encoder::Codec(CodecTag::SparsePackedLanes), 2048), (Encoder::Zstd { level: 1 }, 1024)]
    {
        let key = Reader::from_source(write(&base, None, Encoder::Auto, chunk)).unwrap();
        let delta = Reader::from_source(write(&cur, Some((&base, "b")), encoder, chunk)).unwrap();
        for g in [gpu, &small] {
            let b = g.load(&key, None).unwrap();
            let c = g.load(&delta, Some(&b)).unwrap();
            assert_eq!(g.read_back(&c.tensors()[0]).unwrap(), cur[0].3, "{encoder:?}");
        }
    }
}

#[test]
#[cfg_attr(feature = "skip-gpu-tests", ignore = "built with --features skip-gpu-tests: no GPU adapter")]
fn the_layer_loader_gives_each_layer_in_order() {
    let gpu = gpu();
    let mut ck: Checkpoint =
        vec![("embed.weight".into(), DType::F32, vec![64, 8], tensor_bytes(DType::F32, 512, 1, true))];
    for layer in 0..3 {
        for (part, n) in [("attn.w", 256), ("mlp.w", 512), ("norm.b", 8)] {
            let name = format!("model.layers.{layer}.{part}");
            ck.push((name, DType::BF16, vec![n], tensor_bytes(DType::BF16, n as usize, layer + n, true)));
        }
    }
    ck.push(("lm_head.weight".into(), DType::F16, vec![128], tensor_bytes(DType::F16, 128, 9, true)));
    let reader = Reader::from_source(write(&ck, None, Encoder::Auto, 256)).unwrap();
    let mut loader = LayerLoader::new(gpu, &reader, None).unwrap();
    let keys: Vec<String> = loader.keys().map(String::from).collect();
    assert_eq!(keys, ["embed", "model.layers.0", "model.layers.1", "model.layers.2", "lm_head"]);
    let mut seen = Vec::new();
    while let Some(layer) = loader.next_layer() {
        let layer = layer.unwrap();
        for t in &layer.tensors {
            assert_eq!(layer_key(&t.name), layer.key);
            let want = &ck.iter().find(|c| c.0 == t.name).unwrap().3;
            assert_eq!(&gpu.read_back(t).unwrap(), want, "{}", t.name);
            seen.push(t.name.clone());
        }
    }
    assert_eq!(seen, ck.iter().map(|c| c.0.clone()).collect::<Vec<_>>());
}

#[test]
#[cfg_attr(feature = "skip-gpu-tests", ignore = "built with --features skip-gpu-tests: no GPU adapter")]
fn chains_follow_hints_and_wrong_bases_are_rejected() {
    let gpu = gpu();
    let dir = tempfile::tempdir().unwrap();
    let a: Checkpoint = vec![("w".into(), DType::F32, vec![3000], tensor_bytes(DType::F32, 3000, 5, true))];
    let mut b = a.clone();
    b[0].3[40] ^= 1;
    let mut c = b.clone();
    c[0].3[400] ^= 2;
    let save = |name: &str, bytes: Vec<u8>| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    save("a.tpde", write(&a, None, Encoder::Auto, 1024));
    save("b.tpde", write(&b, Some((&a, "a.tpde")), Encoder::Auto, 1024));
    let c_path = save("c.tpde", write(&c, Some((&b, "b.tpde")), Encoder::AutoSerial, 1024));
    let ck = gpu.load_chain(&c_path).unwrap();
    assert_eq!(gpu.read_back(&ck.tensors()[0]).unwrap(), c[0].3);
    assert_eq!(*ck.content_digest(), open_chain(&c_path).unwrap().content_digest());

    // c against a instead of b: the digests differ, as the CPU reader says.
    let key_a = gpu.load(&Reader::open(dir.path().join("a.tpde")).unwrap(), None).unwrap();
    let e = gpu.load(&Reader::open(&c_path).unwrap(), Some(&key_a)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BaseMismatch, "{e}");
    let e = gpu.load(&Reader::open(&c_path).unwrap(), None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BaseMissing, "{e}");
    std::fs::remove_file(dir.path().join("a.tpde")).unwrap();
    let e = gpu.load_chain(&c_path).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BaseMissing, "{e}");
}

/// What goes over the host-device link for one tensor: for the codecs the device decodes, its
/// stored bytes and the lookup tables planned from them, a fraction of the decoded tensor; for
/// the serial rANS planes the CPU decodes, the decoded planes.
#[test]
#[cfg_attr(feature = "skip-gpu-tests", ignore = "built with --features skip-gpu-tests: no GPU adapter")]
fn only_compressed_bytes_are_uploaded() {
    let gpu = &own_gpu();
    let n = 1 << 16;
    let ck: Checkpoint = vec![("w".into(), DType::BF16, vec![n as u64], tensor_bytes(DType::BF16, n, 3, true))];
    let upload = |encoder: Encoder| {
        let reader = Reader::from_source(write(&ck, None, encoder, 1 << 14)).unwrap();
        let t = &reader.tensors()[0];
        let stored: u64 = t.chunks.iter().map(|c| c.stored_length).sum();
        let before = gpu.uploaded_bytes();
        let on_device = gpu.decode(&reader, t, None).unwrap();
        let uploaded = gpu.uploaded_bytes() - before;
        assert_eq!(gpu.read_back(&on_device).unwrap(), ck[0].3, "{encoder:?}");
        (stored, uploaded, t.byte_length)
    };
    for encoder in [Encoder::Auto, Encoder::Codec(CodecTag::PlanesLanes)] {
        let (stored, uploaded, decoded) = upload(encoder);
        assert!(stored * 4 < decoded, "{encoder:?}: the test needs compressible data");
        assert!(
            uploaded >= stored && uploaded * 2 < decoded,
            "{encoder:?}: {uploaded} bytes uploaded, {stored} stored, {decoded} decoded"
        );
    }
    // The serial form is decoded on the CPU: its planes go up whole.
    let (_, uploaded, decoded) = upload(Encoder::Codec(CodecTag::Planes));
    assert!(uploaded >= decoded, "serial planes: {uploaded} bytes uploaded for {decoded} decoded");
}

/// A device opened with kernel timing decodes the same bytes, and times the kernels that ran:
/// the lane kernel for a lane-coded keyframe, none for a raw one (uploaded, no kernel).
#[test]
#[cfg_attr(feature = "skip-gpu-tests", ignore = "built with --features skip-gpu-tests: no GPU adapter")]
fn kernel_timing_times_the_kernels_that_ran() {
    let Some(gpu) = timed_gpu() else { return };
    assert_eq!(gpu.take_kernel_times().unwrap().batches, 0);
    assert!(own_gpu().take_kernel_times().is_none(), "timing is off unless asked for");
    let n = 1 << 16;
    let ck: Checkpoint = vec![("w".into(), DType::F32, vec![n as u64], tensor_bytes(DType::F32, n, 5, true))];
    for (encoder, lanes_ran) in [(Encoder::Codec(CodecTag::PlanesLanes), true), (Encoder::Raw, false)] {
        let reader = Reader::from_source(write(&ck, None, encoder, 1 << 16)).unwrap();
        let on_device = gpu.decode(&reader, &reader.tensors()[0], None).unwrap();
        assert_eq!(gpu.read_back(&on_device).unwrap(), ck[0].3, "{encoder:?}");
        let t = gpu.take_kernel_times().unwrap();
        assert_eq!(t.batches > 0, lanes_ran, "{encoder:?}: {t:?}");
        let lanes = tpde_gpu::timing::KERNELS.iter().position(|k| *k == "decode_lanes").unwrap();
        assert_eq!(!t.per_kernel[lanes].is_zero(), lanes_ran, "{encoder:?}: {t:?}");
        // One thread a lane: a plane of 2^16 symbols in lanes of 4096 has 16.
        assert_eq!(t.decode_threads > 0, lanes_ran, "{encoder:?}: {t:?}");
        assert_eq!(t.decode_threads % 16, 0, "{encoder:?}: {t:?}");
        assert_eq!(gpu.take_kernel_times().unwrap().batches, 0, "taking the times resets them");
    }
}

/// Many small tensors (every dtype, odd lengths, an empty one, keyframe codecs that use the
/// kernels and ones uploaded as they are) decode in one set of dispatches, side by side in one
/// buffer, then each lands in its own: one batch, not one per tensor, and the CPU's bytes.
/// A kernel error names its own tensor and chunk, not the group's.
#[test]
#[cfg_attr(feature = "skip-gpu-tests", ignore = "built with --features skip-gpu-tests: no GPU adapter")]
fn many_small_tensors_decode_in_one_dispatch() {
    let Some(gpu) = timed_gpu() else { return };
    let dtypes = [DType::F32, DType::BF16, DType::F16, DType::U8, DType::I64, DType::F64, DType::Bool];
    let ck: Checkpoint = (0..40)
        .map(|k| {
            let dtype = dtypes[k % dtypes.len()];
            let n = if k == 7 { 0 } else { 37 + 211 * k };
            (
                format!("model.layers.{}.t{k}", k / 10),
                dtype,
                vec![n as u64],
                tensor_bytes(dtype, n, k as u64 + 1, k % 3 > 0),
            )
        })
        .collect();
    for encoder in [Encoder::Auto, Encoder::Codec(CodecTag::PlanesLanes), Encoder::Raw] {
        let bytes = write(&ck, None, encoder, 1 << 16);
        let reader = Reader::from_source(bytes.clone()).unwrap();
        gpu.take_kernel_times();
        let on_device = gpu.load(&reader, None).unwrap();
        assert_same(&gpu, &on_device, &reader, &ck);
        let batches = gpu.take_kernel_times().unwrap().batches;
        assert!(batches <= 1, "{encoder:?}: {batches} batches for 40 small tensors");
        let mut layers = LayerLoader::new(&gpu, &reader, None).unwrap();
        while let Some(layer) = layers.next_layer() {
            for t in layer.unwrap().tensors {
                assert!(gpu.read_back(&t).unwrap() == *reader.read(&t.name).unwrap(), "{}", t.name);
            }
        }
    }
    // A byte in the middle of the 29th tensor's lanes changed (its CRC made to match): the
    // error is about that tensor's chunk, on either reader, not the group's first.
    let key = write(&ck, None, Encoder::Codec(CodecTag::PlanesLanes), 1 << 16);
    let r = Reader::from_source(key.clone()).unwrap();
    let t = &r.tensors()[28];
    let mut stored = r.chunk_bytes(t, 0).unwrap().to_vec();
    let (records, _) = tpde_codec::planes::parse(
        t.chunks[0].codec,
        &stored,
        0,
        t.dtype.size() as usize,
        t.chunks[0].element_count as usize,
    )
    .unwrap();
    use tpde_codec::planes::PlaneRecord;
    let Some(PlaneRecord::Lanes(_, lanes)) = records.iter().find(|r| matches!(r, PlaneRecord::Lanes(..))) else {
        panic!("a lane record in {}", t.name)
    };
    stored[(lanes.bytes.start + lanes.bytes.end) / 2] ^= 0x5A;
    let cpu = Reader::from_source(tpde_format::surgery::with_chunk(&key, 28, 0, &stored).unwrap()).unwrap();
    let name = &cpu.tensors()[28].name;
    let cpu_err = cpu.read(name).unwrap_err();
    assert_eq!(cpu_err.kind(), ErrorKind::Malformed, "{cpu_err}");
    let Err(gpu_err) = gpu.load(&cpu, None) else { panic!("the device accepted the damaged lanes") };
    assert!(gpu_err.to_string().contains(name.as_str()), "{gpu_err} (want {name})");
    assert_eq!(gpu_err.kind(), cpu_err.kind());
}

/// The layer loader uploads the next layer before it waits for the current one to decode:
/// when the first layer comes back, the second one's bytes are already on their way.
#[test]
#[cfg_attr(feature = "skip-gpu-tests", ignore = "built with --features skip-gpu-tests: no GPU adapter")]
fn the_layer_loader_uploads_the_next_layer_before_it_waits() {
    let gpu = &own_gpu();
    let ck: Checkpoint = (0..3)
        .map(|l| (format!("model.layers.{l}.w"), DType::F32, vec![4096], tensor_bytes(DType::F32, 4096, l + 1, true)))
        .collect();
    let reader = Reader::from_source(write(&ck, None, Encoder::Auto, 4096)).unwrap();
    // What each layer's decode uploads on its own.
    let per_layer: Vec<u64> = reader
        .tensors()
        .iter()
        .map(|t| {
            let before = gpu.uploaded_bytes();
            gpu.decode(&reader, t, None).unwrap();
            gpu.uploaded_bytes() - before
        })
        .collect();
    let mut loader = LayerLoader::new(gpu, &reader, None).unwrap();
    let before = gpu.uploaded_bytes();
    let first = loader.next_layer().unwrap().unwrap();
    assert_eq!(first.key, "model.layers.0");
    assert_eq!(
        gpu.uploaded_bytes() - before,
        per_layer[0] + per_layer[1],
        "layer 1 goes up before layer 0 is waited for"
    );
    let second = loader.next_layer().unwrap().unwrap();
    assert_eq!(second.key, "model.layers.1");
    assert_eq!(gpu.uploaded_bytes() - before, per_layer.iter().sum::<u64>());
}

/// Checkpoint-shaped tensors at the size the writer's defaults are for (2^17 elements: many
/// lanes per plane), Adam moments whose rows span orders of magnitude and weights one step
/// apart: the default encoder writes context and base-context records (asserted), and the
/// device decodes them as the CPU does.
#[test]
#[cfg_attr(feature = "skip-gpu-tests", ignore = "built with --features skip-gpu-tests: no GPU adapter")]
fn context_records_in_many_lanes_decode_on_the_device() {
    let gpu = gpu();
    let n = 1usize << 17;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut unit = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f32 / (1u64 << 53) as f32
    };
    let (mut v, mut w, mut w2) = (Vec::new(), Vec::new(), Vec::new());
    let (mut vs, mut ws) = (1e-8f32, 0.02f32);
    for i in 0..n {
        if i % 512 == 0 {
            vs = 10f32.powf(-12.0 + 6.0 * unit());
            ws = 0.01 + 0.05 * unit();
        }
        v.extend((vs * (0.5 + unit())).to_le_bytes());
        let a = (unit() - 0.5) * ws;
        w.extend(a.to_le_bytes());
        w2.extend((a + (unit() - 0.5) * ws * 1e-3).to_le_bytes());
    }
    let a: Checkpoint =
        vec![("exp_avg_sq".into(), DType::F32, vec![n as u64], v.clone()), ("w".into(), DType::F32, vec![n as u64], w)];
    let b: Checkpoint =
        vec![("exp_avg_sq".into(), DType::F32, vec![n as u64], v), ("w".into(), DType::F32, vec![n as u64], w2)];
    let key = write(&a, None, Encoder::Auto, 1 << 20);
    let delta = write(&b, Some((&a, "")), Encoder::Auto, 1 << 20);
    let (mut contexts, mut base_contexts, mut lanes) = (0, 0, 0);
    for file in [&key, &delta] {
        let r = Reader::from_source(file.clone()).unwrap();
        for t in r.tensors() {
            for (i, c) in t.chunks.iter().enumerate() {
                let stored = r.chunk_bytes(t, i).unwrap();
                let n = c.element_count as usize;
                let Ok((records, _)) = tpde_codec::planes::parse(c.codec, &stored, 0, 4, n) else { continue };
                for rec in records {
                    match rec {
                        tpde_codec::planes::PlaneRecord::Contexts(_, l) => {
                            (contexts, lanes) = (contexts + 1, lanes.max(l.lanes))
                        }
                        tpde_codec::planes::PlaneRecord::BaseContexts(_, l) => {
                            (base_contexts, lanes) = (base_contexts + 1, lanes.max(l.lanes))
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    assert!(
        contexts > 0 && base_contexts > 0 && lanes >= 32,
        "{contexts} context, {base_contexts} base-context records, {lanes} lanes"
    );
    let cpu_key = Reader::from_source(key).unwrap();
    let on_device = gpu.load(&cpu_key, None).unwrap();
    assert_same(gpu, &on_device, &cpu_key, &a);
    let cpu_delta = Reader::from_source(delta).unwrap().with_base(std::sync::Arc::new(cpu_key)).unwrap();
    let delta_on_device = gpu.load(&cpu_delta, Some(&on_device)).unwrap();
    assert_same(gpu, &delta_on_device, &cpu_delta, &b);
}

/// Bit patterns that reach every path of the device's integer binary32 arithmetic: zeros,
/// subnormals, the normal range's ends, ones, infinities, NaNs, and random finite values.
fn awkward_f32s(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let special = [
        0u32,
        0x8000_0000,
        1,
        0x8000_0001,
        0x007F_FFFF,
        0x0080_0000,
        0x7F7F_FFFF,
        0x3F80_0000,
        0x7F80_0000,
        0xFF80_0000,
        0x7FC0_0000,
        0x7F80_0001,
    ];
    (0..n)
        .flat_map(|i| {
            let r = next();
            let bits = match r % 8 {
                0 => special[(r >> 8) as usize % special.len()],
                1 => (r >> 16) as u32 & 0x807F_FFFF,                  // subnormal
                2 => ((r >> 16) as u32 & 0x80FF_FFFF) | (0x30 << 23), // small normal
                _ => (r >> 16) as u32 & 0xBFFF_FFFF | ((i as u32 & 1) << 29), // mostly near 1
            };
            bits.to_le_bytes()
        })
        .collect()
}

#[test]
#[cfg_attr(feature = "skip-gpu-tests", ignore = "built with --features skip-gpu-tests: no GPU adapter")]
fn predictions_on_the_device_are_the_cpus_bit_for_bit() {
    use tpde_format::{ChunkEntry, Prediction, TensorEntry};
    let gpu = gpu();
    let n = 1 << 18;
    let (b, m, o) = (awkward_f32s(n, 11), awkward_f32s(n, 12), awkward_f32s(n, 13));
    let up = |name: &str, bytes: &[u8]| gpu.upload(name, DType::F32, &[n as u64], bytes).unwrap();
    let (db, dm, d_o) = (up("b", &b), up("m", &m), up("o", &o));
    let k = |bits: u32| f32::from_bits(bits);
    let predictions = [
        Prediction::AdamSecondMoment {
            one_minus_beta1: 0.1,
            beta2: 0.999,
            one_minus_beta2: 0.001,
            exp_avg: "m".into(),
        },
        Prediction::AdamParameter {
            decay: 0.9999,
            bias2_sqrt: 0.0316,
            eps: 1e-8,
            neg_step: -1e-3,
            exp_avg: "m".into(),
            exp_avg_sq: "o".into(),
        },
        // Constants that are subnormal, huge or negative push results to both ends of the range.
        Prediction::AdamSecondMoment {
            one_minus_beta1: k(3),
            beta2: k(0x7F00_0000),
            one_minus_beta2: -2.5,
            exp_avg: "m".into(),
        },
        Prediction::AdamParameter {
            decay: k(0x0040_0000),
            bias2_sqrt: k(0x0000_0100),
            eps: -0.0,
            neg_step: k(0x7E80_0000),
            exp_avg: "m".into(),
            exp_avg_sq: "o".into(),
        },
        // The reverse predictors (since 1.9), ordinary and extreme constants.
        Prediction::AdamSecondMomentReverse {
            one_minus_beta1: 0.1,
            beta2: 0.999,
            one_minus_beta2: 0.001,
            exp_avg: "m".into(),
        },
        Prediction::AdamParameterReverse {
            decay: 0.9999,
            bias2_sqrt: 0.0316,
            eps: 1e-8,
            neg_step: -1e-3,
            exp_avg: "m".into(),
            exp_avg_sq: "o".into(),
        },
        Prediction::AdamSecondMomentReverse {
            one_minus_beta1: k(0x7F00_0000),
            beta2: k(5),
            one_minus_beta2: -2.5,
            exp_avg: "m".into(),
        },
        Prediction::AdamParameterReverse {
            decay: k(0x0040_0000),
            bias2_sqrt: k(0x0000_0100),
            eps: -0.0,
            neg_step: k(0x7E80_0000),
            exp_avg: "m".into(),
            exp_avg_sq: "o".into(),
        },
    ];
    for p in &predictions {
        // Three chunks, one of them a plain delta (its base bytes are copied, not predicted).
        let chunk = |start: u64, count: u64, codec| ChunkEntry {
            element_start: start,
            element_count: count,
            offset: 0,
            stored_length: 0,
            decoded_length: count * 4,
            crc32: 0,
            codec,
            params: if codec == CodecTag::DeltaPredicted { p.to_bytes() } else { Vec::new() },
        };
        let third = n as u64 / 3;
        let t = TensorEntry {
            name: "t".into(),
            dtype: DType::F32,
            shape: vec![n as u64],
            byte_length: n as u64 * 4,
            digest: [0; 32],
            chunks: vec![
                chunk(0, third, CodecTag::DeltaPredicted),
                chunk(third, third, CodecTag::DeltaSubContext),
                chunk(2 * third, n as u64 - 2 * third, CodecTag::DeltaPredicted),
            ],
        };
        let got = gpu.read_back(&gpu.prediction_base(&t, &db, |_| Ok((&dm, &d_o))).unwrap()).unwrap();
        let mut want = vec![0u8; n * 4];
        tpde_codec::predicted::predict(
            p,
            tpde_codec::predicted::Inputs { base: &b, exp_avg: &m, other: &o },
            &mut want,
        );
        let (lo, hi) = (third as usize * 4, 2 * third as usize * 4);
        want[lo..hi].copy_from_slice(&b[lo..hi]);
        let differ: Vec<_> = (0..n).filter(|&i| got[i * 4..i * 4 + 4] != want[i * 4..i * 4 + 4]).take(5).collect();
        let show = |v: &[u8], i: usize| format!("{:08x}", u32::from_le_bytes(v[i * 4..i * 4 + 4].try_into().unwrap()));
        assert!(
            differ.is_empty(),
            "{p:?}: elements {differ:?} differ: device {:?}, CPU {:?}; inputs b {:?} m {:?} o {:?}",
            differ.iter().map(|&i| show(&got, i)).collect::<Vec<_>>(),
            differ.iter().map(|&i| show(&want, i)).collect::<Vec<_>>(),
            differ.iter().map(|&i| show(&b, i)).collect::<Vec<_>>(),
            differ.iter().map(|&i| show(&m, i)).collect::<Vec<_>>(),
            differ.iter().map(|&i| show(&o, i)).collect::<Vec<_>>(),
        );
    }
}

/// 1.8's sparse plane records (spec §6.2.5) expand on the device as the CPU reader expands
/// them: a delta whose exponents moved at 1% of the elements (its top plane a sparse record)
/// and one where none moved (a constant plane), several chunks each.
#[test]
fn sparse_plane_records_decode_on_the_device() {
    let gpu = gpu();
    let n = 1usize << 16;
    let w: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 0.02).collect();
    let step = |doubled: &dyn Fn(usize) -> bool| -> Vec<u8> {
        w.iter()
            .enumerate()
            .flat_map(|(i, &x)| {
                let nudged = f32::from_bits(x.to_bits() ^ (1 + (i as u32).wrapping_mul(2_654_435_761) % 255));
                (if doubled(i) { nudged * 2.0 } else { nudged }).to_le_bytes()
            })
            .collect()
    };
    let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
    let a: Checkpoint = vec![
        ("moved".into(), DType::F32, vec![n as u64], bytes.clone()),
        ("still".into(), DType::F32, vec![n as u64], bytes),
    ];
    let b: Checkpoint = vec![
        ("moved".into(), DType::F32, vec![n as u64], step(&|i| i % 97 == 3)),
        ("still".into(), DType::F32, vec![n as u64], step(&|_| false)),
    ];
    let key = write(&a, None, Encoder::Auto, 1 << 16);
    let delta = write_in(&b, Some((&a, "")), Encoder::Auto, 1 << 16, 8);
    let r = Reader::from_source(delta.clone()).unwrap();
    let mut sparse = 0;
    for t in r.tensors() {
        for (i, c) in t.chunks.iter().enumerate() {
            let stored = r.chunk_bytes(t, i).unwrap();
            let (records, _) = tpde_codec::planes::parse(c.codec, &stored, 0, 4, c.element_count as usize).unwrap();
            sparse += records.iter().filter(|r| matches!(r, tpde_codec::planes::PlaneRecord::Sparse(_))).count();
        }
    }
    assert!(sparse >= 8, "{sparse} sparse records in 8 chunks");
    let cpu_key = Reader::from_source(key).unwrap();
    let on_device = gpu.load(&cpu_key, None).unwrap();
    let cpu_delta = Reader::from_source(delta).unwrap().with_base(std::sync::Arc::new(cpu_key)).unwrap();
    let delta_on_device = gpu.load(&cpu_delta, Some(&on_device)).unwrap();
    assert_same(gpu, &delta_on_device, &cpu_delta, &b);
}

/// Block records (spec §6.2.6) on the device: planes of several whole blocks and a partial one,
/// in bf16 and f32 keyframes and in a delta, bit for bit as the CPU reads them; and a record
/// with one word changed is rejected, as the CPU rejects it.
#[test]
#[cfg_attr(feature = "skip-gpu-tests", ignore = "built with --features skip-gpu-tests: no GPU adapter")]
fn block_records_decode_on_the_device() {
    // Both ways a step's words are handed out: subgroup ballots where the adapter has them
    // (lavapipe's subgroups are 8 wide, so across subgroups too), and workgroup memory.
    let workgroup = Gpu::without_subgroups().unwrap_or_else(|e| panic!("{e}"));
    assert!(!workgroup.uses_subgroups());
    let info = gpu().info();
    if info.driver == "llvmpipe" {
        assert!(gpu().uses_subgroups(), "lavapipe has subgroups of {} lanes", info.subgroup_min_size);
    }
    for gpu in [gpu(), &workgroup] {
        block_records_on(gpu);
        base_context_blocks_on(gpu);
        context_blocks_on(gpu);
    }
}

/// Neighbour-context block records (spec §6.2.7): a keyframe of rows that each share a scale,
/// of two blocks of 65536 and a partial one, bit for bit as the CPU reads it; and one changed
/// word is rejected, as the CPU rejects it.
fn context_blocks_on(gpu: &Gpu) {
    use tpde_codec::planes::{PlaneRecord, CONTEXT_BLOCKS_SINCE_MINOR};
    let n = 2 * 65_536 + 3001;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let values: Vec<u8> = (0..n)
        .flat_map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Rows of 256 whose scale is 2^-(row mod 17), each element within a factor of 4.
            let scale = (-(((i / 256) % 17) as f32)).exp2();
            (scale * (1.0 + 3.0 * (x >> 40) as f32 / (1u64 << 24) as f32)).to_le_bytes()
        })
        .collect();
    let a: Checkpoint = vec![("rows".into(), DType::F32, vec![n as u64], values)];
    let key = write_in(&a, None, Encoder::Auto, 1 << 20, CONTEXT_BLOCKS_SINCE_MINOR);
    let r = Reader::from_source(key.clone()).unwrap();
    let stored = r.chunk_bytes(&r.tensors()[0], 0).unwrap().to_vec();
    let c = &r.tensors()[0].chunks[0];
    let (records, _) = tpde_codec::planes::parse(c.codec, &stored, 0, 4, n).unwrap();
    let Some(PlaneRecord::ContextBlocks(_, layout)) =
        records.iter().find(|r| matches!(r, PlaneRecord::ContextBlocks(..))).cloned()
    else {
        panic!("no neighbour-context block record: {records:?}")
    };
    assert_eq!(layout.blocks, 3);
    let on_device = gpu.load(&r, None).unwrap();
    assert_same(gpu, &on_device, &r, &a);

    let mut bad = stored.clone();
    bad[layout.words.start + 40] ^= 0x5A;
    let bad = tpde_format::surgery::with_chunk(&key, 0, 0, &bad).unwrap();
    let cpu = Reader::from_source(bad).unwrap();
    let cpu_err = cpu.read("rows").unwrap_err();
    assert_eq!(cpu_err.kind(), ErrorKind::Malformed, "{cpu_err}");
    let Err(gpu_err) = gpu.load(&cpu, None) else { panic!("the device accepted the damaged record") };
    assert!(gpu_err.to_string().contains("rANS block"), "{gpu_err}");
}

/// Base-context block records (spec §6.4.2): a delta whose change depends on its base's
/// exponent, of two blocks of 65536 and a partial one, bit for bit as the CPU reads it, with
/// every context coded, and with the unchanged contexts left out; and one changed word of each
/// kind is rejected, as the CPU rejects it.
fn base_context_blocks_on(gpu: &Gpu) {
    use tpde_codec::planes::{PlaneRecord, CONTEXT_BLOCKS_SINCE_MINOR};
    let n = 2 * 65_536 + 1001;
    let a: Checkpoint = vec![
        ("h".into(), DType::BF16, vec![n as u64], tensor_bytes(DType::BF16, n, 5, true)),
        ("w".into(), DType::F32, vec![n as u64], tensor_bytes(DType::F32, n, 9, true)),
        ("hu".into(), DType::BF16, vec![n as u64], tensor_bytes(DType::BF16, n, 6, true)),
        ("wu".into(), DType::F32, vec![n as u64], tensor_bytes(DType::F32, n, 10, true)),
    ];
    // Elements of half the exponents change by much in their low bits, the others by a bit
    // ("h", "w") or not at all ("hu", "wu": their contexts are left out).
    let mut b = a.clone();
    for (name, dtype, _, data) in b.iter_mut() {
        let w = dtype.size() as usize;
        let left_out = name.ends_with('u');
        for (i, e) in data.chunks_exact_mut(w).enumerate() {
            // (Small changes where the others stay, so that the sparse form does not win.)
            let much = if left_out { (i as u8) % 4 + 1 } else { (i as u8).wrapping_mul(37) | 1 };
            e[0] ^= if e[w - 1] & 1 == 0 { much } else { u8::from(!left_out) };
        }
    }
    let key = write_in(&a, None, Encoder::Auto, 1 << 20, CONTEXT_BLOCKS_SINCE_MINOR);
    let delta = write_in(&b, Some((&a, "")), Encoder::Auto, 1 << 20, CONTEXT_BLOCKS_SINCE_MINOR);
    let r = Reader::from_source(delta.clone()).unwrap();
    let mut found = Vec::new();
    for (ti, t) in r.tensors().iter().enumerate() {
        let stored = r.chunk_bytes(t, 0).unwrap();
        let c = &t.chunks[0];
        let (records, _) = tpde_codec::planes::parse(c.codec, &stored, 0, t.dtype.size() as usize, n).unwrap();
        for r in &records {
            if let PlaneRecord::BaseContextBlocks(model, layout) = r {
                assert_eq!(layout.blocks, 3);
                found.push((ti, layout.words.start + 40, model.has_unchanged()));
            }
        }
    }
    let left_out = found.iter().filter(|f| f.2).count();
    assert!(left_out >= 2 && found.len() > left_out, "{found:?}: records of both kinds");
    let cpu_key = std::sync::Arc::new(Reader::from_source(key).unwrap());
    let on_device = gpu.load(&cpu_key, None).unwrap();
    let cpu_delta = Reader::from_source(delta.clone()).unwrap().with_base(cpu_key.clone()).unwrap();
    let delta_on_device = gpu.load(&cpu_delta, Some(&on_device)).unwrap();
    assert_same(gpu, &delta_on_device, &cpu_delta, &b);

    for unchanged in [false, true] {
        let &(ti, at, _) = found.iter().find(|f| f.2 == unchanged).expect("both kinds");
        let mut stored = r.chunk_bytes(&r.tensors()[ti], 0).unwrap().to_vec();
        stored[at] ^= 0x5A;
        let bad = tpde_format::surgery::with_chunk(&delta, ti, 0, &stored).unwrap();
        let cpu = Reader::from_source(bad).unwrap().with_base(cpu_key.clone()).unwrap();
        let cpu_err = cpu.read(&cpu.tensors()[ti].name).unwrap_err();
        assert_eq!(cpu_err.kind(), ErrorKind::Malformed, "{cpu_err}");
        let Err(gpu_err) = gpu.load(&cpu, Some(&on_device)) else { panic!("the device accepted the damaged record") };
        assert!(gpu_err.to_string().contains("rANS block"), "{gpu_err}");
    }
}

fn block_records_on(gpu: &Gpu) {
    use tpde_codec::planes::{PlaneRecord, BLOCKS_SINCE_MINOR};
    let n = 3 * 16_384 + 77;
    let a: Checkpoint = vec![
        ("w".into(), DType::F32, vec![n as u64], awkward_f32s(n, 3)),
        ("h".into(), DType::BF16, vec![n as u64], tensor_bytes(DType::BF16, n, 5, true)),
        ("s".into(), DType::F32, vec![n as u64], tensor_bytes(DType::F32, n, 9, true)),
    ];
    let mut b = a.clone();
    for (_, _, _, data) in b.iter_mut() {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte ^= u8::from(i % 7 == 0) * ((i as u8) | 1);
        }
    }
    let key = write_in(&a, None, Encoder::Auto, 1 << 20, BLOCKS_SINCE_MINOR);
    let delta = write_in(&b, Some((&a, "")), Encoder::Auto, 1 << 20, BLOCKS_SINCE_MINOR);
    let blocks_in = |file: &Vec<u8>| -> Vec<(usize, usize)> {
        let r = Reader::from_source(file.clone()).unwrap();
        let mut found = Vec::new();
        for (ti, t) in r.tensors().iter().enumerate() {
            let stored = r.chunk_bytes(t, 0).unwrap();
            let c = &t.chunks[0];
            let w = t.dtype.size() as usize;
            let (records, _) = tpde_codec::planes::parse(c.codec, &stored, 0, w, n).unwrap();
            for r in &records {
                if let PlaneRecord::Blocks(_, layout) = r {
                    found.push((ti, layout.words.start + 40));
                }
            }
        }
        found
    };
    let in_key = blocks_in(&key);
    assert!(in_key.len() >= 3, "{in_key:?}: a block record in every keyframe tensor");
    let cpu_key = Reader::from_source(key.clone()).unwrap();
    let on_device = gpu.load(&cpu_key, None).unwrap();
    assert_same(gpu, &on_device, &cpu_key, &a);
    let cpu_delta = Reader::from_source(delta).unwrap().with_base(std::sync::Arc::new(cpu_key)).unwrap();
    let delta_on_device = gpu.load(&cpu_delta, Some(&on_device)).unwrap();
    assert_same(gpu, &delta_on_device, &cpu_delta, &b);

    // One word of the first block record changed (the chunk's CRC made to match): the words
    // no longer bring the states back to 2^16, or run out, on either reader.
    let (ti, at) = in_key[0];
    let r = Reader::from_source(key.clone()).unwrap();
    let mut stored = r.chunk_bytes(&r.tensors()[ti], 0).unwrap().to_vec();
    stored[at] ^= 0x5A;
    let bad = tpde_format::surgery::with_chunk(&key, ti, 0, &stored).unwrap();
    let cpu = Reader::from_source(bad).unwrap();
    let cpu_err = cpu.read(&cpu.tensors()[ti].name).unwrap_err();
    assert_eq!(cpu_err.kind(), ErrorKind::Malformed, "{cpu_err}");
    let Err(gpu_err) = gpu.load(&cpu, None) else { panic!("the device accepted the damaged record") };
    assert!(gpu_err.to_string().contains("rANS block"), "{gpu_err}");
}
