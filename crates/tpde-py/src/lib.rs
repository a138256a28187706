//! `tpde._tpde`, the extension module under the Python package `tpde`.
//!
//! A thin layer over the `tpde` crate: it converts between Python and Rust types, releases the
//! GIL around every read, decode, encode and write, and maps [`tpde::Error`] to
//! `tpde.TpdeError` with the error's category as `kind`. Tensors cross as flat `uint8` numpy
//! arrays; the Python modules give them their dtype and shape (numpy, ml_dtypes, torch).

mod interrupt;
mod object;
mod predictions;
mod staging;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use numpy::ndarray::ArrayView1;
use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use rayon::prelude::*;
use tpde::format::digest::to_hex;
use tpde::format::digest::Digest;
use tpde::format::metadata::RESERVED_PREFIX;
use tpde::format::TensorEntry;
use tpde::memory::MemoryCheckpoint;
use tpde::open::{self, open_base, open_tpde_with, read_range};
use tpde::pack::TensorRef;
use tpde::{DType, ErrorKind, FileReader, Location, WriteOptions};
use tpde::{PackJob, PackReport, PackSource, Packed, Progress};

use predictions::{prediction_candidates, PredictionArg};

create_exception!(tpde, TpdeError, PyException, "A TPDE operation failed; `kind` is the error's category.");

/// The Python exception for a TPDE error: `TpdeError(message)` with `kind` set.
fn py_err(e: tpde::Error) -> PyErr {
    Python::attach(|py| {
        if e.kind() == ErrorKind::NotFound {
            // `tpde.TpdeNotFoundError`, a TpdeError and a FileNotFoundError at once: a class with
            // two exception bases is simplest made in Python.
            let made = py.import("tpde._errors").and_then(|m| m.call_method1("not_found", (e.to_string(),)));
            if let Ok(value) = made {
                return PyErr::from_value(value);
            }
        }
        let err = TpdeError::new_err(e.to_string());
        let value = err.value(py);
        // Setting an attribute on a fresh exception instance cannot fail.
        let _ = value.setattr("kind", e.kind().as_str());
        err
    })
}

/// The encoder a `codec=` name asks for (`auto`, `raw`, `zstd`, a codec tag's name).
fn encoder(codec: &str) -> PyResult<tpde::Encoder> {
    codec.parse().map_err(|e: tpde::codec::UnknownEncoder| match codec {
        "delta-predicted" => invalid(format!("{e}: the Checkpointer gives predictions (predict=True)")),
        _ => invalid(e.to_string()),
    })
}

/// A path or URL from Python.
fn location(s: &str) -> PyResult<Location> {
    Location::parse(s).map_err(py_err)
}

fn invalid(message: impl Into<String>) -> PyErr {
    py_err(tpde::Error::new(ErrorKind::InvalidArgument, message))
}

/// An open `.tpde` file (with its base attached, for a delta): the object behind
/// `tpde.safe_open`. Arrays that view its memory map keep it alive.
#[pyclass(frozen, module = "tpde._tpde")]
struct File {
    reader: Arc<FileReader>,
    /// Where the file is: every error names it.
    at: Location,
}

impl File {
    /// A read error as `TpdeError`, naming the file.
    fn err(&self, e: tpde::read::ReadError) -> PyErr {
        py_err(tpde::Error::from(e).context(&self.at))
    }

    fn entry(&self, name: &str) -> PyResult<&TensorEntry> {
        self.reader.tensor(name).map_err(|e| self.err(e))
    }

    /// A new zeroed `uint8` array of `len` bytes for (part of) tensor `t`: refused over the
    /// reader's `max_tensor_bytes`, and a `limit-exceeded` `TpdeError` when the memory cannot
    /// be had (numpy's C constructor would hand PyO3 a null pointer, which panics).
    fn new_array<'py>(&self, py: Python<'py>, t: &TensorEntry, len: u64) -> PyResult<Bound<'py, PyArray1<u8>>> {
        self.reader.check_size(t).map_err(|e| self.err(e))?;
        let out_of_memory =
            || py_err(tpde::Error::from(tpde::read::ReadError::OutOfMemory { name: t.name.clone(), bytes: len }));
        let len = usize::try_from(len).map_err(|_| out_of_memory())?;
        let array = py.import("numpy")?.getattr("zeros")?.call1((len, "uint8")).map_err(|e| {
            match e.is_instance_of::<pyo3::exceptions::PyMemoryError>(py) {
                true => out_of_memory(),
                false => e,
            }
        })?;
        Ok(array.cast_into::<PyArray1<u8>>()?)
    }
}

#[pymethods]
impl File {
    /// Opens `path`; a delta is attached to `base` if given, else to the base its path hint
    /// names (which may be missing: reading a delta tensor then fails with `base-missing`).
    /// `follow_hints=False` follows no hint; `hint_roots` follows local hints only into those
    /// folders. `max_tensor_bytes` caps the tensors decoded (default 16 GiB).
    #[new]
    #[pyo3(signature = (path, base=None, follow_hints=true, hint_roots=None, max_tensor_bytes=None))]
    fn new(
        py: Python<'_>,
        path: &str,
        base: Option<&str>,
        follow_hints: bool,
        hint_roots: Option<Vec<PathBuf>>,
        max_tensor_bytes: Option<u64>,
    ) -> PyResult<Self> {
        let (path, base) = (location(path)?, base.map(location).transpose()?);
        let mut opts = open::OpenOptions { hints: hint_policy(follow_hints, hint_roots), ..Default::default() };
        if let Some(limit) = max_tensor_bytes {
            opts.read.max_tensor_bytes = limit;
        }
        let reader = py.detach(|| open_tpde_with(&path, base.as_ref(), &opts)).map_err(py_err)?;
        Ok(File { reader: Arc::new(reader), at: path })
    }

    /// For a file in object storage, `(requests, bytes)` its reads sent and received so far
    /// (opening included; not its bases'); `None` for a local file.
    fn object_stats(&self) -> Option<(u64, u64)> {
        self.reader.source().object_stats().map(|s| (s.requests, s.bytes))
    }

    /// Tensor names, in the file's order.
    fn keys(&self) -> Vec<String> {
        self.reader.tensors().iter().map(|t| t.name.clone()).collect()
    }

    /// The user's metadata: every entry outside the reserved `tpde.` namespace, as strings.
    fn metadata(&self) -> BTreeMap<String, String> {
        tpde::unpack::safetensors_metadata(&self.reader)
    }

    /// Every metadata entry, reserved ones included, as strings.
    fn all_metadata(&self) -> BTreeMap<String, String> {
        self.reader.directory().metadata.iter().map(|m| (m.key.clone(), m.value.to_string())).collect()
    }

    /// `(dtype name, shape)` of a tensor.
    fn info(&self, name: &str) -> PyResult<(&'static str, Vec<u64>)> {
        let t = self.entry(name)?;
        Ok((t.dtype.name(), t.shape.clone()))
    }

    /// Whether the file is a delta (needs a base).
    fn is_delta(&self) -> bool {
        self.reader.directory().base.is_some()
    }

    /// The hex content digest of what the file decodes to.
    fn content_digest(&self) -> String {
        to_hex(&self.reader.content_digest())
    }

    /// Bytes of the file, and stored (compressed) bytes of its tensors.
    fn sizes(&self) -> (u64, u64) {
        (self.reader.file_len(), self.reader.tensors().iter().map(|t| t.stored_length()).sum())
    }

    /// Stored (compressed) bytes of one tensor's chunks.
    fn stored_bytes(&self, name: &str) -> PyResult<u64> {
        Ok(self.entry(name)?.stored_length())
    }

    /// Checks every CRC and digest (decoding every tensor).
    fn verify(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.reader.verify().map(|_| ())).map_err(|e| self.err(e))
    }

    /// A tensor's bytes as a flat `uint8` array: a read-only view of the memory map when it is
    /// stored `raw` (no copy), else decoded straight into a new array.
    fn read<'py>(slf: &Bound<'py, Self>, name: &str) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let this = slf.get();
        let t = this.entry(name)?;
        if this.reader.is_zero_copy(t) {
            let bytes = slf.py().detach(|| this.reader.read_tensor(t)).map_err(|e| this.err(e))?;
            let view = ArrayView1::from(&bytes[..]);
            // SAFETY: `bytes` borrows the memory map owned by `this.reader`, which lives as
            // long as `slf`; the array holds `slf` as its base object, so the map outlives it,
            // and a map never moves. The array is made read-only before Python sees it.
            let array = unsafe { PyArray1::borrow_from_array(&view, slf.clone().into_any()) };
            array.readwrite().make_nonwriteable();
            return Ok(array);
        }
        let array = this.new_array(slf.py(), t, t.byte_length)?;
        {
            let mut rw = array.readwrite();
            let out = rw.as_slice_mut().expect("a new array is contiguous");
            slf.py()
                .detach(|| {
                    tpde::read::populate(out); // fresh pages, as in `read_many`
                    this.reader.read_into(t, out)
                })
                .map_err(|e| this.err(e))?;
        }
        Ok(array)
    }

    /// The bytes of several tensors, as [`File::read`] gives each, but decoded in one parallel
    /// pass over all their chunks (most tensors are one chunk: read one by one, they keep one
    /// core busy). With `copy_raw`, `raw` tensors are copied into new arrays too (in the same
    /// pass) instead of viewing the map: for frameworks that need writable memory.
    /// `progress(done, total)` is called as it goes (see `save`); Ctrl-C raises once the pass
    /// ends, the arrays dropped.
    #[pyo3(signature = (names, copy_raw=false, progress=None))]
    fn read_many<'py>(
        slf: &Bound<'py, Self>,
        names: Vec<String>,
        copy_raw: bool,
        progress: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<Bound<'py, PyArray1<u8>>>> {
        let this = slf.get();
        let entries = names.iter().map(|n| this.entry(n)).collect::<PyResult<Vec<_>>>()?;
        let mut arrays = Vec::with_capacity(entries.len());
        let mut decode = Vec::new();
        for (k, t) in entries.iter().enumerate() {
            if !copy_raw && this.reader.is_zero_copy(t) {
                arrays.push(Self::read(slf, &t.name)?);
            } else {
                arrays.push(this.new_array(slf.py(), t, t.byte_length)?);
                decode.push(k);
            }
        }
        {
            let mut writers = decode.iter().map(|&k| arrays[k].readwrite()).collect::<Vec<_>>();
            let jobs = decode
                .iter()
                .zip(writers.iter_mut())
                .map(|(&k, rw)| (entries[k], rw.as_slice_mut().expect("a new array is contiguous")))
                .collect::<Vec<_>>();
            let total: u64 = decode.iter().map(|&k| entries[k].byte_length).sum();
            let read = interrupt::interruptible(slf.py(), progress.as_ref(), |cancel| {
                cancel.set_length(total);
                // The arrays are fresh: their pages mapped a few calls each, on every core,
                // rather than a fault per page as the decoder writes them.
                let mut jobs = jobs;
                jobs.par_iter_mut().for_each(|(_, out)| tpde::read::populate(out));
                Ok(this.reader.read_many_into_reporting(jobs, &|bytes| cancel.inc(bytes)))
            })?;
            read.map_err(py_err)?.map_err(|e| this.err(e))?;
        }
        Ok(arrays)
    }

    /// Decodes tensors `names` into `outs`: writable, contiguous `uint8` arrays of exactly each
    /// tensor's bytes (views of memory the caller already has, such as a model's parameters),
    /// in one parallel pass, without new pages or a copy. Arrays must not overlap.
    fn read_into(&self, py: Python<'_>, names: Vec<String>, outs: Vec<Bound<'_, PyArray1<u8>>>) -> PyResult<()> {
        if names.len() != outs.len() {
            return Err(invalid(format!("{} names but {} arrays", names.len(), outs.len())));
        }
        let entries = names.iter().map(|n| self.entry(n)).collect::<PyResult<Vec<_>>>()?;
        // Arrays over one storage through different objects (torch tensors' `.numpy()`) escape
        // numpy's borrow tracking: overlaps are refused here, before any slice exists.
        let mut spans: Vec<(usize, usize, usize)> = outs
            .iter()
            .enumerate()
            .filter(|(_, a)| a.len() > 0)
            .map(|(k, a)| (a.data() as usize, a.len(), k))
            .collect();
        spans.sort_unstable();
        if let Some(w) = spans.windows(2).find(|w| w[0].0 + w[0].1 > w[1].0) {
            return Err(invalid(format!(
                "tensors {:?} and {:?}: their arrays overlap; give each its own memory",
                names[w[0].2], names[w[1].2]
            )));
        }
        let mut writers = Vec::with_capacity(outs.len());
        for (t, out) in entries.iter().zip(&outs) {
            // numpy's borrow tracking refuses an array that overlaps one already borrowed.
            let rw = out.try_readwrite().map_err(|e| {
                invalid(format!(
                    "tensor {:?}: its array cannot be written here ({e}); is it read-only or shared?",
                    t.name
                ))
            })?;
            writers.push(rw);
        }
        let mut jobs = Vec::with_capacity(entries.len());
        for (t, rw) in entries.iter().zip(writers.iter_mut()) {
            let out =
                rw.as_slice_mut().map_err(|_| invalid(format!("tensor {:?}: its array is not contiguous", t.name)))?;
            jobs.push((*t, out));
        }
        py.detach(|| self.reader.read_many_into(jobs)).map_err(|e| self.err(e))
    }

    /// Bytes `start..end` of a tensor, decoding only the chunks that cover them.
    fn read_range<'py>(slf: &Bound<'py, Self>, name: &str, start: u64, end: u64) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let this = slf.get();
        let t = this.entry(name)?;
        if start > end || end > t.byte_length {
            return Err(invalid(format!("tensor {name:?}: byte range {start}..{end} outside 0..{}", t.byte_length)));
        }
        let array = this.new_array(slf.py(), t, end - start)?;
        {
            let mut rw = array.readwrite();
            let out = rw.as_slice_mut().expect("a new array is contiguous");
            slf.py().detach(|| read_range(&this.reader, t, start, out)).map_err(|e| py_err(e.context(&this.at)))?;
        }
        Ok(array)
    }
}

/// A checkpoint as a file written by [`save`] decodes, held in memory (`save(keep=True)`):
/// the base of the next delta without decoding that file and its chain again.
#[pyclass(frozen, module = "tpde._tpde")]
struct Snapshot {
    tensors: Arc<MemoryCheckpoint>,
    digest: Digest,
}

#[pymethods]
impl Snapshot {
    /// The content digest of the tensors held (hex): the file's.
    fn content_digest(&self) -> String {
        to_hex(&self.digest)
    }

    /// Logical bytes held.
    fn nbytes(&self) -> u64 {
        self.tensors.logical_bytes()
    }
}

/// The base of a delta written at `output`: `snapshot` when it holds what the file `path`
/// decodes to (same content digest, read from the file's directory), else the file itself
/// and its chain.
fn base_of(at: &Location, snapshot: Option<&Snapshot>) -> Result<Arc<dyn tpde::Base>, tpde::Error> {
    if let Some(s) = snapshot {
        let tpde_file = match at {
            Location::Local(p) => open::is_tpde(p)?,
            Location::Object(_) => true,
        };
        if tpde_file && open::open_reader(at)?.content_digest() == s.digest {
            return Ok(s.tensors.clone());
        }
    }
    open_base(at)
}

/// Writes tensors to `path` atomically. `tensors` is a list of `(name, dtype name, shape,
/// flat uint8 array)`; `metadata` the user's string entries. With `base` (a `.tpde` or
/// `.safetensors` path) the file is a delta against it, decoded from `base_snapshot` when that
/// holds what `base` decodes to; `max_abs_error` (τ) and `max_rel_error` (ρ) make a delta lossy
/// (a change of at most τ + ρ·|x| is dropped), except for the tensors
/// named in `exact`. Returns a dict of what was written, with the written checkpoint as a
/// `Snapshot` under "snapshot" if `keep`.
#[pyfunction]
#[pyo3(signature = (path, tensors, metadata=None, base=None, codec="auto", max_abs_error=None, exact=None, keep=false, base_snapshot=None, max_rel_error=None, predictions=None, progress=None, expect=None))]
#[allow(clippy::too_many_arguments)]
fn save<'py>(
    py: Python<'py>,
    path: &str,
    tensors: Vec<(String, String, Vec<u64>, PyReadonlyArray1<'py, u8>)>,
    metadata: Option<BTreeMap<String, String>>,
    base: Option<&str>,
    codec: &str,
    max_abs_error: Option<f64>,
    exact: Option<HashSet<String>>,
    keep: bool,
    base_snapshot: Option<PyRef<'py, Snapshot>>,
    max_rel_error: Option<f64>,
    predictions: Option<Vec<PredictionArg>>,
    progress: Option<Bound<'py, PyAny>>,
    expect: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let encoder = encoder(codec)?;
    let predictions = prediction_candidates(predictions.unwrap_or_default())?;
    let (path, base) = (location(path)?, base.map(location).transpose()?);
    check_bounds(max_abs_error, max_rel_error)?;
    let mut refs: Vec<(String, DType, Vec<u64>)> = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, data) in &tensors {
        let dt = DType::from_name(dtype).ok_or_else(|| invalid(format!("tensor {name:?}: unknown dtype {dtype:?}")))?;
        let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        let want = elements.and_then(|n| n.checked_mul(dt.size()));
        if want != Some(data.len() as u64) {
            return Err(invalid(format!("tensor {name:?}: {} bytes given for shape {shape:?} of {dtype}", data.len())));
        }
        refs.push((name.clone(), dt, shape.clone()));
    }
    let slices: Vec<&[u8]> = tensors
        .iter()
        .map(|t| t.3.as_slice().map_err(|_| invalid("tensor data must be contiguous")))
        .collect::<PyResult<_>>()?;
    let metadata: Vec<(String, String)> = metadata.unwrap_or_default().into_iter().collect();
    let snapshot = base_snapshot.as_deref();
    // Ctrl-C stops a long save between batches, leaving nothing behind.
    let Packed { report, reconstruction: kept } = interrupt::interruptible(py, progress.as_ref(), |cancel| {
        let base_ck = base.as_ref().map(|b| base_of(b, snapshot)).transpose()?;
        let list: Vec<TensorRef<'_>> =
            refs.iter().zip(&slices).map(|((n, d, s), data)| (n.as_str(), *d, s.as_slice(), *data)).collect();
        let job = PackJob {
            options: WriteOptions { encoder, ..WriteOptions::default() },
            base: base_ck.as_deref().zip(base.as_ref()).map(|(b, at)| (b, path.hint_to(at))),
            max_abs_error,
            max_rel_error,
            exact: exact.unwrap_or_default(),
            keep_reconstruction: keep,
            predictions,
            expect: object::expected(expect.as_deref()),
        };
        let source = PackSource::Tensors { tensors: &list, metadata: &metadata, format: "python" };
        tpde::pack(source, &path, job, cancel)
    })?
    .map_err(py_err)?;
    let d = pack_report(py, &report)?;
    if let Some(k) = kept {
        d.set_item("snapshot", Snapshot { tensors: Arc::new(k), digest: report.content_digest })?;
    }
    Ok(d)
}

/// Writes the tensors `snapshot` holds to `path` atomically, lossless: a keyframe, or with
/// `base` a delta against it (decoded from `base_snapshot` when that holds what `base` decodes
/// to). The file decodes to the snapshot's tensors, so to its content digest. For re-encoding a checkpoint that
/// is in memory against another base (the Checkpointer's newest-as-keyframe layout) without
/// copying it to Python. `order`, the snapshot's tensor names, is the order to write them in
/// (the file's they came from, so that the bytes are those written from the file); by name if
/// not given. `predictions` are `save`'s.
#[pyfunction]
#[pyo3(signature = (path, snapshot, metadata=None, base=None, base_snapshot=None, codec="auto", order=None, predictions=None, expect=None))]
#[allow(clippy::too_many_arguments)]
fn save_snapshot<'py>(
    py: Python<'py>,
    path: &str,
    snapshot: PyRef<'py, Snapshot>,
    metadata: Option<BTreeMap<String, String>>,
    base: Option<&str>,
    base_snapshot: Option<PyRef<'py, Snapshot>>,
    codec: &str,
    order: Option<Vec<String>>,
    predictions: Option<Vec<PredictionArg>>,
    expect: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let encoder = encoder(codec)?;
    let predictions = prediction_candidates(predictions.unwrap_or_default())?;
    let (path, base) = (location(path)?, base.map(location).transpose()?);
    let metadata: Vec<(String, String)> = metadata.unwrap_or_default().into_iter().collect();
    let (content, base_snapshot) = (snapshot.tensors.clone(), base_snapshot.as_deref());
    let mut list = content.tensors();
    if let Some(order) = order {
        let at: HashMap<&str, usize> = order.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
        if order.len() != list.len() || list.iter().any(|t| !at.contains_key(t.0)) {
            return Err(invalid("order must name each of the snapshot's tensors once"));
        }
        list.sort_unstable_by_key(|t| at[t.0]);
    }
    let Packed { report, .. } = interrupt::interruptible(py, None, |cancel| {
        let base_ck = base.as_ref().map(|b| base_of(b, base_snapshot)).transpose()?;
        let job = PackJob {
            base: base_ck.as_deref().zip(base.as_ref()).map(|(b, at)| (b, path.hint_to(at))),
            predictions,
            expect: object::expected(expect.as_deref()),
            ..PackJob::keyframe(WriteOptions { encoder, ..WriteOptions::default() })
        };
        let source = PackSource::Tensors { tensors: &list, metadata: &metadata, format: "python" };
        tpde::pack(source, &path, job, cancel)
    })?
    .map_err(py_err)?;
    pack_report(py, &report)
}

/// Lossy bounds must be finite and not negative.
fn check_bounds(max_abs_error: Option<f64>, max_rel_error: Option<f64>) -> PyResult<()> {
    for (name, bound) in [("max_abs_error", max_abs_error), ("max_rel_error", max_rel_error)] {
        if bound.is_some_and(|t| !(t.is_finite() && t >= 0.0)) {
            return Err(invalid(format!("{name} must be a finite number >= 0")));
        }
    }
    Ok(())
}

fn pack_report<'py>(py: Python<'py>, report: &PackReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("tensors", report.tensors)?;
    d.set_item("delta_tensors", report.delta_tensors)?;
    d.set_item("logical_bytes", report.logical_bytes)?;
    d.set_item("stored_bytes", report.stored_bytes)?;
    d.set_item("file_bytes", report.file_bytes)?;
    d.set_item("content_digest", to_hex(&report.content_digest))?;
    d.set_item("seconds", report.seconds)?;
    d.set_item("files", report.files)?;
    d.set_item("skipped_files", report.skipped_files)?;
    let links: Vec<(&str, String)> = report.links.iter().map(|(p, t)| (p.as_str(), t.display().to_string())).collect();
    d.set_item("links", links)?;
    Ok(d)
}

/// `tpde pack`: a `.safetensors` file or a Hugging Face model folder into one `.tpde` file at
/// `output`, a delta against `base` (a `.tpde`, a `.safetensors` or a model folder) if given.
#[pyfunction]
#[pyo3(signature = (input, output, base=None, codec="auto", max_abs_error=None, max_rel_error=None, progress=None))]
#[allow(clippy::too_many_arguments)]
fn pack<'py>(
    py: Python<'py>,
    input: PathBuf,
    output: &str,
    base: Option<&str>,
    codec: &str,
    max_abs_error: Option<f64>,
    max_rel_error: Option<f64>,
    progress: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let encoder = encoder(codec)?;
    let (output, base) = (location(output)?, base.map(location).transpose()?);
    check_bounds(max_abs_error, max_rel_error)?;
    let hint = base.as_ref().map(|b| output.hint_to(b));
    let report = interrupt::interruptible(py, progress.as_ref(), |cancel| {
        let base_ck = base.as_ref().map(open_base).transpose()?;
        let job = PackJob {
            base: base_ck.as_deref().zip(base.as_ref()).map(|(b, at)| (b, output.hint_to(at))),
            max_abs_error,
            max_rel_error,
            ..PackJob::keyframe(WriteOptions { encoder, ..WriteOptions::default() })
        };
        tpde::pack(PackSource::Path(&input), &output, job, cancel).map(|p| p.report)
    })?
    .map_err(py_err)?;
    let d = pack_report(py, &report)?;
    d.set_item("hint_note", hint.and_then(|h| open::hint_note(&output, &h)))?;
    Ok(d)
}

/// `tpde unpack`: a `.tpde` file into a `.safetensors` file, or, if it was packed from a
/// model folder and `output` does not end in `.safetensors`, into that folder again.
/// Ctrl-C stops it, leaving no file; `progress(done, total)` is called as it goes.
#[pyfunction]
#[pyo3(signature = (input, output, base=None, follow_hints=true, hint_roots=None, progress=None, replace=false))]
#[allow(clippy::too_many_arguments)]
fn unpack<'py>(
    py: Python<'py>,
    input: &str,
    output: PathBuf,
    base: Option<&str>,
    follow_hints: bool,
    hint_roots: Option<Vec<PathBuf>>,
    progress: Option<Bound<'py, PyAny>>,
    replace: bool,
) -> PyResult<(u64, u64)> {
    let (input, base) = (location(input)?, base.map(location).transpose()?);
    let opts = open::OpenOptions { hints: hint_policy(follow_hints, hint_roots), ..Default::default() };
    let r = interrupt::interruptible(py, progress.as_ref(), |cancel| {
        tpde::unpack::unpack_with(&input, base.as_ref(), &output, &opts, replace, cancel)
    })?
    .map_err(py_err)?;
    Ok((r.tensors, r.logical_bytes))
}

/// The hints followed: none, only into `hint_roots` (empty: none local, and URLs only within the
/// bucket opened), or every one.
fn hint_policy(follow_hints: bool, hint_roots: Option<Vec<PathBuf>>) -> open::HintPolicy {
    match (follow_hints, hint_roots) {
        (false, _) => open::HintPolicy::none(),
        (true, Some(roots)) => open::HintPolicy { paths: tpde::read::PathHints::Within(roots), ..Default::default() },
        (true, None) => open::HintPolicy::default(),
    }
}

/// The names of the files in the folder `path` (a local folder, not recursive, or an object
/// prefix `s3://bucket/prefix`, every key below it), sorted; none for a missing folder.
#[pyfunction]
fn list_files(py: Python<'_>, path: &str) -> PyResult<Vec<String>> {
    let at = location(path)?;
    py.detach(|| at.list()).map_err(py_err)
}

/// Whether a file (not a folder) is at `path`, a local path or an object URL.
#[pyfunction]
fn is_file(py: Python<'_>, path: &str) -> PyResult<bool> {
    let at = location(path)?;
    py.detach(|| at.is_file()).map_err(py_err)
}

/// Whether the local file at `path` starts with the TPDE magic (the facade's one test of it).
#[pyfunction]
fn is_tpde(py: Python<'_>, path: PathBuf) -> PyResult<bool> {
    py.detach(|| tpde::open::is_tpde(&path)).map_err(py_err)
}

/// Copies the file at `source` to `dest` (paths or object URLs), streaming; the copy appears
/// whole or not at all. Returns the bytes copied.
#[pyfunction]
fn copy(py: Python<'_>, source: &str, dest: &str) -> PyResult<u64> {
    let (from, to) = (location(source)?, location(dest)?);
    py.detach(|| tpde::location::copy(&from, &to)).map_err(py_err)
}

/// Removes the file at `path`, a local path or an object URL (a missing one is no error).
#[pyfunction]
fn remove(py: Python<'_>, path: &str) -> PyResult<()> {
    let at = location(path)?;
    py.detach(|| at.remove()).map_err(py_err)
}

/// The spec's dtype names, in registry order: `(name, bytes per element)`.
#[pyfunction]
fn dtypes(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyTuple>>> {
    DType::ALL
        .iter()
        .map(|d| PyTuple::new(py, [d.name().into_pyobject(py)?.into_any(), d.size().into_pyobject(py)?.into_any()]))
        .collect()
}

/// Runs the `tpde` (or, with `inspect`, `tpde-inspect`) command line on `argv` (the program's
/// name first) and returns its exit status: the console scripts `pip install` puts on `PATH`.
#[pyfunction]
#[pyo3(signature = (argv, inspect=false))]
fn cli(py: Python<'_>, argv: Vec<std::ffi::OsString>, inspect: bool) -> u8 {
    py.detach(|| match inspect {
        false => tpde_cli::cli::tpde(argv),
        true => tpde_cli::cli::tpde_inspect(argv),
    })
}

#[pymodule]
fn _tpde(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("RESERVED_PREFIX", RESERVED_PREFIX)?;
    m.add("TpdeError", m.py().get_type::<TpdeError>())?;
    m.add_class::<File>()?;
    m.add_class::<Snapshot>()?;
    m.add_class::<staging::Stages>()?;
    m.add_function(wrap_pyfunction!(save, m)?)?;
    m.add_function(wrap_pyfunction!(save_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(pack, m)?)?;
    m.add_function(wrap_pyfunction!(unpack, m)?)?;
    m.add_function(wrap_pyfunction!(dtypes, m)?)?;
    m.add_function(wrap_pyfunction!(list_files, m)?)?;
    m.add_function(wrap_pyfunction!(is_file, m)?)?;
    m.add_function(wrap_pyfunction!(is_tpde, m)?)?;
    m.add_function(wrap_pyfunction!(remove, m)?)?;
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add_function(wrap_pyfunction!(copy, m)?)?;
    m.add_function(wrap_pyfunction!(object::object_create_new, m)?)?;
    m.add_function(wrap_pyfunction!(object::object_read, m)?)?;
    m.add_function(wrap_pyfunction!(object::object_write, m)?)?;
    m.add_function(wrap_pyfunction!(object::object_version, m)?)?;
    Ok(())
}
