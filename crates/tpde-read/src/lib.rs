//! The TPDE reader.
//!
//! [`Reader::open`] maps the file and reads only the header (first 64 bytes), the trailer
//! (last 32 bytes) and the directory the trailer points to; it validates all of it against the
//! spec before returning. Reading a tensor touches only that tensor's chunks, and for a delta
//! the same chunks of its base: a TPDE base decodes each delta chunk's base range on its own
//! ([`Base::read_range_into`]), so a chain is decoded a chunk at a time through all its files and
//! a slice ([`Reader::read_range_into`]) touches only the chunks it covers in each; other bases
//! (a `.safetensors` file) hand over whole tensors. A tensor whose
//! chunks are all `raw` and adjacent comes back as a slice borrowed from the map, without a
//! copy; other tensors decode their chunks in parallel into one buffer.
//!
//! Every length and offset from the file is checked before use; any byte string given to
//! [`Reader::from_source`] yields a [`ReadError`], never a panic.
//!
//! ```
//! use tpde_read::Reader;
//! use tpde_write::{Writer, WriteOptions};
//! use tpde_format::DType;
//! let mut w = Writer::new(Vec::new(), WriteOptions::default())?;
//! w.add_tensor("bias", DType::U8, &[4], &[1, 2, 3, 4])?;
//! let file = w.finish()?;
//!
//! let r = Reader::from_source(file)?;
//! let bias = r.read("bias")?;
//! assert!(matches!(bias, std::borrow::Cow::Borrowed(_)), "raw tensors are not copied");
//! assert_eq!(&*bias, &[1, 2, 3, 4]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod base;
pub mod chain;
mod decode;
mod error;
pub mod files;
mod inputs;
mod open;
mod pages;
mod source;
pub mod staging;
mod verify;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;
use tpde_codec::predicted::Inputs;
use tpde_codec::ChunkContext;
use tpde_format::digest::{content_digest, tensor_digest, to_hex, Digest, DigestInput};
use tpde_format::validate::validate;
use tpde_format::{
    ChunkEntry, CodecTag, DType, Directory, FormatError, Header, MetadataValue, Operand, Position, Prediction,
    TensorEntry, Trailer,
};

pub use base::{Base, BaseTensor};
pub use chain::{open_chain, open_chain_with, PathHints, MAX_CHAIN};
pub use error::ReadError;
pub use source::{out_of_range, Source, StreamSource};

use inputs::InputCache;

pub use decode::TensorChunks;
pub(crate) use decode::*;
pub use open::map_file;
pub use pages::populate;
pub use verify::{check_digest, VerifyReport};

/// Whether chunk CRCs are checked on read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChecksumPolicy {
    /// Check every chunk's CRC-32 before decoding it (the default).
    #[default]
    Verify,
    /// Skip chunk CRCs: for input already verified or produced by a trusted process. The
    /// header, trailer and directory are still checked, and decoding still never panics.
    Trust,
}

/// Reader settings.
#[derive(Clone, Copy, Debug)]
pub struct ReadOptions {
    /// Chunk CRC policy.
    pub checksums: ChecksumPolicy,
    /// The largest tensor the reader decodes, in logical bytes: a larger one is a
    /// `limit-exceeded` error before anything is allocated or decoded. A file can declare a
    /// tensor far larger than itself (chunks that decode to 1 GiB from a few bytes, or many
    /// chunk entries naming one stored range, R22), so this, not the file's size, bounds what
    /// reading it costs.
    pub max_tensor_bytes: u64,
}

/// The default [`ReadOptions::max_tensor_bytes`]: 16 GiB, above the largest tensor of today's
/// released models (a 128k x 16k embedding in fp32 is 8 GiB) and below what a file can claim.
pub const DEFAULT_MAX_TENSOR_BYTES: u64 = 16 << 30;

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions { checksums: ChecksumPolicy::Verify, max_tensor_bytes: DEFAULT_MAX_TENSOR_BYTES }
    }
}

/// An open TPDE file.
pub struct Reader<S: Source = memmap2::Mmap> {
    src: S,
    header: Header,
    trailer: Trailer,
    directory: Directory,
    index: HashMap<String, usize>,
    options: ReadOptions,
    /// The base a delta file decodes against, once attached and its digest checked.
    base: Option<Arc<dyn Base>>,
    /// The tensors that predictions read (spec §6.8), this file's or, once a delta against this
    /// file is opened, its (predictors 1, 3 and 4 read the base): their decoded chunks are kept
    /// in `inputs`.
    predicted_inputs: std::sync::RwLock<HashSet<String>>,
    inputs: InputCache,
}

impl<S: Source> Reader<S> {
    /// Whether any chunk of the file decodes against a base.
    pub fn uses_base(&self) -> bool {
        self.tensors().iter().any(|t| self.tensor_uses_base(t))
    }

    /// Whether any chunk of `t` decodes against the base.
    pub fn tensor_uses_base(&self, t: &TensorEntry) -> bool {
        t.chunks.iter().any(|c| c.codec.needs_base())
    }

    /// The source the file is read from.
    pub fn source(&self) -> &S {
        &self.src
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The trailer.
    pub fn trailer(&self) -> &Trailer {
        &self.trailer
    }

    /// The directory.
    pub fn directory(&self) -> &Directory {
        &self.directory
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[TensorEntry] {
        &self.directory.tensors
    }

    /// The file's metadata value for `key`.
    pub fn metadata(&self, key: &str) -> Option<&MetadataValue> {
        self.directory.metadata_value(key)
    }

    /// The file's length in bytes.
    pub fn file_len(&self) -> u64 {
        self.src.len()
    }

    /// The settings.
    pub fn options(&self) -> ReadOptions {
        self.options
    }

    /// The tensor entry named `name`.
    pub fn tensor(&self, name: &str) -> Result<&TensorEntry, ReadError> {
        Ok(&self.directory.tensors[self.tensor_index(name)?])
    }

    /// Where the tensor named `name` is in [`Reader::tensors`].
    pub fn tensor_index(&self, name: &str) -> Result<usize, ReadError> {
        self.index.get(name).copied().ok_or_else(|| ReadError::NotFound { name: name.to_owned() })
    }

    /// The content digest of the file's tensors (spec §7), from the directory alone.
    pub fn content_digest(&self) -> Digest {
        content_digest(self.directory.tensors.iter().map(|t| DigestInput {
            name: &t.name,
            dtype: t.dtype,
            shape: &t.shape,
            digest: &t.digest,
        }))
    }

    /// The error of a delta file's chunk decoded without its base: the recorded digest and hint.
    pub fn base_missing(&self) -> ReadError {
        let b = self.directory.base.as_ref().expect("validation ties base codecs to a base reference");
        ReadError::BaseMissing { digest: to_hex(&b.digest), hint: b.path_hint.clone() }
    }
}

/// Where chunk `i` of `t` is, for error messages: tensor, chunk index and file offset.
pub fn chunk_location(t: &TensorEntry, i: usize, c: &ChunkEntry) -> Position {
    Position::chunk(&t.name, i as u32).with_offset(c.offset)
}
