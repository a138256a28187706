//! Which optimizer prediction (spec §6.8) a pack tries on a delta tensor: the first guess that
//! predicts a sample of its elements well.

use std::borrow::Cow;
use std::collections::HashMap;

use tpde_codec::predicted::Inputs;
use tpde_format::{DType, Prediction};
use tpde_read::Base;

use crate::Error;

/// A prediction chosen for a tensor, with the tensors it reads (those of
/// [`tpde_codec::predicted::Inputs`]: the first moment the params name, of the file or of the
/// base, and the other input).
pub struct Chosen<'a> {
    pub(crate) prediction: Prediction,
    pub(crate) exp_avg: Cow<'a, [u8]>,
    pub(crate) other: Cow<'a, [u8]>,
}

/// Elements of a tensor a prediction is tried on before its chunks are.
const PREDICTION_SAMPLE: usize = 256;

/// The first of `candidates` that predicts at least 90% of a sample of `data` (the tensor's
/// first elements) bit-exactly, else the one that predicts most of it if that is at least 2%,
/// else `None`: one candidate per guess about the optimizer (which moments belong to which
/// weight, which learning rate the step used), so a wrong guess costs a sample, not a pass
/// over the tensor. `base` is the tensor's base bytes; `file` the f32 tensors being packed.
pub fn choose_prediction<'a>(
    candidates: &[Prediction],
    data: &[u8],
    base: &[u8],
    file: &HashMap<&str, &'a [u8]>,
    base_ck: &'a dyn Base,
) -> Result<Option<Chosen<'a>>, Error> {
    let n = data.len().min(PREDICTION_SAMPLE * 4);
    let same = |name: &str| file.get(name).copied().filter(|t| t.len() == data.len());
    let mut best: Option<(usize, Chosen<'a>)> = None;
    for p in candidates {
        // A tensor of the base the prediction reads, f32 of the tensor's length.
        let from_base = |name: &str| -> Result<Option<Cow<'a, [u8]>>, Error> {
            Ok(base_ck.tensor(name)?.filter(|t| t.dtype == DType::F32 && t.data.len() == data.len()).map(|t| t.data))
        };
        let names = p.names();
        let inputs = match p {
            Prediction::AdamSecondMoment { .. } | Prediction::AdamSecondMomentReverse { .. } => {
                same(names[0]).map(Cow::Borrowed).zip(from_base(names[0])?)
            }
            Prediction::AdamParameter { .. } => {
                same(names[0]).map(Cow::Borrowed).zip(same(names[1]).map(Cow::Borrowed))
            }
            Prediction::AdamParameterReverse { .. } => from_base(names[0])?.zip(from_base(names[1])?),
        };
        let Some((exp_avg, other)) = inputs else { continue };
        let mut predicted = vec![0u8; n];
        let inputs = Inputs { base: &base[..n], exp_avg: &exp_avg[..n], other: &other[..n] };
        tpde_codec::predicted::predict(p, inputs, &mut predicted);
        let hits = predicted.chunks_exact(4).zip(data.chunks_exact(4)).filter(|(a, b)| a == b).count();
        let chosen = Chosen { prediction: p.clone(), exp_avg, other };
        if hits * 10 >= (n / 4) * 9 {
            return Ok(Some(chosen));
        }
        if best.as_ref().is_none_or(|(h, _)| hits > *h) {
            best = Some((hits, chosen));
        }
    }
    Ok(best.filter(|(hits, _)| hits * 50 >= n / 4 && *hits > 0).map(|(_, c)| c))
}
