//! `tpde bench-gpu`: decode throughput of the GPU decoder per codec, side by side in one run
//! with plain host-to-device uploads of the uncompressed tensors (wgpu's `write_buffer`, and the
//! decoder's own host path: buffers mapped at creation, filled by every core) and with the CPU
//! reader.
//!
//! Every figure is the median of `runs` wall-clock timings in GB/s (10^9 bytes) of logical
//! tensor bytes. A GPU decode is timed from the memory-mapped file to every tensor resident on
//! the device (host planning, CRCs, upload, kernels, waiting for them); the upload row is
//! `queue.write_buffer` of the uncompressed bytes and the same wait. The CPU reader decodes
//! into host memory on all cores. Files are packed in memory first, so no disk is timed. The
//! last rows time the layer loader over an `auto` keyframe and a chain (a keyframe, then a
//! delta decoded on it), in GB/s of the final checkpoint's logical bytes. The "kernels alone"
//! rows sum the decode kernels' own device time (GPU timestamps), with each kernel's share:
//! where they are far above the whole-decode rows, the host work and uploads bound the decode.

use std::path::Path;
use std::time::Instant;

use tpde::codec::Encoder;
use tpde::format::CodecTag;
use tpde::read::{Base, Reader};
use tpde::write::{WriteOptions, Writer, DEFAULT_CHUNK_BYTES};
use tpde_gpu::timing::KernelTimes;
use tpde_gpu::wgpu;
use tpde_gpu::{DeviceCheckpoint, Gpu, LayerLoader};

mod decades;
pub use decades::run as decades;

use crate::{ratio, CliError};
use tpde::safetensors::SafetensorsFile;

/// One row of the results.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// What was measured.
    pub what: String,
    /// Stored bytes / logical bytes, where it applies.
    pub ratio: Option<f64>,
    /// GPU GB/s.
    pub gpu_gb_s: Option<f64>,
    /// GPU GB/s of the decode kernels alone (their own device time).
    pub kernels_gb_s: Option<f64>,
    /// CPU reader GB/s.
    pub cpu_gb_s: Option<f64>,
    /// A line printed under the row (the kernels' split of their time).
    pub note: Option<String>,
}

fn median_secs(runs: usize, mut f: impl FnMut() -> Result<(), CliError>) -> Result<f64, CliError> {
    f()?;
    let mut t = Vec::with_capacity(runs);
    for _ in 0..runs {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

fn pack(st: &SafetensorsFile, base: Option<&SafetensorsFile>, encoder: Encoder) -> Result<Vec<u8>, CliError> {
    let base_ref = match base {
        Some(b) => Some(tpde::format::BaseRef { digest: b.content_digest()?, path_hint: String::new() }),
        None => None,
    };
    // As `tpde pack` writes them: `auto` in a 1.10 file, with rANS blocks (spec §6.2.6).
    let min_minor_version = if encoder == Encoder::Auto { tpde::codec::planes::CONTEXT_BLOCKS_SINCE_MINOR } else { 0 };
    let opts = WriteOptions {
        encoder,
        chunk_bytes: DEFAULT_CHUNK_BYTES,
        base: base_ref,
        min_minor_version,
        ..WriteOptions::default()
    };
    let mut w = Writer::new(Vec::new(), opts)?;
    for (name, dtype, shape, data) in st.tensors() {
        let bt = base.and_then(|b| b.tensors().find(|t| t.0 == name)).filter(|t| t.1 == dtype && t.2 == shape);
        match bt {
            Some(bt) => w.add_tensor_delta(name, dtype, shape, data, bt.3)?,
            None => w.add_tensor(name, dtype, shape, data)?,
        };
    }
    Ok(w.finish()?)
}

/// `st` uploaded whole to `gpu`: a base for the deltas decoded there.
fn resident(gpu: &Gpu, st: &SafetensorsFile) -> Result<DeviceCheckpoint, CliError> {
    let tensors = st.tensors().map(|(n, d, s, x)| gpu.upload(n, d, s, x)).collect::<Result<Vec<_>, _>>()?;
    Ok(DeviceCheckpoint::new(st.content_digest()?, tensors))
}

/// Measures `input` (and deltas against `base`, if given) on `gpu`.
pub fn run(gpu: &Gpu, input: &Path, base: Option<&Path>, runs: usize) -> Result<Vec<Row>, CliError> {
    let st = SafetensorsFile::open(input)?;
    let base_st = base.map(SafetensorsFile::open).transpose()?;
    let logical: u64 = st.tensors().map(|t| t.3.len() as u64).sum();
    let gb_s = |secs: f64| logical as f64 / secs / 1e9;
    let mut rows = Vec::new();

    // The uncompressed tensors uploaded as a wgpu user would (write_buffer: a copy on the
    // calling thread into wgpu's staging), then through the decoder's host path.
    let secs = median_secs(runs, || {
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        let ts: Vec<_> = st
            .tensors()
            .map(|(name, _, _, b)| {
                let size = (b.len() as u64).next_multiple_of(4).max(4);
                let d = gpu.device();
                let buffer = d.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(name),
                    size,
                    usage,
                    mapped_at_creation: false,
                });
                gpu.queue().write_buffer(&buffer, 0, &b[..b.len() / 4 * 4]);
                buffer
            })
            .collect();
        gpu.synchronize()?;
        drop(ts);
        Ok(())
    })?;
    rows.push(Row { what: "upload, write_buffer".into(), gpu_gb_s: Some(gb_s(secs)), ..Row::default() });
    let secs = median_secs(runs, || {
        let ts = st.tensors().map(|(n, d, s, b)| gpu.upload(n, d, s, b)).collect::<Result<Vec<_>, _>>()?;
        gpu.synchronize()?;
        drop(ts);
        Ok(())
    })?;
    rows.push(Row { what: "upload, mapped, every core".into(), gpu_gb_s: Some(gb_s(secs)), ..Row::default() });

    let base_ck = base_st.as_ref().map(|b| resident(gpu, b)).transpose()?;
    let mut cases: Vec<(String, Encoder, bool)> = vec![
        ("raw".into(), Encoder::Raw, false),
        ("zstd -3 (CPU-decoded, uploaded)".into(), Encoder::Zstd { level: 3 }, false),
        ("planes (serial rANS on the CPU)".into(), Encoder::Codec(CodecTag::Planes), false),
        ("auto (lane and context forms)".into(), Encoder::Auto, false),
    ];
    if base_st.is_some() {
        cases.push(("delta, auto-serial".into(), Encoder::AutoSerial, true));
        cases.push(("delta, auto".into(), Encoder::Auto, true));
        cases.push(("delta, sparse-packed-lanes".into(), Encoder::Codec(CodecTag::SparsePackedLanes), true));
    }
    for (label, encoder, delta) in cases {
        let bytes = pack(&st, if delta { base_st.as_ref() } else { None }, encoder)?;
        let stored = bytes.len() as u64;
        let mut reader = Reader::from_source(bytes)?;
        let secs = median_secs(runs, || {
            let ck = gpu.load(&reader, if delta { base_ck.as_ref() } else { None })?;
            gpu.synchronize()?;
            drop(ck);
            Ok(())
        })?;
        let gpu_gb_s = Some(gb_s(secs));
        if let (true, Some(b)) = (delta, &base) {
            let cpu_base = SafetensorsFile::open(b)?;
            reader = reader.with_base(std::sync::Arc::new(cpu_base))?;
        }
        let cpu = median_secs(runs, || {
            for t in reader.tensors() {
                std::hint::black_box(reader.read_tensor(t)?);
            }
            Ok(())
        })?;
        rows.push(Row {
            what: label,
            ratio: Some(ratio(stored, logical)),
            gpu_gb_s,
            kernels_gb_s: None,
            cpu_gb_s: Some(gb_s(cpu)),
            note: None,
        });
    }

    // The layer loader: each layer decoded when asked for, the next one's host work and upload
    // overlapping it. Near the whole-file `auto` row when the overlap hides the host work.
    let keyframe = Reader::from_source(pack(&st, None, Encoder::Auto)?)?;
    let secs = layer_loader_secs(gpu, &keyframe, runs)?;
    rows.push(Row {
        what: "auto, layer by layer (LayerLoader)".into(),
        ratio: None,
        gpu_gb_s: Some(gb_s(secs)),
        kernels_gb_s: None,
        cpu_gb_s: None,
        note: None,
    });

    // A chain from its keyframe: the base decoded on the device, then the delta on it, as a
    // resume from the end of a chain does.
    if let Some(b) = &base_st {
        let base_file = Reader::from_source(pack(b, None, Encoder::Auto)?)?;
        let delta = Reader::from_source(pack(&st, Some(b), Encoder::Auto)?)?;
        let secs = median_secs(runs, || {
            let base_ck = gpu.load(&base_file, None)?;
            let ck = gpu.load(&delta, Some(&base_ck))?;
            gpu.synchronize()?;
            drop((ck, base_ck));
            Ok(())
        })?;
        rows.push(Row {
            what: "chain: keyframe, then delta (auto)".into(),
            ratio: None,
            gpu_gb_s: Some(gb_s(secs)),
            kernels_gb_s: None,
            cpu_gb_s: None,
            note: None,
        });
    }
    rows.extend(kernels_alone(&st, base_st.as_ref(), runs)?);
    Ok(rows)
}

/// The decode kernels' own device time (GPU timestamps) for an `auto` keyframe and delta: what
/// the rows above would reach if the host work and the uploads cost nothing. Their median run.
fn kernels_alone(st: &SafetensorsFile, base: Option<&SafetensorsFile>, runs: usize) -> Result<Vec<Row>, CliError> {
    let logical: u64 = st.tensors().map(|t| t.3.len() as u64).sum();
    let timed = match Gpu::with_kernel_timing() {
        Ok(gpu) => gpu,
        Err(e) => {
            let note = Some(format!("  (not measured: {e})"));
            return Ok(vec![Row {
                what: "decode kernels alone".into(),
                ratio: None,
                gpu_gb_s: None,
                kernels_gb_s: None,
                cpu_gb_s: None,
                note,
            }]);
        }
    };
    let base_ck = base.map(|b| resident(&timed, b)).transpose()?;
    let mut cases = vec![("auto: decode kernels alone", None)];
    if base.is_some() {
        cases.push(("delta, auto: decode kernels alone", base));
    }
    let mut rows = Vec::new();
    for (label, delta_of) in cases {
        let reader = Reader::from_source(pack(st, delta_of, Encoder::Auto)?)?;
        let base = if delta_of.is_some() { base_ck.as_ref() } else { None };
        let Some(t) = kernel_times(&timed, &reader, base, runs)? else { continue };
        let total = t.total().as_secs_f64();
        rows.push(Row {
            what: label.into(),
            gpu_gb_s: (total > 0.0).then(|| logical as f64 / total / 1e9),
            note: Some(format!("  {} batches: {}", t.batches, shares(&t))),
            ..Row::default()
        });
    }
    Ok(rows)
}

/// The median seconds of the layer loader over `keyframe`, layer by layer.
fn layer_loader_secs<S: tpde::read::Source + Sync>(
    gpu: &Gpu,
    keyframe: &Reader<S>,
    runs: usize,
) -> Result<f64, CliError> {
    median_secs(runs, || {
        let mut loader = LayerLoader::new(gpu, keyframe, None)?;
        while let Some(layer) = loader.next_layer() {
            std::hint::black_box(layer?);
        }
        gpu.synchronize()?;
        Ok(())
    })
}

/// The median run's kernel times of decoding `reader` on `timed` (opened with kernel timing),
/// after a first run that warms the device up, as `median_secs` does.
fn kernel_times<S: tpde::read::Source + Sync>(
    timed: &Gpu,
    reader: &Reader<S>,
    base: Option<&DeviceCheckpoint>,
    runs: usize,
) -> Result<Option<KernelTimes>, CliError> {
    let mut times = Vec::new();
    for _ in 0..=runs {
        drop(timed.load(reader, base)?);
        timed.synchronize()?;
        times.extend(timed.take_kernel_times());
    }
    times.remove(0);
    times.sort_by_key(|t| t.total());
    let middle = times.len() / 2;
    Ok((!times.is_empty()).then(|| times.swap_remove(middle)))
}

/// Each kernel's share of the kernels' time, and the entropy decoders' threads a batch.
fn shares(t: &KernelTimes) -> String {
    let total = t.total().as_secs_f64().max(f64::MIN_POSITIVE);
    let split: Vec<String> = tpde_gpu::timing::KERNELS
        .iter()
        .zip(t.per_kernel)
        .filter(|(_, d)| !d.is_zero())
        .map(|(k, d)| format!("{k} {:.0}%", 100.0 * d.as_secs_f64() / total))
        .collect();
    format!("{}; {} decode threads a batch", split.join(", "), t.decode_threads / t.batches.max(1))
}

/// The table.
pub fn render(gpu: &Gpu, input: &Path, rows: &[Row], runs: usize) -> String {
    let info = gpu.info();
    let mut s = format!(
        "{} on {} ({:?}, {}; rANS blocks by {}), median of {runs} runs, GB/s of logical bytes\n",
        input.display(),
        info.name,
        info.backend,
        info.driver_info,
        if gpu.uses_subgroups() { "subgroups" } else { "workgroup memory" }
    );
    s += &format!("{:<36} {:>7} {:>10} {:>10} {:>10}\n", "what", "ratio", "GPU GB/s", "kernels", "CPU GB/s");
    let num = |x: Option<f64>, p: usize| x.map_or("-".to_string(), |v| format!("{v:.p$}"));
    for r in rows {
        s += &format!(
            "{:<36} {:>7} {:>10} {:>10} {:>10}\n",
            r.what,
            num(r.ratio, 3),
            num(r.gpu_gb_s, 2),
            num(r.kernels_gb_s, 2),
            num(r.cpu_gb_s, 2)
        );
        if let Some(note) = &r.note {
            s += &format!("{note}\n");
        }
    }
    s
}
