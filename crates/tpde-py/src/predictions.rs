//! The optimizer predictions (spec §6.8) Python offers `save` to try, as tuples.

use std::collections::HashMap;

use pyo3::prelude::*;

use crate::invalid;

/// A prediction as Python gives it: `(tensor, predictor, constants, names)`.
pub(crate) type PredictionArg = (String, u8, Vec<f64>, Vec<String>);

/// Predictions to try, from `(tensor, predictor, constants, names)` tuples (spec §6.8: predictors
/// 1 and 3 take 3 constants and 1 name, 2 and 4 take 4 and 2). Constants are rounded to binary32
/// to nearest, as torch rounds a Python float applied to a float32 tensor.
pub(crate) fn prediction_candidates(list: Vec<PredictionArg>) -> PyResult<HashMap<String, Vec<tpde::Prediction>>> {
    let mut out: HashMap<String, Vec<tpde::Prediction>> = HashMap::new();
    for (tensor, code, k, names) in list {
        let p = match (code, &k[..], &names[..]) {
            (1, &[a, b, c], [m]) => tpde::Prediction::AdamSecondMoment {
                one_minus_beta1: a as f32,
                beta2: b as f32,
                one_minus_beta2: c as f32,
                exp_avg: m.clone(),
            },
            (2, &[d, r, e, h], [m, v]) => tpde::Prediction::AdamParameter {
                decay: d as f32,
                bias2_sqrt: r as f32,
                eps: e as f32,
                neg_step: h as f32,
                exp_avg: m.clone(),
                exp_avg_sq: v.clone(),
            },
            (3, &[a, b, c], [m]) => tpde::Prediction::AdamSecondMomentReverse {
                one_minus_beta1: a as f32,
                beta2: b as f32,
                one_minus_beta2: c as f32,
                exp_avg: m.clone(),
            },
            (4, &[d, r, e, h], [m, v]) => tpde::Prediction::AdamParameterReverse {
                decay: d as f32,
                bias2_sqrt: r as f32,
                eps: e as f32,
                neg_step: h as f32,
                exp_avg: m.clone(),
                exp_avg_sq: v.clone(),
            },
            _ => {
                return Err(invalid(format!(
                    "prediction for {tensor:?}: predictor {code} with {} constants and {} names",
                    k.len(),
                    names.len()
                )))
            }
        };
        out.entry(tensor).or_default().push(p);
    }
    Ok(out)
}
