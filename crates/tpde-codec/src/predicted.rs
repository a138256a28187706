//! `delta-predicted` (spec §6.8): a chunk coded as `delta-sub-context` against a prediction
//! instead of the base, and the predictions' arithmetic.
//!
//! Every operation is one IEEE 754 binary32 operation, rounded to nearest even, in the order
//! the spec's parentheses give: Rust's `f32` `+ − × ÷ sqrt` are exactly those (no fused
//! multiply-add, no flushing of subnormals, no excess precision), so the prediction is the
//! same bit for bit on every conforming reader. Only NaN payloads differ between machines,
//! which is why a NaN prediction is replaced by the canonical quiet NaN.

use tpde_format::{CodecTag, DType, Prediction};

use crate::float::{trailing, Dense, DenseOp};
use crate::planes::{self, Finish, PlaneForm, Records};
use crate::{ChunkCodec, ChunkContext, CodecError};

/// The prediction of a NaN (spec §6.8): the canonical quiet NaN.
pub const CANONICAL_NAN: u32 = 0x7FC0_0000;

/// The minor version from which a `delta-predicted` chunk may hold sparse plane records (spec
/// §6.2, 1.9): an exact prediction leaves planes of zeros, which a sparse record decodes about
/// four times faster than rANS lanes.
pub const SPARSE_IN_PREDICTED_SINCE_MINOR: u16 = 9;

/// The inputs of a prediction over one chunk's elements, little-endian `f32` bytes of equal
/// length: the base's element of the chunk's own tensor, and the tensors the prediction names.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// The base tensor of the chunk's own name (spec §6.3).
    pub base: &'a [u8],
    /// The first moment the params name: of this file (predictors 1-3), of the base (4).
    pub exp_avg: &'a [u8],
    /// Predictors 1 and 3: the base's first moment. Predictor 2: the second moment of this
    /// file; predictor 4: of the base.
    pub other: &'a [u8],
}

/// Writes the prediction of `p` over `inputs` to `out` (all of one length, a multiple of 4).
/// The compiler vectorizes these loops as they are (`cargo bench -p tpde-codec --bench kernels
/// -- prediction`: 7.4 GiB/s for predictor 3, 3.5 for predictor 4, bound by its square root and
/// divisions, on one Zen 4 core); a hand-blocked version of 16 lanes measured slower (3.4 and
/// 2.5), so a predicted chunk's time is its residual's decode, not its prediction.
pub fn predict(p: &Prediction, inputs: Inputs<'_>, out: &mut [u8]) {
    let n = out.len();
    assert!(
        n.is_multiple_of(4) && inputs.base.len() == n && inputs.exp_avg.len() == n && inputs.other.len() == n,
        "prediction inputs of one length"
    );
    let f = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let elements = inputs.base.chunks_exact(4).zip(inputs.exp_avg.chunks_exact(4)).zip(inputs.other.chunks_exact(4));
    match *p {
        Prediction::AdamSecondMoment { one_minus_beta1: a, beta2, one_minus_beta2: c, .. } => {
            for (o, ((v0, m), m0)) in out.chunks_exact_mut(4).zip(elements) {
                let (v0, m, m0) = (f(v0), f(m), f(m0));
                let g = m0 + (m - m0) / a;
                o.copy_from_slice(&canonical(v0 * beta2 + (c * g) * g).to_le_bytes());
            }
        }
        Prediction::AdamParameter { decay: d, bias2_sqrt: r, eps: e, neg_step: h, .. } => {
            for (o, ((w0, m), v)) in out.chunks_exact_mut(4).zip(elements) {
                let (w0, m, v) = (f(w0), f(m), f(v));
                o.copy_from_slice(&canonical(w0 * d + (h * m) / (v.sqrt() / r + e)).to_le_bytes());
            }
        }
        // The two steps above undone: the base is the checkpoint after this one.
        Prediction::AdamSecondMomentReverse { one_minus_beta1: a, beta2, one_minus_beta2: c, .. } => {
            for (o, ((v1, m), m1)) in out.chunks_exact_mut(4).zip(elements) {
                let (v1, m, m1) = (f(v1), f(m), f(m1));
                let g = m + (m1 - m) / a;
                o.copy_from_slice(&canonical((v1 - (c * g) * g) / beta2).to_le_bytes());
            }
        }
        Prediction::AdamParameterReverse { decay: d, bias2_sqrt: r, eps: e, neg_step: h, .. } => {
            for (o, ((w1, m1), v1)) in out.chunks_exact_mut(4).zip(elements) {
                let (w1, m1, v1) = (f(w1), f(m1), f(v1));
                o.copy_from_slice(&canonical((w1 - (h * m1) / (v1.sqrt() / r + e)) / d).to_le_bytes());
            }
        }
    }
}

fn canonical(x: f32) -> u32 {
    if x.is_nan() {
        CANONICAL_NAN
    } else {
        x.to_bits()
    }
}

/// The `delta-predicted` codec. Its [`ChunkContext::base`] is the chunk's prediction, which
/// the reader computes ([`predict`]) from the tensors the params name; the stored bytes are
/// those of `delta-sub-context` against it.
#[derive(Clone, Copy, Debug)]
pub struct Predicted;

impl Predicted {
    /// Appends the stored form of `input` coded against `prediction` to `out`; the chunk's
    /// params are `p.to_bytes()`. `records`: the newer plane records the file may hold (sparse
    /// ones from 1.9 here, [`SPARSE_IN_PREDICTED_SINCE_MINOR`]; blocks from 1.10).
    pub fn encode_against(
        dtype: DType,
        prediction: &[u8],
        input: &[u8],
        records: Records,
        out: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        let ctx = ChunkContext { dtype, base: Some(prediction) };
        Dense(DenseOp::Sub, PlaneForm::BaseContexts).encode_planes(ctx, input, records, out)?;
        Ok(())
    }
}

impl ChunkCodec for Predicted {
    fn tag(&self) -> CodecTag {
        CodecTag::DeltaPredicted
    }

    fn encode(&self, _: ChunkContext, _: &[u8], _: &mut Vec<u8>) -> Result<Vec<u8>, CodecError> {
        Err(CodecError::Encode {
            codec: self.tag(),
            detail: "a prediction's chunk is encoded with Predicted::encode_against, which takes the prediction".into(),
        })
    }

    fn check_lengths(&self, _stored: u64, _decoded: u64) -> Result<(), CodecError> {
        Ok(()) // the base tensor, not the stored bytes, justifies the decoded length
    }

    fn decode(&self, ctx: ChunkContext, params: &[u8], stored: &[u8], out: &mut [u8]) -> Result<(), CodecError> {
        Prediction::parse(params).map_err(|detail| CodecError::BadParams { codec: self.tag(), detail })?;
        let prediction = ctx.base.ok_or(CodecError::MissingBase { codec: self.tag() })?;
        if prediction.len() != out.len() {
            return Err(CodecError::BaseLength {
                codec: self.tag(),
                found: prediction.len() as u64,
                expected: out.len() as u64,
            });
        }
        let context_base = planes::BaseElements { dtype: ctx.dtype, elements: prediction };
        // The residual is `delta-sub`'s, against the prediction (spec §6.8).
        let finish = Finish::Delta { op: DenseOp::Sub, float: ctx.dtype.is_float(), base: prediction };
        let end = planes::decode(self.tag(), stored, 0, 4, finish, Some(context_base), out)?;
        trailing(self.tag(), stored, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(x: &[f32]) -> Vec<u8> {
        x.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn words(b: &[u8]) -> Vec<u32> {
        b.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn predictions_follow_the_spec_formulas_and_round_trip() {
        let v = Prediction::AdamSecondMoment {
            one_minus_beta1: 0.1,
            beta2: 0.999,
            one_minus_beta2: 0.001,
            exp_avg: "m".into(),
        };
        let (v0, m, m0) = ([4e-8f32, 0.0, f32::NAN, 1e-40], [2e-4f32, -1e-5, 0.0, 0.0], [1e-4f32, 0.0, 0.0, 0.0]);
        let mut out = vec![0; 16];
        predict(&v, Inputs { base: &bytes(&v0), exp_avg: &bytes(&m), other: &bytes(&m0) }, &mut out);
        let g = 1e-4f32 + (2e-4f32 - 1e-4) / 0.1;
        let want = [4e-8f32 * 0.999 + (0.001 * g) * g, 0.0, 0.0, 1e-40 * 0.999];
        let got = words(&out);
        assert_eq!(got[0], want[0].to_bits());
        assert_eq!(got[2], CANONICAL_NAN, "NaN in, the canonical NaN out");
        assert_eq!(got[3], want[3].to_bits(), "subnormals are kept");
        assert_ne!(got[3], 0);

        // A chunk coded against its prediction decodes back to the chunk.
        let cur = bytes(&[4.1e-8f32, 1e-11, 3.0, 1e-40]);
        let mut stored = Vec::new();
        Predicted::encode_against(DType::F32, &out, &cur, Records { sparse: true, ..Records::FIRST }, &mut stored)
            .unwrap();
        let mut back = vec![0; 16];
        let ctx = ChunkContext { dtype: DType::F32, base: Some(&out) };
        Predicted.decode(ctx, &v.to_bytes(), &stored, &mut back).unwrap();
        assert_eq!(back, cur);
        let bad = Predicted.decode(ctx, &[9], &stored, &mut back).unwrap_err();
        assert!(matches!(bad, CodecError::BadParams { .. }), "{bad}");
    }

    /// Each element gets the formula's bits at every length (the compiler vectorizes the loop:
    /// its tail too), NaNs, infinities, subnormals and negative v among them.
    #[test]
    fn every_element_is_its_formula_at_every_length() {
        let special = [f32::NAN, f32::INFINITY, -1e-40, 1e-40, -1.0, 0.0, -0.0, 3.5e-3];
        let value = |k: usize, salt: u32| -> f32 {
            let x = (k as u32).wrapping_mul(2_654_435_761).wrapping_add(salt);
            if x.is_multiple_of(11) {
                special[(x / 11) as usize % special.len()]
            } else {
                (x % 10_000) as f32 * 1e-4 - 0.5
            }
        };
        type Formula = fn(f32, f32, f32) -> f32;
        let formulas: [(Prediction, Formula); 2] = [
            (
                Prediction::AdamSecondMomentReverse {
                    one_minus_beta1: 0.1,
                    beta2: 0.999,
                    one_minus_beta2: 0.001,
                    exp_avg: "m".into(),
                },
                |v1, m, m1| {
                    let g = m + (m1 - m) / 0.1;
                    (v1 - (0.001 * g) * g) / 0.999
                },
            ),
            (
                Prediction::AdamParameter {
                    decay: 0.9999,
                    bias2_sqrt: 0.0447,
                    eps: 1e-8,
                    neg_step: -1e-3,
                    exp_avg: "m".into(),
                    exp_avg_sq: "v".into(),
                },
                |w0, m, v| w0 * 0.9999 + (-1e-3 * m) / (v.sqrt() / 0.0447 + 1e-8),
            ),
        ];
        for (p, f) in &formulas {
            for n in [0, 1, 15, 16, 17, 31, 32, 33, 100] {
                let (x, y, z): (Vec<f32>, Vec<f32>, Vec<f32>) = (
                    (0..n).map(|k| value(k, 1)).collect(),
                    (0..n).map(|k| value(k, 2)).collect(),
                    (0..n).map(|k| value(k, 3)).collect(),
                );
                let mut out = vec![0; 4 * n];
                predict(p, Inputs { base: &bytes(&x), exp_avg: &bytes(&y), other: &bytes(&z) }, &mut out);
                let want: Vec<u32> = (0..n).map(|k| canonical(f(x[k], y[k], z[k]))).collect();
                assert_eq!(words(&out), want, "{p:?}, {n} elements");
            }
        }
    }

    /// One AdamW step forward in binary32, as torch's single-tensor step takes it, then the
    /// reverse predictors (3, 4) from the step's result: each comes within a few ulp of the element
    /// before it and follows the spec's formulas (a swapped input or sign would not).
    #[test]
    fn reverse_predictions_undo_one_step() {
        let (a, beta2, c) = (0.1f32, 0.999f32, 0.001f32);
        let (d, r, e, h) = (0.99999f32, 0.0447f32, 1e-8f32, -2.2e-3f32);
        let (w0, m0, v0, g) =
            ([0.5f32, -0.03, 1e-40], [1e-3f32, -2e-4, 0.0], [1e-6f32, 4e-8, 0.0], [0.01f32, -0.02, 0.0]);
        let m1: Vec<f32> = (0..3).map(|i| m0[i] + a * (g[i] - m0[i])).collect();
        let v1: Vec<f32> = (0..3).map(|i| v0[i] * beta2 + (c * g[i]) * g[i]).collect();
        let w1: Vec<f32> = (0..3).map(|i| w0[i] * d + (h * m1[i]) / (v1[i].sqrt() / r + e)).collect();
        let v_rev =
            Prediction::AdamSecondMomentReverse { one_minus_beta1: a, beta2, one_minus_beta2: c, exp_avg: "m".into() };
        let mut out = vec![0; 12];
        predict(&v_rev, Inputs { base: &bytes(&v1), exp_avg: &bytes(&m0), other: &bytes(&m1) }, &mut out);
        let gg: Vec<f32> = (0..3).map(|i| m0[i] + (m1[i] - m0[i]) / a).collect();
        let want: Vec<u32> = (0..3).map(|i| canonical((v1[i] - (c * gg[i]) * gg[i]) / beta2)).collect();
        assert_eq!(words(&out), want);
        let close = |x: u32, y: f32| (x as i64 - y.to_bits() as i64).abs() <= 4; // close, not exact: the inverse rounds
        assert!((0..3).all(|i| close(want[i], v0[i])), "{want:x?} against {v0:?}");

        let w_rev = Prediction::AdamParameterReverse {
            decay: d,
            bias2_sqrt: r,
            eps: e,
            neg_step: h,
            exp_avg: "m".into(),
            exp_avg_sq: "v".into(),
        };
        predict(&w_rev, Inputs { base: &bytes(&w1), exp_avg: &bytes(&m1), other: &bytes(&v1) }, &mut out);
        let want: Vec<u32> = (0..3).map(|i| canonical((w1[i] - (h * m1[i]) / (v1[i].sqrt() / r + e)) / d)).collect();
        assert_eq!(words(&out), want);
        assert_eq!(want[2], 1e-40f32.to_bits(), "a subnormal weight comes back as it was");
        assert!((0..3).all(|i| close(want[i], w0[i])), "{want:x?} against {w0:?}");
        let nan = [f32::NAN; 3];
        predict(&w_rev, Inputs { base: &bytes(&w1), exp_avg: &bytes(&m1), other: &bytes(&nan) }, &mut out);
        assert_eq!(words(&out), [CANONICAL_NAN; 3]);
    }
}
