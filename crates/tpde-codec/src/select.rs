//! The writer's per-chunk choice among the lossless forms (spec §10): estimate every form's
//! size from sampled histograms and exact position-code lengths, then transform and encode
//! only the smallest.

use tpde_format::CodecTag;

use crate::float::{width, Dense, DenseOp, Planes, Sparse};
use crate::planes::{self, PlaneForm, Records};
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

/// A chunk's estimated forms, smallest first, and the changed positions when a sparse form
/// was estimated (its encoding reuses them).
struct Estimate {
    choices: Vec<Choice>,
    positions: Option<Vec<u32>>,
}

fn estimate_all(ctx: ChunkContext, input: &[u8], base: &[u8], form: PlaneForm) -> Estimate {
    let (dtype, w) = (ctx.dtype, width(ctx.dtype));
    let n = input.len() / w;
    // Each form is estimated from a sample of its elements: only the chosen one is computed
    // whole (measured on real f32 deltas: the whole XOR and subtraction were both computed and
    // counted, where one is kept).
    let hists_of = |op| planes::sampled_histograms(n, w, |r| Dense::forward(op, dtype, &input[r.clone()], &base[r]));
    let xor_hists = hists_of(DenseOp::Xor);
    let xor_cost = planes::estimate(&xor_hists);
    // Dense deltas in lane form may code planes with the base's contexts (spec §6.4.1), which
    // each plane takes only where it estimates them smaller: the choice between the forms is
    // made on their order-0 estimates.
    let dense = form.dense();
    let mut choices = vec![Choice { tag: Dense(DenseOp::Xor, dense).tag(), bytes: xor_cost }];
    // Subtraction is estimated however few elements changed: on real bf16 weights where 80–86%
    // are unchanged, a changed one moves by a unit or two in its last place, which subtraction
    // keeps in the low plane where XOR carries it into the next.
    let sub_cost = planes::estimate(&hists_of(DenseOp::Sub));
    choices.push(Choice { tag: Dense(DenseOp::Sub, dense).tag(), bytes: sub_cost });
    // Sparse: the changed values are the nonzero XOR elements, so their histograms are the
    // XOR's less the unchanged elements' zeros. Positions are only found and costed when a
    // sparse form could beat both dense ones, with at least one bit per position (finding
    // and costing them was 13% of a one-core bf16 weights delta pack whose subtraction was
    // far smaller).
    let changed = Sparse::count_changed(input, base, w);
    let mut value_hists = xor_hists;
    for h in &mut value_hists {
        h[0] = h[0].saturating_sub((n - changed) as u64);
    }
    let values_cost = planes::estimate(&value_hists);
    let mut positions = None;
    if 8.0 + values_cost + changed as f64 / 8.0 < xor_cost.min(sub_cost) {
        let pos = Sparse::positions(input, base, w);
        // The lane form has one position coder, the packed blocks a GPU decodes in parallel.
        let coders: &[PositionCoder] = match form {
            PlaneForm::Serial => &PositionCoder::ALL,
            _ => &[PositionCoder::Packed],
        };
        for &coder in coders {
            let bytes = 8.0 + coder.cost_bits(&pos).div_ceil(8) as f64 + values_cost;
            choices.push(Choice { tag: Sparse(coder, form).tag(), bytes });
        }
        positions = Some(pos);
    }
    // A fresh keyframe, only when the delta saves little (a re-initialised tensor, or Adam's
    // first moment many steps apart, where a keyframe measured smaller than delta-sub).
    if xor_cost > input.len() as f64 * 0.75 {
        let key = planes::sampled_histograms(n, w, |r| {
            let mut elements = input[r].to_vec();
            if planes::rotates(dtype) {
                planes::rotate(&mut elements, w, true);
            }
            elements
        });
        choices.push(Choice { tag: Planes(form.keyframe()).tag(), bytes: planes::estimate(&key) });
    }
    choices.sort_by(|a, b| a.bytes.total_cmp(&b.bytes));
    Estimate { choices, positions }
}

/// Encodes the chunk in its smallest estimated form.
/// `records`: the newer plane records the file may hold (sparse ones in dense deltas, blocks).
pub fn encode_best(
    ctx: ChunkContext,
    input: &[u8],
    form: PlaneForm,
    records: Records,
    out: &mut Vec<u8>,
) -> Result<(CodecTag, Vec<u8>), CodecError> {
    let keyframe = Planes(form.keyframe());
    let Some(base) = ctx.base.filter(|b| b.len() == input.len()) else {
        return Ok((keyframe.tag(), keyframe.encode_planes(ctx, input, records, out)?));
    };
    let est = estimate_all(ctx, input, base, form);
    let best = est.choices[0].tag;
    // The positions the estimate found are reused; any other form is encoded by its codec.
    if let (Some(coder), Some(positions)) = (PositionCoder::of(best), &est.positions) {
        Sparse(coder, form).write(ctx.dtype, input, base, positions, out);
        return Ok((best, Vec::new()));
    }
    for op in [DenseOp::Xor, DenseOp::Sub] {
        if best == Dense(op, form.dense()).tag() {
            return Ok((best, Dense(op, form.dense()).encode_planes(ctx, input, records, out)?));
        }
    }
    if best == keyframe.tag() {
        return Ok((best, keyframe.encode_planes(ctx, input, records, out)?));
    }
    Ok((best, crate::decoder(best).encode(ctx, input, out)?))
}
