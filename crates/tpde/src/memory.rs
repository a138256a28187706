//! Tensors held in memory as a base: the reconstruction of a lossy file, which the next delta
//! of a series decodes against.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::OnceLock;

use rayon::prelude::*;
use tpde_format::digest::{content_digest, tensor_digest, Digest, DigestInput};
use tpde_format::DType;
use tpde_read::{Base, BaseTensor, ReadError};

/// A tensor in memory, as [`crate::pack`] takes it: name, dtype, shape, little-endian bytes in
/// row-major order.
pub type TensorRef<'a> = (&'a str, DType, &'a [u64], &'a [u8]);

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

    /// The tensors held, by name: what [`crate::pack`] takes, to write them again (a
    /// checkpoint re-encoded against another base).
    pub fn tensors(&self) -> Vec<TensorRef<'_>> {
        let mut out: Vec<_> =
            self.tensors.iter().map(|(n, (d, s, b))| (n.as_str(), *d, s.as_slice(), b.as_slice())).collect();
        out.sort_unstable_by_key(|t| t.0);
        out
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
