//! Bases of delta files (spec §6.3, §7): what a delta decodes against. Following a chain of
//! them through path hints is [`crate::chain`]'s.

use std::borrow::Cow;

use tpde_format::digest::Digest;
use tpde_format::DType;

use crate::{ReadError, Reader, Source};

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
    /// Tensors a delta's predictions will read through [`Base::read_range_into`] (spec §6.8):
    /// a base that decodes them keeps what it decodes, so a chain decodes each once.
    fn keep_decoded(&self, _names: &[&str]) {}
    /// Fetches ahead what [`Base::read_range_into`] of bytes `range` of tensor `name` will
    /// read, for a base in remote storage (and its own chain); a no-op for others.
    fn prefetch_range(&self, _name: &str, _range: std::ops::Range<u64>) -> Result<(), ReadError> {
        Ok(())
    }
    /// [`Base::prefetch_range`] of several tensors' whole bytes at once: a remote base fetches
    /// them with few requests (neighbours coalesced) rather than one or more a tensor.
    fn prefetch_tensors(&self, names: &[&str]) -> Result<(), ReadError> {
        for name in names {
            if let Some((dtype, shape)) = self.tensor_info(name)? {
                let len = shape.iter().product::<u64>() * dtype.size();
                self.prefetch_range(name, 0..len)?;
            }
        }
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

    fn keep_decoded(&self, names: &[&str]) {
        let mut kept = self.predicted_inputs.write().expect("not poisoned");
        kept.extend(names.iter().filter(|n| self.index.contains_key(**n)).map(|n| n.to_string()));
    }

    fn prefetch_range(&self, name: &str, range: std::ops::Range<u64>) -> Result<(), ReadError> {
        self.prefetch_span(name, range)
    }

    fn prefetch_tensors(&self, names: &[&str]) -> Result<(), ReadError> {
        let tensors = names.iter().filter_map(|n| Reader::tensor(self, n).ok()).collect::<Vec<_>>();
        self.prefetch_whole(&tensors)
    }
}
