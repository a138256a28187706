//! TPDE checkpoints in one dependency.
//!
//! This crate re-exports the format ([`format`]), the codecs ([`codec`]), the reader ([`read`])
//! and the writer ([`write`]), and holds what every front end needs on top of them. One way in,
//! [`pack()`] (a safetensors file, a model folder or tensors in memory; [`series`] for a folder of
//! checkpoints as a chain), and one way out, [`unpack()`]; [`verify`] against the original;
//! [`open`] for a file with its chain of bases under a hint policy; [`safetensors`] and
//! [`sharded`] for the containers it converts; [`location`] for paths and, with the `object`
//! feature, `s3://` URLs alike. The `tpde` command-line tools and the Python package are thin
//! layers over it; a Rust program that embeds TPDE adds this crate alone.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The guide's examples, likewise.
#[doc = include_str!("../../../docs/guide.md")]
#[cfg(doctest)]
pub struct GuideDoctests;

pub mod files;
pub mod location;
pub mod memory;
pub mod open;
pub mod pack;
pub mod safetensors;
pub mod series;
pub mod sharded;
pub mod unpack;
pub mod verify;

use std::fmt;
use std::sync::Arc;

pub use tpde_codec as codec;
pub use tpde_format as format;
/// Object storage (`s3://` URLs): the `object` feature.
#[cfg(feature = "object")]
pub use tpde_object as object;
pub use tpde_read as read;
pub use tpde_write as write;

pub use location::{FileReader, Location};
pub use pack::{pack, PackJob, PackReport, PackSource, Packed};
pub use tpde_codec::Encoder;
pub use tpde_format::{DType, ErrorKind, MetadataValue, Prediction};
pub use tpde_read::{Base, Reader};
pub use tpde_write::{FileWriter, WriteOptions, Writer};
pub use unpack::{unpack, UnpackReport};

/// Why an operation failed: a category to match on (the spec's error categories, plus
/// `invalid-argument` for a caller's mistake), a message that says where and what, and the
/// lower-level error it came from, if any ([`std::error::Error::source`]: a
/// [`read::ReadError`], [`write::WriteError`] or [`std::io::Error`] to match on in detail).
#[derive(Clone, Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    usage: bool,
    located: bool,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// A failure of category `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into(), usage: false, located: false, source: None }
    }

    /// A failure of category `kind` caused by `source`, whose text is the message.
    pub fn caused_by(kind: ErrorKind, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        let message = source.to_string();
        Error { source: Some(Arc::new(source)), ..Error::new(kind, message) }
    }

    /// The caller asked for something that cannot be done as asked (a bad option or a
    /// combination of them), before any file was read.
    pub fn usage(message: impl Into<String>) -> Self {
        Error { usage: true, ..Error::new(ErrorKind::InvalidArgument, message) }
    }

    /// The input is not what it claims to be (a damaged safetensors file, a duplicate name).
    pub fn malformed(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Malformed, message)
    }

    /// The category.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether the error is a misuse of options rather than a failure of the input or the
    /// system (the CLI's exit code 2).
    pub fn is_usage(&self) -> bool {
        self.usage
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Marks the message as naming the file it is about (the output a write failed on), so that
    /// callers that name the input in front of other errors leave it as it is.
    pub fn located(mut self) -> Self {
        self.located = true;
        self
    }

    /// Whether the message names the file it is about: see [`Error::located`].
    pub fn is_located(&self) -> bool {
        self.located
    }

    /// The same error with `context` (a path, a tensor) in front of its message.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<tpde_read::ReadError> for Error {
    fn from(e: tpde_read::ReadError) -> Self {
        Error::caused_by(e.kind(), e)
    }
}

impl From<tpde_write::WriteError> for Error {
    fn from(e: tpde_write::WriteError) -> Self {
        Error::caused_by(e.kind(), e)
    }
}

impl From<std::io::Error> for Error {
    /// A file that is not there is `not-found` (Python raises it as a `FileNotFoundError` too);
    /// any other I/O failure is `io`.
    fn from(e: std::io::Error) -> Self {
        let kind = match e.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            _ => ErrorKind::Io,
        };
        Error::caused_by(kind, e)
    }
}

/// Progress of a long operation, in logical tensor bytes. The CLI draws a bar; other callers
/// pass `&()` to ignore it.
pub trait Progress: Sync {
    /// The total, once known.
    fn set_length(&self, _bytes: u64) {}
    /// `bytes` more are done (called from any thread).
    fn inc(&self, _bytes: u64) {}
    /// The operation is over.
    fn finish(&self) {}
    /// Whether the caller wants the operation stopped (the Python binding, on Ctrl-C). A pack
    /// asks between batches of tensors and stops with an `interrupted` error, its partial
    /// output removed.
    fn cancelled(&self) -> bool {
        false
    }
}

/// The error of an operation its caller stopped ([`Progress::cancelled`]).
pub fn interrupted() -> Error {
    Error::new(ErrorKind::Io, "interrupted; nothing was written")
}

impl Progress for () {}

/// `stored / logical`, the share of the raw bytes a file keeps (1.0 for empty input).
pub fn ratio(stored: u64, logical: u64) -> f64 {
    if logical == 0 {
        1.0
    } else {
        stored as f64 / logical as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn errors_keep_their_cause_through_context() {
        let e = Error::from(read::ReadError::NotADelta).context("ckpt.tpde");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.message().starts_with("ckpt.tpde: "), "{e}");
        let source = e.source().expect("a cause");
        assert!(matches!(source.downcast_ref::<read::ReadError>(), Some(read::ReadError::NotADelta)));
        let io = Error::from(std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full"));
        assert_eq!(
            io.source().and_then(|s| s.downcast_ref::<std::io::Error>()).map(|e| e.kind()),
            Some(std::io::ErrorKind::StorageFull)
        );
        assert!(Error::usage("bad option").source().is_none());
    }
}
