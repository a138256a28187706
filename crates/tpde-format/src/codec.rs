//! The codec-tag registry (spec §6). A tag says how a chunk's stored bytes decode to its
//! logical bytes. Tags are stable; a new tag is a minor version. The codecs themselves live in
//! the `tpde-codec` crate; this is the list of names a file may use.

use crate::error::{FormatError, Location};

/// A registered codec tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CodecTag {
    /// `0x0000 raw`: the stored bytes are the logical bytes.
    Raw,
    /// `0x0001 zstd`: the stored bytes are one or more Zstandard frames (RFC 8878) whose
    /// concatenated content is the logical bytes.
    Zstd,
}

impl CodecTag {
    /// Every tag of this version of the registry.
    pub const ALL: [CodecTag; 2] = [CodecTag::Raw, CodecTag::Zstd];

    /// The on-disk value.
    pub const fn to_u16(self) -> u16 {
        match self {
            CodecTag::Raw => 0x0000,
            CodecTag::Zstd => 0x0001,
        }
    }

    /// The tag with this value, if registered.
    pub fn from_u16(tag: u16) -> Option<CodecTag> {
        CodecTag::ALL.into_iter().find(|c| c.to_u16() == tag)
    }

    pub(crate) fn parse(tag: u16) -> Result<CodecTag, FormatError> {
        CodecTag::from_u16(tag).ok_or(FormatError::UnknownCodec { tag, location: Location::default() })
    }

    /// The registry name.
    pub const fn name(self) -> &'static str {
        match self {
            CodecTag::Raw => "raw",
            CodecTag::Zstd => "zstd",
        }
    }

    /// The tag with this registry name.
    pub fn from_name(name: &str) -> Option<CodecTag> {
        CodecTag::ALL.into_iter().find(|c| c.name() == name)
    }
}

impl std::fmt::Display for CodecTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
