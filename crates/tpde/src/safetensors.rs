//! Safetensors files: read through their memory map ([`SafetensorsFile`], also a base a delta
//! can decode against), written piece by piece ([`write`]), and the dtype names both use.

pub mod write;

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use ::safetensors::{Dtype as StDtype, SafeTensors};
use rayon::prelude::*;
use tpde_format::digest::{content_digest, tensor_digest, Digest, DigestInput};
use tpde_format::DType;
use tpde_read::{Base, BaseTensor, ReadError};

use crate::Error;

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
        let map = tpde_read::map_file(path).map_err(|e| Error::from(e).context(path.display()))?;
        let st_err = |e: safetensors::SafeTensorError| match &map[..map.len().min(8)] {
            m if m == tpde_format::header::MAGIC => Error::usage(format!(
                "{}: already a TPDE file, not a safetensors file: `tpde unpack` writes it back as safetensors, \
                 `tpde cp` copies it",
                path.display()
            )),
            [b'P', b'K', 3, 4, ..] => Error::usage(format!(
                "{}: a zip file (torch.save's format?), not a safetensors file: TPDE packs safetensors files and \
                 model folders; save torch tensors with tpde.torch.save_file or a Checkpointer",
                path.display()
            )),
            _ => Error::malformed(format!("{}: not a valid safetensors file: {e}", path.display())),
        };
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

    /// The tensors' digests, in file order (computed on first use).
    pub(crate) fn tensor_digests(&self) -> &[Digest] {
        &self.digests().tensors
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
