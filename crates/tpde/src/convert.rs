//! safetensors ⇄ TPDE. Every tensor's bytes, dtype and shape survive bit-exact, and so does
//! the safetensors `__metadata__` map: its entries become TPDE string metadata under the same
//! keys, and come back out on unpack.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Instant;

use rayon::prelude::*;
use safetensors::Dtype as StDtype;
use tpde_codec::predicted::Inputs;
use tpde_codec::Encoder;
use tpde_format::digest::{content_digest, tensor_digest, Digest, DigestInput};
use tpde_format::metadata::{KEY_MAX_ABS_ERROR, KEY_MAX_REL_ERROR, KEY_PRODUCER, KEY_SOURCE_FORMAT, RESERVED_PREFIX};
use tpde_format::{BaseRef, CodecTag, DType, ErrorKind, MetadataValue, Prediction, TensorEntry};
use tpde_read::{Base, TensorChunks};
use tpde_write::lossy::{self, Bound};
use tpde_write::{PredictInput, TensorInput, WriteOptions, Writer};

use crate::checkpoint::{open_tpde, MemoryCheckpoint, SafetensorsFile};
use crate::location::{FileReader, Location, Sink, Stored};
use crate::{safetensors_out, Error, Progress};

/// The TPDE dtype of a safetensors dtype, if the registry has it.
pub fn dtype_from_safetensors(d: StDtype) -> Option<DType> {
    Some(match d {
        StDtype::BOOL => DType::Bool,
        StDtype::U8 => DType::U8,
        StDtype::I8 => DType::I8,
        StDtype::I16 => DType::I16,
        StDtype::U16 => DType::U16,
        StDtype::I32 => DType::I32,
        StDtype::U32 => DType::U32,
        StDtype::I64 => DType::I64,
        StDtype::U64 => DType::U64,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::F32 => DType::F32,
        StDtype::F64 => DType::F64,
        StDtype::F8_E4M3 => DType::F8E4M3,
        StDtype::F8_E5M2 => DType::F8E5M2,
        _ => return None,
    })
}

/// The safetensors dtype of a TPDE dtype.
pub fn dtype_to_safetensors(d: DType) -> StDtype {
    match d {
        DType::Bool => StDtype::BOOL,
        DType::U8 => StDtype::U8,
        DType::I8 => StDtype::I8,
        DType::I16 => StDtype::I16,
        DType::U16 => StDtype::U16,
        DType::I32 => StDtype::I32,
        DType::U32 => StDtype::U32,
        DType::I64 => StDtype::I64,
        DType::U64 => StDtype::U64,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::F32 => StDtype::F32,
        DType::F64 => StDtype::F64,
        DType::F8E4M3 => StDtype::F8_E4M3,
        DType::F8E5M2 => StDtype::F8_E5M2,
        other => unreachable!("dtype {other} has no safetensors name"),
    }
}

/// What a pack did.
#[derive(Clone, Copy, Debug, Default)]
pub struct PackReport {
    /// Tensors written.
    pub tensors: u64,
    /// Tensors written as deltas against the base.
    pub delta_tensors: u64,
    /// Logical tensor bytes.
    pub logical_bytes: u64,
    /// Stored chunk bytes.
    pub stored_bytes: u64,
    /// The output file's size.
    pub file_bytes: u64,
    /// The content digest of what was written.
    pub content_digest: Digest,
    /// Wall time.
    pub seconds: f64,
}

/// How to pack: the writer's options, and for a delta the base and an optional lossy bound.
pub struct PackJob<'a> {
    /// Writer options; `base` is filled in from `base` below.
    pub options: WriteOptions,
    /// The base checkpoint and the path recorded as its hint.
    pub base: Option<(&'a dyn Base, String)>,
    /// Lossy absolute bound τ (`--max-abs-error`); `None` with `max_rel_error` `None` is
    /// lossless.
    pub max_abs_error: Option<f64>,
    /// Lossy relative bound ρ (`--max-rel-error`): a change of at most τ + ρ·|x| is dropped.
    pub max_rel_error: Option<f64>,
    /// Tensors kept bit-exact even in a lossy pack (an optimizer's step counters).
    pub exact: HashSet<String>,
    /// Keep the reconstruction of what was written (for the next delta of a lossy series).
    pub keep_reconstruction: bool,
    /// Predictions to try (spec §6.8), by the name of the tensor they predict, best guess
    /// first: for each delta tensor the first that predicts a sample of its elements well is
    /// tried on every chunk ([`choose_prediction`]). Ignored in a lossy pack.
    pub predictions: HashMap<String, Vec<Prediction>>,
}

impl PackJob<'_> {
    /// The lossy bound, if the job is lossy.
    pub fn bound(&self) -> Option<Bound> {
        (self.max_abs_error.is_some() || self.max_rel_error.is_some())
            .then(|| Bound { abs: self.max_abs_error.unwrap_or(0.0), rel: self.max_rel_error.unwrap_or(0.0) })
    }

    /// A keyframe, lossless.
    pub fn keyframe(options: WriteOptions) -> PackJob<'static> {
        PackJob {
            options,
            base: None,
            max_abs_error: None,
            max_rel_error: None,
            exact: HashSet::new(),
            keep_reconstruction: false,
            predictions: HashMap::new(),
        }
    }
}

/// A tensor to pack: name, dtype, shape, little-endian bytes in row-major order.
pub type TensorRef<'a> = (&'a str, DType, &'a [u64], &'a [u8]);

/// Packs a safetensors file into a TPDE file, as a delta if the job has a base.
pub fn pack(input: &Path, output: &Location, job: PackJob<'_>, bar: &dyn Progress) -> Result<PackReport, Error> {
    let src = SafetensorsFile::open(input)?;
    pack_file(&src, input, output, job, bar).map(|(r, _)| r)
}

/// [`pack`] from an open file; returns the reconstruction if the job asked for it.
pub fn pack_file(
    src: &SafetensorsFile,
    input: &Path,
    output: &Location,
    job: PackJob<'_>,
    bar: &dyn Progress,
) -> Result<(PackReport, Option<MemoryCheckpoint>), Error> {
    let lossless = job.bound().is_none();
    let tensors: Vec<TensorRef<'_>> = src.tensors().collect();
    let mut metadata: Vec<(String, String)> =
        src.metadata().into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
    metadata.sort();
    let (report, kept, digests) = pack_tensors(&tensors, &metadata, "safetensors", output, job, bar).map_err(|e| {
        if e.is_usage() || e.is_located() {
            e
        } else {
            e.context(input.display())
        }
    })?;
    if lossless {
        // The file decodes to `src`, so its digests are `src`'s, for the next delta of a series.
        src.set_digests(report.content_digest, digests);
    }
    Ok((report, kept))
}

/// Writes `tensors` (in this order) and the string `metadata` (under the caller's keys, outside
/// the reserved `tpde.` namespace) to a TPDE file at `output`, atomically; a delta if the job
/// has a base. `source_format` is recorded as `tpde.source_format`. Returns what was written,
/// the reconstruction if the job asked for it, and the tensors' digests in order.
pub fn pack_tensors(
    tensors: &[TensorRef<'_>],
    metadata: &[(String, String)],
    source_format: &str,
    output: &Location,
    job: PackJob<'_>,
    bar: &dyn Progress,
) -> Result<(PackReport, Option<MemoryCheckpoint>, Vec<Digest>), Error> {
    let start = Instant::now();
    let bound = job.bound();
    let mut options = job.options;
    if let Some((base, hint)) = &job.base {
        options.base = Some(BaseRef { digest: base.content_digest()?, path_hint: hint.clone() });
    }
    if bound.is_some() && job.base.is_none() {
        return Err(Error::usage("max_abs_error and max_rel_error drop changes against a base: they need a base"));
    }
    let predicting = bound.is_none() && job.base.is_some() && !job.predictions.is_empty();
    if predicting {
        // Spec §11: a writer that may choose delta-predicted declares 1.6.
        options.min_minor_version = options.min_minor_version.max(CodecTag::DeltaPredicted.since_minor());
    }
    if job.max_rel_error.is_some() {
        // Spec §11: tpde.max_rel_error is defined in 1.5.
        options.min_minor_version = options.min_minor_version.max(5);
    }
    if let Some(k) = metadata.iter().map(|(k, _)| k).find(|k| k.starts_with(RESERVED_PREFIX)) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("metadata key {k:?} is in TPDE's reserved `tpde.` namespace; rename it to pack this file"),
        ));
    }
    // A write that fails (a full disk, a store that refuses) names the file it was writing.
    let writing = |e: Error| match e.kind() {
        ErrorKind::Io => e.context(output).located(),
        _ => e,
    };
    let mut w = Writer::new(output.create().map_err(writing)?, options).map_err(|e| writing(e.into()))?;
    w.add_metadata(KEY_PRODUCER, MetadataValue::String(format!("tpde {}", env!("CARGO_PKG_VERSION"))))?;
    w.add_metadata(KEY_SOURCE_FORMAT, MetadataValue::String(source_format.into()))?;
    if let Some(tau) = job.max_abs_error {
        w.add_metadata(KEY_MAX_ABS_ERROR, MetadataValue::F64(tau))?;
    }
    if let Some(rho) = job.max_rel_error {
        w.add_metadata(KEY_MAX_REL_ERROR, MetadataValue::F64(rho))?;
    }
    for (k, v) in metadata {
        w.add_metadata(k.clone(), MetadataValue::String(v.clone()))?;
    }
    bar.set_length(tensors.iter().map(|t| t.3.len() as u64).sum());
    let mut report = PackReport::default();
    let mut kept = job.keep_reconstruction.then(MemoryCheckpoint::default);
    // The f32 tensors of the file, by name: what predictions read.
    let f32s: HashMap<&str, &[u8]> = match predicting {
        true => tensors.iter().filter(|t| t.1 == DType::F32).map(|&(n, _, _, b)| (n, b)).collect(),
        false => HashMap::new(),
    };
    // Tensors go to the writer in batches, whose chunks it encodes in parallel.
    let mut batch: Vec<Pending<'_>> = Vec::new();
    let mut first = 0;
    while first < tensors.len() {
        if bar.cancelled() {
            return Err(crate::interrupted());
        }
        let mut end = first;
        let mut batch_bytes = 0;
        while end < tensors.len() && batch_bytes < PACK_BATCH_BYTES {
            batch_bytes += tensors[end].3.len();
            end += 1;
        }
        let group = &tensors[first..end];
        first = end;
        // A tensor whose base counterpart has its name, dtype and shape is a delta; any other
        // (new, reshaped, retyped) is a keyframe inside the delta file. The batch's base
        // tensors decode in parallel: most are one chunk, and one at a time kept one core busy.
        let bases: Vec<Result<Option<tpde_read::BaseTensor<'_>>, Error>> = match &job.base {
            Some((b, _)) => group
                .par_iter()
                .map(|&(name, dtype, shape, _)| Ok(b.tensor(name)?.filter(|t| t.dtype == dtype && t.shape == shape)))
                .collect(),
            None => group.iter().map(|_| Ok(None)).collect(),
        };
        for (&(name, dtype, shape, data), base) in group.iter().zip(bases) {
            let base = base?;
            let bound = bound.filter(|_| !job.exact.contains(name));
            let data: Cow<[u8]> = match (&base, bound) {
                (Some(b), Some(bound)) => Cow::Owned(lossy::snap_to_base(dtype, data, &b.data, bound)),
                _ => Cow::Borrowed(data),
            };
            if let Some(k) = &mut kept {
                k.insert(name, dtype, shape, data.to_vec());
            }
            let predict = match (&base, &job.base) {
                (Some(b), Some((base_ck, _))) if predicting => {
                    let candidates = job.predictions.get(name).map(Vec::as_slice).unwrap_or_default();
                    choose_prediction(candidates, &data, &b.data, &f32s, *base_ck)?
                }
                _ => None,
            };
            batch.push(Pending { name, dtype, shape, data, base, predict });
        }
        add_batch(&mut w, &batch, &mut report).map_err(writing)?;
        bar.inc(batch_bytes as u64);
        batch.clear();
    }
    report.content_digest = content_digest(w.tensors().iter().map(|t| DigestInput {
        name: &t.name,
        dtype: t.dtype,
        shape: &t.shape,
        digest: &t.digest,
    }));
    let digests = w.tensors().iter().map(|t| t.digest).collect();
    if let Some(k) = &mut kept {
        // The reconstruction is what the file decodes to: the file's digest is its digest.
        k.set_content_digest(report.content_digest);
    }
    report.file_bytes = w.finish().map_err(|e| writing(e.into()))?.commit().map_err(writing)?;
    report.seconds = start.elapsed().as_secs_f64();
    bar.finish();
    Ok((report, kept, digests))
}

/// Logical bytes [`pack_file`] gives the writer at a time: enough tensors to keep every core
/// busy, few enough that a chain base's decoded tensors (and a lossy pack's snapped ones) stay
/// a small part of memory.
const PACK_BATCH_BYTES: usize = 64 << 20;

/// A tensor on its way to the writer, with its base counterpart if it is a delta.
struct Pending<'a> {
    name: &'a str,
    dtype: DType,
    shape: &'a [u64],
    data: Cow<'a, [u8]>,
    base: Option<tpde_read::BaseTensor<'a>>,
    predict: Option<Chosen<'a>>,
}

/// A prediction chosen for a tensor, with the tensors it reads: `exp_avg` of the file and, for
/// predictor 1, `exp_avg` of the base, for predictor 2 `exp_avg_sq` of the file.
pub struct Chosen<'a> {
    prediction: Prediction,
    exp_avg: &'a [u8],
    other: Cow<'a, [u8]>,
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
        let Some(exp_avg) = same(p.inputs()[0]) else { continue };
        let other: Cow<'a, [u8]> = match p {
            Prediction::AdamSecondMoment { exp_avg: name, .. } => {
                match base_ck.tensor(name)?.filter(|t| t.dtype == DType::F32 && t.data.len() == data.len()) {
                    Some(t) => t.data,
                    None => continue,
                }
            }
            Prediction::AdamParameter { exp_avg_sq, .. } => match same(exp_avg_sq) {
                Some(v) => Cow::Borrowed(v),
                None => continue,
            },
        };
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

fn add_batch(w: &mut Writer<Sink>, batch: &[Pending<'_>], report: &mut PackReport) -> Result<(), Error> {
    // Base digests the base does not know are computed here, in parallel.
    let base_digests: Vec<Option<Digest>> =
        batch.par_iter().map(|p| p.base.as_ref().map(|b| b.digest.unwrap_or_else(|| tensor_digest(&b.data)))).collect();
    let inputs: Vec<TensorInput<'_>> = batch
        .iter()
        .zip(base_digests)
        .map(|(p, digest)| TensorInput {
            name: p.name,
            dtype: p.dtype,
            shape: p.shape,
            data: &p.data,
            base: p.base.as_ref().zip(digest).map(|(b, d)| (&b.data[..], d)),
            predict: p.predict.as_ref().map(|c| PredictInput {
                prediction: &c.prediction,
                exp_avg: c.exp_avg,
                other: &c.other,
            }),
        })
        .collect();
    w.add_tensors(&inputs)?;
    for entry in &w.tensors()[w.tensors().len() - batch.len()..] {
        report.tensors += 1;
        report.logical_bytes += entry.byte_length;
        report.stored_bytes += entry.stored_length();
    }
    report.delta_tensors += batch.iter().filter(|p| p.base.is_some()).count() as u64;
    Ok(())
}

/// The path hint to record for `base` in a file written at `output`: the base's path relative
/// to the output's folder (`base.tpde`, `../step-100/rank-0.tpde`), so that a folder of
/// checkpoints copied elsewhere keeps its chains; the absolute path when there is no relative
/// one (another drive), or when either folder cannot be resolved.
pub fn path_hint(base: &Path, output: &Path) -> String {
    let dir_of = |p: &Path| {
        let d = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        d.canonicalize().ok()
    };
    let absolute = || base.canonicalize().unwrap_or_else(|_| base.to_path_buf()).display().to_string();
    let (Some(from), Some(to), Some(name)) = (dir_of(output), dir_of(base), base.file_name()) else {
        return absolute();
    };
    let (mut a, mut b) = (from.components().peekable(), to.components().peekable());
    if a.peek() != b.peek() {
        return absolute(); // no common root
    }
    while a.peek().is_some() && a.peek() == b.peek() {
        a.next();
        b.next();
    }
    // Spec §7.3: components separated by `/` whatever the platform's separator.
    let mut rel: Vec<String> = a.map(|_| "..".to_string()).collect();
    rel.extend(b.map(|c| c.as_os_str().to_string_lossy().into_owned()));
    rel.push(name.to_string_lossy().into_owned());
    rel.join("/")
}

/// What `pack-series` did, file by file.
#[derive(Clone, Debug)]
pub struct SeriesEntry {
    /// The checkpoint packed.
    pub input: std::path::PathBuf,
    /// The file written.
    pub output: Location,
    /// Whether it is a keyframe.
    pub keyframe: bool,
    /// The pack.
    pub report: PackReport,
}

/// Packs every `.safetensors` file of `dir` (in name order) into `out_dir` as a chain: a
/// keyframe every `keyframe_every` files, each other file a delta against the one before. With
/// a lossy bound the base of each delta is the previous file as it decodes (closed loop).
pub fn pack_series(
    dir: &Path,
    out_dir: &Location,
    keyframe_every: usize,
    options: WriteOptions,
    max_abs_error: Option<f64>,
    max_rel_error: Option<f64>,
    bar: &dyn Progress,
) -> Result<Vec<SeriesEntry>, Error> {
    if keyframe_every == 0 {
        return Err(Error::usage("--keyframe-every must be at least 1"));
    }
    let mut inputs: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::from(e).context(dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    inputs.sort();
    if inputs.is_empty() {
        return Err(Error::new(ErrorKind::NotFound, format!("{}: no .safetensors files", dir.display())));
    }
    out_dir.create_dir_all()?;
    let mut done = Vec::new();
    // The previous checkpoint as it decodes: its safetensors file when lossless, the kept
    // reconstruction when lossy.
    let mut prev: Option<(SafetensorsFile, Option<MemoryCheckpoint>, Location)> = None;
    for (i, input) in inputs.iter().enumerate() {
        let src = SafetensorsFile::open(input)?;
        let stem = input.file_stem().unwrap_or_default().to_string_lossy().into_owned();
        let output = out_dir.join(&format!("{stem}.tpde"))?;
        let keyframe = i % keyframe_every == 0;
        let base: Option<(&dyn Base, String)> = match (&prev, keyframe) {
            (Some((file, recon, out)), false) => {
                let b: &dyn Base = match recon {
                    Some(r) => r,
                    None => file,
                };
                Some((b, output.hint_to(out)))
            }
            _ => None,
        };
        let job = PackJob {
            options: options.clone(),
            max_abs_error: max_abs_error.filter(|_| base.is_some()),
            max_rel_error: max_rel_error.filter(|_| base.is_some()),
            exact: HashSet::new(),
            keep_reconstruction: max_abs_error.is_some() || max_rel_error.is_some(),
            predictions: HashMap::new(),
            base,
        };
        let (report, recon) = pack_file(&src, input, &output, job, bar)?;
        done.push(SeriesEntry { input: input.clone(), output: output.clone(), keyframe, report });
        prev = Some((src, recon, output));
    }
    Ok(done)
}

/// What an unpack did.
#[derive(Clone, Copy, Debug, Default)]
pub struct UnpackReport {
    /// Tensors written.
    pub tensors: u64,
    /// Logical tensor bytes.
    pub logical_bytes: u64,
    /// Wall time.
    pub seconds: f64,
}

/// The safetensors `__metadata__` map a TPDE file carries: every non-reserved entry, strings
/// as they are and other types in their text form.
pub fn safetensors_metadata<S: tpde_read::Source>(r: &tpde_read::Reader<S>) -> BTreeMap<String, String> {
    r.directory()
        .metadata
        .iter()
        .filter(|m| !m.key.starts_with(RESERVED_PREFIX))
        .map(|m| (m.key.clone(), m.value.to_string()))
        .collect()
}

/// Decodes every tensor of a TPDE file (CRCs checked) and writes a safetensors file,
/// atomically (temporary file, then rename), chunk by chunk (see [`safetensors_out`]). A delta
/// decodes against `base` if given, else against the chain its path hints name.
pub fn unpack(
    input: &Location,
    base: Option<&Location>,
    output: &Path,
    bar: &dyn Progress,
) -> Result<UnpackReport, Error> {
    let start = Instant::now();
    let r = open_tpde(input, base)?;
    unpack_open(&r, output, bar)?;
    Ok(unpack_report(&r, start))
}

/// [`unpack`] of a file already open.
pub fn unpack_open(r: &FileReader, output: &Path, bar: &dyn Progress) -> Result<(), Error> {
    let all: Vec<usize> = (0..r.tensors().len()).collect();
    bar.set_length(r.tensors().iter().map(|t| t.byte_length).sum());
    unpack_tensors(r, &all, &safetensors_metadata(r), output, bar)?;
    bar.finish();
    Ok(())
}

/// Writes the tensors `select` (indices into `r.tensors()`) of an open file, with `metadata`,
/// to the safetensors file `output`, decoding chunk by chunk.
pub fn unpack_tensors(
    r: &FileReader,
    select: &[usize],
    metadata: &BTreeMap<String, String>,
    output: &Path,
    bar: &dyn Progress,
) -> Result<(), Error> {
    // A tensor stored `raw` in one run is written straight from the map, in one piece.
    enum Opened<'r> {
        Whole(Cow<'r, [u8]>),
        Chunks(TensorChunks<'r, Stored>),
    }
    let pieces = |t: &TensorEntry| match r.is_zero_copy(t) {
        true => vec![t.byte_length],
        false => t.chunks.iter().map(|c| c.decoded_length).collect(),
    };
    write_unpacked(
        r,
        select,
        metadata,
        output,
        bar,
        pieces,
        |t| Ok(if r.is_zero_copy(t) { Opened::Whole(r.read_tensor(t)?) } else { Opened::Chunks(r.tensor_chunks(t)?) }),
        |opened, i, buf| match opened {
            Opened::Whole(bytes) => Ok(bytes),
            Opened::Chunks(chunks) => {
                // Validation bounds a chunk's decoded length (MAX_CHUNK_DECODED_LEN, 1 GiB).
                buf.resize(chunks.tensor().chunks[i].decoded_length as usize, 0);
                chunks.decode_into(i, buf)?;
                Ok(buf)
            }
        },
    )
}

/// Writes the tensors `select` of `r` to a safetensors file with `metadata`, as
/// [`safetensors_out::write`] does: each tensor in the pieces of `pieces(t)`, readied by `open`
/// and produced by `piece`. Progress goes to `bar` (whose length the caller sets).
#[allow(clippy::too_many_arguments)]
pub fn write_unpacked<'r, T: Send + Sync>(
    r: &'r FileReader,
    select: &[usize],
    metadata: &BTreeMap<String, String>,
    output: &Path,
    bar: &dyn Progress,
    pieces: impl Fn(&TensorEntry) -> Vec<u64>,
    open: impl Fn(&'r TensorEntry) -> Result<T, Error> + Sync,
    piece: impl for<'p> Fn(&'p T, usize, &'p mut Vec<u8>) -> Result<&'p [u8], Error> + Sync,
) -> Result<(), Error> {
    let too_large = |t: &TensorEntry| {
        Error::new(ErrorKind::LimitExceeded, format!("tensor {:?}: too large for this platform", t.name))
    };
    let entries = select
        .iter()
        .map(|&i| {
            let t = &r.tensors()[i];
            let shape = t.shape.iter().map(|&d| usize::try_from(d)).collect::<Result<Vec<_>, _>>();
            let shape = shape.map_err(|_| {
                Error::new(ErrorKind::LimitExceeded, format!("tensor {:?}: shape does not fit this platform", t.name))
            })?;
            let len = usize::try_from(t.byte_length).map_err(|_| too_large(t))?;
            let pieces =
                pieces(t).into_iter().map(usize::try_from).collect::<Result<_, _>>().map_err(|_| too_large(t))?;
            Ok(safetensors_out::Entry {
                name: t.name.clone(),
                dtype: dtype_to_safetensors(t.dtype),
                shape,
                len,
                pieces,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    safetensors_out::write(
        output,
        &entries,
        metadata,
        |i| open(&r.tensors()[select[i]]),
        |opened, j, buf| {
            let bytes = piece(opened, j, buf)?;
            bar.inc(bytes.len() as u64);
            Ok(bytes)
        },
    )
}

/// The report of an unpack of `r` that started at `start`.
pub fn unpack_report(r: &FileReader, start: Instant) -> UnpackReport {
    UnpackReport {
        tensors: r.tensors().len() as u64,
        logical_bytes: r.tensors().iter().map(|t| t.byte_length).sum(),
        seconds: start.elapsed().as_secs_f64(),
    }
}

/// Compares every tensor (name, dtype, shape, bytes) and the metadata map of two safetensors
/// files; returns a description of the first difference.
pub fn compare_safetensors(a: &Path, b: &Path) -> Result<Option<String>, Error> {
    let (fa, fb) = (SafetensorsFile::open(a)?, SafetensorsFile::open(b)?);
    let mut ta: Vec<_> = fa.tensors().collect();
    let mut tb: Vec<_> = fb.tensors().collect();
    ta.sort_by_key(|t| t.0);
    tb.sort_by_key(|t| t.0);
    if ta.len() != tb.len() {
        return Ok(Some(format!("tensor counts differ: {} vs {}", ta.len(), tb.len())));
    }
    if let Some((x, _)) = ta.iter().zip(&tb).find(|(x, y)| x != y) {
        return Ok(Some(format!("tensor {:?} differs", x.0)));
    }
    if fa.metadata().cloned().unwrap_or_default() != fb.metadata().cloned().unwrap_or_default() {
        return Ok(Some("metadata differs".into()));
    }
    Ok(None)
}

/// Which readers `pack` chooses codecs for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// Any codec.
    Cpu,
    /// Only codecs a GPU decodes in parallel (spec §6.7): `raw` and the lane forms.
    Gpu,
}

/// Parses a codec name (`auto`, `raw`, `zstd` or any registered tag) into an encoder for
/// `profile`; a codec the profile excludes is a usage error.
pub fn encoder(codec: &str, level: Option<i32>, profile: Profile) -> Result<Encoder, Error> {
    if level.is_some() && codec != "zstd" {
        return Err(Error::usage("--level applies to --codec zstd only"));
    }
    let encoder = match codec {
        "auto" => Encoder::Auto,
        "auto-serial" => Encoder::AutoSerial,
        "raw" => Encoder::Raw,
        "zstd" => {
            let level = level.unwrap_or(3);
            let range = zstd::compression_level_range();
            if !range.contains(&level) {
                return Err(Error::usage(format!("--level {level} is outside zstd's {range:?}")));
            }
            Encoder::Zstd { level }
        }
        "delta-predicted" => {
            return Err(Error::usage(
                "delta-predicted codes a tensor against an optimizer's prediction, which the Python Checkpointer \
                 gives (predict=True); a pack chooses codecs without one",
            ))
        }
        other => CodecTag::from_name(other).map(Encoder::Codec).ok_or_else(|| {
            let names: Vec<&str> = CodecTag::ALL.iter().map(|t| t.name()).collect();
            Error::usage(format!("unknown codec {other:?}: expected auto, auto-serial, {}", names.join(", ")))
        })?,
    };
    let gpu_ok = match encoder {
        Encoder::Raw | Encoder::Auto => true,
        Encoder::Codec(tag) => tag.gpu_parallel(),
        Encoder::Zstd { .. } | Encoder::AutoSerial => false,
    };
    if profile == Profile::Gpu && !gpu_ok {
        let names: Vec<&str> = CodecTag::ALL.iter().filter(|t| t.gpu_parallel()).map(|t| t.name()).collect();
        return Err(Error::usage(format!(
            "--profile gpu writes only codecs a GPU decodes in parallel: auto, {}; not {codec}",
            names.join(", ")
        )));
    }
    Ok(encoder)
}

/// How far a decoded file is from the checkpoint it was packed from.
#[derive(Clone, Debug, Default)]
pub struct AgainstReport {
    /// Tensors compared.
    pub tensors: u64,
    /// Tensors that are bit-identical.
    pub identical: u64,
    /// The largest absolute difference of any float element.
    pub max_abs_error: f64,
    /// The bound the file records, if lossy.
    pub bound: Option<Bound>,
}

/// Decodes `file` and compares it with `original`: bit-exact for a lossless file; for a lossy
/// one every float element within the recorded τ (non-finite values and integers exact).
pub fn verify_against(file: &Location, base: Option<&Location>, original: &Path) -> Result<AgainstReport, Error> {
    let r = open_tpde(file, base)?;
    let orig = SafetensorsFile::open(original)?;
    let recorded = |key| match r.metadata(key) {
        Some(MetadataValue::F64(t)) => Some(*t),
        _ => None,
    };
    let (abs, rel) = (recorded(KEY_MAX_ABS_ERROR), recorded(KEY_MAX_REL_ERROR));
    let bound = (abs.is_some() || rel.is_some()).then(|| Bound { abs: abs.unwrap_or(0.0), rel: rel.unwrap_or(0.0) });
    let mut rep = AgainstReport { bound, ..AgainstReport::default() };
    let names: std::collections::HashSet<&str> = orig.tensors().map(|t| t.0).collect();
    if let Some(extra) = r.tensors().iter().find(|t| !names.contains(t.name.as_str())) {
        return Err(Error::new(
            ErrorKind::ChecksumMismatch,
            format!("tensor {:?} is not in {}", extra.name, original.display()),
        ));
    }
    for (name, dtype, shape, want) in orig.tensors() {
        let t = r.tensor(name).map_err(|_| {
            Error::new(ErrorKind::ChecksumMismatch, format!("tensor {name:?} is missing from the file"))
        })?;
        if t.dtype != dtype || t.shape != shape {
            return Err(Error::new(
                ErrorKind::ChecksumMismatch,
                format!("tensor {name:?}: dtype or shape differs from the original"),
            ));
        }
        let got = r.read_tensor(t)?;
        rep.tensors += 1;
        if *got == *want {
            rep.identical += 1;
            continue;
        }
        let w = dtype.size() as usize;
        for (i, (a, b)) in got.chunks_exact(w).zip(want.chunks_exact(w)).enumerate() {
            if a == b {
                continue;
            }
            let (Some(x), Some(y), Some(bound)) =
                (lossy::element_value(dtype, a), lossy::element_value(dtype, b), bound)
            else {
                let why = match bound {
                    None => "the file is lossless",
                    Some(_) => "it is not a float, and a lossy file keeps every integer exactly",
                };
                return Err(Error::new(
                    ErrorKind::ChecksumMismatch,
                    format!("tensor {name:?} element {i} differs, and {why}"),
                ));
            };
            let err = (x - y).abs();
            if !(x.is_finite() && y.is_finite() && bound.allows(y, x)) {
                let limit = match bound.rel {
                    0.0 => format!("{}", bound.abs),
                    rel => format!("{} + {rel}·|x| = {}", bound.abs, bound.abs + rel * y.abs()),
                };
                return Err(Error::new(
                    ErrorKind::ChecksumMismatch,
                    format!(
                        "tensor {name:?} element {i}: {x} decoded, {y} original, error {err} over the bound {limit}"
                    ),
                ));
            }
            rep.max_abs_error = rep.max_abs_error.max(err);
        }
    }
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::path_hint;
    use std::fs;

    #[test]
    fn path_hints_are_relative_to_the_output_folder() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("step-1"), root.path().join("step-2/deep"));
        fs::create_dir_all(&a).unwrap();
        fs::create_dir_all(&b).unwrap();
        let base = a.join("rank-0.tpde");
        fs::write(&base, b"").unwrap();
        assert_eq!(path_hint(&base, &a.join("next.tpde")), "rank-0.tpde");
        let up = path_hint(&base, &b.join("rank-0.tpde"));
        assert_eq!(std::path::Path::new(&up), std::path::Path::new("../../step-1/rank-0.tpde"));
        // A hint resolves from the output's folder to the base.
        assert_eq!(b.join(&up).canonicalize().unwrap(), base.canonicalize().unwrap());
        let down = path_hint(&b.join("x.tpde"), &root.path().join("y.tpde"));
        assert_eq!(std::path::Path::new(&down), std::path::Path::new("step-2/deep/x.tpde"));
    }
}
