//! Checking a packed file against what it was packed from: bit-exact, or within the lossy
//! bound it records; and two safetensors files against each other.

use std::collections::HashMap;
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
/// not followed into; a subfolder that cannot be read is a failed check of its own. In path
/// order.
///
/// Each file is decoded once (and once more to hold it, below): files are checked bases first,
/// and a file of the folder that others are deltas against is held decoded in memory (up to
/// [`VERIFY_HOLD_BYTES`]) while they are checked against it, so a chain of n deltas costs n
/// decodes, not n²/2 (600 deltas in one chain took 101 s).
pub fn verify_folder(folder: &Path, opts: &crate::open::OpenOptions) -> Result<Vec<FolderCheck>, Error> {
    use std::sync::Arc;

    use crate::open::{open_reader_with, open_tpde_with};
    use tpde_read::PathHints;

    let mut opts = opts.clone();
    if opts.hints.paths == PathHints::WithinStart {
        opts.hints.paths = PathHints::Within(vec![folder.to_path_buf()]);
    }
    let links = links(folder)?;
    let mut checks: Vec<Option<FolderCheck>> = (0..links.files.len()).map(|_| None).collect();
    let mut waiting: Vec<usize> = vec![0; links.files.len()];
    for b in links.bases.iter().flatten() {
        waiting[*b] += 1;
    }
    let mut held: HashMap<usize, Arc<crate::memory::MemoryCheckpoint>> = HashMap::new();
    for i in links.bases_first() {
        let at = Location::Local(links.files[i].clone());
        let hint = links.hints[i].as_ref().ok().cloned().flatten();
        // Against the base held in memory where the hint leads to it and may be followed; else
        // as a load opens it (which says why a hint is not followed).
        let in_memory = links.bases[i].and_then(|b| {
            let allowed = opts.hints.paths != PathHints::Ignore && opts.hints.follow(&at, hint.as_deref()?).is_ok();
            held.get(&b).filter(|_| allowed).cloned()
        });
        let opened = match in_memory {
            Some(base) => open_reader_with(&at, opts.read)
                .and_then(|r| r.with_base(base).map_err(|e| Error::from(e).context(&at))),
            None => open_tpde_with(&at, None, &opts),
        };
        let result = opened.and_then(|r| {
            let report = r.verify_with(|_| {}).map_err(|e| Error::from(e).context(&at))?;
            if waiting[i] > 0 && report.logical_bytes <= VERIFY_HOLD_BYTES {
                held.insert(i, Arc::new(decoded(&r).map_err(|e| e.context(&at))?));
            }
            Ok(report)
        });
        if let Some(b) = links.bases[i] {
            waiting[b] -= 1;
            if waiting[b] == 0 {
                held.remove(&b);
            }
        }
        let path = links.files[i].strip_prefix(folder).unwrap_or(&links.files[i]).to_path_buf();
        checks[i] = Some(FolderCheck { path, base: hint, result });
    }
    let mut checks: Vec<FolderCheck> = checks.into_iter().flatten().collect();
    checks.extend(links.unreadable.into_iter().map(|(dir, e)| FolderCheck {
        path: dir.strip_prefix(folder).unwrap_or(&dir).to_path_buf(),
        base: None,
        result: Err(e),
    }));
    checks.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(checks)
}

/// The largest checkpoint (logical bytes) [`verify_folder`] holds decoded in memory while the
/// files that are deltas against it are checked; a larger one's dependents each decode their
/// chain from its keyframe, as a load does.
pub const VERIFY_HOLD_BYTES: u64 = 4 << 30;

/// Every tensor of `r` decoded, each checked against its digest, as a base in memory.
fn decoded(r: &crate::location::FileReader) -> Result<crate::memory::MemoryCheckpoint, Error> {
    let mut held = crate::memory::MemoryCheckpoint::default();
    for t in r.tensors() {
        let data = r.read_tensor(t)?;
        tpde_read::check_digest(t, &data)?;
        held.insert(&t.name, t.dtype, &t.shape, data.into_owned());
    }
    held.set_content_digest(r.content_digest());
    Ok(held)
}

/// The TPDE files under a folder and the folder's file each one's hint names ([`links`]).
struct Links {
    /// The files, in path order.
    files: Vec<PathBuf>,
    /// Each file's base hint (None: a keyframe), or why its directory does not read.
    hints: Vec<Result<Option<String>, Error>>,
    /// The index of the file each one's hint names, when it is one of `files`.
    bases: Vec<Option<usize>>,
    /// The subfolders that could not be read, and why.
    unreadable: Unreadable,
}

/// The TPDE files under `folder` with their bases: from the files' directories alone.
fn links(folder: &Path) -> Result<Links, Error> {
    let (files, unreadable) = tpde_files(folder)?;
    let canonical: HashMap<PathBuf, usize> =
        files.iter().enumerate().filter_map(|(i, f)| Some((f.canonicalize().ok()?, i))).collect();
    let (hints, bases) = files
        .iter()
        .map(|path| {
            let hint = base_hint(path, Default::default());
            let base = hint.as_ref().ok().and_then(|h| h.as_deref()).and_then(|h| {
                let named = tpde_read::chain::resolve_path_hint(path, h).canonicalize().ok()?;
                canonical.get(&named).copied()
            });
            (hint, base)
        })
        .unzip();
    Ok(Links { files, hints, bases, unreadable })
}

impl Links {
    /// Every file once, each after the folder's file it is a delta against (a file in a loop
    /// of hints, which no load finishes, comes after the others).
    fn bases_first(&self) -> Vec<usize> {
        let mut dependents = vec![Vec::new(); self.files.len()];
        for (i, b) in self.bases.iter().enumerate() {
            if let Some(b) = *b {
                dependents[b].push(i);
            }
        }
        let mut order = Vec::with_capacity(self.files.len());
        let mut placed = vec![false; self.files.len()];
        let roots = (0..self.files.len()).filter(|&i| self.bases[i].is_none());
        let mut pending: Vec<usize> = roots.collect::<Vec<_>>().into_iter().rev().collect();
        loop {
            while let Some(i) = pending.pop() {
                if !std::mem::replace(&mut placed[i], true) {
                    order.push(i);
                    pending.extend(dependents[i].iter().rev());
                }
            }
            match (0..self.files.len()).find(|&i| !placed[i]) {
                Some(i) => pending.push(i),
                None => return order,
            }
        }
    }
}

/// Subfolders that could not be read, and why.
type Unreadable = Vec<(PathBuf, Error)>;

/// The TPDE files under `folder`, whatever their names, in path order, and the subfolders that
/// could not be read (a failure of the folder itself is an error); links are not followed.
fn tpde_files(folder: &Path) -> Result<(Vec<PathBuf>, Unreadable), Error> {
    let (mut files, mut unreadable) = (Vec::new(), Vec::new());
    let mut pending = vec![folder.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let listed = std::fs::read_dir(&dir).and_then(|entries| {
            let mut found = Vec::new();
            for entry in entries {
                let entry = entry?;
                found.push((entry.path(), entry.file_type()?));
            }
            Ok(found)
        });
        let entries = match listed {
            Ok(entries) => entries,
            Err(e) if dir != folder => {
                unreadable.push((dir.clone(), Error::from(e).context(dir.display())));
                continue;
            }
            Err(e) => return Err(Error::from(e).context(dir.display())),
        };
        for (path, kind) in entries {
            if kind.is_dir() {
                pending.push(path);
            } else if kind.is_file() && crate::open::is_tpde(&path).unwrap_or(true) {
                files.push(path); // one that cannot be read is a file that fails its check
            }
        }
    }
    files.sort();
    Ok((files, unreadable))
}

/// One TPDE file of a folder and its place in the folder's chains ([`folder_chains`]). Paths
/// are relative to the folder.
#[derive(Debug)]
pub struct ChainLink {
    /// The file (or a subfolder that could not be read, with its error under `base`).
    pub path: PathBuf,
    /// Its base's path hint as the file records it (None: a keyframe); `Err` if its header or
    /// directory does not read.
    pub base: Result<Option<String>, Error>,
    /// The folder's file that hint names, if it is one.
    pub base_file: Option<PathBuf>,
    /// The files whose chains run through this one (indices into the list [`folder_chains`]
    /// returns, in path order): what deleting it makes unloadable.
    pub needed_by: Vec<usize>,
}

/// The path hint of the base of the TPDE file at `path`, read from its directory (None: a
/// keyframe).
fn base_hint(path: &Path, read: tpde_read::ReadOptions) -> Result<Option<String>, Error> {
    let r = crate::open::open_reader_with(&Location::Local(path.to_path_buf()), read)?;
    Ok(r.directory().base.as_ref().map(|b| b.path_hint.clone()))
}

/// Which file of `folder` each TPDE file under it needs, from the files' directories alone
/// (nothing is decoded: [`verify_folder`] checks the chains), and so what deleting each costs.
/// Unreadable subfolders are listed too, each with its error.
pub fn folder_chains(folder: &Path) -> Result<Vec<ChainLink>, Error> {
    let Links { files, hints, bases, unreadable } = links(folder)?;
    // Each file's chain, walked up through the folder's files once (a loop stops it: `walked`
    // marks the files this walk passed). Files are in path order, so each `needed_by` is too.
    let mut needed_by = vec![Vec::new(); files.len()];
    let mut walked = vec![usize::MAX; files.len()];
    for i in 0..files.len() {
        walked[i] = i;
        let mut at = bases[i];
        while let Some(j) = at.filter(|&j| walked[j] != i) {
            needed_by[j].push(i);
            walked[j] = i;
            at = bases[j];
        }
    }
    let relative = |p: &Path| p.strip_prefix(folder).unwrap_or(p).to_path_buf();
    let mut links: Vec<ChainLink> = hints
        .into_iter()
        .zip(bases)
        .zip(needed_by)
        .enumerate()
        .map(|(i, ((base, b), needed_by))| ChainLink {
            path: relative(&files[i]),
            base,
            base_file: b.map(|b| relative(&files[b])),
            needed_by,
        })
        .collect();
    // Unreadable subfolders after the files, so that the indices above stay valid.
    links.extend(unreadable.into_iter().map(|(dir, e)| ChainLink {
        path: relative(&dir),
        base: Err(e),
        base_file: None,
        needed_by: Vec::new(),
    }));
    Ok(links)
}
