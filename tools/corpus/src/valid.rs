//! `valid/`: every dtype, codec tag, position coder and feature, keyframes and deltas with
//! their bases, and the structural edge cases (empty, scalar, non-ASCII, longest, highest).

use half::{bf16, f16};
use tpde_codec::Encoder;
use tpde_format::files::FileEntry;
use tpde_format::limits::{MAX_KEY_LEN, MAX_NAME_LEN, MAX_RANK};
use tpde_format::metadata::{KEY_MAX_ABS_ERROR, KEY_MAX_REL_ERROR, KEY_PRODUCER, KEY_SOURCE_FORMAT, KEY_STEP};
use tpde_format::{surgery, CodecTag, DType, MetadataEntry, MetadataValue, Prediction};
use tpde_write::lossy::Bound;

use crate::{Gen, Rng, Spec, T};

/// The keyframe the delta files decode against.
pub const DELTA_BASE: &str = "valid/delta-base.tpde";
/// The small multi-chunk files most invalid files are cut from.
pub const SMALL_RAW: &str = "valid/small-raw.tpde";
pub const SMALL_ZSTD: &str = "valid/small-zstd.tpde";
pub const SMALL_PLANES: &str = "valid/small-planes.tpde";
/// The file whose `delta-xor` chunks the delta rules are broken in.
pub const DELTA_XOR: &str = "valid/delta-xor.tpde";
pub const DELTA_PACKED: &str = "valid/delta-sparse-packed.tpde";
/// The lane-form files (1.2) the lane rules are broken in.
pub const LANES_F32: &str = "valid/codec-planes-lanes-f32.tpde";
pub const LANES_PACKED: &str = "valid/delta-sparse-packed-lanes.tpde";
/// The context-record file (1.3) the context rules are broken in.
pub const CONTEXT_F32: &str = "valid/codec-planes-context-f32.tpde";
/// The keyframe the base-context deltas (1.4) decode against.
pub const CONTEXT_BASE: &str = "valid/delta-context-base.tpde";
/// A `delta-sub-context` file whose first chunk has base-context records.
pub const DELTA_SUB_CONTEXT: &str = "valid/delta-sub-context.tpde";

pub fn all(g: &mut Gen) {
    small(g);
    dtypes(g);
    codecs(g);
    deltas(g);
    structure(g);
    lanes(g);
    contexts(g);
    base_contexts(g);
    clarifications(g);
    relative_bound(g);
    predicted(g);
    predicted_edges(g);
    files(g);
    sparse_planes(g);
}

/// Bytes of `values` as `dtype` (a float dtype that `half` or the std covers, or an integer).
pub fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size() as usize);
    for &v in values {
        match dtype {
            DType::F64 => out.extend(v.to_le_bytes()),
            DType::F32 => out.extend((v as f32).to_le_bytes()),
            DType::F16 => out.extend(f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend(bf16::from_f64(v).to_le_bytes()),
            DType::I64 => out.extend((v as i64).to_le_bytes()),
            DType::I32 => out.extend((v as i32).to_le_bytes()),
            DType::I16 => out.extend((v as i16).to_le_bytes()),
            DType::I8 => out.extend((v as i8).to_le_bytes()),
            DType::U64 => out.extend((v as u64).to_le_bytes()),
            DType::U32 => out.extend((v as u32).to_le_bytes()),
            DType::U16 => out.extend((v as u16).to_le_bytes()),
            DType::U8 => out.push(v as u8),
            DType::Bool => out.push(u8::from(v != 0.0)),
            // f8 (and any dtype added later, by width): sign, an exponent near the middle of
            // the range, a mantissa from the value.
            _ => {
                let (e_bits, m_bits) = if dtype == DType::F8E4M3 { (4, 3) } else { (5, 2) };
                let mag = v.abs().max(1e-9).log2().floor() as i64 + (1 << (e_bits - 1)) - 1;
                let e = mag.clamp(1, (1 << e_bits) - 2) as u8;
                let m = ((v.abs() * 1e6) as u64 % (1 << m_bits)) as u8;
                out.push(u8::from(v < 0.0) << 7 | e << m_bits | m);
            }
        }
    }
    out
}

/// `n` weight-like values of `dtype`: normal around 0 for floats, small for integers.
pub fn weights(dtype: DType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let sd = if dtype.is_float() { 0.05 } else { 20.0 };
    let values: Vec<f64> =
        (0..n).map(|_| rng.normal(sd)).map(|v| if dtype == DType::Bool { v.signum() } else { v }).collect();
    let values: Vec<f64> = match dtype {
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => values.iter().map(|v| v.abs()).collect(),
        DType::Bool => values.iter().map(|&v| f64::from(u8::from(v > 0.0))).collect(),
        _ => values,
    };
    encode(dtype, &values)
}

/// `data` with a `share` of its elements changed in their low `bits` bits (training-like
/// drift on the bit patterns), always including the first and last elements.
pub fn drift(dtype: DType, data: &[u8], share: f64, bits: u32, rng: &mut Rng) -> Vec<u8> {
    let w = dtype.size() as usize;
    let n = data.len() / w;
    let mut out = data.to_vec();
    for i in 0..n {
        if i != 0 && i != n - 1 && rng.unit() >= share {
            continue;
        }
        let mask = if dtype == DType::Bool { 1 } else { (rng.next() % ((1u64 << bits.min(8 * w as u32 - 1)) - 1)) + 1 };
        for (j, b) in out[i * w..(i + 1) * w].iter_mut().enumerate() {
            *b ^= (mask >> (8 * j)) as u8;
        }
    }
    out
}

/// Edge-case bit patterns of `dtype` (zeros, signs, infinities, NaNs with payloads,
/// subnormals, extremes), then random ones, `n` elements in all.
fn edge_values(dtype: DType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let w = dtype.size() as usize;
    let bits = 8 * w as u32;
    let all = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
    let sign = 1u64 << (bits - 1);
    let mut patterns: Vec<u64> = vec![0, 1, sign, all, all >> 1, sign | 1];
    if let Some((e, m)) = float_fields(dtype) {
        let inf = ((1u64 << e) - 1) << m;
        patterns.extend([inf, inf | sign, inf | 1, inf | (1 << (m - 1)), inf - 1, 1 << m, (1 << m) - 1]);
    } else if dtype == DType::Bool {
        patterns = vec![0, 1];
    }
    let mut out = Vec::with_capacity(n * w);
    for i in 0..n {
        let p = patterns.get(i).copied().unwrap_or_else(|| {
            if dtype == DType::Bool {
                rng.next() & 1
            } else {
                rng.next() & all
            }
        });
        out.extend(&p.to_le_bytes()[..w]);
    }
    out
}

/// Exponent and mantissa widths of a float dtype.
fn float_fields(dtype: DType) -> Option<(u32, u32)> {
    Some(match dtype {
        DType::F64 => (11, 52),
        DType::F32 => (8, 23),
        DType::F16 => (5, 10),
        DType::BF16 => (8, 7),
        DType::F8E4M3 => (4, 3),
        DType::F8E5M2 => (5, 2),
        _ => return None,
    })
}

fn elems(shape: &[u64]) -> usize {
    shape.iter().product::<u64>() as usize
}

/// The small files most invalid ones are cut from: several tensors, several chunks each.
fn small(g: &mut Gen) {
    for (path, encoder, what) in [
        (SMALL_RAW, Encoder::Raw, "raw"),
        (SMALL_ZSTD, Encoder::Zstd { level: 3 }, "zstd"),
        (SMALL_PLANES, Encoder::Codec(CodecTag::Planes), "planes"),
    ] {
        let ramp: Vec<f64> = (0..300).map(|i| f64::from(i) * 0.25).collect();
        let bytes: Vec<f64> = (0..200u32).map(|i| f64::from((i * i) % 7)).collect();
        let description = format!("four tensors in 128-byte {what} chunks: f32 [3, 100], an i64 scalar, an empty bf16, u8 [200] with a non-ASCII name");
        g.valid(
            Spec::new(path, "§4", &description)
                .encoder(encoder)
                .chunk_bytes(128)
                .meta(KEY_STEP, MetadataValue::U64(42))
                .meta("flag", MetadataValue::Bool(true))
                .tensor(T::new("ramp", DType::F32, &[3, 100], encode(DType::F32, &ramp)))
                .tensor(T::new("scalar", DType::I64, &[], encode(DType::I64, &[7.0])))
                .tensor(T::new("empty", DType::BF16, &[0, 5], Vec::new()))
                .tensor(T::new("ünïcode/名前", DType::U8, &[200], encode(DType::U8, &bytes))),
        );
    }
}

/// One raw file per dtype, holding its edge-case bit patterns.
fn dtypes(g: &mut Gen) {
    let mut rng = Rng::new(1);
    for dtype in DType::ALL {
        let path = format!("valid/dtype-{dtype}.tpde");
        let description = format!("{dtype}: zeros, signs, extremes, infinities, NaN payloads, subnormals, random bit patterns; a [4, 16] tensor and a scalar");
        let values = edge_values(dtype, 64, &mut rng);
        let scalar = values[dtype.size() as usize..2 * dtype.size() as usize].to_vec();
        g.valid(
            Spec::new(&path, "§4.1", &description).tensor(T::new("values", dtype, &[4, 16], values)).tensor(T::new(
                "scalar",
                dtype,
                &[],
                scalar,
            )),
        );
    }
}

/// `zstd` and `planes` keyframes, `planes` for every element width and both plane modes.
fn codecs(g: &mut Gen) {
    let mut rng = Rng::new(2);
    let zstd_data = weights(DType::F32, 2048, &mut rng);
    g.valid(
        Spec::new("valid/codec-zstd.tpde", "§6", "zstd (0x0001) chunks of weights, counters and a constant tensor")
            .encoder(Encoder::Zstd { level: 3 })
            .chunk_bytes(2048)
            .tensor(T::new("w", DType::F32, &[64, 32], zstd_data))
            .tensor(T::new(
                "steps",
                DType::I64,
                &[300],
                encode(DType::I64, &(0..300).map(f64::from).collect::<Vec<_>>()),
            ))
            .tensor(T::new("zeros", DType::F16, &[4096], vec![0; 8192])),
    );
    for dtype in [DType::F64, DType::F32, DType::BF16, DType::F16, DType::F8E4M3, DType::F8E5M2, DType::I32, DType::U8]
    {
        let path = format!("valid/codec-planes-{dtype}.tpde");
        let description = format!(
            "planes (0x0002) of {dtype} weights over several chunks: rANS-coded planes (§6.2.1, §6.2.2) and stored ones; a constant tensor; a tensor of one element"
        );
        let n = 3000;
        let data = weights(dtype, n, &mut rng);
        let constant = encode(dtype, &vec![1.0; 512]);
        let one = weights(dtype, 1, &mut rng);
        g.valid(
            Spec::new(&path, "§6.2", &description)
                .encoder(Encoder::Codec(CodecTag::Planes))
                .chunk_bytes(4096)
                .tensor(T::new("w", dtype, &[n as u64], data))
                .tensor(T::new("constant", dtype, &[512], constant))
                .tensor(T::new("one", dtype, &[1], one)),
        );
    }
    let mut mixed =
        Spec::new("valid/codec-mixed.tpde", "§6", "raw, zstd and planes chunks in one file").chunk_bytes(256);
    for (i, encoder) in
        [Encoder::Raw, Encoder::Zstd { level: 1 }, Encoder::Codec(CodecTag::Planes), Encoder::AutoSerial]
            .into_iter()
            .enumerate()
    {
        mixed = mixed
            .tensor(T::new(&format!("t{i}"), DType::BF16, &[300], weights(DType::BF16, 300, &mut rng)).with(encoder));
    }
    mixed.options.encoder = Encoder::AutoSerial;
    g.valid(mixed);
}

/// The tensors of the base checkpoint.
fn base_tensors(rng: &mut Rng) -> Vec<T> {
    let mut ts: Vec<T> = [
        ("w.f32", DType::F32, vec![64, 32]),
        ("w.bf16", DType::BF16, vec![128, 16]),
        ("w.f16", DType::F16, vec![40, 10]),
        ("w.f64", DType::F64, vec![16, 16]),
        ("w.f8", DType::F8E4M3, vec![256]),
        ("w.big", DType::F32, vec![128, 64]),
        ("counts", DType::I32, vec![100]),
        ("mask", DType::Bool, vec![64]),
    ]
    .into_iter()
    .map(|(name, dtype, shape)| T::new(name, dtype, &shape, weights(dtype, elems(&shape), rng)))
    .collect();
    ts.push(T::new("step", DType::I64, &[], encode(DType::I64, &[1000.0])));
    let tied = weights(DType::F32, 96, rng);
    ts.push(T::new("tied.a", DType::F32, &[96], tied.clone()));
    ts.push(T::new("tied.b", DType::F32, &[96], tied));
    ts
}

/// Every tensor of `base` drifted: `share` of the elements in their low `bits` bits; the step
/// counter moves on.
fn drifted(base: &[T], share: f64, bits: u32, rng: &mut Rng) -> Vec<T> {
    let mut out = Vec::new();
    let tied = drift(DType::F32, &base.iter().find(|t| t.name == "tied.a").unwrap().data, share, bits, rng);
    for t in base {
        let data = match t.name.as_str() {
            "step" => (i64::from_le_bytes(t.data[..].try_into().unwrap()) + 10).to_le_bytes().to_vec(),
            "tied.a" | "tied.b" => tied.clone(),
            _ => drift(t.dtype, &t.data, share, bits, rng),
        };
        out.push(T { data, delta: true, ..t.clone() });
    }
    out
}

fn deltas(g: &mut Gen) {
    let mut rng = Rng::new(3);
    let base = base_tensors(&mut rng);
    g.valid(
        Spec::new(DELTA_BASE, "§7.3", "the keyframe the delta files decode against (planes): weights of every float width, counters, a mask, a step, tied tensors")
            .encoder(Encoder::Codec(CodecTag::Planes))
            .chunk_bytes(4096)
            .meta(KEY_STEP, MetadataValue::U64(1000))
            .tensors(base.clone()),
    );
    for (path, tag, share, bits, description) in [
        (DELTA_XOR, CodecTag::DeltaXor, 1.0, 12, "delta-xor (0x0003): every element changed in its low 12 bits"),
        (
            "valid/delta-sub.tpde",
            CodecTag::DeltaSub,
            1.0,
            12,
            "delta-sub (0x0004): every element changed in its low 12 bits",
        ),
        (
            "valid/delta-sparse-elias-delta.tpde",
            CodecTag::SparseEliasDelta,
            0.03,
            8,
            "sparse-elias-delta (0x0005): 3% of the elements changed, the first and last always",
        ),
        (
            "valid/delta-sparse-fibonacci.tpde",
            CodecTag::SparseFibonacci,
            0.03,
            8,
            "sparse-fibonacci (0x0006): 3% of the elements changed, the first and last always",
        ),
        (
            "valid/delta-sparse-rice.tpde",
            CodecTag::SparseRice,
            0.03,
            8,
            "sparse-rice (0x0007): 3% of the elements changed, the first and last always",
        ),
        (
            DELTA_PACKED,
            CodecTag::SparsePacked,
            0.05,
            8,
            "sparse-packed (0x0008): 5% of the elements changed, several 128-position blocks per chunk",
        ),
    ] {
        let current = drifted(&base, share, bits, &mut rng);
        let rule = if share < 1.0 { "§6.5.1" } else { "§6.4" };
        g.valid(
            Spec::new(path, rule, description)
                .encoder(Encoder::Codec(tag))
                .chunk_bytes(8192)
                .meta(KEY_STEP, MetadataValue::U64(1010))
                .tensors(current)
                .base(DELTA_BASE),
        );
    }
    let auto = drifted(&base, 0.2, 6, &mut rng);
    g.valid(
        Spec::new(
            "valid/delta-auto.tpde",
            "§6.3",
            "the writer's choice per chunk among every codec (what `tpde pack --base` writes)",
        )
        .encoder(Encoder::AutoSerial)
        .chunk_bytes(1024)
        .tensors(auto)
        .base(DELTA_BASE),
    );

    // Tensors added, removed, reshaped and retyped: those are keyframes inside a delta.
    let mut changed = drifted(&base, 0.05, 8, &mut rng);
    changed.retain(|t| t.name != "step" && t.name != "mask");
    for t in &mut changed {
        match t.name.as_str() {
            "counts" => {
                t.shape = vec![10, 10];
                t.delta = false;
            }
            "w.f16" => {
                t.dtype = DType::BF16;
                t.data = weights(DType::BF16, 400, &mut rng);
                t.delta = false;
            }
            _ => {}
        }
    }
    changed.push(T::new("added", DType::F32, &[7, 3], weights(DType::F32, 21, &mut rng)));
    g.valid(
        Spec::new("valid/delta-tensor-changes.tpde", "§6.3", "a delta whose tensors differ from the base's: one added, two removed, one reshaped, one retyped (those are keyframes)")
            .encoder(Encoder::AutoSerial)
            .tensors(changed)
            .base(DELTA_BASE),
    );

    // A chain: a delta against a delta.
    let xor = g.get(DELTA_XOR).tensors.clone();
    let next = drifted(&xor, 0.02, 6, &mut rng);
    g.valid(
        Spec::new(
            "valid/delta-chain.tpde",
            "§7.3",
            "a delta against valid/delta-xor.tpde, itself a delta: a chain of two",
        )
        .encoder(Encoder::AutoSerial)
        .tensors(next)
        .base(DELTA_XOR),
    );

    // Lossy: changes under τ dropped against the base, the bound recorded.
    let tau = 1e-3;
    let mut lossy = drifted(&base, 1.0, 14, &mut rng);
    for (t, b) in lossy.iter_mut().zip(&base) {
        t.data = tpde_write::lossy::snap_to_base(t.dtype, &t.data, &b.data, Bound { abs: tau, rel: 0.0 });
    }
    g.valid(
        Spec::new(
            "valid/delta-lossy.tpde",
            "§6.6",
            "lossy delta: float changes under 1e-3 dropped against the base; tpde.max_abs_error records the bound",
        )
        .encoder(Encoder::AutoSerial)
        .meta(KEY_MAX_ABS_ERROR, MetadataValue::F64(tau))
        .tensors(lossy)
        .base(DELTA_BASE),
    );

    // A delta whose base is found through its path hint.
    let hinted = drifted(&base, 0.01, 4, &mut rng);
    g.valid(
        Spec::new(
            "valid/delta-via-hint.tpde",
            "§7.3",
            "a delta found through its path hint (\"delta-base.tpde\", next to it)",
        )
        .encoder(Encoder::AutoSerial)
        .tensors(hinted)
        .base(DELTA_BASE),
    );
    let case = g.cases.last_mut().expect("just added");
    case.base = None;
    case.follow_hints = true;
}

fn structure(g: &mut Gen) {
    let mut rng = Rng::new(4);
    g.valid(Spec::new("valid/empty-file.tpde", "§5", "no tensors and no metadata"));
    g.valid(
        Spec::new("valid/empty-tensors.tpde", "§5.3", "tensors with zero elements (no chunks) next to a non-empty one")
            .encoder(Encoder::Zstd { level: 3 })
            .tensor(T::new("zero", DType::F32, &[0], Vec::new()))
            .tensor(T::new("zero-rows", DType::BF16, &[0, 5], Vec::new()))
            .tensor(T::new("zero-middle", DType::I8, &[3, 0, 2], Vec::new()))
            .tensor(T::new("one", DType::U16, &[1], vec![1, 2])),
    );
    let mut scalars = Spec::new("valid/scalars.tpde", "§5.3", "rank-0 tensors (one element) of several dtypes")
        .encoder(Encoder::AutoSerial);
    for dtype in [DType::F32, DType::BF16, DType::F64, DType::I64, DType::U8, DType::Bool, DType::F8E5M2] {
        scalars = scalars.tensor(T::new(&format!("scalar.{dtype}"), dtype, &[], weights(dtype, 1, &mut rng)));
    }
    g.valid(scalars);
    let mut names = Spec::new(
        "valid/names-unicode.tpde",
        "§5.3",
        "non-ASCII names, unnormalized: composed and decomposed é are two names; emoji, CJK, right-to-left, spaces",
    );
    for name in ["caf\u{e9}", "cafe\u{301}", "名前/重み", "emoji 🙂.weight", "وزن", " spaced name ", "a/b.c:d[0]"]
    {
        names = names.tensor(T::new(name, DType::U8, &[3], name.as_bytes()[..3].to_vec()));
    }
    g.valid(names.meta("ключ", MetadataValue::String("значение".into())));

    // The longest name and key the limits allow, in multi-byte characters.
    let long_name: String = "名".repeat(MAX_NAME_LEN as usize / 3) + &"n".repeat(MAX_NAME_LEN as usize % 3);
    let long_key: String = "k".repeat(MAX_KEY_LEN as usize);
    g.valid(
        Spec::new(
            "valid/limits-longest-name.tpde",
            "§8",
            "a tensor name of exactly 4096 bytes of UTF-8 and a metadata key of exactly 1024 bytes",
        )
        .meta(&long_key, MetadataValue::U64(1))
        .tensor(T::new(&long_name, DType::F32, &[2], encode(DType::F32, &[1.0, 2.0]))),
    );
    let mut shape = vec![1u64; MAX_RANK as usize];
    shape[0] = 2;
    shape[31] = 3;
    let mut zero_shape = vec![7u64; MAX_RANK as usize];
    zero_shape[5] = 0;
    g.valid(
        Spec::new(
            "valid/limits-highest-rank.tpde",
            "§8",
            "rank-32 tensors: one of 6 elements, one with a zero dimension",
        )
        .tensor(T::new("rank32", DType::I16, &shape, encode(DType::I16, &[1.0, -2.0, 3.0, -4.0, 5.0, -6.0])))
        .tensor(T::new("rank32-empty", DType::F32, &zero_shape, Vec::new())),
    );
    g.valid(
        Spec::new(
            "valid/chunk-boundaries.tpde",
            "§5.4",
            "tensors of exactly one 64-byte chunk, one element more, one less, one element, many chunks",
        )
        .chunk_bytes(64)
        .tensor(T::new("exact", DType::F32, &[16], weights(DType::F32, 16, &mut rng)))
        .tensor(T::new("one-more", DType::F32, &[17], weights(DType::F32, 17, &mut rng)))
        .tensor(T::new("one-less", DType::F32, &[15], weights(DType::F32, 15, &mut rng)))
        .tensor(T::new("single", DType::F64, &[1], weights(DType::F64, 1, &mut rng)))
        .tensor(T::new("many", DType::U8, &[64 * 40 + 3], weights(DType::U8, 64 * 40 + 3, &mut rng)))
        .tensor(
            T::new("odd-width", DType::BF16, &[3, 11], weights(DType::BF16, 33, &mut rng))
                .with(Encoder::Zstd { level: 3 }),
        ),
    );
    for alignment in [128u32, 4096] {
        let path = format!("valid/alignment-{alignment}.tpde");
        let description =
            format!("payload alignment {alignment}: chunks start at multiples of it, zero padding between");
        let mut spec = Spec::new(&path, "§4", &description).chunk_bytes(u64::from(alignment) * 2);
        spec.options.alignment = alignment;
        g.valid(spec.tensor(T::new("w", DType::F32, &[3000], weights(DType::F32, 3000, &mut rng))).tensor(T::new(
            "b",
            DType::F32,
            &[5],
            weights(DType::F32, 5, &mut rng),
        )));
    }
    let tied = weights(DType::F32, 500, &mut rng);
    g.valid(
        Spec::new(
            "valid/tied-tensors.tpde",
            "§4",
            "three names for the same bytes (tied embeddings): identical chunk ranges, stored once",
        )
        .encoder(Encoder::Zstd { level: 3 })
        .chunk_bytes(512)
        .tensor(T::new("embed.weight", DType::F32, &[100, 5], tied.clone()))
        .tensor(T::new("lm_head.weight", DType::F32, &[100, 5], tied.clone()))
        .tensor(T::new("flat", DType::F32, &[500], tied)),
    );

    // Every metadata type, reserved keys, and a type this reader does not know.
    let metadata = vec![
        (KEY_STEP, MetadataValue::U64(u64::MAX)),
        (KEY_PRODUCER, MetadataValue::String("tpde-corpus".into())),
        (KEY_SOURCE_FORMAT, MetadataValue::String("safetensors".into())),
        ("bool.true", MetadataValue::Bool(true)),
        ("bool.false", MetadataValue::Bool(false)),
        ("i64.min", MetadataValue::I64(i64::MIN)),
        ("f64.negative-zero", MetadataValue::F64(-0.0)),
        ("f64.nan-payload", MetadataValue::F64(f64::from_bits(0x7ff8_0000_dead_beef))),
        ("f64.inf", MetadataValue::F64(f64::INFINITY)),
        ("string.empty", MetadataValue::String(String::new())),
        ("bytes", MetadataValue::Bytes(vec![0, 1, 0xfe, 0xff])),
        ("bytes.empty", MetadataValue::Bytes(Vec::new())),
    ];
    let mut spec =
        Spec::new("valid/metadata-all-types.tpde", "§5.2", "every metadata type, edge values, the reserved keys");
    for (k, v) in metadata {
        spec = spec.meta(k, v);
    }
    let bytes = g.valid(spec.tensor(T::new("x", DType::U8, &[1], vec![9])));
    let unknown = MetadataValue::Unknown { type_code: 0x7f, bytes: vec![1, 2, 3] };
    let with_unknown =
        surgery::with_directory(&bytes, |d| d.metadata.push(MetadataEntry::new("future.type", unknown.clone())))
            .expect("surgery on a valid file");
    g.valid_derived(
        "valid/metadata-unknown-type.tpde",
        "§5.2",
        "a metadata value of an unlisted type (0x7f): accepted and kept",
        "valid/metadata-all-types.tpde",
        with_unknown,
    );
    if let tpde_conformance::Expect::Valid { metadata, .. } = &mut g.cases.last_mut().unwrap().expect {
        metadata.push(tpde_conformance::ExpectedMetadata::new("future.type", &unknown));
    }

    // Forward compatibility: what a 1.x reader must accept.
    let small = g.get(SMALL_ZSTD).bytes.clone();
    // 255, not the next minor: it stays newer than this document as the spec grows.
    let newer = surgery::with_header(&small, |h| h.minor_version = 255).expect("surgery");
    g.valid_derived(
        "valid/newer-minor-version.tpde",
        "§11",
        "minor version 1.255, newer than any this document defines: a 1.x reader reads it",
        SMALL_ZSTD,
        newer,
    );
    let flag = surgery::with_header(&small, |h| h.optional_features |= 1 << 9).expect("surgery");
    g.valid_derived(
        "valid/unknown-optional-feature.tpde",
        "§2.1",
        "an unknown may-ignore feature bit (9): ignored",
        SMALL_ZSTD,
        flag,
    );
}

/// The lane tags of 1.2 (§6.2.3, §6.7): keyframes of every element width with several lanes per
/// plane and a partial last word, each delta lane tag, and the GPU profile's choice per chunk.
fn lanes(g: &mut Gen) {
    let mut rng = Rng::new(5);
    for (dtype, n) in [(DType::F32, 9003), (DType::BF16, 20001), (DType::F64, 5001), (DType::F8E4M3, 30001)] {
        let path = format!("valid/codec-planes-lanes-{dtype}.tpde");
        let description = format!(
            "planes-lanes (0x0009) of {n} {dtype} weights: rANS planes in several lanes, the last word partial (§6.2.3); a constant tensor; a tensor of one element"
        );
        let data = weights(dtype, n, &mut rng);
        g.valid(
            Spec::new(&path, "§6.2.3", &description)
                .encoder(Encoder::Codec(CodecTag::PlanesLanes))
                .chunk_bytes(1 << 20)
                .tensor(T::new("w", dtype, &[n as u64], data))
                .tensor(T::new("constant", dtype, &[512], encode(dtype, &vec![1.0; 512])))
                .tensor(T::new("one", dtype, &[1], weights(dtype, 1, &mut rng))),
        );
    }
    let base = base_tensors(&mut Rng::new(3));
    for (path, encoder, share, bits, description) in [
        (
            "valid/delta-xor-lanes.tpde",
            Encoder::Codec(CodecTag::DeltaXorLanes),
            1.0,
            12,
            "delta-xor-lanes (0x000A): every element changed in its low 12 bits",
        ),
        (
            "valid/delta-sub-lanes.tpde",
            Encoder::Codec(CodecTag::DeltaSubLanes),
            1.0,
            12,
            "delta-sub-lanes (0x000B): every element changed in its low 12 bits",
        ),
        (
            LANES_PACKED,
            Encoder::Codec(CodecTag::SparsePackedLanes),
            0.05,
            8,
            "sparse-packed-lanes (0x000C): 5% of the elements changed, several 128-position blocks per chunk",
        ),
        (
            "valid/delta-gpu-profile.tpde",
            Encoder::Auto,
            0.2,
            6,
            "the default choice per chunk among the lane tags (what `tpde pack --base` writes, under either profile)",
        ),
    ] {
        g.valid(
            Spec::new(path, "§6.7", description)
                .encoder(encoder)
                .chunk_bytes(32768)
                .meta(KEY_STEP, MetadataValue::U64(1010))
                .tensors(drifted(&base, share, bits, &mut rng))
                .base(DELTA_BASE),
        );
    }
}

/// `n` values like an optimizer moment's: rows of 64 that share a scale, the scales spread over
/// many binades, so an element's exponent is most likely near the one before it.
fn moments(dtype: DType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut scale = 1.0;
    let values: Vec<f64> = (0..n)
        .map(|i| {
            if i % 64 == 0 {
                scale = (2f64).powf(-4.0 - 16.0 * rng.unit());
            }
            scale * (0.5 + rng.unit())
        })
        .collect();
    encode(dtype, &values)
}

/// `planes-context` of 1.3 (§6.2.4): moment-like tensors whose exponent plane is a context
/// record, next to weights whose planes stay order-0 lanes in the same codec.
fn contexts(g: &mut Gen) {
    let mut rng = Rng::new(13);
    for (dtype, n) in [(DType::F32, 20001), (DType::BF16, 30003)] {
        let path = format!("valid/codec-planes-context-{dtype}.tpde");
        let description = format!(
            "planes-context (0x000D) of {n} {dtype} moment-like values, rows of 64 sharing a scale: the exponent plane is a context record in several lanes, the last word partial (§6.2.4); weights in the same codec, whose planes are order-0 lanes"
        );
        let file = g.valid(
            Spec::new(&path, "§6.2.4", &description)
                .encoder(Encoder::Codec(CodecTag::PlanesContext))
                .chunk_bytes(1 << 20)
                .tensor(T::new("exp_avg_sq", dtype, &[n as u64], moments(dtype, n, &mut rng)))
                .tensor(T::new("w", dtype, &[4096], weights(dtype, 4096, &mut rng))),
        );
        // The exponent plane (the last) must be a context record, or the file tests nothing new.
        let c = surgery::directory(&file).expect("a valid file").tensors[0].chunks[0].clone();
        let stored = &file[c.offset as usize..(c.offset + c.stored_length) as usize];
        let (records, _) = tpde_codec::planes::parse(c.codec, stored, 0, dtype.size() as usize, n).expect("valid");
        assert!(matches!(records.last(), Some(tpde_codec::planes::PlaneRecord::Contexts(..))), "{path}");
    }
}

/// `n` weights of `dtype` over many scales (each a normal value times 2^-k, k up to 9), and the
/// same weights each moved by a small step in value, so that a weight's step in its bit pattern
/// depends on its exponent. Returns (base, moved).
pub(crate) fn weights_and_steps(dtype: DType, n: usize, rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
    let base: Vec<f64> = (0..n).map(|_| rng.normal(0.05) * (2f64).powi(-((rng.unit() * 10.0) as i32))).collect();
    // Rounded to the dtype first, so the step is from the value stored.
    let stored = |v: f64| match dtype {
        DType::F32 => f64::from(v as f32),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => f16::from_f64(v).to_f64(),
    };
    let base: Vec<f64> = base.into_iter().map(stored).collect();
    let moved: Vec<f64> = base.iter().map(|&v| v + (rng.unit() - 0.5) * 2e-6).collect();
    (encode(dtype, &base), encode(dtype, &moved))
}

/// The base-context deltas of 1.4 (§6.4.1): a keyframe of weights over many scales, and both
/// tags against it, with every weight moved by a small step in value. Their float planes are
/// base-context records (the first chunk of each f32 and bf16 tensor is checked to be).
fn base_contexts(g: &mut Gen) {
    let mut rng = Rng::new(17);
    let tensors = [("w.f32", DType::F32, 20001), ("w.bf16", DType::BF16, 30003), ("w.f16", DType::F16, 5000)];
    let (mut base, mut moved) = (Vec::new(), Vec::new());
    for (name, dtype, n) in tensors {
        let (b, m) = weights_and_steps(dtype, n, &mut rng);
        base.push(T::new(name, dtype, &[n as u64], b));
        moved.push(T { delta: true, ..T::new(name, dtype, &[n as u64], m) });
    }
    let counts = encode(DType::I32, &(0..3000).map(|i| f64::from(i * 37 % 5000)).collect::<Vec<_>>());
    let counted = encode(DType::I32, &(0..3000).map(|i| f64::from(i * 37 % 5000 + i % 3)).collect::<Vec<_>>());
    base.push(T::new("counts", DType::I32, &[3000], counts));
    moved.push(T { delta: true, ..T::new("counts", DType::I32, &[3000], counted) });
    g.valid(
        Spec::new(CONTEXT_BASE, "§6.4.1", "the keyframe the base-context deltas decode against (planes-lanes): f32, bf16 and f16 weights over ten binades, an i32 counter")
            .encoder(Encoder::Codec(CodecTag::PlanesLanes))
            .chunk_bytes(1 << 20)
            .tensors(base),
    );
    for (path, tag) in
        [("valid/delta-xor-context.tpde", CodecTag::DeltaXorContext), (DELTA_SUB_CONTEXT, CodecTag::DeltaSubContext)]
    {
        let description = format!(
            "{tag} (0x{:04X}) of every weight moved by a small step in value: base-context records (mode 4) whose tables follow the base's exponent, in several lanes, the last word partial; an i32 counter in the same codec",
            tag.to_u16()
        );
        let file = g.valid(
            Spec::new(path, "§6.4.1", &description)
                .encoder(Encoder::Codec(tag))
                .chunk_bytes(1 << 20)
                .tensors(moved.clone())
                .base(CONTEXT_BASE),
        );
        let d = surgery::directory(&file).expect("a valid file");
        for t in d.tensors.iter().filter(|t| t.dtype == DType::F32 || t.dtype == DType::BF16) {
            let c = &t.chunks[0];
            let stored = &file[c.offset as usize..(c.offset + c.stored_length) as usize];
            let n = c.element_count as usize;
            let (records, _) =
                tpde_codec::planes::parse(c.codec, stored, 0, t.dtype.size() as usize, n).expect("valid");
            let coded = records.iter().any(|r| matches!(r, tpde_codec::planes::PlaneRecord::BaseContexts(..)));
            assert!(coded, "{path}: {} has no base-context record", t.name);
        }
    }
}

/// Points the spec's 1.4 revision made explicit (§2.1, §6 zstd), each tested by a file.
fn clarifications(g: &mut Gen) {
    // A delta whose tensors all use keyframe codecs, read with no base at all: each tensor
    // decodes without the base, so a reader returns them (§2.1, §6.3).
    let mut rng = Rng::new(41);
    let added = vec![
        T::new(
            "added.weight",
            DType::F32,
            &[16, 8],
            encode(DType::F32, &(0..128).map(|_| rng.normal(0.02)).collect::<Vec<_>>()),
        ),
        T::new("added.step", DType::I64, &[], 7i64.to_le_bytes().to_vec()),
    ];
    g.valid(
        Spec::new(
            "valid/delta-keyframe-chunks-only.tpde",
            "§2.1",
            "a delta (BASE flag, base reference) whose every chunk uses a keyframe codec, read with no base: its tensors decode without one",
        )
        .encoder(Encoder::Zstd { level: 3 })
        .tensors(added)
        .base(DELTA_BASE),
    );
    g.cases.last_mut().expect("just added").base = None;

    // A skippable frame (RFC 8878 §3.1.2) before the data frame of a zstd chunk decodes to
    // nothing (§6, zstd).
    let small = g.get(SMALL_ZSTD).bytes.clone();
    let d = surgery::directory(&small).expect("a valid file");
    let c = &d.tensors[0].chunks[0];
    let mut stored = vec![0x50, 0x2A, 0x4D, 0x18, 4, 0, 0, 0];
    stored.extend_from_slice(b"tpde");
    stored.extend_from_slice(&small[c.offset as usize..(c.offset + c.stored_length) as usize]);
    let skippable = surgery::with_chunk(&small, 0, 0, &stored).expect("surgery");
    g.valid_derived(
        "valid/codec-zstd-skippable-frame.tpde",
        "§6",
        "a zstd chunk whose data frame follows a skippable frame of 4 bytes: it decodes to nothing",
        SMALL_ZSTD,
        skippable,
    );
}

/// 1.5: a lossy delta with a relative bound (§6.6). Its weights span six orders of magnitude
/// (as a checkpoint's weights and Adam moments do), so one ρ drops the small relative changes
/// of every scale where an absolute τ would drop all of the small tensors' changes and none of
/// the large ones'.
fn relative_bound(g: &mut Gen) {
    let mut rng = Rng::new(15);
    let scales = [1.0, 1e-2, 1e-4, 1e-6];
    let values: Vec<f64> = (0..1024).map(|i| rng.normal(1.0) * scales[i % 4]).collect();
    let base = vec![T::new("w.scales", DType::F32, &[1024], encode(DType::F32, &values))];
    let rho = 1e-3;
    let bound = Bound { abs: 0.0, rel: rho };
    let next: Vec<f64> = values.iter().map(|v| v * (1.0 + rng.normal(2e-3))).collect();
    let mut lossy = T::new("w.scales", DType::F32, &[1024], encode(DType::F32, &next));
    lossy.data = tpde_write::lossy::snap_to_base(DType::F32, &lossy.data, &base[0].data, bound);
    lossy.delta = true;
    g.valid(
        Spec::new(
            "valid/delta-lossy-relative-base.tpde",
            "§7.3",
            "the keyframe of delta-lossy-relative: f32 weights at four scales from 1 to 1e-6",
        )
        .encoder(Encoder::Codec(CodecTag::Planes))
        .tensors(base),
    );
    g.valid(
        Spec::new(
            "valid/delta-lossy-relative.tpde",
            "§6.6",
            "lossy delta, relative bound (1.5): changes of at most 1e-3 of |x| dropped; tpde.max_rel_error records it",
        )
        .encoder(Encoder::AutoSerial)
        .minor(5)
        .meta(KEY_MAX_REL_ERROR, MetadataValue::F64(rho))
        .tensor(lossy)
        .base("valid/delta-lossy-relative-base.tpde"),
    );
}

/// The keyframe the predicted delta decodes against.
pub const PREDICTED_BASE: &str = "valid/delta-predicted-base.tpde";
/// 1.6's predicted delta (§6.8).
pub const PREDICTED: &str = "valid/delta-predicted.tpde";

/// One AdamW step of 3000 weights in binary32, as torch's single-tensor step takes it (lr 1e-3,
/// weight decay 0.01, betas 0.9 and 0.999, eps 1e-8, step count `t`), with special elements: a NaN
/// weight, an infinite one, a negative second moment, subnormal moments. The constants are
/// those §6.8's predictors get for it; the 1.6 file predicts the step forward, 1.9's backward.
pub struct AdamWStep {
    pub a: f32,
    pub b2: f32,
    pub c: f32,
    pub d: f32,
    pub r: f32,
    pub e: f32,
    pub h: f32,
    pub w0: Vec<f32>,
    pub m0: Vec<f32>,
    pub v0: Vec<f32>,
    pub m1: Vec<f32>,
    pub v1: Vec<f32>,
    pub w1: Vec<f32>,
}

pub fn adamw_step(rng: &mut Rng, t: i32) -> AdamWStep {
    let n = 3000;
    let (beta1, beta2, eps, lr, wd) = (0.9f64, 0.999f64, 1e-8f64, 1e-3f64, 0.01f64);
    let (a, b2, c) = ((1.0 - beta1) as f32, beta2 as f32, (1.0 - beta2) as f32);
    let (d, r, e, h) = (
        (1.0 - lr * wd) as f32,
        (1.0 - beta2.powi(t)).sqrt() as f32,
        eps as f32,
        (-(lr / (1.0 - beta1.powi(t)))) as f32,
    );
    let mut w0: Vec<f32> = (0..n).map(|_| rng.normal(0.05) as f32).collect();
    let mut m0: Vec<f32> = (0..n).map(|_| rng.normal(1e-3) as f32).collect();
    let mut v0: Vec<f32> = (0..n).map(|_| (rng.normal(1e-3) as f32).powi(2)).collect();
    let grad: Vec<f32> = (0..n).map(|_| rng.normal(1e-3) as f32).collect();
    (w0[5], w0[6], v0[7], m0[8], v0[8]) = (f32::NAN, f32::INFINITY, -1e-6, 1e-39, 1e-40);
    let m1: Vec<f32> = m0.iter().zip(&grad).map(|(&m, &g)| m + a * (g - m)).collect();
    let v1: Vec<f32> = v0.iter().zip(&grad).map(|(&v, &g)| v * b2 + (c * g) * g).collect();
    let w1: Vec<f32> = (0..n).map(|i| w0[i] * d + (h * m1[i]) / (v1[i].sqrt() / r + e)).collect();
    AdamWStep { a, b2, c, d, r, e, h, w0, m0, v0, m1, v1, w1 }
}

/// 1.6: one AdamW step of weights `w` and moments `m`, `v`, computed in binary32 as torch does,
/// stored as a delta whose `v` and `w` are predicted (§6.8). The weights' last chunk is noise
/// that no prediction fits, coded as a plain delta; special elements (a NaN weight, an infinite
/// one, a negative second moment, subnormal moments) test the canonical NaN and the subnormals.
fn predicted(g: &mut Gen) {
    let mut rng = Rng::new(16);
    let AdamWStep { a, b2, c, d, r, e, h, w0, m0, v0, m1, v1, mut w1 } = adamw_step(&mut rng, 7);
    for x in &mut w1[2048..] {
        *x = rng.normal(0.05) as f32;
    }
    let shape = [30, 100];
    g.valid(
        Spec::new(
            PREDICTED_BASE,
            "§6.8",
            "the keyframe of delta-predicted: AdamW's weights w and moments m, v before a step (f32, 30x100)",
        )
        .encoder(Encoder::Codec(CodecTag::PlanesLanes))
        .tensors([
            T::new("w", DType::F32, &shape, f32_bytes(&w0)),
            T::new("m", DType::F32, &shape, f32_bytes(&m0)),
            T::new("v", DType::F32, &shape, f32_bytes(&v0)),
        ]),
    );
    let v_pred =
        Prediction::AdamSecondMoment { one_minus_beta1: a, beta2: b2, one_minus_beta2: c, exp_avg: "m".into() };
    let w_pred = Prediction::AdamParameter {
        decay: d,
        bias2_sqrt: r,
        eps: e,
        neg_step: h,
        exp_avg: "m".into(),
        exp_avg_sq: "v".into(),
    };
    let file = g.valid(
        Spec::new(
            PREDICTED,
            "§6.8",
            "delta-predicted (0x0010, 1.6) after one AdamW step: w (listed first, read before the tensors it depends on) predicted from its base and this file's m and v (predictor 2), v from its base and m here and in the base (predictor 1); w's last chunk is a plain delta; a NaN, an infinity, a negative v and subnormals among the elements",
        )
        .encoder(Encoder::Auto)
        .minor(6)
        .chunk_bytes(4096)
        .tensors([
            T { delta: true, predict: Some(w_pred), ..T::new("w", DType::F32, &shape, f32_bytes(&w1)) },
            T { delta: true, ..T::new("m", DType::F32, &shape, f32_bytes(&m1)) },
            T { delta: true, predict: Some(v_pred), ..T::new("v", DType::F32, &shape, f32_bytes(&v1)) },
        ])
        .base(PREDICTED_BASE),
    );
    let d = surgery::directory(&file).expect("a valid file");
    let tags = |name: &str| {
        d.tensors.iter().find(|t| t.name == name).unwrap().chunks.iter().map(|c| c.codec).collect::<Vec<_>>()
    };
    assert_eq!(tags("w")[..2], [CodecTag::DeltaPredicted; 2], "w's first chunks are predicted");
    assert_ne!(tags("w")[2], CodecTag::DeltaPredicted, "w's noise is a plain delta");
    assert!(tags("v").iter().all(|&c| c == CodecTag::DeltaPredicted), "v is predicted");
}

/// The keyframe the predicted deltas of the 1.6 revision decode against.
pub const PREDICTED_EDGE_BASE: &str = "valid/delta-predicted-edge-base.tpde";
/// Predictions whose results depend on subnormal operands; its moment `sm` is a raw keyframe.
pub const PREDICTED_SUBNORMAL: &str = "valid/delta-predicted-subnormal.tpde";
/// A chain of 4 predicted tensors, the longest §6.8 allows; `c0` is a plain delta.
pub const PREDICTED_CHAIN: &str = "valid/delta-predicted-chain.tpde";
/// A predicted chunk with base-context records whose tables the prediction chooses.
pub const PREDICTED_CONTEXTS: &str = "valid/delta-predicted-contexts.tpde";

/// Constants of predictor 1 (a, β, c) used by the edge files.
pub const EDGE_MOMENT: (f32, f32, f32) = (0.1, 0.999, 0.001);

/// Predictor 1 (`adam-second-moment`) with [`EDGE_MOMENT`], reading `m`.
pub fn edge_moment(m: &str) -> Prediction {
    let (a, b, c) = EDGE_MOMENT;
    Prediction::AdamSecondMoment { one_minus_beta1: a, beta2: b, one_minus_beta2: c, exp_avg: m.into() }
}

/// The prediction `p` over whole tensors (little-endian f32 bytes), as a reader computes it.
pub fn prediction_of(p: &Prediction, base: &[u8], exp_avg: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; base.len()];
    tpde_codec::predicted::predict(p, tpde_codec::predicted::Inputs { base, exp_avg, other }, &mut out);
    out
}

fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The 1.6 revision's predicted files (issue 43): each catches a reader that a plausible bug
/// lets pass the files before it. Asserts check that each file holds what it tests.
fn predicted_edges(g: &mut Gen) {
    let mut rng = Rng::new(43);
    // Subnormals (§6.8: "subnormal operands and results as they are"): `sv` and `sw` are their
    // exact predictions, so the residuals are zero and every decoded byte is the prediction.
    // Elements 0-1: p = b × β of a subnormal base (a subnormal result); element 2: predictor 2
    // divides h × m of a subnormal m by ε, a normal result that is 0 under flush-to-zero;
    // element 3: a subnormal base weight.
    let n = 256;
    let normal = |rng: &mut Rng, sd: f64| (0..n).map(|_| rng.normal(sd) as f32).collect::<Vec<f32>>();
    let (mut sm0, mut sm1) = (normal(&mut rng, 1e-3), normal(&mut rng, 1e-3));
    let mut sv0: Vec<f32> = normal(&mut rng, 1e-4).iter().map(|x| x * x).collect();
    let mut sw0 = normal(&mut rng, 0.05);
    (sv0[0], sm0[0], sm1[0]) = (1e-40, 0.0, 0.0);
    (sv0[1], sm0[1], sm1[1]) = (2.5e-39, 1e-30, 1e-30);
    (sv0[2], sm0[2], sm1[2], sw0[2]) = (0.0, 0.0, 1e-39, 0.0);
    (sw0[3], sm1[3]) = (1e-41, 0.0);
    let sv_pred = edge_moment("sm");
    let (d, r, e, h) = (0.99999f32, 0.05f32, 1e-8f32, -1e-3f32);
    let sw_pred = Prediction::AdamParameter {
        decay: d,
        bias2_sqrt: r,
        eps: e,
        neg_step: h,
        exp_avg: "sm".into(),
        exp_avg_sq: "sv".into(),
    };
    let (sm0, sm1, sv0, sw0) = (f32_bytes(&sm0), f32_bytes(&sm1), f32_bytes(&sv0), f32_bytes(&sw0));
    let sv1 = prediction_of(&sv_pred, &sv0, &sm1, &sm0);
    let sw1 = prediction_of(&sw_pred, &sw0, &sm1, &sv1);
    let word = |b: &[u8], i: usize| f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap());
    assert!(word(&sv1, 0).is_subnormal() && word(&sv1, 1).is_subnormal(), "subnormal second moments");
    assert!(word(&sw1, 2).is_normal() && word(&sw1, 3).is_subnormal(), "a normal weight from a subnormal m");

    // A chain c1 → c2 → c3 → c4 → cm of 4 predicted tensors (cm plain), each its exact
    // prediction; c0 is a plain delta whose bytes are its prediction from c1 (the invalid
    // chain of 5 names c1 in its params).
    let cm0 = f32_bytes(&normal(&mut rng, 1e-3));
    let cm1 = f32_bytes(&normal(&mut rng, 1e-3));
    let c_base: Vec<Vec<u8>> =
        (0..5).map(|_| f32_bytes(&normal(&mut rng, 1e-3).iter().map(|x| x * x).collect::<Vec<_>>())).collect();
    let mut c_file = vec![Vec::new(); 5];
    let (mut m1, mut m0) = (cm1.clone(), cm0.clone());
    for i in (0..5).rev() {
        c_file[i] = prediction_of(&edge_moment("-"), &c_base[i], &m1, &m0);
        (m1, m0) = (c_file[i].clone(), c_base[i].clone());
    }

    // Base contexts from the prediction (§6.2, §6.8): in each row of 64 elements of x the first
    // moment has one scale (2^0, 2^-3 or 2^-6), so x's prediction p ≈ c × g² has about one
    // exponent per row, unrelated to its base's (tiny values in other binades). x is p moved by
    // a number of units in the last place whose high bytes grow as p's scale falls, so the residual's
    // planes follow p's exponent (mode 4 records, which this file holds) and their neighbours
    // (mode 3 records, which invalid/r25-predicted-context-mode holds).
    let nx = 16384;
    let xb: Vec<f32> =
        (0..nx).map(|_| (rng.normal(1.0) * 2f64.powi(-60 - (rng.unit() * 20.0) as i32)) as f32).collect();
    let (mut xm1, mut steps) = (vec![0f32; nx], vec![0i32; nx]);
    for (row, step) in xm1.chunks_mut(64).zip(steps.chunks_mut(64)) {
        let j = 3 * (rng.unit() * 3.0) as i32;
        for (x, s) in row.iter_mut().zip(step) {
            *x = EDGE_MOMENT.0 * (1e-3 * 2f64.powi(-j) * (1.0 + 0.1 * rng.normal(1.0))) as f32;
            // A random low byte, so the residual's lowest plane is stored (mode 0).
            *s = ((rng.normal(1.0) * 2f64.powi(2 * j)).round() as i32) * 256 + (rng.next() % 256) as i32;
        }
    }
    let (xb, xm1, xm0) = (f32_bytes(&xb), f32_bytes(&xm1), vec![0u8; 4 * nx]);
    let p = prediction_of(&edge_moment("xm"), &xb, &xm1, &xm0);
    let x1: Vec<f32> = p
        .chunks_exact(4)
        .zip(&steps)
        .map(|(w, &s)| f32::from_bits(u32::from_le_bytes(w.try_into().unwrap()).wrapping_add_signed(s)))
        .collect();

    let shape = [n as u64];
    let f32t = |name: &str, data: &[u8], shape: &[u64]| T::new(name, DType::F32, shape, data.to_vec());
    let mut base = vec![
        f32t("sm", &sm0, &shape),
        f32t("sv", &sv0, &shape),
        f32t("sw", &sw0, &shape),
        // sv's bytes as i32, for a predicted tensor that is not f32 (invalid/r30-predicted-tensor-dtype).
        T::new("sv.bits", DType::I32, &shape, sv0.clone()),
        f32t("cm", &cm0, &shape),
    ];
    base.extend((0..5).map(|i| f32t(&format!("c{i}"), &c_base[i], &shape)));
    base.extend([f32t("x", &xb, &[nx as u64]), f32t("xm", &xm0, &[nx as u64])]);
    g.valid(
        Spec::new(PREDICTED_EDGE_BASE, "§6.8", "the keyframe of the predicted files of the 1.6 revision (subnormal, chain, contexts): f32 moments and weights, an i32 copy of one")
            .encoder(Encoder::Codec(CodecTag::PlanesLanes))
            .tensors(base),
    );
    let predicted = |t: T, p: Prediction| T { delta: true, predict: Some(p), ..t };
    let plain = |t: T| T { delta: true, ..t };
    let tags = |file: &[u8], name: &str| {
        let d = surgery::directory(file).expect("a valid file");
        d.tensors.iter().find(|t| t.name == name).unwrap().chunks.iter().map(|c| c.codec).collect::<Vec<_>>()
    };

    let file = g.valid(
        Spec::new(PREDICTED_SUBNORMAL, "§6.8", "predictions whose results depend on subnormal operands (a subnormal base second moment or weight, a subnormal first moment divided by eps into a normal weight): a reader that flushes subnormals decodes other bytes; the moment sm is a raw keyframe")
            .encoder(Encoder::Auto)
            .minor(6)
            .tensors([
                f32t("sm", &sm1, &shape).with(Encoder::Raw),
                predicted(f32t("sv", &sv1, &shape), sv_pred),
                predicted(f32t("sw", &sw1, &shape), sw_pred),
            ])
            .base(PREDICTED_EDGE_BASE),
    );
    assert_eq!(tags(&file, "sv"), [CodecTag::DeltaPredicted], "sv is predicted");
    assert_eq!(tags(&file, "sw"), [CodecTag::DeltaPredicted], "sw is predicted");

    let mut chain = vec![plain(f32t("cm", &cm1, &shape)), plain(f32t("c0", &c_file[0], &shape))];
    let names = ["c1", "c2", "c3", "c4", "cm"];
    chain.extend((1..5).map(|i| predicted(f32t(names[i - 1], &c_file[i], &shape), edge_moment(names[i]))));
    let file = g.valid(
        Spec::new(PREDICTED_CHAIN, "§6.8", "a chain of 4 predicted tensors, the longest allowed: c1 reads c2, c2 c3, c3 c4, c4 the plain delta cm (predictor 1)")
            .encoder(Encoder::Auto)
            .minor(6)
            .tensors(chain)
            .base(PREDICTED_EDGE_BASE),
    );
    for name in &names[..4] {
        assert_eq!(tags(&file, name), [CodecTag::DeltaPredicted], "{name} is predicted");
    }
    assert_ne!(tags(&file, "c0"), [CodecTag::DeltaPredicted], "c0 is a plain delta");

    let file = g.valid(
        Spec::new(PREDICTED_CONTEXTS, "§6.2, §6.8", "a predicted chunk with base-context records (mode 4) whose tables follow its prediction's exponents, which differ from its base's, and stored planes (mode 0)")
            .encoder(Encoder::Auto)
            .minor(6)
            .chunk_bytes(1 << 20)
            .tensors([
                predicted(f32t("x", &f32_bytes(&x1), &[nx as u64]), edge_moment("xm")),
                plain(f32t("xm", &xm1, &[nx as u64])),
            ])
            .base(PREDICTED_EDGE_BASE),
    );
    assert_eq!(tags(&file, "x"), [CodecTag::DeltaPredicted], "x is predicted");
    let c = surgery::directory(&file).unwrap().tensors[0].chunks[0].clone();
    let stored = &file[c.offset as usize..(c.offset + c.stored_length) as usize];
    let (records, _) = tpde_codec::planes::parse(c.codec, stored, 0, 4, nx).expect("valid");
    use tpde_codec::planes::PlaneRecord::{BaseContexts, Stored};
    assert!(records.iter().any(|r| matches!(r, BaseContexts(..))), "x has a base-context record: {records:?}");
    assert!(records.iter().any(|r| matches!(r, Stored(..))), "x has a stored plane: {records:?}");
}

/// 1.7's model folder file (§5.5): the files beside the weights, libzstd's frame at level 19.
pub const FILES: &str = "valid/files-model-folder.tpde";

/// The files of a model folder, as the corpus carries them: nested, empty, hidden, non-ASCII.
pub fn folder_files() -> Vec<FileEntry> {
    let file = |path: &str, data: &[u8]| FileEntry { path: path.into(), data: data.to_vec() };
    let vocab: String = (0..400).map(|i| format!("tok{i}\n")).collect();
    vec![
        file(".gitattributes", b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"),
        file("1_Pooling/config.json", b"{\"word_embedding_dimension\": 8, \"pooling_mode_mean_tokens\": true}\n"),
        file("config.json", b"{\"architectures\": [\"BertModel\"], \"hidden_size\": 8}\n"),
        file("docs/r\u{e9}sum\u{e9} \u{6a21}\u{578b}.md", "# r\u{e9}sum\u{e9}\n".as_bytes()),
        file("empty.txt", b""),
        file("vocab.txt", vocab.as_bytes()),
    ]
}

/// A file table's bytes (spec §5.5): the count, then each path and file; `count` may lie.
pub fn table_bytes(count: u32, entries: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut out = count.to_le_bytes().to_vec();
    for (path, data) in entries {
        out.extend((path.len() as u16).to_le_bytes());
        out.extend_from_slice(path);
        out.extend((data.len() as u64).to_le_bytes());
        out.extend_from_slice(data);
    }
    out
}

/// A Zstandard frame (RFC 8878) of raw blocks, written by hand so that its bytes depend on no
/// library: single segment, a 4-byte content size of `declared`.
pub fn raw_frame(declared: u32, content: &[u8]) -> Vec<u8> {
    let mut out = vec![0x28, 0xB5, 0x2F, 0xFD, 0xA0];
    out.extend(declared.to_le_bytes());
    raw_blocks(&mut out, content);
    out
}

/// `content` as raw blocks of at most 1 KiB, the last one flagged.
pub fn raw_blocks(out: &mut Vec<u8>, content: &[u8]) {
    let blocks: Vec<&[u8]> = if content.is_empty() { vec![&[][..]] } else { content.chunks(1024).collect() };
    for (i, b) in blocks.iter().enumerate() {
        let last = u32::from(i + 1 == blocks.len());
        out.extend_from_slice(&((b.len() as u32) << 3 | last).to_le_bytes()[..3]);
        out.extend_from_slice(b);
    }
}

fn files(g: &mut Gen) {
    let small = || T::new("w", DType::F32, &[2], encode(DType::F32, &[1.0, -2.0]));
    let files = folder_files();
    let frame = tpde_write::files_frame(&files).expect("a valid table");
    g.valid(
        Spec::new(
            FILES,
            "§5.5",
            "1.7: a model folder's files beside its weights (nested, empty, hidden, non-ASCII paths) in tpde.files, compressed by libzstd",
        )
        .files(files.clone(), frame)
        .tensor(small()),
    );
    // Raw blocks, a window descriptor (not single segment) and a 2-byte content size (+256).
    let entries: Vec<(&[u8], &[u8])> = files.iter().map(|f| (f.path.as_bytes(), &f.data[..])).collect();
    let table = table_bytes(entries.len() as u32, &entries);
    let mut frame = vec![0x28, 0xB5, 0x2F, 0xFD, 0x40, 0x00];
    frame.extend(((table.len() - 256) as u16).to_le_bytes());
    raw_blocks(&mut frame, &table);
    g.valid(
        Spec::new(
            "valid/files-raw-blocks.tpde",
            "§5.5",
            "the same files in a frame of raw blocks with a 1 KiB window and a 2-byte content size",
        )
        .files(files, frame)
        .tensor(small()),
    );
    g.valid(
        Spec::new("valid/files-none.tpde", "§5.5", "a file table of no files")
            .files(Vec::new(), raw_frame(4, &table_bytes(0, &[])))
            .tensor(small()),
    );
    // A Dictionary_ID field that is there and 0 names no dictionary (§5.5).
    let one: Vec<FileEntry> = vec![FileEntry { path: "config.json".into(), data: b"{}".to_vec() }];
    let table = table_bytes(1, &[(b"config.json", b"{}")]);
    let mut frame = vec![0x28, 0xB5, 0x2F, 0xFD, 0xA1, 0x00];
    frame.extend((table.len() as u32).to_le_bytes());
    raw_blocks(&mut frame, &table);
    g.valid(
        Spec::new(
            "valid/files-dictionary-id-zero.tpde",
            "§5.5",
            "a frame with a 1-byte Dictionary_ID field of 0: no dictionary",
        )
        .files(one.clone(), frame)
        .tensor(small()),
    );
    g.valid(
        Spec::new("valid/files-checksum.tpde", "§5.5", "a frame with a content checksum (libzstd), which matches")
            .files(one.clone(), checksummed_frame(&table))
            .tensor(small()),
    );
    // Single segment with a 1-byte content size (Frame_Content_Size_Flag 0).
    let mut frame = vec![0x28, 0xB5, 0x2F, 0xFD, 0x20, table.len() as u8];
    raw_blocks(&mut frame, &table);
    g.valid(
        Spec::new("valid/files-content-size-1-byte.tpde", "§5.5", "a single-segment frame with a 1-byte content size")
            .files(one.clone(), frame)
            .tensor(small()),
    );
    // A window's mantissa read as RFC 8878 gives it: exponent 15 and mantissa 1 is 32 + 4 MiB.
    let mut frame = vec![0x28, 0xB5, 0x2F, 0xFD, 0x80, (15 << 3) | 1];
    frame.extend((table.len() as u32).to_le_bytes());
    raw_blocks(&mut frame, &table);
    g.valid(
        Spec::new(
            "valid/files-window-mantissa.tpde",
            "§5.5",
            "a frame whose window is 36 MiB: exponent 15, mantissa 1",
        )
        .files(one.clone(), frame)
        .tensor(small()),
    );
    // Each limit at its edge: a 64 MiB window (exponent 16, mantissa 0), a path of 1024 bytes,
    // a component of 255.
    let (path, component) = (long_path(1024), "b".repeat(255));
    let edge = vec![
        FileEntry { path: path.clone(), data: b"{}".to_vec() },
        FileEntry { path: component.clone(), data: b"[]".to_vec() },
    ];
    let table = table_bytes(2, &[(path.as_bytes(), b"{}"), (component.as_bytes(), b"[]")]);
    let mut frame = vec![0x28, 0xB5, 0x2F, 0xFD, 0x80, 16 << 3];
    frame.extend((table.len() as u32).to_le_bytes());
    raw_blocks(&mut frame, &table);
    g.valid(
        Spec::new(
            "valid/files-at-limits.tpde",
            "§5.5",
            "limits at their edge: a 64 MiB window, a path of 1024 bytes, a path component of 255",
        )
        .files(edge, frame)
        .tensor(small()),
    );
    files_at_count_limit(g);
    // The weights rule's edges (§5.5): on the last component only, ASCII letters folded only,
    // a suffix only where the component ends in it.
    let edges: Vec<FileEntry> = ["model.c\u{212a}pt", "notes.bin.txt", "vocab.index.json", "x.bin/config.json"]
        .into_iter()
        .map(|p| FileEntry { path: p.into(), data: b"{}".to_vec() })
        .collect();
    for f in &edges {
        assert!(crate::isolation::broken_path_conditions(f.path.as_bytes()).is_empty(), "{}", f.path);
    }
    let entries: Vec<(&[u8], &[u8])> = edges.iter().map(|f| (f.path.as_bytes(), &f.data[..])).collect();
    let table = table_bytes(entries.len() as u32, &entries);
    g.valid(
        Spec::new(
            "valid/files-weights-rule-edges.tpde",
            "§5.5",
            "paths the weights rule allows: a folder x.bin/, a KELVIN SIGN (U+212A) for the k of .ckpt, .bin not last, .index.json after no weights suffix",
        )
        .files(edges, raw_frame(table.len() as u32, &table))
        .tensor(small()),
    );
}

/// The file count's limit at its edge: 4096 empty files, `f0000` … `f4095`.
fn files_at_count_limit(g: &mut Gen) {
    let paths: Vec<String> = (0..4096).map(|i| format!("f{i:04}")).collect();
    let entries: Vec<(&[u8], &[u8])> = paths.iter().map(|p| (p.as_bytes(), &b""[..])).collect();
    let table = table_bytes(4096, &entries);
    let files = paths.iter().map(|p| FileEntry { path: p.clone(), data: Vec::new() }).collect();
    g.valid(
        Spec::new("valid/files-count-at-limit.tpde", "§5.5", "a file table of 4096 files, the count's limit")
            .files(files, raw_frame(table.len() as u32, &table))
            .tensor(T::new("w", DType::F32, &[2], encode(DType::F32, &[1.0, -2.0]))),
    );
}

/// A path of `len` bytes in components of at most 255 (`aaa…/aaa…/…`), for the path limit alone.
pub fn long_path(len: usize) -> String {
    let parts = (len + 1).div_ceil(256);
    let letters = len - (parts - 1);
    let sizes = (0..parts).map(|i| letters / parts + usize::from(i < letters % parts));
    let path = sizes.map(|n| "a".repeat(n)).collect::<Vec<_>>().join("/");
    assert!(path.len() == len && path.split('/').all(|c| !c.is_empty() && c.len() <= 255), "{len}");
    path
}

/// `content` compressed by libzstd into one frame with its content size and a content checksum.
pub fn checksummed_frame(content: &[u8]) -> Vec<u8> {
    let mut c = zstd::bulk::Compressor::new(3).expect("a compressor");
    c.include_checksum(true).expect("checksum flag");
    c.include_contentsize(true).expect("content size flag");
    let frame = c.compress(content).expect("compresses");
    assert_ne!(frame[4] & 0x04, 0, "the frame has a checksum");
    frame
}

/// The keyframe of 1.8's sparse-plane delta.
pub const SPARSE_PLANES_BASE: &str = "valid/delta-sparse-planes-base.tpde";
/// 1.8's sparse plane records (§6.2.5).
pub const SPARSE_PLANES: &str = "valid/delta-sparse-planes.tpde";

/// 1.8: dense deltas whose top plane (sign and exponent) is a sparse record, as `auto` writes
/// it in a file that declares 1.8: unchanged (a constant plane, no position listed), changed at
/// random elements (Golomb-Rice positions) and at every 63rd (packed positions), each checked
/// to be coded so.
fn sparse_planes(g: &mut Gen) {
    let mut rng = Rng::new(18);
    let n = 4096;
    let weights: Vec<f64> = (0..n).map(|_| rng.normal(0.05)).collect();
    // Weights of one exponent (in [0.5, 1)): when they double, the top plane changes by one
    // byte value, which the sparse record's values code in a lane record.
    let m = 16384;
    let halves: Vec<f64> = (0..m).map(|_| 0.5 + 0.49 * rng.unit()).collect();
    let base = vec![
        T::new("a.low-bits", DType::F32, &[n as u64], encode(DType::F32, &weights)),
        T::new("b.random", DType::F32, &[n as u64], encode(DType::F32, &weights)),
        T::new("c.strided", DType::F32, &[m as u64], encode(DType::F32, &halves)),
    ];
    g.valid(
        Spec::new(
            SPARSE_PLANES_BASE,
            "§7.3",
            "the keyframe of delta-sparse-planes: f32 weights, twice 4096 of N(0, 0.05²) and 16384 in [0.5, 1)",
        )
        .encoder(Encoder::Codec(CodecTag::Planes))
        .tensors(base.clone()),
    );
    // Every element moves in its low mantissa bits; some also double (the exponent moves).
    let step = |from: &[f64], doubled: &dyn Fn(usize) -> bool, rng: &mut Rng| -> Vec<u8> {
        let values: Vec<f32> = from
            .iter()
            .enumerate()
            .map(|(i, &w)| {
                let w = w as f32;
                let nudged = f32::from_bits(w.to_bits() ^ (1 + (rng.next() % 255) as u32));
                if doubled(i) {
                    nudged * 2.0
                } else {
                    nudged
                }
            })
            .collect();
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    };
    let picked: Vec<bool> = (0..n).map(|_| rng.unit() < 0.012).collect();
    let tensors = vec![
        step(&weights, &|_| false, &mut rng),
        step(&weights, &|i| picked[i], &mut rng),
        step(&halves, &|i| i % 63 == 17, &mut rng),
    ];
    let delta: Vec<T> = base
        .iter()
        .zip(tensors)
        .map(|(b, data)| T { delta: true, ..T::new(&b.name, DType::F32, &b.shape, data) })
        .collect();
    let bytes = g.valid(
        Spec::new(
            SPARSE_PLANES,
            "§6.2.5",
            "1.8 sparse plane records: the top plane of a dense delta chunk constant (no position listed), with 1.2% of the exponents changed at random (Golomb-Rice positions, stored bytes), with every 63rd changed (packed positions, a lane record of the bytes)",
        )
        .encoder(Encoder::Auto)
        .minor(8)
        .tensors(delta)
        .base(SPARSE_PLANES_BASE),
    );
    // The generator's promise: each tensor's top plane is the sparse record its name says.
    let dir = tpde_format::surgery::directory(&bytes).expect("a valid file");
    for (t, (count, coder)) in dir.tensors.iter().zip([(Some(0), None), (None, Some(0u8)), (None, Some(1u8))]) {
        let c = &t.chunks[0];
        let stored = &bytes[c.offset as usize..(c.offset + c.stored_length) as usize];
        let (records, _) = tpde_codec::planes::parse(c.codec, stored, 0, 4, c.element_count as usize).expect("valid");
        let tpde_codec::planes::PlaneRecord::Sparse(s) = &records[3] else {
            panic!("{}: its top plane is {:?}, not a sparse record", t.name, records[3]);
        };
        assert!(count.is_none_or(|m| s.count == m), "{}: {} positions", t.name, s.count);
        let coder_byte = stored[s.positions.start - 5];
        assert!(coder.is_none_or(|k| coder_byte == k), "{}: coder {coder_byte}", t.name);
    }
    sparse_planes_sub(g);
}

/// A sparse record whose fill is not zero, under `delta-sub-context` (1.8 let mode 0x05 under
/// 0x000E and 0x000F; its files held it only under 0x000E, always with fill 0): almost every
/// element one unit below its base (zigzag 1: plane 0 is almost all 0x01), every 256th unchanged
/// (a listed 0x00, which only a fill of 0 would forbid).
fn sparse_planes_sub(g: &mut Gen) {
    let base = g.get(SPARSE_PLANES_BASE).tensors.iter().find(|t| t.name == "b.random").expect("base").clone();
    let data: Vec<u8> = base
        .data
        .chunks_exact(4)
        .enumerate()
        .flat_map(|(i, b)| {
            let bits = u32::from_le_bytes(b.try_into().unwrap());
            (if i % 256 == 5 { bits } else { bits.wrapping_sub(1) }).to_le_bytes()
        })
        .collect();
    let path = "valid/delta-sparse-planes-sub.tpde";
    let bytes = g.valid(
        Spec::new(
            path,
            "§6.2.5",
            "a sparse record of fill 0x01 under delta-sub-context (0x000F): every element one unit below its base but every 256th, unchanged (listed 0x00)",
        )
        .encoder(Encoder::Auto)
        .minor(8)
        .tensor(T { delta: true, ..T::new("b.random", DType::F32, &base.shape, data) })
        .base(SPARSE_PLANES_BASE),
    );
    let dir = tpde_format::surgery::directory(&bytes).expect("a valid file");
    let c = &dir.tensors[0].chunks[0];
    assert_eq!(c.codec, CodecTag::DeltaSubContext);
    let stored = &bytes[c.offset as usize..(c.offset + c.stored_length) as usize];
    let (records, _) = tpde_codec::planes::parse(c.codec, stored, 0, 4, c.element_count as usize).expect("valid");
    let tpde_codec::planes::PlaneRecord::Sparse(s) = &records[0] else {
        panic!("plane 0 is {:?}, not a sparse record", records[0]);
    };
    assert_eq!((s.fill, s.count), (1, 16), "fill 0x01, the unchanged elements listed");
}
