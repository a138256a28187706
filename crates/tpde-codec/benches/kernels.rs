//! Criterion benches of the codec kernels a restore and a pack spend their time in, on one
//! 4 MiB chunk (the writer's default) of checkpoint-like data: weights drawn from N(0, 0.05²)
//! (f32, and the same values as bf16), and the same weights one small training step later for
//! the deltas. Throughput is of logical (decoded) bytes.
//!
//!     cargo bench -p tpde-codec --bench kernels
//!
//! Whole checkpoints, side by side with zstd, safetensors and ZipNN, are `tpde bench`'s job.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use tpde_codec::{ChunkContext, Encoder};
use tpde_format::DType;

const CHUNK: usize = 4 << 20;

/// `n` values of N(0, σ²), from a fixed xorshift stream (Box-Muller).
fn normal(n: usize, sigma: f32, seed: u64) -> Vec<f32> {
    let mut x = seed | 1;
    let mut uniform = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32 * sigma
        })
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// bf16 by truncation, as a checkpoint cast down would mostly hold.
fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes()).collect()
}

fn bench_codec(c: &mut Criterion, name: &str, dtype: DType, base: Option<&[u8]>, input: &[u8]) {
    let ctx = ChunkContext { dtype, base };
    let mut stored = Vec::new();
    let (tag, params) = Encoder::Auto.encode(ctx, input, &mut stored).expect("encodes");
    let mut g = c.benchmark_group(format!("{name} ({tag}, {:.3} of raw)", stored.len() as f64 / input.len() as f64));
    g.throughput(Throughput::Bytes(input.len() as u64));
    g.sample_size(20);
    // Checked before timing: a filter (`cargo bench ... -- NAME`) may skip the timed closure.
    let mut out = vec![0u8; input.len()];
    tpde_codec::decode(tag, ctx, &params, &stored, &mut out).expect("decodes");
    assert!(out == input, "{name}: the round trip is bit-exact");
    g.bench_function("decode", |b| {
        b.iter(|| tpde_codec::decode(tag, ctx, &params, black_box(&stored), &mut out).expect("decodes"))
    });
    // The encoder of a file that declares 1.9 (lane records) and of one that declares 1.10
    // (rANS blocks for order-0 planes): `TPDE_ISA=avx2` measures a CPU without AVX-512.
    for (what, minor) in [("encode, 1.9 lanes", 9), ("encode, 1.10 blocks", 10)] {
        g.bench_function(what, |b| {
            b.iter(|| {
                let mut s = Vec::with_capacity(stored.len());
                Encoder::Auto.encode_in(ctx, black_box(input), minor, &mut s).expect("encodes")
            })
        });
    }
    g.finish();
}

fn kernels(c: &mut Criterion) {
    // A step of 1e-5 moves most f32 weights; bf16 needs 1e-3 to move a comparable share.
    type ToBytes = fn(&[f32]) -> Vec<u8>;
    let forms: [(&str, DType, usize, f32, ToBytes); 2] =
        [("f32", DType::F32, CHUNK / 4, 1e-5, f32_bytes), ("bf16", DType::BF16, CHUNK / 2, 1e-3, bf16_bytes)];
    for (name, dtype, n, step, bytes) in forms {
        let w = normal(n, 0.05, 7);
        let w2: Vec<f32> = w.iter().zip(normal(n, step, 11)).map(|(a, d)| a + d).collect();
        let (now, before) = (bytes(&w2), bytes(&w));
        bench_codec(c, &format!("{name} keyframe"), dtype, None, &now);
        bench_codec(c, &format!("{name} delta"), dtype, Some(&before), &now);
    }
    let f32_now = f32_bytes(&normal(CHUNK / 4, 0.05, 7));

    // What every read and every pack also does per chunk: the stored bytes' CRC-32 and the
    // tensor's BLAKE3 digest.
    let mut g = c.benchmark_group("checks");
    g.throughput(Throughput::Bytes(f32_now.len() as u64));
    g.bench_function("crc32 (chunk CRC)", |b| b.iter(|| crc32fast::hash(black_box(&f32_now))));
    g.bench_function("blake3 (tensor digest)", |b| b.iter(|| tpde_format::digest::tensor_digest(black_box(&f32_now))));
    g.finish();

    // A `delta-predicted` chunk's prediction (spec §6.8), before its residual is decoded: the
    // reverse predictors a Checkpointer's older steps use, on Adam-like moments.
    let m = f32_bytes(&normal(CHUNK / 4, 1e-4, 13));
    let v = f32_bytes(&normal(CHUNK / 4, 1e-4, 17).iter().map(|x| x * x).collect::<Vec<_>>());
    let inputs = tpde_codec::predicted::Inputs { base: &f32_now, exp_avg: &m, other: &v };
    let mut out = vec![0u8; f32_now.len()];
    let mut g = c.benchmark_group("prediction");
    g.throughput(Throughput::Bytes(f32_now.len() as u64));
    let w = tpde_format::prediction::Prediction::AdamParameterReverse {
        decay: 0.9999,
        bias2_sqrt: 0.0447,
        eps: 1e-8,
        neg_step: -1e-3,
        exp_avg: "m".into(),
        exp_avg_sq: "v".into(),
    };
    g.bench_function("predictor 4 (weights)", |b| b.iter(|| tpde_codec::predicted::predict(&w, inputs, &mut out)));
    let v_rev = tpde_format::prediction::Prediction::AdamSecondMomentReverse {
        one_minus_beta1: 0.1,
        beta2: 0.999,
        one_minus_beta2: 0.001,
        exp_avg: "m".into(),
    };
    g.bench_function("predictor 3 (second moment)", |b| {
        b.iter(|| tpde_codec::predicted::predict(&v_rev, inputs, &mut out))
    });
    g.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
