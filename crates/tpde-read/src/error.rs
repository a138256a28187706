//! Reader errors: the format layer's and the codecs', with where they happened.

use std::path::PathBuf;

use tpde_codec::CodecError;
use tpde_format::{ErrorKind, FormatError, Position};

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
    /// The source failed to give bytes it holds: a disk, or a network after its retries.
    #[error("reading the {what} at bytes {start}..{end}: {source}")]
    Source {
        /// What was being read.
        what: &'static str,
        /// The first byte asked for.
        start: u64,
        /// The end of the last range asked for.
        end: u64,
        /// The error (for a remote object it names the object).
        source: std::io::Error,
    },
    /// The file breaks a rule of the spec.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A chunk's stored bytes do not decode.
    #[error("{location}: {source}")]
    Codec {
        /// The chunk.
        location: Position,
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
    /// The system could not give the memory to decode a tensor into.
    #[error("tensor {name:?}: cannot allocate {bytes} bytes to decode it into")]
    OutOfMemory {
        /// The tensor.
        name: String,
        /// The bytes asked for.
        bytes: u64,
    },
    /// The file is a delta and no base was attached.
    #[error(
        "this file is a delta: decoding it needs its base (content digest {digest}{}); give it with --base \
         (Python: base=), or let its hint be followed (--hint-root DIR, Python: hints=[DIR])",
        hint_note(hint)
    )]
    BaseMissing {
        /// The base's content digest, hex.
        digest: String,
        /// The path hint the file records.
        hint: String,
    },
    /// The base attached is not the one the file was written against.
    #[error("wrong base: this file was written against content digest {expected}, this base has {found}")]
    BaseMismatch {
        /// The digest the file records, hex.
        expected: String,
        /// The attached base's digest, hex.
        found: String,
    },
    /// The base has the right digest but not the tensor a delta chunk needs.
    #[error("tensor {name:?} does not match its base: {detail}")]
    BaseTensor {
        /// The tensor.
        name: String,
        /// What differs.
        detail: String,
    },
    /// A base was given for a file that is not a delta.
    #[error("the file has no base reference: it is a keyframe and decodes on its own")]
    NotADelta,
    /// A base's path hint that the reader's [`PathHints`](crate::PathHints) (or, for a URL,
    /// the caller's settings) do not let it follow.
    #[error(
        "base path hint {hint:?} not followed: {why}; give the base with --base (Python: base=), allow its \
         folder with --hint-root DIR (hints=[DIR]), or follow every hint of your own files with --follow-hints \
         (hints=\"follow\")"
    )]
    HintRefused {
        /// The hint.
        hint: String,
        /// Why not, and what to do instead.
        why: String,
    },
    /// A base given by the caller that is not a file: nothing there, or a folder (spec §7.3: a
    /// base not found).
    #[error("{}: no base file there: {source}", path.display())]
    GivenBaseMissing {
        /// The path given.
        path: PathBuf,
        /// Why it is not a file.
        source: std::io::Error,
    },
    /// Following base references loops or exceeds the chain limit.
    #[error("base chain: {detail}")]
    BaseChain {
        /// What happened.
        detail: String,
    },
    /// A file that declares a newer minor version than this reader's breaks a rule as this reader
    /// knows it: the file may use what a newer minor version adds (spec §11), so the message
    /// says so. The category is the error's own.
    #[error("{source} (the file declares format 1.{minor}, newer than this reader's 1.{}: it may use something this reader does not know; a newer reader may read it)", tpde_format::FORMAT_MINOR)]
    Newer {
        /// The file's minor version.
        minor: u16,
        /// The error.
        source: Box<ReadError>,
    },
    /// A caller's buffer has the wrong length.
    #[error("buffer for {name:?} is {found} bytes, {expected} expected")]
    BufferLength {
        /// The tensor, or `tensor[chunk i]`.
        name: String,
        /// The buffer's length.
        found: u64,
        /// The tensor's or the chunk's length.
        expected: u64,
    },
}

impl ReadError {
    /// The category of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ReadError::Io { source, .. } | ReadError::Source { source, .. }
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                ErrorKind::NotFound
            }
            ReadError::Io { .. } | ReadError::Source { .. } => ErrorKind::Io,
            ReadError::Format(e) => e.kind(),
            ReadError::Codec { source, .. } => source.kind(),
            ReadError::NotFound { .. } => ErrorKind::NotFound,
            ReadError::TooLarge { .. } | ReadError::OutOfMemory { .. } => ErrorKind::LimitExceeded,
            ReadError::BufferLength { .. } | ReadError::NotADelta => ErrorKind::InvalidArgument,
            ReadError::BaseMissing { .. } | ReadError::HintRefused { .. } | ReadError::GivenBaseMissing { .. } => {
                ErrorKind::BaseMissing
            }
            ReadError::BaseMismatch { .. } => ErrorKind::BaseMismatch,
            ReadError::BaseTensor { .. } => ErrorKind::Malformed,
            ReadError::BaseChain { .. } => ErrorKind::BaseChain,
            ReadError::Newer { source, .. } => source.kind(),
        }
    }

    /// This error of a file that declares minor version `minor`: wrapped in [`ReadError::Newer`]
    /// when that is newer than this reader's and the error is one a newer version could explain
    /// (something unknown or malformed in what a later minor version may add: a codec, a dtype,
    /// a flag, a plane record).
    pub fn in_file_of_minor(self, minor: u16) -> Self {
        let explained = matches!(self.kind(), ErrorKind::Malformed | ErrorKind::UnsupportedFeature);
        match minor > tpde_format::FORMAT_MINOR && explained && !matches!(self, ReadError::Newer { .. }) {
            true => ReadError::Newer { minor, source: Box::new(self) },
            false => self,
        }
    }
}

impl ReadError {
    /// A failure of the source to give `ranges` (what the reader asked for at once).
    pub(crate) fn source(what: &'static str, ranges: &[std::ops::Range<u64>], source: std::io::Error) -> Self {
        let start = ranges.iter().map(|r| r.start).min().unwrap_or(0);
        let end = ranges.iter().map(|r| r.end).max().unwrap_or(0);
        ReadError::Source { what, start, end, source }
    }
}

fn hint_note(hint: &str) -> String {
    if hint.is_empty() {
        String::new()
    } else {
        format!(", path hint {hint:?}")
    }
}
