//! Errors of the format layer: a category a caller can match on ([`ErrorKind`]) and a detailed
//! variant that says where (byte offset, tensor, chunk) and what (found vs expected).

use std::fmt;

/// What went wrong, coarsely: the category a caller (or the conformance manifest) matches on.
///
/// The names are stable: they appear in `tpde-inspect --json` and in `conformance/manifest.json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Reading the underlying file failed.
    Io,
    /// The first bytes are not the TPDE magic.
    NotTpde,
    /// The file's major version is not one this reader implements.
    UnsupportedVersion,
    /// The file uses something this reader does not know: a must-understand feature flag, a
    /// codec tag or a dtype code.
    UnsupportedFeature,
    /// The file ends before a structure it declares.
    Truncated,
    /// A CRC-32 or digest does not match the bytes it covers.
    ChecksumMismatch,
    /// The bytes parse but break a rule of the spec (bounds, overlap, lengths, encodings).
    Malformed,
    /// A length or count exceeds a limit of the spec.
    LimitExceeded,
    /// A requested tensor is not in the file.
    NotFound,
    /// The caller asked for something invalid (a writer given inconsistent input).
    InvalidArgument,
    /// A delta file's base was not given or not found.
    BaseMissing,
    /// The base given is not the one the file was written against (its content digest or a
    /// tensor's dtype or shape differ).
    BaseMismatch,
    /// Following base references leads back to a file already in the chain, or past the
    /// reader's chain-length limit.
    BaseChain,
}

impl ErrorKind {
    /// The stable kebab-case name used in JSON output and the conformance manifest.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Io => "io",
            ErrorKind::NotTpde => "not-tpde",
            ErrorKind::UnsupportedVersion => "unsupported-version",
            ErrorKind::UnsupportedFeature => "unsupported-feature",
            ErrorKind::Truncated => "truncated",
            ErrorKind::ChecksumMismatch => "checksum-mismatch",
            ErrorKind::Malformed => "malformed",
            ErrorKind::LimitExceeded => "limit-exceeded",
            ErrorKind::NotFound => "not-found",
            ErrorKind::InvalidArgument => "invalid-argument",
            ErrorKind::BaseMissing => "base-missing",
            ErrorKind::BaseMismatch => "base-mismatch",
            ErrorKind::BaseChain => "base-chain",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where in a file something is: any of a byte offset, a tensor and a chunk index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Position {
    /// Absolute byte offset in the file.
    pub offset: Option<u64>,
    /// Tensor name.
    pub tensor: Option<String>,
    /// Chunk index within the tensor.
    pub chunk: Option<u32>,
}

impl Position {
    /// A location at an absolute byte offset.
    pub fn at(offset: u64) -> Self {
        Position { offset: Some(offset), ..Default::default() }
    }
    /// A location naming a tensor.
    pub fn tensor(name: &str) -> Self {
        Position { tensor: Some(name.to_owned()), ..Default::default() }
    }
    /// A location naming a chunk of a tensor.
    pub fn chunk(name: &str, index: u32) -> Self {
        Position { tensor: Some(name.to_owned()), chunk: Some(index), offset: None }
    }
    /// The same location with a byte offset added.
    pub fn with_offset(mut self, offset: u64) -> Self {
        self.offset = Some(offset);
        self
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(t) = &self.tensor {
            parts.push(format!("tensor {t:?}"));
        }
        if let Some(c) = self.chunk {
            parts.push(format!("chunk {c}"));
        }
        if let Some(o) = self.offset {
            parts.push(format!("byte {o}"));
        }
        if parts.is_empty() {
            f.write_str("file")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// A rule of the spec that a file breaks. Each variant names the spec's rule in its message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// Rule R1: the magic.
    #[error("not a TPDE file{}: the first 8 bytes are {found:02x?}, expected {expected:02x?}", other_format(found))]
    NotTpde {
        /// The bytes found.
        found: Vec<u8>,
        /// The TPDE magic.
        expected: [u8; 8],
    },
    /// Rule R2: the major version.
    #[error("unsupported TPDE version {major}.{minor}: this reader implements major version {supported}")]
    UnsupportedVersion {
        /// Major version found.
        major: u16,
        /// Minor version found.
        minor: u16,
        /// Major version this reader implements.
        supported: u16,
    },
    /// Rule R4: a must-understand feature flag this reader does not know.
    #[error("unknown must-understand feature flags {unknown:#x} (this reader understands {known:#x})")]
    UnknownRequiredFeatures {
        /// The unknown bits.
        unknown: u64,
        /// The bits this reader understands.
        known: u64,
    },
    /// Rule R11: a codec tag not in this reader's registry.
    #[error("unknown codec tag {tag:#06x} at {location}")]
    UnknownCodec {
        /// The tag found.
        tag: u16,
        /// Where.
        location: Position,
    },
    /// Rule R10: a dtype code not in this reader's registry.
    #[error("unknown dtype code {code:#04x} at {location}")]
    UnknownDType {
        /// The code found.
        code: u8,
        /// Where.
        location: Position,
    },
    /// Rule R5/R6: the file ends before a structure.
    #[error("truncated file: {}", truncated(.what, *.start, *.end, *.file_len))]
    Truncated {
        /// The structure.
        what: &'static str,
        /// First byte needed.
        start: u64,
        /// One past the last byte needed.
        end: u64,
        /// The file's length.
        file_len: u64,
    },
    /// Rules R3, R7, R16: a CRC-32 or digest mismatch.
    #[error("{what} checksum mismatch at {location}: stored {stored}, computed {computed}")]
    ChecksumMismatch {
        /// What the checksum covers.
        what: &'static str,
        /// Where.
        location: Position,
        /// The stored value, in hex.
        stored: String,
        /// The computed value, in hex.
        computed: String,
    },
    /// Any other rule: the bytes parse but are not a valid TPDE file.
    #[error("malformed {what} at {location}: {detail}")]
    Malformed {
        /// The structure.
        what: &'static str,
        /// Where.
        location: Position,
        /// Found vs expected.
        detail: String,
    },
    /// Rule R9: a limit of the spec.
    #[error("{what} is {found} at {location}, over the limit of {limit}")]
    LimitExceeded {
        /// What is too large.
        what: &'static str,
        /// The value found.
        found: u64,
        /// The spec's limit.
        limit: u64,
        /// Where.
        location: Position,
    },
}

impl FormatError {
    /// The category of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            FormatError::NotTpde { .. } => ErrorKind::NotTpde,
            FormatError::UnsupportedVersion { .. } => ErrorKind::UnsupportedVersion,
            FormatError::UnknownRequiredFeatures { .. }
            | FormatError::UnknownCodec { .. }
            | FormatError::UnknownDType { .. } => ErrorKind::UnsupportedFeature,
            FormatError::Truncated { .. } => ErrorKind::Truncated,
            FormatError::ChecksumMismatch { .. } => ErrorKind::ChecksumMismatch,
            FormatError::Malformed { .. } => ErrorKind::Malformed,
            FormatError::LimitExceeded { .. } => ErrorKind::LimitExceeded,
        }
    }

    pub(crate) fn malformed(what: &'static str, location: Position, detail: impl Into<String>) -> Self {
        FormatError::Malformed { what, location, detail: detail.into() }
    }

    /// Adds `base` to the byte offset of the location this error carries, for errors found
    /// while parsing a structure that starts at `base` in the file.
    pub fn offset_by(mut self, base: u64) -> Self {
        let loc = match &mut self {
            FormatError::UnknownCodec { location, .. }
            | FormatError::UnknownDType { location, .. }
            | FormatError::ChecksumMismatch { location, .. }
            | FormatError::Malformed { location, .. }
            | FormatError::LimitExceeded { location, .. } => Some(location),
            _ => None,
        };
        if let Some(loc) = loc {
            loc.offset = loc.offset.map(|o| o.saturating_add(base));
        }
        self
    }
}

/// Formats a checksum for error messages.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A truncated file's message: the bytes a structure needs past the end, or (when they are
/// there but are not the structure, a trailer without its end magic) where it was looked for.
fn truncated(what: &str, start: u64, end: u64, file_len: u64) -> String {
    match end > file_len {
        true => format!("{what} needs bytes {start}..{end} but the file is {file_len} bytes long"),
        false => format!("{what}, at bytes {start}..{end} of {file_len}"),
    }
}

/// What a file that is not TPDE seems to be, from its first bytes, for [`FormatError::NotTpde`]:
/// the formats a checkpoint folder holds.
fn other_format(first: &[u8]) -> &'static str {
    match first {
        [b'P', b'K', 3, 4, ..] => " (a zip file: torch.save's format?)",
        [0x80, 2..=5, ..] => " (a pickle: torch.save's legacy format?)",
        [_, _, _, _, _, _, 0, 0, ..] if first.len() == 8 => " (a safetensors file?)",
        _ => "",
    }
}
