//! Which optimizer prediction (spec §6.8) a pack tries on a delta tensor: the first guess that
//! predicts a sample of its elements well.

use std::borrow::Cow;
use std::collections::HashMap;

use tpde_codec::predicted::Inputs;
use tpde_format::{DType, Operand, Prediction};
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
    // An operand's first `n` bytes, if it is an f32 tensor of the tensor's length; the base's is
    // read through its ranges, so that a wrong guess does not decode a whole tensor.
    let sample = |(name, at): (&str, Operand)| -> Result<Option<Cow<'_, [u8]>>, Error> {
        Ok(match at {
            Operand::File => same(name).map(|t| Cow::Borrowed(&t[..n])),
            Operand::Base => match base_ck.tensor_info(name)? {
                Some((DType::F32, shape)) if shape.iter().product::<u64>() * 4 == data.len() as u64 => {
                    let mut out = vec![0u8; n];
                    base_ck.read_range_into(name, 0..n as u64, &mut out)?;
                    Some(Cow::Owned(out))
                }
                _ => None,
            },
        })
    };
    let mut best: Option<(usize, &Prediction)> = None;
    for p in candidates {
        let [first, second] = p.operands();
        let (Some(exp_avg), Some(other)) = (sample(first)?, sample(second)?) else { continue };
        let (exp_avg, other) = (&exp_avg[..], &other[..]);
        let mut predicted = vec![0u8; n];
        tpde_codec::predicted::predict(p, Inputs { base: &base[..n], exp_avg, other }, &mut predicted);
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
    let whole = |(name, at): (&str, Operand)| -> Result<Cow<'a, [u8]>, Error> {
        Ok(match at {
            Operand::File => Cow::Borrowed(same(name).expect("sampled above")),
            Operand::Base => base_ck.tensor(name)?.expect("sampled above").data,
        })
    };
    let [first, second] = p.operands();
    let (exp_avg, other) = (whole(first)?, whole(second)?);
    Ok(Some(Chosen { prediction: p.clone(), exp_avg, other }))
}
