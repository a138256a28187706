//! Bases of delta files (spec §6.3, §7): what a delta decodes against, and following a chain of
//! deltas back to its keyframe through the path hints the files record.

use std::borrow::Cow;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tpde_format::digest::Digest;
use tpde_format::DType;

use crate::{ReadError, Reader, Source};

/// The longest chain of deltas [`open_chain`] follows: a safeguard against hint loops that a
/// path check cannot see (links, mounts), far above any sensible keyframe interval.
pub const MAX_CHAIN: usize = 1024;

/// One tensor of a base.
#[derive(Clone, Debug)]
pub struct BaseTensor<'a> {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u64>,
    /// Logical bytes.
    pub data: Cow<'a, [u8]>,
    /// Its tensor digest (spec §7.1), when the base has it without hashing `data` (a TPDE
    /// file's directory records it), so a writer need not hash the bytes again.
    pub digest: Option<Digest>,
}

/// A checkpoint a delta file can decode against: another TPDE file (keyframe or delta, with its
/// own base attached), or any other container that can name its tensors (the `tpde` tool
/// implements it for `.safetensors`).
pub trait Base: Send + Sync {
    /// The content digest of the base's tensors (spec §7).
    fn content_digest(&self) -> Result<Digest, ReadError>;
    /// The tensor `name`, or `None` if the base has none.
    fn tensor(&self, name: &str) -> Result<Option<BaseTensor<'_>>, ReadError>;
    /// Whether this base decodes part of a tensor on its own ([`Base::read_range_into`]): then a
    /// delta asks it for each chunk's base bytes, and a chain is decoded a chunk at a time
    /// through all its files, instead of a whole tensor per file.
    fn reads_ranges(&self) -> bool {
        false
    }
    /// The dtype and shape of tensor `name`, or `None` if the base has none.
    fn tensor_info(&self, name: &str) -> Result<Option<(DType, Vec<u64>)>, ReadError> {
        Ok(self.tensor(name)?.map(|t| (t.dtype, t.shape)))
    }
    /// Decodes bytes `range` of tensor `name` (which has the dtype and shape the caller
    /// checked) into `out`, of the range's length. Only called when [`Base::reads_ranges`].
    fn read_range_into(&self, name: &str, range: std::ops::Range<u64>, out: &mut [u8]) -> Result<(), ReadError> {
        let t = self.tensor(name)?.ok_or_else(|| ReadError::NotFound { name: name.into() })?;
        out.copy_from_slice(&t.data[range.start as usize..range.end as usize]);
        Ok(())
    }
    /// Fetches ahead what [`Base::read_range_into`] of bytes `range` of tensor `name` will
    /// read, for a base in remote storage (and its own chain); a no-op for others.
    fn prefetch_range(&self, _name: &str, _range: std::ops::Range<u64>) -> Result<(), ReadError> {
        Ok(())
    }
}

impl<S: Source + Send> Base for Reader<S> {
    fn content_digest(&self) -> Result<Digest, ReadError> {
        Ok(Reader::content_digest(self))
    }

    fn tensor(&self, name: &str) -> Result<Option<BaseTensor<'_>>, ReadError> {
        let Ok(t) = Reader::tensor(self, name) else {
            return Ok(None);
        };
        let data = self.read_tensor(t)?;
        Ok(Some(BaseTensor { dtype: t.dtype, shape: t.shape.clone(), data, digest: Some(t.digest) }))
    }

    fn reads_ranges(&self) -> bool {
        true
    }

    fn tensor_info(&self, name: &str) -> Result<Option<(DType, Vec<u64>)>, ReadError> {
        Ok(Reader::tensor(self, name).ok().map(|t| (t.dtype, t.shape.clone())))
    }

    fn read_range_into(&self, name: &str, range: std::ops::Range<u64>, out: &mut [u8]) -> Result<(), ReadError> {
        let t = Reader::tensor(self, name)?;
        self.decode_range(t, range, out)
    }

    fn prefetch_range(&self, name: &str, range: std::ops::Range<u64>) -> Result<(), ReadError> {
        self.prefetch_span(name, range)
    }
}

/// Opens the file at `path` and, if it decodes against a base, the chain of bases behind it:
/// each base is found through the path hint of the file that refers to it (relative to that
/// file's folder) and checked against the recorded content digest.
pub fn open_chain(path: impl AsRef<Path>) -> Result<Reader, ReadError> {
    open_link(path.as_ref(), &mut HashSet::new())
}

/// Where the base of the delta at `path` should be: its path hint, relative to the folder of
/// `path`. `None` when the file decodes without a base or records no hint.
pub fn hinted_base_path<S: Source>(path: &Path, reader: &Reader<S>) -> Option<PathBuf> {
    let base = reader.directory().base.as_ref().filter(|b| !b.path_hint.is_empty())?;
    reader.uses_base().then(|| path.parent().unwrap_or(Path::new(".")).join(&base.path_hint))
}

fn open_link(path: &Path, seen: &mut HashSet<PathBuf>) -> Result<Reader, ReadError> {
    let key = path.canonicalize().map_err(|source| ReadError::Io { path: path.to_path_buf(), source })?;
    if !seen.insert(key) {
        return Err(ReadError::BaseChain { detail: format!("{} refers back to itself", path.display()) });
    }
    if seen.len() > MAX_CHAIN {
        return Err(ReadError::BaseChain { detail: format!("more than {MAX_CHAIN} files in the chain") });
    }
    let reader = Reader::open(path)?;
    let Some(base) = reader.directory().base.as_ref().filter(|_| reader.uses_base()) else {
        return Ok(reader);
    };
    let missing = |hint: String| ReadError::BaseMissing { digest: tpde_format::digest::to_hex(&base.digest), hint };
    let base_path = hinted_base_path(path, &reader).ok_or_else(|| missing(String::new()))?;
    if !base_path.exists() {
        return Err(missing(base_path.display().to_string()));
    }
    let base_reader = open_link(&base_path, seen)?;
    reader.with_base(Arc::new(base_reader))
}
