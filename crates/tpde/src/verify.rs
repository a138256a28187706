//! Checking a packed file against what it was packed from: bit-exact, or within the lossy
//! bound it records; and two safetensors files against each other.

use std::path::{Path, PathBuf};

use tpde_format::metadata::{KEY_MAX_ABS_ERROR, KEY_MAX_REL_ERROR};
use tpde_format::MetadataValue;
use tpde_write::lossy::{self, Bound};

use crate::location::Location;
use crate::open::open_tpde;
use crate::safetensors::SafetensorsFile;
use crate::{Error, ErrorKind};

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

/// One checkpoint file of a folder, and what checking it found ([`verify_folder`]).
#[derive(Debug)]
pub struct FolderCheck {
    /// The file, relative to the folder.
    pub path: std::path::PathBuf,
    /// The base its path hint names, as the file records it (None: a keyframe).
    pub base: Option<String>,
    /// Its whole chain checked ([`tpde_read::Reader::verify_with`]), or why not.
    pub result: Result<tpde_read::VerifyReport, Error>,
}

/// Checks every TPDE file under `folder` (any name: a `Checkpointer`'s steps, Lightning's
/// `.ckpt` files, a Trainer's `checkpoint-N/checkpoint.tpde`), each with the chain its hints
/// name, as a load of it would: a file whose base was deleted, damaged or replaced fails here,
/// before anyone needs it. Hints are confined to `folder` unless `opts` says otherwise; links are
/// not followed into. In path order.
pub fn verify_folder(folder: &Path, opts: &crate::open::OpenOptions) -> Result<Vec<FolderCheck>, Error> {
    use crate::open::open_tpde_with;
    use tpde_read::PathHints;

    let mut opts = opts.clone();
    if opts.hints.paths == PathHints::WithinStart {
        opts.hints.paths = PathHints::Within(vec![folder.to_path_buf()]);
    }
    Ok(tpde_files(folder)?
        .into_iter()
        .map(|path| {
            let at = Location::Local(path.clone());
            let base = base_hint(&path, opts.read).ok().flatten();
            let result = open_tpde_with(&at, None, &opts)
                .and_then(|r| r.verify_with(|_| {}).map_err(|e| Error::from(e).context(&at)));
            let path = path.strip_prefix(folder).unwrap_or(&path).to_path_buf();
            FolderCheck { path, base, result }
        })
        .collect())
}

/// The TPDE files under `folder`, whatever their names, in path order; links are not followed.
fn tpde_files(folder: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut files = Vec::new();
    let mut pending = vec![folder.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| Error::from(e).context(dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::from(e).context(dir.display()))?;
            let kind = entry.file_type().map_err(|e| Error::from(e).context(entry.path().display()))?;
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file() && crate::open::is_tpde(&entry.path())? {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    Ok(files)
}

/// One TPDE file of a folder and its place in the folder's chains ([`folder_chains`]). Paths
/// are relative to the folder.
#[derive(Debug)]
pub struct ChainLink {
    /// The file.
    pub path: PathBuf,
    /// Its base's path hint as the file records it (None: a keyframe); `Err` if its header or
    /// directory does not read.
    pub base: Result<Option<String>, Error>,
    /// The folder's file that hint names, if it is one.
    pub base_file: Option<PathBuf>,
    /// The files whose chains run through this one: what deleting it makes unloadable.
    pub needed_by: Vec<PathBuf>,
}

/// The path hint of the base of the TPDE file at `path`, read from its directory (None: a
/// keyframe).
fn base_hint(path: &Path, read: tpde_read::ReadOptions) -> Result<Option<String>, Error> {
    let r = crate::open::open_reader_with(&Location::Local(path.to_path_buf()), read)?;
    Ok(r.directory().base.as_ref().map(|b| b.path_hint.clone()))
}

/// Which file of `folder` each TPDE file under it needs, from the files' directories alone
/// (nothing is decoded: [`verify_folder`] checks the chains), and so what deleting each costs.
pub fn folder_chains(folder: &Path) -> Result<Vec<ChainLink>, Error> {
    let files = tpde_files(folder)?;
    let canonical: Vec<Option<PathBuf>> = files.iter().map(|f| f.canonicalize().ok()).collect();
    let (hints, bases): (Vec<_>, Vec<Option<usize>>) = files
        .iter()
        .map(|path| {
            let hint = base_hint(path, Default::default());
            let base = hint.as_ref().ok().and_then(|h| h.as_deref()).and_then(|h| {
                let named = tpde_read::chain::resolve_path_hint(path, h).canonicalize().ok()?;
                canonical.iter().position(|c| c.as_ref() == Some(&named))
            });
            (hint, base)
        })
        .unzip();
    // Each file's chain, walked up through the folder's files (bounded: a loop stops it). Files
    // are in path order, so each `needed_by` is too.
    let relative = |i: usize| files[i].strip_prefix(folder).unwrap_or(&files[i]).to_path_buf();
    let mut needed_by = vec![Vec::new(); files.len()];
    for i in 0..files.len() {
        let mut seen = vec![i];
        let mut at = bases[i];
        while let Some(j) = at.filter(|j| !seen.contains(j)) {
            needed_by[j].push(relative(i));
            seen.push(j);
            at = bases[j];
        }
    }
    Ok(hints
        .into_iter()
        .zip(bases)
        .zip(needed_by)
        .enumerate()
        .map(|(i, ((base, b), needed_by))| ChainLink { path: relative(i), base, base_file: b.map(relative), needed_by })
        .collect())
}
