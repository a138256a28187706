//! Packing: tensors into one `.tpde` file, a keyframe or a delta against a base. One way in,
//! [`pack`], from a safetensors file, a Hugging Face model folder (sharded or not) or tensors in
//! memory.

mod prediction;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Instant;

use rayon::prelude::*;
use tpde_format::digest::{content_digest, tensor_digest, Digest, DigestInput};
use tpde_format::metadata::{
    self, KEY_MAX_ABS_ERROR, KEY_MAX_REL_ERROR, KEY_PRODUCER, KEY_SOURCE_FORMAT, RESERVED_PREFIX,
};
use tpde_format::{BaseRef, CodecTag, DType, ErrorKind, MetadataValue, Prediction};
use tpde_read::Base;
use tpde_write::lossy::{self, Bound};
use tpde_write::{PredictInput, TensorInput, WriteOptions, Writer};

pub use prediction::{choose_prediction, Chosen};

use crate::location::{Location, Sink};
use crate::memory::MemoryCheckpoint;
pub use crate::memory::TensorRef;
use crate::safetensors::SafetensorsFile;
use crate::{Error, Progress};

/// What a pack did.
#[derive(Clone, Debug, Default)]
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
    /// Files beside the weights carried in the file (`tpde.files`).
    pub files: u64,
    /// Files of the folder left out (weights in other formats, hidden folders).
    pub skipped_files: u64,
    /// Carried files that are links, each with where it leads (inside the folder, or a
    /// Hugging Face cache's blob).
    pub links: Vec<(String, std::path::PathBuf)>,
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
    /// For a destination in object storage: what the object there must still be when the file
    /// is committed (the version a writer saw before it checked its lease), else nothing is
    /// written. A local file's writers are fenced by the folder's lock instead.
    #[cfg(feature = "object")]
    pub expect: crate::object::Expect,
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
            #[cfg(feature = "object")]
            expect: crate::object::Expect::Anything,
        }
    }
}

/// What [`pack`] reads.
#[derive(Clone, Copy)]
pub enum PackSource<'a> {
    /// A `.safetensors` file, or a Hugging Face model folder: its one `model.safetensors`, or
    /// its shards and their `*.safetensors.index.json` (see [`crate::sharded`]).
    Path(&'a Path),
    /// Tensors in memory, in this order, with string metadata under the caller's keys (outside
    /// the reserved `tpde.` namespace); `format` is recorded as `tpde.source_format`.
    Tensors {
        /// The tensors.
        tensors: &'a [TensorRef<'a>],
        /// The metadata.
        metadata: &'a [(String, String)],
        /// Where they came from (`"python"`).
        format: &'a str,
    },
}

/// What [`pack`] wrote, and what it decodes to if the job asked ([`PackJob::keep_reconstruction`]).
pub struct Packed {
    /// The pack.
    pub report: PackReport,
    /// The tensors as the file decodes them (a lossy pack's snapped values).
    pub reconstruction: Option<MemoryCheckpoint>,
}

/// Packs `source` into one TPDE file at `destination`, atomically: a keyframe, or a delta if the
/// job has a base. The one way in, for every front end.
pub fn pack(
    source: PackSource<'_>,
    destination: &Location,
    job: PackJob<'_>,
    bar: &dyn Progress,
) -> Result<Packed, Error> {
    match source {
        PackSource::Tensors { tensors, metadata, format } => {
            let source = Source { tensors, metadata, files: &[], format };
            pack_tensors(source, destination, job, bar).map(|(packed, _)| packed)
        }
        PackSource::Path(dir) if dir.is_dir() => pack_folder(dir, destination, job, bar),
        PackSource::Path(file) => pack_file(&SafetensorsFile::open(file)?, file, destination, job, bar),
    }
}

/// [`pack`] of a model folder: its tensors, its layout (to write the folder back) and the files
/// beside the weights (spec §5.5).
fn pack_folder(dir: &Path, destination: &Location, job: PackJob<'_>, bar: &dyn Progress) -> Result<Packed, Error> {
    let folder = crate::sharded::open_model_folder(dir)?;
    let gathered = crate::files::gather(dir, &folder.layout)?;
    let tensors: Vec<TensorRef<'_>> = folder.tensors().collect();
    let mut metadata = folder.layout.to_metadata();
    let format = match folder.is_one_file() {
        true => {
            // As a lone `.safetensors` file packs: its `__metadata__` under its own keys.
            let mut own: Vec<(String, String)> =
                folder.shards[0].metadata().into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
            own.sort();
            metadata.extend(own);
            "safetensors"
        }
        false => crate::sharded::SOURCE_FORMAT,
    };
    let source = Source { tensors: &tensors, metadata: &metadata, files: &gathered.files, format };
    let (mut packed, _) = pack_tensors(source, destination, job, bar).map_err(|e| {
        if e.is_usage() || e.is_located() {
            e
        } else {
            e.context(dir.display())
        }
    })?;
    packed.report.skipped_files = gathered.skipped.len() as u64;
    packed.report.links = gathered.links;
    Ok(packed)
}

/// What [`pack_tensors`] writes besides the writer's own entries.
pub(crate) struct Source<'a> {
    /// The tensors, in this order.
    pub tensors: &'a [TensorRef<'a>],
    /// String metadata under the caller's keys (outside the reserved `tpde.` namespace).
    pub metadata: &'a [(String, String)],
    /// The files beside the weights (`tpde.files`, spec §5.5); none for tensors alone.
    pub files: &'a [tpde_format::files::FileEntry],
    /// Recorded as `tpde.source_format`.
    pub format: &'a str,
}

/// [`pack`] of a safetensors file already open (a series reuses it as the next delta's base).
pub(crate) fn pack_file(
    src: &SafetensorsFile,
    input: &Path,
    output: &Location,
    job: PackJob<'_>,
    bar: &dyn Progress,
) -> Result<Packed, Error> {
    let lossless = job.bound().is_none();
    let tensors: Vec<TensorRef<'_>> = src.tensors().collect();
    let mut metadata: Vec<(String, String)> =
        src.metadata().into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
    metadata.sort();
    let source = Source { tensors: &tensors, metadata: &metadata, files: &[], format: "safetensors" };
    let (packed, digests) = pack_tensors(source, output, job, bar).map_err(|e| {
        if e.is_usage() || e.is_located() {
            e
        } else {
            e.context(input.display())
        }
    })?;
    if lossless {
        // The file decodes to `src`, so its digests are `src`'s, for the next delta of a series.
        src.set_digests(packed.report.content_digest, digests);
    }
    Ok(packed)
}

/// Writes `source` (its tensors in order, its metadata and files) to a TPDE file at `output`,
/// atomically; a delta if the job has a base. Returns what was written and the tensors'
/// digests in order.
pub(crate) fn pack_tensors(
    source: Source<'_>,
    output: &Location,
    job: PackJob<'_>,
    bar: &dyn Progress,
) -> Result<(Packed, Vec<Digest>), Error> {
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
        // Spec §11: a writer that may choose delta-predicted declares 1.6, 1.9 if it may choose a
        // reverse predictor, or (`auto`) a sparse plane record in a predicted chunk.
        let since = job.predictions.values().flatten().map(Prediction::since_minor).max();
        let mut minor = since.unwrap_or(CodecTag::DeltaPredicted.since_minor());
        if options.encoder == tpde_codec::Encoder::Auto {
            minor = minor.max(tpde_codec::predicted::SPARSE_IN_PREDICTED_SINCE_MINOR);
        }
        options.min_minor_version = options.min_minor_version.max(minor);
    }
    if job.max_rel_error.is_some() {
        options.min_minor_version = options.min_minor_version.max(metadata::since_minor(KEY_MAX_REL_ERROR));
    }
    if options.encoder == tpde_codec::Encoder::Auto {
        // Spec §11: `auto` codes order-0 planes as rANS blocks (1.10), context planes as rANS
        // blocks (1.11), and a delta's nearly constant plane as a sparse record (1.8).
        options.min_minor_version = options.min_minor_version.max(tpde_codec::planes::CONTEXT_BLOCKS_SINCE_MINOR);
    }
    if !source.files.is_empty() {
        options.min_minor_version = options.min_minor_version.max(metadata::since_minor(metadata::KEY_FILES));
    }
    let Source { tensors, metadata, files, format: source_format } = source;
    if let Some(k) = metadata.iter().map(|(k, _)| k).find(|k| k.starts_with(RESERVED_PREFIX)) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("metadata key {k:?} is in TPDE's reserved `tpde.` namespace; rename it to pack this file"),
        ));
    }
    // A write that fails (a full disk, a store that refuses) names the file it was writing.
    let writing = |e: Error| match e.kind() {
        ErrorKind::Io if !e.is_located() => e.context(output).located(),
        _ => e,
    };
    #[cfg(feature = "object")]
    let sink = output.create_expecting(&job.expect);
    #[cfg(not(feature = "object"))]
    let sink = output.create();
    let mut w = Writer::new(sink.map_err(writing)?, options).map_err(|e| writing(e.into()))?;
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
    if !files.is_empty() {
        w.add_files(files)?;
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
    report.files = files.len() as u64;
    report.file_bytes = w.finish().map_err(|e| writing(e.into()))?.commit().map_err(writing)?;
    report.seconds = start.elapsed().as_secs_f64();
    bar.finish();
    Ok((Packed { report, reconstruction: kept }, digests))
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
                exp_avg: &c.exp_avg,
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
