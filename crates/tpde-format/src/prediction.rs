//! Predictions (spec §6.8): the params of a `delta-predicted` chunk, which name the tensors and
//! binary32 constants its prediction is computed from, and the dependency rules between the
//! tensors of a file (R30). The arithmetic itself is in `tpde-codec` (`predict`).

use std::collections::HashMap;

use crate::directory::Directory;
use crate::error::{FormatError, Position};
use crate::limits::MAX_PREDICTION_DEPTH;
use crate::{CodecTag, DType};

/// What a `delta-predicted` chunk predicts its elements from (spec §6.8). Constants are
/// binary32 values, stored as their bit patterns; a reader uses them as they are.
#[derive(Clone, Debug, PartialEq)]
pub enum Prediction {
    /// Predictor 1: Adam's second moment after one step, `p = b·β + (c·g)·g` with the gradient
    /// recovered from the first moment as `g = m' + (m − m')/a`. `b` is the base's element of
    /// this tensor, `m` of tensor `exp_avg` in this file, `m'` of `exp_avg` in the base.
    AdamSecondMoment {
        /// `a`: 1 − β1.
        one_minus_beta1: f32,
        /// `β`: β2.
        beta2: f32,
        /// `c`: 1 − β2.
        one_minus_beta2: f32,
        /// The first moment's tensor.
        exp_avg: String,
    },
    /// Predictor 2: a parameter after one Adam(W) step, `p = b·d + (h·m)/(√v/r + e)`. `b` is the
    /// base's element of this tensor, `m` and `v` those of tensors `exp_avg` and `exp_avg_sq` in
    /// this file.
    AdamParameter {
        /// `d`: the decoupled weight decay's factor 1 − lr·λ (1 without it).
        decay: f32,
        /// `r`: the square root of the second moment's bias correction, √(1 − β2^t).
        bias2_sqrt: f32,
        /// `e`: ε.
        eps: f32,
        /// `h`: the signed step, −lr / (1 − β1^t).
        neg_step: f32,
        /// The first moment's tensor.
        exp_avg: String,
        /// The second moment's tensor (under `amsgrad`, its running maximum).
        exp_avg_sq: String,
    },
    /// Predictor 3 (since 1.9): Adam's second moment one step *before* the base's, for a file
    /// whose base is the checkpoint after it (a reverse delta), `p = (b − (c·g)·g) / β` with
    /// `g = m + (m' − m)/a`. `b` is the base's element of this tensor, `m` of tensor `exp_avg`
    /// in this file, `m'` of `exp_avg` in the base. The constants are predictor 1's.
    AdamSecondMomentReverse {
        /// `a`: 1 − β1.
        one_minus_beta1: f32,
        /// `β`: β2.
        beta2: f32,
        /// `c`: 1 − β2.
        one_minus_beta2: f32,
        /// The first moment's tensor.
        exp_avg: String,
    },
    /// Predictor 4 (since 1.9): a parameter one Adam(W) step before the base's,
    /// `p = (b − (h·m')/(√v'/r + e)) / d`. `b` is the base's element of this tensor, `m'` and
    /// `v'` those of tensors `exp_avg` and `exp_avg_sq` *in the base*: the moments of the step
    /// that led from this file to its base. The constants are predictor 2's for that step.
    AdamParameterReverse {
        /// `d`: 1 − lr·λ.
        decay: f32,
        /// `r`: √(1 − β2^t), t the base's step count.
        bias2_sqrt: f32,
        /// `e`: ε.
        eps: f32,
        /// `h`: −lr / (1 − β1^t).
        neg_step: f32,
        /// The base's first moment's tensor.
        exp_avg: String,
        /// The base's second moment's tensor (under `amsgrad`, its running maximum).
        exp_avg_sq: String,
    },
}

/// Where a prediction reads an operand (spec §6.8): this file, or its base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    /// A tensor of the file itself, decoded over the same elements first.
    File,
    /// A tensor of the file's base.
    Base,
}

impl Prediction {
    /// The predictor's code in the params.
    pub fn code(&self) -> u8 {
        match self {
            Prediction::AdamSecondMoment { .. } => 1,
            Prediction::AdamParameter { .. } => 2,
            Prediction::AdamSecondMomentReverse { .. } => 3,
            Prediction::AdamParameterReverse { .. } => 4,
        }
    }

    /// The first format minor version that defines this predictor.
    pub fn since_minor(&self) -> u16 {
        if self.is_reverse() {
            9
        } else {
            6
        }
    }

    /// Whether this predictor runs backwards in time: its base is the checkpoint after the file.
    pub fn is_reverse(&self) -> bool {
        self.code() >= 3
    }

    /// The constants, in the order the params store them.
    pub fn constants(&self) -> Vec<f32> {
        match *self {
            Prediction::AdamSecondMoment { one_minus_beta1, beta2, one_minus_beta2, .. }
            | Prediction::AdamSecondMomentReverse { one_minus_beta1, beta2, one_minus_beta2, .. } => {
                vec![one_minus_beta1, beta2, one_minus_beta2]
            }
            Prediction::AdamParameter { decay, bias2_sqrt, eps, neg_step, .. }
            | Prediction::AdamParameterReverse { decay, bias2_sqrt, eps, neg_step, .. } => {
                vec![decay, bias2_sqrt, eps, neg_step]
            }
        }
    }

    /// The names the params hold, in their order.
    pub fn names(&self) -> Vec<&str> {
        match self {
            Prediction::AdamSecondMoment { exp_avg, .. } | Prediction::AdamSecondMomentReverse { exp_avg, .. } => {
                vec![exp_avg]
            }
            Prediction::AdamParameter { exp_avg, exp_avg_sq, .. }
            | Prediction::AdamParameterReverse { exp_avg, exp_avg_sq, .. } => vec![exp_avg, exp_avg_sq],
        }
    }

    /// The prediction's two operands besides the base's element of its own tensor, in the order
    /// they are read (spec P8): the first moment the params name, then the other (the base's
    /// first moment under predictors 1 and 3, the second moment under 2 and 4), each with where
    /// it is read.
    pub fn operands(&self) -> [(&str, Operand); 2] {
        use Operand::{Base, File};
        match self {
            Prediction::AdamSecondMoment { exp_avg, .. } | Prediction::AdamSecondMomentReverse { exp_avg, .. } => {
                [(exp_avg, File), (exp_avg, Base)]
            }
            Prediction::AdamParameter { exp_avg, exp_avg_sq, .. } => [(exp_avg, File), (exp_avg_sq, File)],
            Prediction::AdamParameterReverse { exp_avg, exp_avg_sq, .. } => [(exp_avg, Base), (exp_avg_sq, Base)],
        }
    }

    /// The tensors of the same file the prediction reads, in the params' order.
    pub fn inputs(&self) -> Vec<&str> {
        self.operands().into_iter().filter(|(_, at)| *at == Operand::File).map(|(name, _)| name).collect()
    }

    /// The tensors of the base the prediction reads besides the base's tensor of the chunk's
    /// own name, in the params' order.
    pub fn base_inputs(&self) -> Vec<&str> {
        self.operands().into_iter().filter(|(_, at)| *at == Operand::Base).map(|(name, _)| name).collect()
    }

    /// The params bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![self.code()];
        for c in self.constants() {
            out.extend_from_slice(&c.to_bits().to_le_bytes());
        }
        for name in self.names() {
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
        }
        out
    }

    /// Parses a chunk's params (hand-written: a dozen bytes and a name or two, checked to the
    /// byte, do not need a parser library). The error says what is wrong.
    pub fn parse(params: &[u8]) -> Result<Prediction, String> {
        let mut at = params;
        let mut take = |n: usize, what: &str| -> Result<&[u8], String> {
            if at.len() < n {
                return Err(format!("the params end before {what}"));
            }
            let (head, rest) = at.split_at(n);
            at = rest;
            Ok(head)
        };
        let code = take(1, "the predictor")?[0];
        let (constants, count) = match code {
            1 | 3 => (3, 1),
            2 | 4 => (4, 2),
            _ => return Err(format!("predictor {code} is not 1, 2, 3 or 4")),
        };
        let mut k = Vec::with_capacity(4);
        for _ in 0..constants {
            let b = take(4, "a constant")?;
            k.push(f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]])));
        }
        let mut names = Vec::with_capacity(2);
        for _ in 0..count {
            let len = take(2, "a name's length")?;
            let len = u16::from_le_bytes([len[0], len[1]]) as usize;
            let name = std::str::from_utf8(take(len, "a name")?).map_err(|_| "a name is not UTF-8".to_owned())?;
            if name.is_empty() {
                return Err("a name is empty".into());
            }
            names.push(name.to_owned());
        }
        if !at.is_empty() {
            return Err(format!("{} bytes follow the params", at.len()));
        }
        Prediction::from_parts(code, &k, names)
    }

    /// The prediction of predictor `code` with `constants` and `names` in the params' order;
    /// an error says what does not fit (a predictor not 1-4, a count of constants or names
    /// other than its own).
    pub fn from_parts(code: u8, constants: &[f32], names: Vec<String>) -> Result<Prediction, String> {
        let count = names.len();
        let mut names = names.into_iter();
        let (exp_avg, exp_avg_sq) = (names.next(), names.next());
        let bad = || format!("predictor {code} with {} constants and {count} names", constants.len());
        if count > 2 {
            return Err(bad());
        }
        Ok(match (code, constants, exp_avg, exp_avg_sq) {
            (1 | 3, &[a, b, c], Some(exp_avg), None) => {
                let (one_minus_beta1, beta2, one_minus_beta2) = (a, b, c);
                match code {
                    1 => Prediction::AdamSecondMoment { one_minus_beta1, beta2, one_minus_beta2, exp_avg },
                    _ => Prediction::AdamSecondMomentReverse { one_minus_beta1, beta2, one_minus_beta2, exp_avg },
                }
            }
            (2 | 4, &[decay, bias2_sqrt, eps, neg_step], Some(exp_avg), Some(exp_avg_sq)) => match code {
                2 => Prediction::AdamParameter { decay, bias2_sqrt, eps, neg_step, exp_avg, exp_avg_sq },
                _ => Prediction::AdamParameterReverse { decay, bias2_sqrt, eps, neg_step, exp_avg, exp_avg_sq },
            },
            (1..=4, ..) => return Err(bad()),
            _ => return Err(format!("predictor {code} is not 1, 2, 3 or 4")),
        })
    }
}

/// R30: every `delta-predicted` chunk's params parse, its tensor and the tensors it reads are
/// `f32` of one shape, those tensors exist in the file, and no chain of tensors reading each
/// other loops or is longer than [`MAX_PREDICTION_DEPTH`].
pub fn validate_predictions(dir: &Directory) -> Result<(), FormatError> {
    let index: HashMap<&str, usize> = dir.tensors.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
    // The tensors each tensor's predictions read.
    let mut reads: Vec<Vec<usize>> = vec![Vec::new(); dir.tensors.len()];
    for (ti, t) in dir.tensors.iter().enumerate() {
        for (ci, c) in t.chunks.iter().enumerate().filter(|(_, c)| c.codec == CodecTag::DeltaPredicted) {
            let bad =
                |detail: String| FormatError::malformed("prediction", Position::chunk(&t.name, ci as u32), detail);
            let p = Prediction::parse(&c.params).map_err(bad)?;
            if t.dtype != DType::F32 {
                return Err(bad(format!("the tensor is {}; predictions are of f32 tensors", t.dtype)));
            }
            for name in p.inputs() {
                let &i =
                    index.get(name).ok_or_else(|| bad(format!("it reads tensor {name:?}, which the file lacks")))?;
                let input = &dir.tensors[i];
                if input.dtype != DType::F32 || input.shape != t.shape {
                    return Err(bad(format!(
                        "it reads tensor {name:?}, which is {} {:?}; the tensor is f32 {:?}",
                        input.dtype, input.shape, t.shape
                    )));
                }
                if !reads[ti].contains(&i) {
                    reads[ti].push(i);
                }
            }
        }
    }
    // Depth-first along the reads, each tensor explored once: `height[i]` is the longest chain of
    // predicted tensors from i, once known. The path is at most MAX_PREDICTION_DEPTH + 1 long,
    // so the search is bounded whatever the file.
    fn walk(
        reads: &[Vec<usize>],
        height: &mut [usize],
        path: &mut Vec<usize>,
        dir: &Directory,
    ) -> Result<(), FormatError> {
        let here = *path.last().expect("a path starts at a tensor");
        let names =
            |p: &[usize]| p.iter().map(|&i| format!("{:?}", dir.tensors[i].name)).collect::<Vec<_>>().join(" reads ");
        let mut tallest = 0;
        for &next in &reads[here] {
            if reads[next].is_empty() {
                continue;
            }
            let looped = path.contains(&next);
            path.push(next);
            let first = path[0];
            let at = || Position::tensor(&dir.tensors[first].name);
            if looped {
                return Err(FormatError::malformed(
                    "prediction",
                    at(),
                    format!("the predictions loop: {}", names(path)),
                ));
            }
            if height[next] == 0 && path.len() <= MAX_PREDICTION_DEPTH {
                walk(reads, height, path, dir)?;
            }
            if path.len() - 1 + height[next].max(1) > MAX_PREDICTION_DEPTH {
                let detail = format!("a chain of more than {MAX_PREDICTION_DEPTH} predicted tensors: {}", names(path));
                return Err(FormatError::malformed("prediction", at(), detail));
            }
            tallest = tallest.max(height[next]);
            path.pop();
        }
        height[here] = 1 + tallest;
        Ok(())
    }
    let mut height = vec![0; dir.tensors.len()];
    for ti in 0..dir.tensors.len() {
        if !reads[ti].is_empty() && height[ti] == 0 {
            walk(&reads, &mut height, &mut vec![ti], dir)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_round_trip_and_reject_what_the_spec_rejects() {
        let v = Prediction::AdamSecondMoment {
            one_minus_beta1: 0.1,
            beta2: 0.999,
            one_minus_beta2: 0.001,
            exp_avg: "optim/state/0/exp_avg".into(),
        };
        let w = Prediction::AdamParameter {
            decay: 0.9999995,
            bias2_sqrt: 0.0447,
            eps: 1e-8,
            neg_step: -5e-4,
            exp_avg: "m".into(),
            exp_avg_sq: "v".into(),
        };
        let v_rev = Prediction::AdamSecondMomentReverse {
            one_minus_beta1: 0.1,
            beta2: 0.999,
            one_minus_beta2: 0.001,
            exp_avg: "m".into(),
        };
        let w_rev = Prediction::AdamParameterReverse {
            decay: 0.99999,
            bias2_sqrt: 0.0447,
            eps: 1e-8,
            neg_step: -5e-4,
            exp_avg: "m".into(),
            exp_avg_sq: "v".into(),
        };
        for p in [&v, &w, &v_rev, &w_rev] {
            assert_eq!(&Prediction::parse(&p.to_bytes()).unwrap(), p);
        }
        assert_eq!((w_rev.inputs(), w_rev.base_inputs()), (vec![], vec!["m", "v"]), "predictor 4 reads the base only");
        assert_eq!((v_rev.inputs(), v_rev.base_inputs()), (vec!["m"], vec!["m"]));
        assert_eq!((w.inputs(), w.base_inputs()), (vec!["m", "v"], vec![]));
        assert_eq!(w_rev.to_bytes()[0], 4);
        assert_eq!((v.since_minor(), w.since_minor(), v_rev.since_minor(), w_rev.since_minor()), (6, 6, 9, 9));
        assert_eq!([&v, &w, &v_rev, &w_rev].map(|p| p.is_reverse()), [false, false, true, true]);
        let mut long = w.to_bytes();
        long.push(0);
        assert!(Prediction::parse(&long).unwrap_err().contains("follow"));
        let bytes = w.to_bytes();
        assert!(Prediction::parse(&bytes[..bytes.len() - 1]).is_err());
        assert!(Prediction::parse(&[5]).unwrap_err().contains("predictor 5"));
        assert!(Prediction::parse(&[3]).unwrap_err().contains("constant"));
        let names = |n: usize| (0..n).map(|i| format!("t{i}")).collect::<Vec<_>>();
        assert_eq!(Prediction::from_parts(4, &[1.0; 4], names(2)).unwrap().code(), 4);
        for (code, k, n) in [(1, 3, 2), (2, 4, 1), (3, 4, 1), (4, 4, 3), (4, 3, 2), (0, 3, 1)] {
            assert!(Prediction::from_parts(code, &vec![1.0; k], names(n)).is_err(), "{code} {k} {n}");
        }
        // A predictor 1-4 with the wrong counts is named as such, not as an unknown predictor.
        assert!(Prediction::from_parts(3, &[1.0; 4], names(1)).unwrap_err().contains("4 constants and 1 names"));
        let mut empty_name = vec![1u8];
        empty_name.extend_from_slice(&[0; 12]);
        empty_name.extend_from_slice(&[0, 0]);
        assert!(Prediction::parse(&empty_name).unwrap_err().contains("empty"));
    }

    /// A directory of f32 tensors listed in `order`, tensor i predicted (predictor 1) from each
    /// tensor `reads[i]` names, one chunk per name; a tensor that reads nothing is raw.
    fn predicted(reads: &[&[usize]], order: &[usize]) -> Directory {
        use crate::{ChunkEntry, TensorEntry};
        let chunk = |codec, params| ChunkEntry {
            element_start: 0,
            element_count: 1,
            offset: 64,
            stored_length: 4,
            decoded_length: 4,
            crc32: 0,
            codec,
            params,
        };
        let tensors = order
            .iter()
            .map(|&i| {
                let mut chunks: Vec<_> = reads[i]
                    .iter()
                    .map(|r| {
                        let p = Prediction::AdamSecondMoment {
                            one_minus_beta1: 0.1,
                            beta2: 0.999,
                            one_minus_beta2: 0.001,
                            exp_avg: format!("t{r}"),
                        };
                        chunk(CodecTag::DeltaPredicted, p.to_bytes())
                    })
                    .collect();
                if chunks.is_empty() {
                    chunks.push(chunk(CodecTag::Raw, Vec::new()));
                }
                TensorEntry {
                    name: format!("t{i}"),
                    dtype: DType::F32,
                    shape: vec![1],
                    byte_length: 4,
                    digest: [0; 32],
                    chunks,
                }
            })
            .collect();
        Directory { tensors, ..Directory::default() }
    }

    #[test]
    fn chains_are_bounded_and_loops_found_in_any_listing_order() {
        // t0 reads t1 ... reads t(k-1), which reads t(k), a plain tensor: a chain of k.
        let chain = |k: usize| -> Vec<&'static [usize]> {
            const NEXT: [&[usize]; 7] = [&[1], &[2], &[3], &[4], &[5], &[6], &[]];
            let mut r = NEXT[..k].to_vec();
            r.push(&[]);
            r
        };
        let orders = |n: usize| -> Vec<Vec<usize>> {
            let forward: Vec<usize> = (0..n).collect();
            let mut orders: Vec<Vec<usize>> =
                (0..n).map(|s| forward[s..].iter().chain(&forward[..s]).copied().collect()).collect();
            orders.push(forward.into_iter().rev().collect());
            orders
        };
        for order in orders(MAX_PREDICTION_DEPTH + 1) {
            validate_predictions(&predicted(&chain(MAX_PREDICTION_DEPTH), &order)).expect("a chain at the limit");
        }
        for order in orders(MAX_PREDICTION_DEPTH + 2) {
            let e = validate_predictions(&predicted(&chain(MAX_PREDICTION_DEPTH + 1), &order)).unwrap_err();
            assert!(e.to_string().contains("a chain of more than 4"), "{order:?}: {e}");
        }
        // Two chains of 3 into one tensor, and one of 2 beside: heights are kept per tensor.
        let joined: [&[usize]; 6] = [&[1], &[2], &[], &[4], &[1], &[2]];
        for order in orders(6) {
            validate_predictions(&predicted(&joined, &order)).expect("no chain over 4");
        }
        let looped: [&[usize]; 4] = [&[1], &[2], &[0], &[0]];
        for order in orders(4) {
            let e = validate_predictions(&predicted(&looped, &order)).unwrap_err();
            assert!(e.to_string().contains("the predictions loop"), "{order:?}: {e}");
        }
    }

    #[test]
    fn a_wide_lattice_is_walked_once() {
        // Five layers of 256 tensors, each predicted from every tensor of the layer below (256
        // chunks each): chains of 4, 256^3 paths from each top tensor. Each tensor's height is
        // found once, so this takes milliseconds; a walk that went down every path again would
        // not end (the chunk limits allow a file like this).
        const W: usize = 256;
        let layers: Vec<Vec<usize>> = (0..5).map(|l| (l * W..(l + 1) * W).collect()).collect();
        let reads: Vec<&[usize]> =
            (0..5 * W).map(|i| if i / W < 4 { &layers[i / W + 1][..] } else { &[][..] }).collect();
        let order: Vec<usize> = (0..5 * W).collect();
        validate_predictions(&predicted(&reads, &order)).expect("chains of 4");
    }
}
