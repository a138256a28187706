//! The TPDE container format, as written in `spec/`: one definition of every on-disk
//! structure, shared by the writer and the reader, plus the registries (dtypes, codec tags,
//! feature flags, metadata types) and the validation a reader MUST apply.
//!
//! This crate does no I/O of its own. It parses byte slices the caller hands it and tells the
//! caller which byte ranges it needs next ([`Header::LEN`] at the start, [`Trailer::LEN`] at
//! the end, then the directory range the trailer names).
//!
//! ```text
//! +--------+------------------------------+-----------+---------+
//! | Header | chunk payloads (aligned)     | Directory | Trailer |
//! | 64 B   | ...                          | variable  | 32 B    |
//! +--------+------------------------------+-----------+---------+
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod binio;
pub mod codec;
pub mod digest;
pub mod directory;
pub mod dtype;
pub mod error;
pub mod files;
pub mod header;
pub mod limits;
pub mod metadata;
pub mod prediction;
#[cfg(feature = "surgery")]
pub mod surgery;
pub mod trailer;
pub mod validate;

pub use codec::CodecTag;
pub use digest::{content_digest, tensor_digest, Digest};
pub use directory::{BaseRef, ChunkEntry, Directory, TensorEntry};
pub use dtype::DType;
pub use error::{ErrorKind, FormatError, Position};
pub use header::{Header, OptionalFeatures, RequiredFeatures, FORMAT_MAJOR, FORMAT_MINOR, MAGIC};
pub use metadata::{MetadataEntry, MetadataValue};
pub use prediction::{Operand, Prediction};
pub use trailer::Trailer;
