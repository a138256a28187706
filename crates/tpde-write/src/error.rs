//! Why a write failed.

use super::*;

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The output failed.
    #[error("I/O error while writing: {0}")]
    Io(#[from] io::Error),
    /// The caller's input cannot be written as asked.
    #[error("cannot write {what}: {detail}")]
    InvalidInput {
        /// What was being written.
        what: String,
        /// Why not.
        detail: String,
    },
    /// A codec failed to encode.
    #[error("encoding tensor {tensor:?}: {source}")]
    Codec {
        /// The tensor.
        tensor: String,
        /// The codec's error.
        source: CodecError,
    },
}

impl WriteError {
    /// The category of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            WriteError::Io(_) => ErrorKind::Io,
            WriteError::InvalidInput { .. } | WriteError::Codec { .. } => ErrorKind::InvalidArgument,
        }
    }

    pub(crate) fn invalid(what: impl Into<String>, detail: impl Into<String>) -> Self {
        WriteError::InvalidInput { what: what.into(), detail: detail.into() }
    }
}
