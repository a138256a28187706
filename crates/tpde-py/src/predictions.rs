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
        let k: Vec<f32> = k.iter().map(|&x| x as f32).collect();
        let p = tpde::Prediction::from_parts(code, &k, names)
            .map_err(|detail| invalid(format!("prediction for {tensor:?}: {detail}")))?;
        out.entry(tensor).or_default().push(p);
    }
    Ok(out)
}
