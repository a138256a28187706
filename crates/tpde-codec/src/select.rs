//! The writer's per-chunk choice among the lossless forms (spec §10): estimate every form's
//! size from histograms and exact position-code lengths, then encode only the smallest.

use tpde_format::CodecTag;

use crate::float::{width, Dense, DenseOp, Planes, Sparse};
use crate::planes::{self, PlaneForm, Planed};
use crate::positions::PositionCoder;
use crate::{ChunkCodec, ChunkContext, CodecError};

/// A candidate form and its estimated stored bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Choice {
    /// The codec.
    tag: CodecTag,
    /// Estimated stored bytes.
    bytes: f64,
}

/// A chunk's estimated forms, and what encoding the best of them reuses.
struct Estimate {
    choices: Vec<Choice>,
    /// The `delta-xor` elements (rotated for floats): the sparse forms' values too.
    xor: Planed,
    /// Changed positions and their values, when a sparse form was estimated.
    sparse: Option<(Vec<u32>, Planed)>,
    /// The `delta-sub` elements, when estimated.
    sub: Option<Vec<u8>>,
    /// The keyframe's rotated elements, when estimated.
    key: Option<Vec<u8>>,
}

fn estimate_all(ctx: ChunkContext, input: &[u8], base: &[u8], form: PlaneForm) -> Estimate {
    let w = width(ctx.dtype);
    let n = (input.len() / w) as u64;
    let xor = Planed::new(Dense::forward(DenseOp::Xor, ctx.dtype, input, base), w);
    let xor_cost = xor.estimate();
    let mut choices = vec![Choice { tag: Dense(DenseOp::Xor, form).tag(), bytes: xor_cost }];
    // Sparse: the changed values are the nonzero XOR elements, so their histograms are the
    // XOR's less the unchanged elements' zeros. Positions are only found and costed when a
    // sparse form could win, with at least one bit per position.
    let changed = Sparse::count_changed(xor.elements(), w) as u64;
    let mut value_hists = xor.hists.clone();
    for h in &mut value_hists {
        h[0] -= n - changed;
    }
    let values_cost = planes::estimate(&value_hists);
    let mut sparse = None;
    if 8.0 + values_cost + changed as f64 / 8.0 < xor_cost {
        let (pos, values) = Sparse::changes_in(xor.elements(), w);
        // The lane form has one position coder, the packed blocks a GPU decodes in parallel.
        let coders: &[PositionCoder] = match form {
            PlaneForm::Serial => &PositionCoder::ALL,
            PlaneForm::Lanes => &[PositionCoder::Packed],
        };
        for &coder in coders {
            let bytes = 8.0 + coder.cost_bits(&pos).div_ceil(8) as f64 + values_cost;
            choices.push(Choice { tag: Sparse(coder, form).tag(), bytes });
        }
        sparse = Some((pos, Planed::with_hists(values, w, value_hists)));
    }
    // Subtraction can only win when much has changed.
    let mut sub = None;
    if changed * 4 > n {
        let d = Dense::forward(DenseOp::Sub, ctx.dtype, input, base);
        choices.push(Choice { tag: Dense(DenseOp::Sub, form).tag(), bytes: planes::sampled_estimate(&d, w) });
        sub = Some(d);
    }
    // A fresh keyframe, only when the delta saves little (a re-initialised tensor, or Adam's
    // first moment many steps apart, where planes measured 0.844 against delta-sub's 0.853).
    let mut key = None;
    if xor_cost > input.len() as f64 * 0.75 {
        let mut elements = input.to_vec();
        if planes::rotates(ctx.dtype) {
            planes::rotate(&mut elements, w, true);
        }
        choices.push(Choice { tag: Planes(form).tag(), bytes: planes::sampled_estimate(&elements, w) });
        key = Some(elements);
    }
    choices.sort_by(|a, b| a.bytes.total_cmp(&b.bytes));
    Estimate { choices, xor, sparse, sub, key }
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
    if let (Some(coder), Some((positions, values))) = (PositionCoder::of(best), &est.sparse) {
        Sparse(coder, form).write_planed(positions, values, out);
    } else if best == Dense(DenseOp::Sub, form).tag() {
        Planed::new(est.sub.expect("estimated"), width(ctx.dtype)).encode(form, out);
    } else if best == keyframe.tag() {
        Planed::new(est.key.expect("estimated"), width(ctx.dtype)).encode(form, out);
    } else {
        debug_assert_eq!(best, Dense(DenseOp::Xor, form).tag());
        est.xor.encode(form, out);
    }
    Ok((best, Vec::new()))
}
