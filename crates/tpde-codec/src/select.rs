//! The writer's per-chunk choice among the lossless forms (spec §10): estimate every form's
//! size from histograms and exact position-code lengths, then encode only the smallest.

use tpde_format::CodecTag;

use crate::float::{width, Dense, DenseOp, Planes, Sparse};
use crate::planes::{self, PlaneForm, Planed};
use crate::positions::PositionCoder;
use crate::{decoder, ChunkCodec, ChunkContext, CodecError};

/// A candidate form and its estimated stored bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Choice {
    /// The codec.
    tag: CodecTag,
    /// Estimated stored bytes.
    bytes: f64,
}

/// A chunk's changes against its base, and the estimated size of every candidate form.
struct Estimate {
    choices: Vec<Choice>,
    positions: Vec<u32>,
    values: Planed,
    /// The `delta-sub` planes, when computed.
    sub: Option<Planed>,
}

fn estimate_all(ctx: ChunkContext, input: &[u8], base: &[u8], form: PlaneForm) -> Estimate {
    let w = width(ctx.dtype);
    let n = (input.len() / w) as u64;
    let (positions, values) = Sparse::changes(ctx.dtype, input, base);
    let values = Planed::new(&values, w);
    let values_cost = values.estimate();
    let mut choices = Vec::new();
    // The lane form has one position coder, the packed blocks a GPU decodes in parallel.
    let coders: &[PositionCoder] = match form {
        PlaneForm::Serial => &PositionCoder::ALL,
        PlaneForm::Lanes => &[PositionCoder::Packed],
    };
    for &coder in coders {
        let pos = coder.cost_bits(&positions).div_ceil(8) as f64;
        choices.push(Choice { tag: Sparse(coder, form).tag(), bytes: 8.0 + pos + values_cost });
    }
    // Dense XOR: the changed values plus a zero for every unchanged element.
    let mut dense_hist = values.hists.clone();
    for h in &mut dense_hist {
        h[0] += n - positions.len() as u64;
    }
    let xor = planes::estimate(&dense_hist);
    choices.push(Choice { tag: Dense(DenseOp::Xor, form).tag(), bytes: xor });
    // Subtraction can only win when much has changed.
    let mut sub = None;
    if positions.len() as u64 * 4 > n {
        let d = Planed::new(&Dense::forward(DenseOp::Sub, ctx.dtype, input, base), w);
        choices.push(Choice { tag: Dense(DenseOp::Sub, form).tag(), bytes: d.estimate() });
        sub = Some(d);
    }
    // A fresh keyframe, only when the delta saves little (a re-initialised tensor, or Adam's
    // first moment many steps apart, where planes measured 0.844 against delta-sub's 0.853).
    if xor > input.len() as f64 * 0.75 {
        let mut key = input.to_vec();
        if planes::rotates(ctx.dtype) {
            planes::rotate(&mut key, w, true);
        }
        choices.push(Choice { tag: Planes(form).tag(), bytes: Planed::new(&key, w).estimate() });
    }
    choices.sort_by(|a, b| a.bytes.total_cmp(&b.bytes));
    Estimate { choices, positions, values, sub }
}

/// Encodes the chunk in its smallest estimated form.
pub fn encode_best(
    ctx: ChunkContext,
    input: &[u8],
    form: PlaneForm,
    out: &mut Vec<u8>,
) -> Result<(CodecTag, Vec<u8>), CodecError> {
    let keyframe = Planes(form);
    let Some(base) = ctx.base.filter(|b| b.len() == input.len()) else {
        return Ok((keyframe.tag(), keyframe.encode(ctx, input, out)?));
    };
    let est = estimate_all(ctx, input, base, form);
    let best = est.choices[0].tag;
    // What the estimate computed is reused: no second pass over the chunk.
    if let Some(coder) = PositionCoder::of(best) {
        Sparse(coder, form).write_planed(&est.positions, &est.values, out);
        return Ok((best, Vec::new()));
    }
    if let (true, Some(sub)) = (best == Dense(DenseOp::Sub, form).tag(), &est.sub) {
        sub.encode(form, out);
        return Ok((best, Vec::new()));
    }
    let ctx = if best == keyframe.tag() { ChunkContext { base: None, ..ctx } } else { ctx };
    Ok((best, decoder(best).encode(ctx, input, out)?))
}
