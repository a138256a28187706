//! The conformance corpus (`conformance/`): its manifest, and the runner behind
//! `tpde conformance DIR`. The manifest is the contract for every implementation of the spec;
//! `conformance/README.md` explains it to people writing one.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(feature = "gpu")]
use tpde_gpu::{DeviceCheckpoint, Gpu, GpuError};

/// Stands for the GPU in a build without the GPU decoder: there is none to run on.
#[cfg(not(feature = "gpu"))]
pub enum Gpu {}
use tpde::read::{open_chain, ReadError, Reader};

pub use tpde_conformance::*;

/// The result of one corpus file.
#[derive(Debug)]
pub struct Outcome {
    /// The file, relative to the corpus folder.
    pub file: String,
    /// The rule or section it tests.
    pub rule: String,
    /// `None` if it passed, else what went wrong.
    pub failure: Option<String>,
    /// For a file rejected as expected, the reader's message.
    pub rejected_with: Option<String>,
}

/// Which decoder the corpus runs through.
#[derive(Clone, Copy)]
pub enum Backend<'a> {
    /// `tpde-read` on the CPU.
    Cpu,
    /// `tpde-gpu` on this device: tensors decoded on the GPU, read back, and checked against
    /// their digests; the file structure and CRCs are still read by `tpde-read`.
    Gpu(&'a Gpu),
}

/// Runs every file of the corpus in `dir` through the CPU reader. Files in `valid/` or
/// `invalid/` that the manifest does not list fail too: a corpus file without an expectation
/// tests nothing.
pub fn run(dir: &Path) -> Result<Vec<Outcome>, String> {
    run_on(dir, Backend::Cpu)
}

/// [`run`] through `backend`.
pub fn run_on(dir: &Path, backend: Backend) -> Result<Vec<Outcome>, String> {
    let manifest = load_manifest(dir)?;
    let cases: HashMap<&str, &Case> = manifest.files.iter().map(|c| (c.file.as_str(), c)).collect();
    let mut outcomes: Vec<Outcome> = manifest
        .files
        .iter()
        .map(|case| {
            let (failure, rejected_with) = match check(dir, case, &cases, backend) {
                Ok(message) => (None, message),
                Err(failure) => (Some(failure), None),
            };
            Outcome { file: case.file.clone(), rule: case.rule.clone(), failure, rejected_with }
        })
        .collect();
    for sub in ["valid", "invalid"] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub)) else { continue };
        let mut unlisted: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| format!("{sub}/{}", e.file_name().to_string_lossy()))
            .filter(|f| !cases.contains_key(f.as_str()))
            .collect();
        unlisted.sort();
        outcomes.extend(unlisted.into_iter().map(|file| Outcome {
            file,
            rule: "-".into(),
            failure: Some("not listed in the manifest".into()),
            rejected_with: None,
        }));
    }
    Ok(outcomes)
}

/// `Ok` with the reader's message for a file rejected as expected.
fn check(dir: &Path, case: &Case, cases: &HashMap<&str, &Case>, backend: Backend) -> Result<Option<String>, String> {
    let result = match backend {
        Backend::Cpu => read_case(dir, case, cases).map_err(|e| (e.kind(), e.to_string())),
        #[cfg(feature = "gpu")]
        Backend::Gpu(gpu) => gpu_read_case(gpu, dir, case, cases).map_err(|e| (e.kind(), e.to_string())),
        #[cfg(not(feature = "gpu"))]
        Backend::Gpu(gpu) => match *gpu {},
    };
    match (&case.expect, result) {
        (Expect::Valid { tensors, metadata, files }, Ok(read)) => {
            compare(tensors, metadata, files, &read).map(|()| None)
        }
        (Expect::Valid { .. }, Err((kind, e))) => Err(format!("rejected ({kind}): {e}")),
        (Expect::Invalid { error }, Ok(_)) => Err(format!("accepted; expected {error}")),
        (Expect::Invalid { error }, Err((kind, e))) if kind.as_str() == error => Ok(Some(e)),
        (Expect::Invalid { error }, Err((kind, e))) => Err(format!("rejected as {kind}, expected {error}: {e}")),
    }
}

/// One file read as the corpus reads it, outside any manifest: with `bases` attached in order
/// (the file's base, then that base's base, ...), or through its path hints. The JSON the
/// portable runner `conformance/run.py` expects of a reader: `{"tensors": [...], "metadata":
/// [...]}` as in the manifest, or `{"error": CATEGORY, "message": ...}`.
pub fn read_one_json(file: &Path, bases: &[PathBuf], follow_hints: bool) -> String {
    let result = (|| {
        let r = if follow_hints {
            open_chain(file)?
        } else {
            let mut chain: Option<Reader> = None;
            for b in bases.iter().rev() {
                let r = Reader::open(b).map_err(|e| given_base(e, b))?;
                chain = Some(match chain {
                    Some(base) => r.with_base(Arc::new(base))?,
                    None => r,
                });
            }
            let r = Reader::open(file)?;
            match chain {
                Some(base) => r.with_base(Arc::new(base))?,
                None => r,
            }
        };
        read_all(&r)
    })();
    let value = match result {
        Ok(read) if read.files.is_empty() => serde_json::json!({"tensors": read.tensors, "metadata": read.metadata}),
        Ok(read) => serde_json::json!({"tensors": read.tensors, "metadata": read.metadata, "files": read.files}),
        Err(e) => serde_json::json!({"error": e.kind().as_str(), "message": e.to_string()}),
    };
    value.to_string()
}

/// A base given to read against that is not a file (nothing there, or a folder) is a base not
/// found, `base-missing` (spec §7.3), as a hint that leads nowhere is; other errors are the base's own.
fn given_base(e: ReadError, path: &Path) -> ReadError {
    match e {
        ReadError::Io { source, .. }
            if matches!(source.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::IsADirectory) =>
        {
            ReadError::GivenBaseMissing { path: path.to_path_buf(), source }
        }
        e => e,
    }
}

/// What a file decoded to.
struct Read {
    tensors: Vec<ExpectedTensor>,
    metadata: Vec<ExpectedMetadata>,
    files: Vec<ExpectedFile>,
}

/// The files of `r`'s file table (spec §5.5) as the manifest lists them.
fn files_of(r: &Reader) -> Result<Vec<ExpectedFile>, ReadError> {
    Ok(r.files()?.iter().map(|f| ExpectedFile::new(&f.path, &f.data)).collect())
}

/// Opens the file with its base, reads every tensor in directory order, then verifies: the
/// order in which the manifest's expected error must come first.
fn read_case(dir: &Path, case: &Case, cases: &HashMap<&str, &Case>) -> Result<Read, ReadError> {
    read_all(&open_case(dir, case, cases, 0)?)
}

/// Reads every tensor of `r` in directory order, then verifies it.
fn read_all(r: &Reader) -> Result<Read, ReadError> {
    let mut tensors = Vec::with_capacity(r.tensors().len());
    for t in r.tensors() {
        let data = r.read_tensor(t)?;
        tensors.push(ExpectedTensor::new(&t.name, t.dtype, &t.shape, &data));
    }
    r.verify()?;
    let metadata = r.directory().metadata.iter().map(|m| ExpectedMetadata::new(&m.key, &m.value)).collect();
    Ok(Read { tensors, metadata, files: files_of(r)? })
}

fn open_case(dir: &Path, case: &Case, cases: &HashMap<&str, &Case>, depth: usize) -> Result<Reader, ReadError> {
    let path = dir.join(&case.file);
    if case.follow_hints {
        return open_chain(&path);
    }
    let reader = Reader::open(&path)?;
    let Some(base) = &case.base else { return Ok(reader) };
    let base_reader = open_case(dir, manifest_base(cases, base, depth)?, cases, depth + 1)?;
    reader.with_base(Arc::new(base_reader))
}

/// The manifest entry of the base `base` named by a case `depth` links down a chain.
fn manifest_base<'a>(cases: &HashMap<&str, &'a Case>, base: &str, depth: usize) -> Result<&'a Case, ReadError> {
    cases.get(base).copied().filter(|_| depth < tpde::read::MAX_CHAIN).ok_or_else(|| ReadError::Io {
        path: PathBuf::from(base),
        source: std::io::Error::other("the manifest lists no such base, or its bases loop"),
    })
}

#[cfg(feature = "gpu")]
/// [`read_case`] on the GPU: the file and its bases decoded onto the device, every tensor read
/// back and checked against its digest (R26), then the padding (R27), in the CPU reader's order.
fn gpu_read_case(gpu: &Gpu, dir: &Path, case: &Case, cases: &HashMap<&str, &Case>) -> Result<Read, GpuError> {
    let path = dir.join(&case.file);
    let reader = Reader::open(&path)?;
    let ck = if case.follow_hints { gpu.load_chain(&path)? } else { gpu_checkpoint(gpu, dir, case, cases, 0)? };
    let mut tensors = Vec::with_capacity(ck.tensors().len());
    for (t, d) in reader.tensors().iter().zip(ck.tensors()) {
        let data = gpu.read_back_verified(d, t)?;
        tensors.push(ExpectedTensor::new(&t.name, t.dtype, &t.shape, &data));
    }
    reader.verify_padding()?;
    let files = files_of(&reader)?;
    let metadata = reader.directory().metadata.iter().map(|m| ExpectedMetadata::new(&m.key, &m.value)).collect();
    Ok(Read { tensors, metadata, files })
}

/// The checkpoint of `case` on the device, its manifest base first.
#[cfg(feature = "gpu")]
fn gpu_checkpoint(
    gpu: &Gpu,
    dir: &Path,
    case: &Case,
    cases: &HashMap<&str, &Case>,
    depth: usize,
) -> Result<DeviceCheckpoint, GpuError> {
    let reader = Reader::open(dir.join(&case.file))?;
    let base = match &case.base {
        None => None,
        Some(base) => Some(gpu_checkpoint(gpu, dir, manifest_base(cases, base, depth)?, cases, depth + 1)?),
    };
    gpu.load(&reader, base.as_ref())
}

fn compare(
    tensors: &[ExpectedTensor],
    metadata: &[ExpectedMetadata],
    files: &[ExpectedFile],
    read: &Read,
) -> Result<(), String> {
    if read.tensors.len() != tensors.len() {
        return Err(format!("{} tensors, expected {}", read.tensors.len(), tensors.len()));
    }
    for (got, want) in read.tensors.iter().zip(tensors) {
        if got != want {
            return Err(format!("tensor {:?}: got {got:?}, expected {want:?}", want.name));
        }
    }
    let key = |m: &ExpectedMetadata| (m.key.clone(), m.type_code, m.bytes.clone());
    let got: Vec<_> = read.metadata.iter().map(key).collect();
    let want: Vec<_> = metadata.iter().map(key).collect();
    if got != want {
        return Err(format!("metadata {got:?}, expected {want:?}"));
    }
    if read.files != files {
        return Err(format!("files {:?}, expected {files:?}", read.files));
    }
    Ok(())
}

/// The runner's report: one line per file (with `failures_only`, per failing file), then the
/// totals.
pub fn render(outcomes: &[Outcome], failures_only: bool) -> String {
    let mut out = String::new();
    for o in outcomes.iter().filter(|o| !failures_only || o.failure.is_some()) {
        let status = if o.failure.is_none() { "ok  " } else { "FAIL" };
        let _ = write!(out, "{status} {:<6} {}", o.rule, o.file);
        match (&o.failure, &o.rejected_with) {
            (Some(why), _) if o.file.starts_with("invalid/") => {
                let _ = write!(out, ": the file breaks {} (spec §9): {why}", o.rule);
            }
            (Some(why), _) => {
                let _ = write!(out, ": {why}");
            }
            (None, Some(message)) => {
                let _ = write!(out, " ({message})");
            }
            (None, None) => {}
        }
        out.push('\n');
    }
    let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
    let _ = writeln!(out, "{} files: {} passed, {failed} failed", outcomes.len(), outcomes.len() - failed);
    out
}
