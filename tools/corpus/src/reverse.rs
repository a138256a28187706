//! 1.9's reverse predictions (spec §6.8, predictors 3 and 4): a file whose base is the
//! checkpoint one optimizer step *after* it, its second moment and weights predicted back.

use tpde_codec::Encoder;
use tpde_format::{surgery, CodecTag, DType, ErrorKind, Operand, Prediction};

use crate::invalid::{bad_delta, edit_dir};
use crate::valid::{adamw_step, prediction_of, AdamWStep};
use crate::{Gen, Rng, Spec, T};

/// The keyframe after the step: what the reverse delta decodes against.
pub const REVERSE_BASE: &str = "valid/delta-predicted-reverse-base.tpde";
/// The checkpoint before the step, as a reverse delta with predictors 3 and 4.
pub const REVERSE: &str = "valid/delta-predicted-reverse.tpde";
/// The base of [`REVERSE_EXACT`]: it also holds moments `bm`, `bv` that only predictor 4 reads.
pub const REVERSE_EXACT_BASE: &str = "valid/delta-predicted-reverse-exact-base.tpde";
/// Elements that are their predictions exactly, from subnormal operands.
pub const REVERSE_EXACT: &str = "valid/delta-predicted-reverse-exact.tpde";

fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn word(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes"))
}

pub fn valid(g: &mut Gen) {
    realistic(g);
    exact(g);
    graph(g);
}

/// Chain 5 of §6.8: c1 → c2 → c3 → c4 (predictor 1, as `delta-predicted-chain`) → cm, with
/// cm predicted by predictor 4, which reads the base only (exp_avg c0, exp_avg_sq sv).
const CHAIN_P4: &str = "valid/delta-predicted-reverse-chain-p4.tpde";

/// Predictor 4 names nothing of its own file: a prediction graph with its names as edges
/// would count one more predicted tensor on a path (R30's bound), or close a loop. Each
/// predicted tensor is its prediction exactly, so that `auto` codes it predicted.
fn graph(g: &mut Gen) {
    let base = g.get(crate::valid::PREDICTED_EDGE_BASE).tensors.clone();
    let of = |ts: &[T], name: &str| ts.iter().find(|t| t.name == name).expect("a tensor").data.clone();
    // Adds `name`, predicted by `p` from the tensors before it and the base, to `file`.
    let add = |file: &mut Vec<T>, name: &str, p: Prediction| {
        let operand = |(n, at): (&str, Operand)| match at {
            Operand::File => of(file, n),
            Operand::Base => of(&base, n),
        };
        let [first, second] = p.operands();
        let data = prediction_of(&p, &of(&base, name), &operand(first), &operand(second));
        file.push(T { delta: true, predict: Some(p), ..T::new(name, DType::F32, &[256], data) });
    };
    let p4 = |exp_avg: &str, exp_avg_sq: &str| Prediction::AdamParameterReverse {
        decay: 0.99999,
        bias2_sqrt: 0.05,
        eps: 1e-8,
        neg_step: -1e-3,
        exp_avg: exp_avg.into(),
        exp_avg_sq: exp_avg_sq.into(),
    };
    let mut tensors = Vec::new();
    add(&mut tensors, "cm", p4("c0", "sv"));
    for (name, reads) in [("c4", "cm"), ("c3", "c4"), ("c2", "c3"), ("c1", "c2")] {
        add(&mut tensors, name, crate::valid::edge_moment(reads));
    }
    let file = g.valid(
        Spec::new(
            CHAIN_P4,
            "§6.8",
            "5 predicted tensors on one path, c1 → c2 → c3 → c4 (predictor 1) → cm, where cm's predictor 4 reads the base only: R30 counts 4 (a tensor predicted only by predictor 4 ends a path)",
        )
        .encoder(Encoder::Auto)
        .minor(9)
        .tensors(tensors)
        .base(crate::valid::PREDICTED_EDGE_BASE),
    );
    let predicted = |file: &[u8]| {
        let d = surgery::directory(file).expect("a valid file");
        d.tensors.iter().filter(|t| t.chunks.iter().all(|c| c.codec == CodecTag::DeltaPredicted)).count()
    };
    assert_eq!(predicted(&file), 5, "c1 to c4 and cm are predicted");
    // c1 (predictor 3) reads c2 of this file; c2's predictor 4 names c1, which would close a
    // loop if it were an edge.
    let p3 = |m: &str| Prediction::AdamSecondMomentReverse {
        one_minus_beta1: 0.1,
        beta2: 0.999,
        one_minus_beta2: 0.001,
        exp_avg: m.into(),
    };
    let mut tensors = Vec::new();
    add(&mut tensors, "c2", p4("c1", "sv"));
    add(&mut tensors, "c1", p3("c2"));
    let file = g.valid(
        Spec::new(
            "valid/delta-predicted-reverse-p4-no-loop.tpde",
            "§6.8",
            "c1 predicted by predictor 3 from c2 of this file, c2 by predictor 4 naming c1 (read from the base): no loop, since predictor 4's names are not edges",
        )
        .encoder(Encoder::Auto)
        .minor(9)
        .tensors(tensors)
        .base(crate::valid::PREDICTED_EDGE_BASE),
    );
    assert_eq!(predicted(&file), 2, "c1 and c2 are predicted");
}

/// One AdamW step in binary32 as torch takes it (the 1.6 file's step), stored backwards: the
/// base holds the state after it, the file the state before, its weights and second moment
/// predicted back. Special elements as in the 1.6 file: a NaN weight, an infinite one, a
/// negative second moment, subnormal moments; the weights' last chunk is noise that no
/// prediction fits.
fn realistic(g: &mut Gen) {
    let mut rng = Rng::new(54);
    let AdamWStep { a, b2, c, d, r, e, h, mut w0, m0, v0, m1, v1, w1 } = adamw_step(&mut rng, 8);
    for x in &mut w0[2048..] {
        *x = rng.normal(0.05) as f32;
    }
    let shape = [30, 100];
    g.valid(
        Spec::new(
            REVERSE_BASE,
            "§6.8",
            "the base of delta-predicted-reverse: AdamW's weights w and moments m, v after a step (f32, 30x100)",
        )
        .encoder(Encoder::Codec(CodecTag::PlanesLanes))
        .tensors([
            T::new("w", DType::F32, &shape, f32_bytes(&w1)),
            T::new("m", DType::F32, &shape, f32_bytes(&m1)),
            T::new("v", DType::F32, &shape, f32_bytes(&v1)),
        ]),
    );
    let v_pred =
        Prediction::AdamSecondMomentReverse { one_minus_beta1: a, beta2: b2, one_minus_beta2: c, exp_avg: "m".into() };
    let w_pred = Prediction::AdamParameterReverse {
        decay: d,
        bias2_sqrt: r,
        eps: e,
        neg_step: h,
        exp_avg: "m".into(),
        exp_avg_sq: "v".into(),
    };
    let file = g.valid(
        Spec::new(
            REVERSE,
            "§6.8",
            "reverse predictions (1.9) of the state one AdamW step before its base: w predicted back from its base and the base's m and v (predictor 4), v from its base, m here and m in the base (predictor 3), m a plain delta; w's last chunk is a plain delta; a NaN, an infinity, a negative v and subnormals among the elements",
        )
        .encoder(Encoder::Auto)
        .minor(9)
        .chunk_bytes(4096)
        .tensors([
            T { delta: true, predict: Some(w_pred), ..T::new("w", DType::F32, &shape, f32_bytes(&w0)) },
            T { delta: true, ..T::new("m", DType::F32, &shape, f32_bytes(&m0)) },
            T { delta: true, predict: Some(v_pred), ..T::new("v", DType::F32, &shape, f32_bytes(&v0)) },
        ])
        .base(REVERSE_BASE),
    );
    let dir = surgery::directory(&file).expect("a valid file");
    let tags = |name: &str| {
        dir.tensors.iter().find(|t| t.name == name).unwrap().chunks.iter().map(|c| c.codec).collect::<Vec<_>>()
    };
    assert_eq!(tags("w")[..2], [CodecTag::DeltaPredicted; 2], "w's first chunks are predicted");
    assert_ne!(tags("w")[2], CodecTag::DeltaPredicted, "w's noise is a plain delta");
    assert!(tags("v").iter().all(|&c| c == CodecTag::DeltaPredicted), "v is predicted");
    // 1.9 lets a predicted chunk hold sparse plane records (§6.2): the residual's top planes.
    let w = dir.tensors.iter().find(|t| t.name == "w").unwrap();
    let sparse = w.chunks.iter().filter(|c| c.codec == CodecTag::DeltaPredicted).any(|c| {
        let stored = &file[c.offset as usize..(c.offset + c.stored_length) as usize];
        let (records, _) = tpde_codec::planes::parse(c.codec, stored, 0, 4, c.element_count as usize).expect("records");
        records.iter().any(|r| matches!(r, tpde_codec::planes::PlaneRecord::Sparse(_)))
    });
    assert!(sparse, "a predicted chunk of w holds a sparse plane record");
    // The same file declaring 1.8, below the 1.9 that defines predictors 3 and 4: a reader
    // judges each by itself, never by the declared version (§11).
    g.valid_derived(
        "valid/delta-predicted-reverse-declared-1-8.tpde",
        "§11",
        "delta-predicted-reverse declaring version 1.8: predictors 3 and 4 (1.9) and a lower declared version, which a reader must not reject",
        REVERSE,
        surgery::with_header(&file, |h| h.minor_version = 8).expect("surgery"),
    );
}

/// Elements that are their reverse predictions exactly (zero residuals), so that every decoded
/// byte is the prediction: results that a reader flushing subnormals, fusing a multiply-add or
/// reading predictor 4's moments from the file rather than the base gets wrong. Predictor 4
/// names `bm` and `bv`, which only the base holds.
fn exact(g: &mut Gen) {
    let mut rng = Rng::new(55);
    let n = 256;
    let normal = |rng: &mut Rng, sd: f64| (0..n).map(|_| rng.normal(sd) as f32).collect::<Vec<f32>>();
    let (mut m, mut m1) = (normal(&mut rng, 1e-3), normal(&mut rng, 1e-3));
    let mut v1: Vec<f32> = normal(&mut rng, 1e-4).iter().map(|x| x * x + 1e-9).collect();
    let (mut w1, mut bm) = (normal(&mut rng, 0.05), normal(&mut rng, 1e-3));
    let mut bv: Vec<f32> = normal(&mut rng, 1e-4).iter().map(|x| x * x).collect();
    // Predictor 3. Element 0: g = 0, p = b / β of a subnormal b; element 1: b − c·g² subnormal.
    (v1[0], m[0], m1[0]) = (1e-40, 0.0, 0.0);
    (v1[1], m[1], m1[1]) = (1e-38, 2e-21, 2e-21);
    // Predictor 4. Element 2: h·m' of a subnormal m' over ε, a normal result that is 0 under
    // flush-to-zero; element 3: a subnormal base weight; element 4: √ of a negative v', a NaN.
    (w1[2], bm[2], bv[2]) = (0.0, 1e-39, 0.0);
    (w1[3], bm[3]) = (1e-41, 0.0);
    bv[4] = -1e-6;
    let v_pred = Prediction::AdamSecondMomentReverse {
        one_minus_beta1: 0.1,
        beta2: 0.999,
        one_minus_beta2: 0.001,
        exp_avg: "m".into(),
    };
    let w_pred = Prediction::AdamParameterReverse {
        decay: 0.99999,
        bias2_sqrt: 0.05,
        eps: 1e-8,
        neg_step: -1e-3,
        exp_avg: "bm".into(),
        exp_avg_sq: "bv".into(),
    };
    let (m, m1, v1, w1, bm, bv) =
        (f32_bytes(&m), f32_bytes(&m1), f32_bytes(&v1), f32_bytes(&w1), f32_bytes(&bm), f32_bytes(&bv));
    let v0 = prediction_of(&v_pred, &v1, &m, &m1);
    let w0 = prediction_of(&w_pred, &w1, &bm, &bv);
    assert!(word(&v0, 0).is_subnormal() && word(&v0, 1).is_subnormal(), "subnormal second moments");
    assert!(word(&w0, 2).is_normal() && word(&w0, 3).is_subnormal(), "a normal weight from a subnormal m'");
    assert_eq!(word(&w0, 4).to_bits(), 0x7FC0_0000, "the canonical NaN");
    let shape = [n as u64];
    g.valid(
        Spec::new(
            REVERSE_EXACT_BASE,
            "§6.8",
            "the base of delta-predicted-reverse-exact: w, m, v and the moments bm, bv that only predictor 4 reads (f32, 256, raw); bs, bv's bytes as 16x16",
        )
        .encoder(Encoder::Codec(CodecTag::Raw))
        .tensors([
            T::new("w", DType::F32, &shape, w1),
            T::new("m", DType::F32, &shape, m1),
            T::new("v", DType::F32, &shape, v1),
            T::new("bm", DType::F32, &shape, bm),
            T::new("bv", DType::F32, &shape, bv.clone()),
            T::new("bs", DType::F32, &[16, 16], bv),
        ]),
    );
    g.valid(
        Spec::new(
            REVERSE_EXACT,
            "§6.8",
            "reverse predictions (1.9) that are exact, so every element is its prediction: v (predictor 3) with a subnormal base element and a subnormal b − c·g²; w (predictor 4, reading bm and bv, which only the base holds) with a normal result of a subnormal m', a subnormal base weight and the canonical NaN of √ of a negative v'",
        )
        .encoder(Encoder::Auto)
        .minor(9)
        .tensors([
            T { delta: true, predict: Some(w_pred), ..T::new("w", DType::F32, &shape, w0) },
            T { delta: true, ..T::new("m", DType::F32, &shape, m) },
            T { delta: true, predict: Some(v_pred), ..T::new("v", DType::F32, &shape, v0) },
        ])
        .base(REVERSE_EXACT_BASE),
    );
}

/// `file` with the params of every `delta-predicted` chunk of its tensor `tensor` edited.
fn with_prediction(file: &[u8], tensor: &str, edit: &dyn Fn(&mut Prediction)) -> Vec<u8> {
    let t = surgery::directory(file).expect("valid").tensors.iter().position(|t| t.name == tensor).unwrap();
    edit_dir(file, |d| {
        for c in d.tensors[t].chunks.iter_mut().filter(|c| c.codec == CodecTag::DeltaPredicted) {
            let mut p = Prediction::parse(&c.params).expect("valid params");
            edit(&mut p);
            c.params = p.to_bytes();
        }
    })
}

/// `file` with predictor 4 of its tensor `tensor` reading v' from the base's tensor `v`.
fn reading_v(file: &[u8], tensor: &str, v: &str) -> Vec<u8> {
    with_prediction(file, tensor, &|p| {
        if let Prediction::AdamParameterReverse { exp_avg_sq, .. } = p {
            *exp_avg_sq = v.into();
        }
    })
}

/// Each breaks one rule of §6.8 as 1.9 extends it.
pub fn invalid(g: &mut Gen) {
    use ErrorKind::Malformed;
    let file = g.get(REVERSE).bytes.clone();
    let w = surgery::directory(&file).expect("valid").tensors.iter().position(|t| t.name == "w").unwrap();
    let cases: Vec<(&str, &str, &str, Vec<u8>)> = vec![
        (
            "r29-predicted-reverse-base-v-absent",
            "R29",
            "delta-predicted-reverse with w's prediction (predictor 4) reading v' from v.absent, which the base lacks (nor does the file hold it: predictor 4 reads the base only)",
            reading_v(&file, "w", "v.absent"),
        ),
        (
            "r30-predicted-reverse-one-name",
            "R30",
            "delta-predicted-reverse with w's prediction (predictor 4) cut after its first name: predictor 4 has two",
            edit_dir(&file, |d| {
                for c in d.tensors[w].chunks.iter_mut().filter(|c| c.codec == CodecTag::DeltaPredicted) {
                    let cut = c.params.len() - "v".len() - 2;
                    c.params.truncate(cut);
                }
            }),
        ),
    ];
    // P8: what a prediction reads before the chunk's own CRC (R24, checksum-mismatch).
    let crc = edit_dir(&cases[0].3, |d| {
        let c = d.tensors[w].chunks.iter_mut().find(|c| c.codec == CodecTag::DeltaPredicted).expect("predicted");
        c.crc32 ^= 1;
    });
    for (name, rule, description, bytes) in cases {
        bad_delta(g, name, rule, description, bytes, REVERSE_BASE, Malformed);
    }
    bad_delta(
        g,
        "r29-predicted-reverse-base-v-absent-crc",
        "R29",
        "r29-predicted-reverse-base-v-absent with the CRC of w's first predicted chunk wrong too: P8 puts what a prediction reads (v' absent from the base, malformed) before the chunk's own R24",
        crc,
        REVERSE_BASE,
        Malformed,
    );
    // Predictor 3 naming bm, which the base holds (f32, the tensor's shape) and the file does
    // not: only R30's name check rejects it.
    let exact = g.get(REVERSE_EXACT).bytes.clone();
    let absent = with_prediction(&exact, "v", &|p| {
        if let Prediction::AdamSecondMomentReverse { exp_avg, .. } = p {
            *exp_avg = "bm".into();
        }
    });
    bad_delta(
        g,
        "r30-predicted-reverse-name-absent",
        "R30",
        "delta-predicted-reverse-exact with v's prediction (predictor 3) reading bm, which the base holds (f32 of v's shape) and the file lacks",
        absent,
        REVERSE_EXACT_BASE,
        Malformed,
    );
    // A base tensor of another dtype with the same bytes: sv.bits is sv's bytes as i32, so a
    // reader that checks only the byte length decodes cm exactly as the valid file's.
    let chain = g.get(CHAIN_P4).bytes.clone();
    bad_delta(
        g,
        "r29-predicted-reverse-base-dtype",
        "R29",
        "delta-predicted-reverse-chain-p4 with cm's prediction (predictor 4) reading v' from sv.bits, an i32 base tensor holding sv's bytes: the same bytes, not f32",
        reading_v(&chain, "cm", "sv.bits"),
        crate::valid::PREDICTED_EDGE_BASE,
        Malformed,
    );
    // A base tensor of another shape with as many elements: a reader must compare shapes.
    bad_delta(
        g,
        "r29-predicted-reverse-base-shape",
        "R29",
        "delta-predicted-reverse-exact with w's prediction (predictor 4) reading v' from bs, a base tensor of shape [16, 16]: as many elements as w's [256], another shape",
        reading_v(&exact, "w", "bs"),
        REVERSE_EXACT_BASE,
        Malformed,
    );
}
