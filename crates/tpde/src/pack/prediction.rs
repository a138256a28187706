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
    // The first bytes of a tensor of the base, if it is f32 of the tensor's length: a sample
    // read through the base's ranges, so that a wrong guess does not decode a whole tensor.
    let base_sample = |name: &str| -> Result<Option<Vec<u8>>, Error> {
        match base_ck.tensor_info(name)? {
            Some((DType::F32, shape)) if shape.iter().product::<u64>() * 4 == data.len() as u64 => {
                let mut out = vec![0u8; n];
                base_ck.read_range_into(name, 0..n as u64, &mut out)?;
                Ok(Some(out))
            }
            _ => Ok(None),
        }
    };
    let mut best: Option<(usize, &Prediction)> = None;
    for p in candidates {
        let names = p.names();
        let sample = |name: &str| same(name).map(|t| t[..n].to_vec());
        let inputs = match p {
            Prediction::AdamSecondMoment { .. } | Prediction::AdamSecondMomentReverse { .. } => {
                sample(names[0]).zip(base_sample(names[0])?)
            }
            Prediction::AdamParameter { .. } => sample(names[0]).zip(sample(names[1])),
            Prediction::AdamParameterReverse { .. } => base_sample(names[0])?.zip(base_sample(names[1])?),
        };
        let Some((exp_avg, other)) = inputs else { continue };
        let mut predicted = vec![0u8; n];
        tpde_codec::predicted::predict(
            p,
            Inputs { base: &base[..n], exp_avg: &exp_avg, other: &other },
            &mut predicted,
        );
        let hits = predicted.chunks_exact(4).zip(data.chunks_exact(4)).filter(|(a, b)| a == b).count();
        if hits * 10 >= (n / 4) * 9 {
            best = Some((hits, p));
            break;
        }
        if best.is_none_or(|(h, _)| hits > h) {
            best = Some((hits, p));
        }
    }
    let Some((_, p)) = best.filter(|(hits, _)| hits * 50 >= n / 4 && *hits > 0) else { return Ok(None) };
    // The chosen one's inputs, whole.
    let whole = |name: &str| -> Result<Cow<'a, [u8]>, Error> { Ok(Cow::Borrowed(same(name).expect("sampled above"))) };
    let from_base =
        |name: &str| -> Result<Cow<'a, [u8]>, Error> { Ok(base_ck.tensor(name)?.expect("sampled above").data) };
    let names = p.names();
    let (exp_avg, other) = match p {
        Prediction::AdamSecondMoment { .. } | Prediction::AdamSecondMomentReverse { .. } => {
            (whole(names[0])?, from_base(names[0])?)
        }
        Prediction::AdamParameter { .. } => (whole(names[0])?, whole(names[1])?),
        Prediction::AdamParameterReverse { .. } => (from_base(names[0])?, from_base(names[1])?),
    };
    Ok(Some(Chosen { prediction: p.clone(), exp_avg, other }))
}
