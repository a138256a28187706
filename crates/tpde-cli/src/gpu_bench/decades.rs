//! `tpde bench-gpu --decades MB`: the GPU decoder at each size decade (about 1 MB, 16 MB,
//! 256 MB, then MB), for bf16 and fp32 keyframes, a near-empty bf16 delta and the layer loader;
//! each timed whole (host memory to tensors in device buffers), in the decode kernels alone
//! (GPU timestamps), and on the CPU reader (every tensor into new host memory, one parallel
//! pass over all chunks), in one run. The tensors are weight-like, N(0, 0.02), at most 16 MiB
//! each, named as layers; the delta changes one element in 10 000 by its last bit.

use std::path::Path;
use std::sync::Arc;

use half::bf16;
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use tpde::codec::Encoder;
use tpde::read::Reader;
use tpde::safetensors::SafetensorsFile;
use tpde_gpu::Gpu;

use super::{kernel_times, layer_loader_secs, median_secs, pack, resident, Row};
use crate::{ratio, CliError};

/// The decades up to `top` bytes, then `top` itself.
fn sizes(top: u64) -> Vec<u64> {
    let mut s: Vec<u64> = [1_000_000, 16_000_000, 256_000_000].into_iter().filter(|&s| s < top).collect();
    s.push(top);
    s
}

/// Measures every decade up to `top` bytes; the files go to `work` and are removed after.
pub fn run(gpu: &Gpu, top: u64, runs: usize, work: &Path) -> Result<Vec<Row>, CliError> {
    // A device of its own times the kernels: it waits for each batch, which would slow the rest.
    let timed = Gpu::with_kernel_timing().ok();
    let mut rows = Vec::new();
    for size in sizes(top) {
        let mb = format!("{:.0} MB", size as f64 / 1e6);
        for (dtype, name) in [(Dtype::BF16, "bf16"), (Dtype::F32, "fp32")] {
            let base_path = work.join(format!("decade-{size}-{name}.safetensors"));
            write(&base_path, dtype, &weights(size, dtype))?;
            let base = Arc::new(SafetensorsFile::open(&base_path)?);
            let bf16 = dtype == Dtype::BF16;
            rows.extend(measure(gpu, timed.as_ref(), format!("{mb} {name} keyframe"), &base, None, bf16, runs)?);
            if bf16 {
                let next_path = work.join(format!("decade-{size}-{name}-next.safetensors"));
                write(&next_path, dtype, &nudged(&base))?;
                let next = SafetensorsFile::open(&next_path)?;
                let what = format!("{mb} {name} near-empty delta");
                rows.extend(measure(gpu, timed.as_ref(), what, &next, Some(base.clone()), false, runs)?);
                std::fs::remove_file(&next_path)?;
            }
            std::fs::remove_file(&base_path)?;
        }
    }
    Ok(rows)
}

/// Weight-like tensors of about `size` bytes in all, at most 16 MiB each.
fn weights(size: u64, dtype: Dtype) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let width = if dtype == Dtype::BF16 { 2 } else { 4 };
    let count = size.div_ceil(16 << 20).max(1);
    let elements = (size / count / width as u64).max(1) as usize;
    (0..count)
        .into_par_iter()
        .map(|k| {
            let mut rng = StdRng::seed_from_u64(k);
            let normal = Normal::new(0.0f32, 0.02).expect("valid");
            let data: Vec<u8> = match dtype {
                Dtype::BF16 => {
                    (0..elements).flat_map(|_| bf16::from_f32(normal.sample(&mut rng)).to_le_bytes()).collect()
                }
                _ => (0..elements).flat_map(|_| normal.sample(&mut rng).to_le_bytes()).collect(),
            };
            (format!("layers.{k}.weight"), vec![elements], data)
        })
        .collect()
}

/// `base`'s tensors with one element in 10 000 changed in its last bit.
fn nudged(base: &SafetensorsFile) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    base.tensors()
        .map(|(name, dtype, shape, data)| {
            let mut data = data.to_vec();
            let width = dtype.size() as usize;
            for at in (0..data.len()).step_by(width * 10_000) {
                data[at] ^= 1;
            }
            (name.to_string(), shape.iter().map(|&d| d as usize).collect(), data)
        })
        .collect()
}

fn write(path: &Path, dtype: Dtype, tensors: &[(String, Vec<usize>, Vec<u8>)]) -> Result<(), CliError> {
    let views = tensors
        .iter()
        .map(|(name, shape, data)| Ok((name.as_str(), TensorView::new(dtype, shape.clone(), data)?)))
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()
        .map_err(|e| CliError::failed(format!("{}: {e}", path.display())))?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| CliError::failed(format!("{}: {e}", path.display())))
}

/// One row: `st` packed `auto` (a delta against `base_st`, if given), decoded whole on `gpu`, in
/// `timed`'s kernels alone, and on the CPU reader; and with `layers`, a row of the layer loader
/// over the same file.
fn measure(
    gpu: &Gpu,
    timed: Option<&Gpu>,
    what: String,
    st: &SafetensorsFile,
    base_st: Option<Arc<SafetensorsFile>>,
    layers: bool,
    runs: usize,
) -> Result<Vec<Row>, CliError> {
    let logical: u64 = st.tensors().map(|t| t.3.len() as u64).sum();
    let gb_s = |secs: f64| logical as f64 / secs / 1e9;
    let bytes = pack(st, base_st.as_deref(), Encoder::Auto)?;
    let stored = bytes.len() as u64;
    let mut reader = Reader::from_source(bytes)?;
    let base_ck = base_st.as_ref().map(|b| resident(gpu, b)).transpose()?;
    let whole = median_secs(runs, || {
        drop(gpu.load(&reader, base_ck.as_ref())?);
        gpu.synchronize()?;
        Ok(())
    })?;
    drop(base_ck);
    let layers = if layers { Some(layer_loader_secs(gpu, &reader, runs)?) } else { None };
    let kernels = match timed {
        Some(t) => {
            let base_ck = base_st.as_ref().map(|b| resident(t, b)).transpose()?;
            kernel_times(t, &reader, base_ck.as_ref(), runs)?
        }
        None => None,
    };
    if let Some(b) = base_st {
        reader = reader.with_base(b)?;
    }
    let cpu = median_secs(runs, || {
        let mut outs: Vec<Vec<u8>> = reader.tensors().iter().map(|t| vec![0u8; t.byte_length as usize]).collect();
        let jobs = reader.tensors().iter().zip(outs.iter_mut()).map(|(t, o)| (t, &mut o[..])).collect();
        reader.read_many_into(jobs)?;
        std::hint::black_box(outs);
        Ok(())
    })?;
    let layers =
        layers.map(|secs| Row { what: format!("{what}, LayerLoader"), gpu_gb_s: Some(gb_s(secs)), ..Row::default() });
    let whole = Row {
        what,
        ratio: Some(ratio(stored, logical)),
        gpu_gb_s: Some(gb_s(whole)),
        kernels_gb_s: kernels.as_ref().map(|k| k.total().as_secs_f64()).filter(|&s| s > 0.0).map(gb_s),
        cpu_gb_s: Some(gb_s(cpu)),
        note: kernels.map(|k| format!("  kernels: {}", super::shares(&k))),
    };
    Ok([Some(whole), layers].into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn decades_end_at_the_top_size() {
        assert_eq!(super::sizes(1_000_000), [1_000_000]);
        assert_eq!(super::sizes(1_024_000_000), [1_000_000, 16_000_000, 256_000_000, 1_024_000_000]);
        assert_eq!(super::sizes(100_000_000), [1_000_000, 16_000_000, 100_000_000]);
    }
}
