//! `tpde demo`: makes a checkpoint shaped like a small decoder-only transformer mid-training
//! (bf16 weights, fp32 AdamW moments, an integer step counter), writes it as safetensors,
//! then packs, inspects, verifies and unpacks it, and checks the round trip bit for bit.
//!
//! The values are drawn from the distributions such checkpoints have (weights ~ N(0, 0.02),
//! norms near 1, first moments ~ N(0, 1e-4), second moments their squares), so the sizes the
//! demo prints are indicative; the benchmarks in the README use real checkpoints.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use safetensors::Dtype;

use crate::CliError;

/// The shape of the generated model.
#[derive(Clone, Copy, Debug)]
pub struct DemoModel {
    /// Vocabulary size.
    pub vocab: usize,
    /// Model width.
    pub d_model: usize,
    /// Feed-forward width.
    pub d_ff: usize,
    /// Number of layers.
    pub layers: usize,
}

impl Default for DemoModel {
    fn default() -> Self {
        DemoModel { vocab: 8192, d_model: 256, d_ff: 704, layers: 4 }
    }
}

struct Owned {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl safetensors::View for &Owned {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        (&self.data[..]).into()
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn f32_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(f32::to_le_bytes).collect()
}

/// Writes the demo checkpoint as a safetensors file; returns its logical byte count.
pub fn write_checkpoint(m: DemoModel, step: u64, seed: u64, path: &Path) -> Result<u64, CliError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut params: Vec<(String, Vec<usize>, bool)> =
        vec![("model.embed_tokens.weight".into(), vec![m.vocab, m.d_model], false)];
    for l in 0..m.layers {
        let p = format!("model.layers.{l}");
        for proj in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            params.push((format!("{p}.self_attn.{proj}.weight"), vec![m.d_model, m.d_model], false));
        }
        params.push((format!("{p}.mlp.gate_proj.weight"), vec![m.d_ff, m.d_model], false));
        params.push((format!("{p}.mlp.up_proj.weight"), vec![m.d_ff, m.d_model], false));
        params.push((format!("{p}.mlp.down_proj.weight"), vec![m.d_model, m.d_ff], false));
        params.push((format!("{p}.input_layernorm.weight"), vec![m.d_model], true));
        params.push((format!("{p}.post_attention_layernorm.weight"), vec![m.d_model], true));
    }
    params.push(("model.norm.weight".into(), vec![m.d_model], true));
    params.push(("lm_head.weight".into(), vec![m.vocab, m.d_model], false));

    let weight = Normal::new(0.0f32, 0.02).expect("valid");
    let moment = Normal::new(0.0f32, 1e-4).expect("valid");
    let mut tensors: Vec<(String, Owned)> = Vec::new();
    for (name, shape, is_norm) in params {
        let n: usize = shape.iter().product();
        let w: Vec<u8> = (0..n)
            .flat_map(|_| {
                let x = if is_norm { 1.0 + rng.gen_range(-0.05..0.05) } else { weight.sample(&mut rng) };
                bf16::from_f32(x).to_le_bytes()
            })
            .collect();
        let m1: Vec<f32> = (0..n).map(|_| moment.sample(&mut rng)).collect();
        let m2 = f32_bytes(m1.iter().map(|g| g * g * rng.gen_range(0.5f32..2.0) + 1e-12));
        tensors.push((
            format!("optimizer.exp_avg.{name}"),
            Owned { dtype: Dtype::F32, shape: shape.clone(), data: f32_bytes(m1.into_iter()) },
        ));
        tensors.push((
            format!("optimizer.exp_avg_sq.{name}"),
            Owned { dtype: Dtype::F32, shape: shape.clone(), data: m2 },
        ));
        tensors.push((name, Owned { dtype: Dtype::BF16, shape, data: w }));
    }
    tensors.push((
        "optimizer.step".into(),
        Owned { dtype: Dtype::I64, shape: vec![], data: (step as i64).to_le_bytes().to_vec() },
    ));
    let logical = tensors.iter().map(|(_, t)| t.data.len() as u64).sum();
    let meta = HashMap::from([("format".to_string(), "pt".to_string()), ("step".to_string(), step.to_string())]);
    safetensors::serialize_to_file(tensors.iter().map(|(n, t)| (n.as_str(), t)), Some(meta), path)
        .map_err(|e| CliError::failed(format!("{}: {e}", path.display())))?;
    Ok(logical)
}

/// Where the demo puts its files: `dir`, or a fresh temporary directory.
pub fn workdir(dir: Option<PathBuf>) -> Result<(PathBuf, Option<tempfile::TempDir>), CliError> {
    match dir {
        Some(d) => {
            std::fs::create_dir_all(&d)?;
            Ok((d, None))
        }
        None => {
            let t = tempfile::tempdir()?;
            Ok((t.path().to_path_buf(), Some(t)))
        }
    }
}
