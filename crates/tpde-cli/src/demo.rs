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

use std::time::Instant;

use indicatif::HumanBytes;
use tpde::codec::Encoder;
use tpde::write::WriteOptions;
use tpde::{open, series, verify as against};

use crate::{out, outln, progress_bar, ratio, CliError};

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

impl DemoModel {
    /// A model of about `bytes` of checkpoint (bf16 weights and two f32 Adam moments, 10 bytes
    /// a parameter): the default's vocabulary with wider layers, as many as it takes; never
    /// smaller than one such layer.
    pub fn sized(bytes: u64) -> DemoModel {
        let (vocab, d_model, d_ff) = (8192, 1024, 2816);
        let params = bytes / 10;
        let fixed = 2 * vocab * d_model + d_model;
        let per_layer = 4 * d_model * d_model + 3 * d_model * d_ff + 2 * d_model;
        let layers = (params.saturating_sub(fixed as u64) as f64 / per_layer as f64).round().max(1.0) as usize;
        DemoModel { vocab, d_model, d_ff, layers }
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

/// A tiny language model the demo really trains: each byte of text predicts the next through
/// an embedding (256 × `width`) and an output matrix (`width` × 256), with AdamW, as a training
/// loop would. Its checkpoints (weights, both AdamW moments, the step) are what TPDE is for: a
/// series of states a few steps apart.
pub struct TinyModel {
    width: usize,
    /// Embedding, then output matrix, row-major; each parameter with its AdamW moments.
    params: [Vec<f32>; 2],
    exp_avg: [Vec<f32>; 2],
    exp_avg_sq: [Vec<f32>; 2],
    step: u64,
}

impl TinyModel {
    /// A model of the given width, weights ~ N(0, 0.02) from `seed`.
    pub fn new(width: usize, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let init = Normal::new(0.0f32, 0.02).expect("valid");
        let mut draw = |n: usize| (0..n).map(|_| init.sample(&mut rng)).collect::<Vec<f32>>();
        let params = [draw(256 * width), draw(width * 256)];
        let zeros = [vec![0.0; 256 * width], vec![0.0; width * 256]];
        TinyModel { width, params, exp_avg: zeros.clone(), exp_avg_sq: zeros, step: 0 }
    }

    /// One AdamW step (lr 3e-3, betas 0.9/0.999, weight decay 0.01) on `batch` (current byte,
    /// next byte) pairs; returns the batch's mean cross-entropy in nats.
    pub fn train_step(&mut self, batch: &[(u8, u8)]) -> f32 {
        let w = self.width;
        let mut grads = [vec![0.0f32; 256 * w], vec![0.0f32; w * 256]];
        let mut loss = 0.0;
        for &(x, y) in batch {
            let e = &self.params[0][x as usize * w..(x as usize + 1) * w];
            let mut logits = [0.0f32; 256];
            for (k, ek) in e.iter().enumerate() {
                for (l, o) in logits.iter_mut().zip(&self.params[1][k * 256..(k + 1) * 256]) {
                    *l += ek * o;
                }
            }
            let max = logits.iter().cloned().fold(f32::MIN, f32::max);
            let sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
            loss += sum.ln() + max - logits[y as usize];
            // d loss / d logits = softmax - onehot.
            let mut d: Vec<f32> = logits.iter().map(|l| (l - max).exp() / sum).collect();
            d[y as usize] -= 1.0;
            for k in 0..w {
                let row = &self.params[1][k * 256..(k + 1) * 256];
                grads[0][x as usize * w + k] += row.iter().zip(&d).map(|(o, g)| o * g).sum::<f32>();
                for (g, dj) in grads[1][k * 256..(k + 1) * 256].iter_mut().zip(&d) {
                    *g += e[k] * dj;
                }
            }
        }
        self.step += 1;
        let (lr, b1, b2, eps, wd) = (3e-3f32, 0.9f32, 0.999f32, 1e-8f32, 0.01f32);
        let (c1, c2) = (1.0 - b1.powi(self.step as i32), 1.0 - b2.powi(self.step as i32));
        let n = batch.len() as f32;
        let (params, moments) = (self.params.iter_mut(), self.exp_avg.iter_mut().zip(self.exp_avg_sq.iter_mut()));
        for ((param, (exp_avg, exp_avg_sq)), grad) in params.zip(moments).zip(&grads) {
            for (((p, m), v), g) in param.iter_mut().zip(exp_avg.iter_mut()).zip(exp_avg_sq.iter_mut()).zip(grad) {
                let g = g / n;
                *m = b1 * *m + (1.0 - b1) * g;
                *v = b2 * *v + (1.0 - b2) * g * g;
                *p = *p * (1.0 - lr * wd) - lr * (*m / c1) / ((*v / c2).sqrt() + eps);
            }
        }
        loss / n
    }

    /// Writes the training state as a safetensors file; returns its logical byte count.
    pub fn save(&self, path: &Path) -> Result<u64, CliError> {
        let w = self.width;
        let shapes = [vec![256, w], vec![w, 256]];
        let names = ["embed.weight", "out.weight"];
        let mut tensors: Vec<(String, Owned)> = Vec::new();
        for i in 0..2 {
            let t = |data: &[f32]| Owned {
                dtype: Dtype::F32,
                shape: shapes[i].clone(),
                data: f32_bytes(data.iter().copied()),
            };
            tensors.push((format!("model.{}", names[i]), t(&self.params[i])));
            tensors.push((format!("optimizer.exp_avg.{}", names[i]), t(&self.exp_avg[i])));
            tensors.push((format!("optimizer.exp_avg_sq.{}", names[i]), t(&self.exp_avg_sq[i])));
        }
        let step = Owned { dtype: Dtype::I64, shape: vec![], data: (self.step as i64).to_le_bytes().to_vec() };
        tensors.push(("optimizer.step".into(), step));
        let logical = tensors.iter().map(|(_, t)| t.data.len() as u64).sum();
        let meta = HashMap::from([("step".to_string(), self.step.to_string())]);
        safetensors::serialize_to_file(tensors.iter().map(|(n, t)| (n.as_str(), t)), Some(meta), path)
            .map_err(|e| CliError::failed(format!("{}: {e}", path.display())))?;
        Ok(logical)
    }
}

/// The text the demo model learns from: TPDE's own specification.
pub const TRAINING_TEXT: &str = include_str!("../../../spec/tpde-v1.md");

/// Trains a [`TinyModel`] for `steps` steps on [`TRAINING_TEXT`] (batches of 256 byte pairs
/// drawn from `seed`), saving `DIR/stepNNNNNN.safetensors` every `every` steps. Returns each
/// checkpoint's (step, loss at that step, path, logical bytes).
pub fn train_checkpoints(
    dir: &Path,
    width: usize,
    steps: u64,
    every: u64,
    seed: u64,
) -> Result<Vec<(u64, f32, PathBuf, u64)>, CliError> {
    let text = TRAINING_TEXT.as_bytes();
    let mut model = TinyModel::new(width, seed);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x7064_6500);
    let mut out = Vec::new();
    for step in 1..=steps {
        let batch: Vec<(u8, u8)> = (0..256)
            .map(|_| {
                let i = rng.gen_range(0..text.len() - 1);
                (text[i], text[i + 1])
            })
            .collect();
        let loss = model.train_step(&batch);
        if step % every == 0 {
            let path = dir.join(format!("step{step:06}.safetensors"));
            let logical = model.save(&path)?;
            out.push((step, loss, path, logical));
        }
    }
    Ok(out)
}

/// `tpde demo`: trains, packs as a series, prints the sizes, restores the newest through its
/// chain and checks it bit for bit.
pub fn run(dir: Option<PathBuf>) -> Result<(), CliError> {
    let (work, temp) = workdir(dir)?;
    let (train, packed) = (work.join("checkpoints"), work.join("packed"));
    std::fs::create_dir_all(&train)?;

    let t = Instant::now();
    let ckpts = train_checkpoints(&train, 128, 60, 10, 7)?;
    outln!(
        "Trained a tiny byte-level language model (2 x 32768 f32 weights, AdamW) for 60 steps on TPDE's\n\
         spec, saving weights + Adam moments + step every 10 steps as safetensors ({:.1} s).\n",
        t.elapsed().as_secs_f64()
    )?;

    let opts = WriteOptions { encoder: Encoder::Auto, ..WriteOptions::default() };
    let bar = progress_bar(0, "packing");
    let series = series::pack_series(&train, &packed.clone().into(), 10, opts, None, None, &bar)?;
    outln!("| step | loss | safetensors | zstd -3 | tpde | stored as |\n|---:|---:|---:|---:|---:|---|")?;
    let (mut st_total, mut zstd_total, mut tpde_total) = (0, 0, 0);
    for ((step, loss, path, _), e) in ckpts.iter().zip(&series) {
        let st_bytes = std::fs::metadata(path)?.len();
        let zstd_bytes = zstd::bulk::compress(&std::fs::read(path)?, 3)?.len() as u64;
        let kind = if e.keyframe { "keyframe".to_string() } else { format!("delta on step {}", step - 10) };
        outln!(
            "| {step} | {loss:.3} | {} | {} | {} | {kind} |",
            HumanBytes(st_bytes),
            HumanBytes(zstd_bytes),
            HumanBytes(e.report.file_bytes)
        )?;
        st_total += st_bytes;
        zstd_total += zstd_bytes;
        tpde_total += e.report.file_bytes;
    }
    outln!(
        "| all | | {} | {} ({:.3}) | {} ({:.3}) | |\n",
        HumanBytes(st_total),
        HumanBytes(zstd_total),
        ratio(zstd_total, st_total),
        HumanBytes(tpde_total),
        ratio(tpde_total, st_total)
    )?;

    // Restore the last step through its chain (keyframe + deltas), and compare bit for bit.
    let (last, _, last_src, _) = ckpts.last().expect("60 steps give 6 checkpoints");
    let last_tpde = &series.last().expect("one file per checkpoint").output;
    outln!("$ tpde inspect {last_tpde}   (the summary; the full table lists each tensor)")?;
    let r = tpde::read::Reader::from_source(last_tpde.open()?)?;
    let summary = crate::inspect::render_text(&crate::inspect::report(&last_tpde.to_string(), &r, false), false);
    out!("{}", summary.lines().take(6).map(|l| format!("  {l}\n")).collect::<String>())?;
    outln!("$ tpde verify {last_tpde}")?;
    out!("  ")?;
    crate::cli::verify(last_tpde, None, &open::OpenOptions::default())?;
    let back = work.join("restored.safetensors");
    let bar = progress_bar(0, "unpacking");
    let u = tpde::unpack(last_tpde, None, &back, &bar)?;
    let diff = against::compare_safetensors(last_src, &back)?;
    match &diff {
        None => outln!(
            "Restored step {last} from its keyframe and {} deltas in {:.3} s: all {} tensors bit-exact.",
            series.len() - 1,
            u.seconds,
            u.tensors
        )?,
        Some(d) => outln!("Restored step {last}: MISMATCH: {d}")?,
    }
    if let Some(d) = diff {
        return Err(CliError::failed(format!("round trip is not bit-exact: {d}")));
    }
    match temp {
        None => {
            outln!("Files kept in {}: the safetensors in checkpoints/, the TPDE files in packed/.", work.display())?
        }
        Some(_) => outln!("The files were in a temporary folder, now removed; `tpde demo --dir DIR` keeps them.")?,
    }
    Ok(())
}
