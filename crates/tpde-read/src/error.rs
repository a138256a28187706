//! Reader errors: the format layer's and the codecs', with where they happened.

use std::path::PathBuf;

use tpde_codec::CodecError;
use tpde_format::{ErrorKind, FormatError, Location};

/// Why a read failed. [`ReadError::kind`] gives the category to match on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// Opening or mapping the file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file breaks a rule of the spec.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A chunk's stored bytes do not decode.
    #[error("{location}: {source}")]
    Codec {
        /// The chunk.
        location: Location,
        /// The codec's error.
        source: CodecError,
    },
    /// The tensor is not in the file.
    #[error("no tensor named {name:?} in the file")]
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// A tensor is larger than [`ReadOptions::max_tensor_bytes`](crate::ReadOptions).
    #[error("tensor {name:?} is {bytes} bytes, over the reader's limit of {limit}")]
    TooLarge {
        /// The tensor.
        name: String,
        /// Its logical length.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// A caller's buffer has the wrong length.
    #[error("buffer for tensor {name:?} is {found} bytes, the tensor is {expected}")]
    BufferLength {
        /// The tensor.
        name: String,
        /// The buffer's length.
        found: u64,
        /// The tensor's length.
        expected: u64,
    },
}

impl ReadError {
    /// The category of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ReadError::Io { .. } => ErrorKind::Io,
            ReadError::Format(e) => e.kind(),
            ReadError::Codec { source, .. } => source.kind(),
            ReadError::NotFound { .. } => ErrorKind::NotFound,
            ReadError::TooLarge { .. } => ErrorKind::LimitExceeded,
            ReadError::BufferLength { .. } => ErrorKind::InvalidArgument,
        }
    }
}
