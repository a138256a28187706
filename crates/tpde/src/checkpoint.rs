//! Checkpoints the tools read, whatever their container: a `.safetensors` file, or a `.tpde`
//! file with its chain of bases. Either can be the base of a delta.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use rayon::prelude::*;
use safetensors::SafeTensors;
use tpde_format::digest::{content_digest, tensor_digest, to_hex, Digest, DigestInput};
use tpde_format::{DType, TensorEntry};
use tpde_read::{Base, BaseTensor, ReadError, Reader};

use crate::convert::dtype_from_safetensors;
use crate::location::{FileReader, Location};
use crate::{Error, ErrorKind};

/// One tensor of a safetensors file.
struct Entry {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    range: std::ops::Range<usize>,
}

/// A memory-mapped `.safetensors` file.
pub struct SafetensorsFile {
    map: memmap2::Mmap,
    /// In file order.
    entries: Vec<Entry>,
    index: HashMap<String, usize>,
    metadata: Option<HashMap<String, String>>,
    digests: OnceLock<Digests>,
}

/// A file's content digest and its tensors' digests, in file order.
struct Digests {
    content: Digest,
    tensors: Vec<Digest>,
}

impl SafetensorsFile {
    /// Maps and parses the file.
    pub fn open(path: &Path) -> Result<Self, Error> {
        let st_err = |e: safetensors::SafeTensorError| {
            Error::malformed(format!("{}: not a valid safetensors file: {e}", path.display()))
        };
        let map = tpde_read::map_file(path).map_err(|e| Error::from(e).context(path.display()))?;
        let (header_len, header) = SafeTensors::read_metadata(&map).map_err(st_err)?;
        let st = SafeTensors::deserialize(&map).map_err(st_err)?;
        let data_start = 8 + header_len;
        let mut entries = Vec::new();
        for name in header.offset_keys() {
            let t = st.tensor(&name).map_err(st_err)?;
            let dtype = dtype_from_safetensors(t.dtype()).ok_or_else(|| {
                Error::new(
                    tpde_format::ErrorKind::UnsupportedFeature,
                    format!("tensor {name:?}: safetensors dtype {:?} is not in TPDE's registry", t.dtype()),
                )
            })?;
            let info = header.info(&name).expect("listed by offset_keys");
            let range = data_start + info.data_offsets.0..data_start + info.data_offsets.1;
            entries.push(Entry { name, dtype, shape: t.shape().iter().map(|&d| d as u64).collect(), range });
        }
        let index = entries.iter().enumerate().map(|(i, e)| (e.name.clone(), i)).collect();
        let metadata = header.metadata().clone();
        Ok(SafetensorsFile { map, entries, index, metadata, digests: OnceLock::new() })
    }

    /// Tensors in file order: name, dtype, shape, bytes.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, DType, &[u64], &[u8])> {
        self.entries.iter().map(|e| (e.name.as_str(), e.dtype, e.shape.as_slice(), &self.map[e.range.clone()]))
    }

    /// The `__metadata__` map.
    pub fn metadata(&self) -> Option<&HashMap<String, String>> {
        self.metadata.as_ref()
    }

    /// Sets the content digest and the tensors' digests (in file order) when they are already
    /// known, from a TPDE file packed losslessly from this one, sparing a pass over the data.
    pub fn set_digests(&self, content: Digest, tensors: Vec<Digest>) {
        assert_eq!(tensors.len(), self.entries.len(), "one digest per tensor");
        let _ = self.digests.set(Digests { content, tensors });
    }

    fn digests(&self) -> &Digests {
        self.digests.get_or_init(|| {
            let tensors: Vec<Digest> =
                self.entries.par_iter().map(|e| tensor_digest(&self.map[e.range.clone()])).collect();
            let content = content_digest(self.entries.iter().zip(&tensors).map(|(e, d)| DigestInput {
                name: &e.name,
                dtype: e.dtype,
                shape: &e.shape,
                digest: d,
            }));
            Digests { content, tensors }
        })
    }
}

impl Base for SafetensorsFile {
    fn content_digest(&self) -> Result<Digest, ReadError> {
        Ok(self.digests().content)
    }

    fn tensor(&self, name: &str) -> Result<Option<BaseTensor<'_>>, ReadError> {
        Ok(self.index.get(name).map(|&i| {
            let e = &self.entries[i];
            BaseTensor {
                dtype: e.dtype,
                shape: e.shape.clone(),
                data: Cow::Borrowed(&self.map[e.range.clone()]),
                // Known once the content digest is, which a delta's base reference needs first.
                digest: self.digests.get().map(|d| d.tensors[i]),
            }
        }))
    }
}

/// Tensors held in memory: the reconstruction of a lossy file, the base of the next delta in a
/// series.
#[derive(Default)]
pub struct MemoryCheckpoint {
    tensors: HashMap<String, (DType, Vec<u64>, Vec<u8>)>,
    /// The content digest, once computed or known (a pack's reconstruction knows its file's).
    digest: OnceLock<Digest>,
}

impl MemoryCheckpoint {
    /// Adds a tensor.
    pub fn insert(&mut self, name: &str, dtype: DType, shape: &[u64], data: Vec<u8>) {
        self.tensors.insert(name.to_owned(), (dtype, shape.to_vec(), data));
        self.digest = OnceLock::new();
    }

    /// Records the content digest of these tensors, known from elsewhere (the file they were
    /// written to), so that using this checkpoint as a base does not hash it again.
    pub fn set_content_digest(&mut self, digest: Digest) {
        self.digest = OnceLock::from(digest);
    }

    /// Logical bytes held.
    pub fn logical_bytes(&self) -> u64 {
        self.tensors.values().map(|t| t.2.len() as u64).sum()
    }
}

impl Base for MemoryCheckpoint {
    fn content_digest(&self) -> Result<Digest, ReadError> {
        Ok(*self.digest.get_or_init(|| {
            let digests: HashMap<&str, Digest> =
                self.tensors.par_iter().map(|(n, (_, _, d))| (n.as_str(), tensor_digest(d))).collect();
            content_digest(self.tensors.iter().map(|(n, (dtype, shape, _))| DigestInput {
                name: n,
                dtype: *dtype,
                shape,
                digest: &digests[n.as_str()],
            }))
        }))
    }

    fn tensor(&self, name: &str) -> Result<Option<BaseTensor<'_>>, ReadError> {
        Ok(self.tensors.get(name).map(|(dtype, shape, data)| BaseTensor {
            dtype: *dtype,
            shape: shape.clone(),
            data: Cow::Borrowed(data),
            digest: None,
        }))
    }
}

/// Whether the file at `path` starts with the TPDE magic.
pub fn is_tpde(path: &Path) -> Result<bool, Error> {
    use std::io::Read;
    let mut magic = [0u8; 8];
    let mut f = std::fs::File::open(path).map_err(|e| Error::from(e).context(path.display()))?;
    let n = f.read(&mut magic)?;
    Ok(n == 8 && magic == tpde_format::header::MAGIC)
}

/// Opens a checkpoint to use as a base: a `.tpde` file, local or remote, with its own chain
/// found through its path hints, or a local `.safetensors` file.
pub fn open_base(at: &Location) -> Result<Arc<dyn Base>, Error> {
    match at {
        Location::Local(path) if !is_tpde(path)? => Ok(Arc::new(SafetensorsFile::open(path)?)),
        _ => Ok(Arc::new(open_chain(at)?)),
    }
}

/// Opens the `.tpde` file at `at` and, if it decodes against a base, the chain of bases
/// behind it, each attached to the file after it (see [`chain_readers`]).
pub fn open_chain(at: &Location) -> Result<FileReader, Error> {
    let mut links = chain_readers(at)?;
    let (_, mut reader) = links.pop().expect("a chain holds its first file");
    while let Some((loc, next)) = links.pop() {
        reader = next.with_base(Arc::new(reader)).map_err(|e| Error::from(e).context(&loc))?;
    }
    Ok(reader)
}

/// The file at `at` and the bases behind it, each opened as it is (no base attached): the
/// file first, the one that decodes on its own (its keyframe) last. Each base is found
/// through the path hint of the file that refers to it (relative to that file's folder or
/// bucket key, spec §7.3); its content digest is checked when it is attached. A loop, or a
/// chain longer than [`tpde_read::MAX_CHAIN`], is a `base-chain` error.
pub fn chain_readers(at: &Location) -> Result<Vec<(Location, FileReader)>, Error> {
    let chain_err = |detail: String| Error::from(ReadError::BaseChain { detail });
    let mut seen = HashSet::new();
    let mut links: Vec<(Location, FileReader)> = Vec::new();
    let mut next = Some((at.clone(), open_reader(at)?));
    while let Some((at, reader)) = next.take() {
        if !seen.insert(at.identity()?) {
            return Err(chain_err(format!("{at} refers back to itself")));
        }
        if seen.len() > tpde_read::MAX_CHAIN {
            return Err(chain_err(format!("more than {} files in the chain", tpde_read::MAX_CHAIN)));
        }
        if let Some(base) = reader.directory().base.as_ref().filter(|_| reader.uses_base()) {
            let missing = |hint: String| Error::from(ReadError::BaseMissing { digest: to_hex(&base.digest), hint });
            if base.path_hint.is_empty() {
                return Err(missing(String::new()));
            }
            let base_at = at.resolve_hint(&base.path_hint)?;
            match open_present(&base_at)? {
                Some(base_reader) => next = Some((base_at, base_reader)),
                None => return Err(missing(base_at.to_string())),
            }
        }
        links.push((at, reader));
    }
    Ok(links)
}

/// The file at `at` opened, or `None` when there is none: a stat for a local path; for an
/// object, opening it (its first GET answers "not found"), with no HEAD request before it.
fn open_present(at: &Location) -> Result<Option<FileReader>, Error> {
    match at {
        Location::Local(p) if !p.is_file() => Ok(None),
        Location::Object(_) => match open_reader(at) {
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            opened => opened.map(Some),
        },
        Location::Local(_) => open_reader(at).map(Some),
    }
}

/// Opens the `.tpde` file at `at` as it is (no base attached); errors name the file.
pub fn open_reader(at: &Location) -> Result<FileReader, Error> {
    Reader::from_source(at.open()?).map_err(|e| Error::from(e).context(at))
}

/// Opens a `.tpde` file for decoding: with `base` given, attached to it; otherwise, if it is a
/// delta, to the base its path hint names (a `.tpde` with its own chain, or a `.safetensors`).
/// When the hint leads nowhere the reader is returned as it is, and decoding a delta chunk fails
/// naming the base's digest and hint.
pub fn open_tpde(at: &Location, base: Option<&Location>) -> Result<FileReader, Error> {
    let reader = open_reader(at)?;
    if let Some(b) = base {
        return Ok(reader.with_base(open_base(b)?)?);
    }
    let hint = match reader.directory().base.as_ref() {
        Some(b) if !b.path_hint.is_empty() && reader.uses_base() => at.resolve_hint(&b.path_hint).ok(),
        _ => None,
    };
    // A hinted base that is not there leaves the reader as it is; a remote one is found
    // missing by opening it, not by a HEAD request first.
    match hint {
        Some(Location::Local(p)) if !p.is_file() => Ok(reader),
        Some(base_at) => match open_base(&base_at) {
            Err(e) if e.kind() == ErrorKind::NotFound && matches!(base_at, Location::Object(_)) => Ok(reader),
            opened => Ok(reader.with_base(opened?)?),
        },
        None => Ok(reader),
    }
}

/// Decodes the bytes `start..start + out.len()` of tensor `t` into `out`, touching only the
/// chunks that overlap them (a slice of a large tensor), in the file and, for a delta, in its
/// chain of TPDE bases. The range must lie within the tensor.
pub fn read_range(r: &FileReader, t: &TensorEntry, start: u64, out: &mut [u8]) -> Result<(), Error> {
    Ok(r.read_range_into(t, start..start + out.len() as u64, out)?)
}
