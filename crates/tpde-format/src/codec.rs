//! The codec-tag registry (spec §6). A tag says how a chunk's stored bytes decode to its
//! logical bytes. Tags are stable; a new tag is a minor version. The codecs themselves live in
//! the `tpde-codec` crate; this is the list of names a file may use.

use crate::error::{FormatError, Position};

/// A registered codec tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CodecTag {
    /// `0x0000 raw`: the stored bytes are the logical bytes.
    Raw,
    /// `0x0001 zstd`: the stored bytes are one or more Zstandard frames (RFC 8878) whose
    /// concatenated content is the logical bytes.
    Zstd,
    /// `0x0002 planes`: the float-aware keyframe codec (spec §6.2): byte planes, each stored or
    /// rANS-coded.
    Planes,
    /// `0x0003 delta-xor`: every element XORed with the base's, then byte planes (spec §6.4).
    DeltaXor,
    /// `0x0004 delta-sub`: every element's bit pattern minus the base's, zigzagged, then byte
    /// planes (spec §6.4).
    DeltaSub,
    /// `0x0005 sparse-elias-delta`: changed positions as Elias-delta gaps (spec §6.5).
    SparseEliasDelta,
    /// `0x0006 sparse-fibonacci`: changed positions as Fibonacci-coded gaps (spec §6.5).
    SparseFibonacci,
    /// `0x0007 sparse-rice`: changed positions as Golomb-Rice-coded gaps (spec §6.5).
    SparseRice,
    /// `0x0008 sparse-packed`: changed positions in bit-packed blocks that decode in parallel
    /// (spec §6.5).
    SparsePacked,
    /// `0x0009 planes-lanes`: `planes` with rANS planes in independent lanes (spec §6.2.3), the
    /// form a GPU decodes in parallel.
    PlanesLanes,
    /// `0x000A delta-xor-lanes`: `delta-xor` with planes in lane form.
    DeltaXorLanes,
    /// `0x000B delta-sub-lanes`: `delta-sub` with planes in lane form.
    DeltaSubLanes,
    /// `0x000C sparse-packed-lanes`: `sparse-packed` with value planes in lane form.
    SparsePackedLanes,
    /// `0x000D planes-context`: `planes-lanes` whose planes may also be coded with tables
    /// chosen by each lane's symbol before (spec §6.2.4): smaller exponent planes where
    /// neighbouring elements share their scale, as in Adam's moments.
    PlanesContext,
    /// `0x000E delta-xor-context`: `delta-xor-lanes` whose planes may also be coded with tables
    /// chosen by each element's base (spec §6.4.1): the base's exponent tells how far an element
    /// moves in its bit pattern.
    DeltaXorContext,
    /// `0x000F delta-sub-context`: `delta-sub-lanes` whose planes may also be coded with tables
    /// chosen by each element's base (spec §6.4.1).
    DeltaSubContext,
    /// `0x0010 delta-predicted`: `delta-sub-context` against a prediction computed from this
    /// file's and the base's tensors (spec §6.8), such as what Adam's step makes of a weight.
    DeltaPredicted,
}

impl CodecTag {
    /// Every tag of this version of the registry.
    pub const ALL: [CodecTag; 17] = [
        CodecTag::Raw,
        CodecTag::Zstd,
        CodecTag::Planes,
        CodecTag::DeltaXor,
        CodecTag::DeltaSub,
        CodecTag::SparseEliasDelta,
        CodecTag::SparseFibonacci,
        CodecTag::SparseRice,
        CodecTag::SparsePacked,
        CodecTag::PlanesLanes,
        CodecTag::DeltaXorLanes,
        CodecTag::DeltaSubLanes,
        CodecTag::SparsePackedLanes,
        CodecTag::PlanesContext,
        CodecTag::DeltaXorContext,
        CodecTag::DeltaSubContext,
        CodecTag::DeltaPredicted,
    ];

    /// The on-disk value.
    pub const fn to_u16(self) -> u16 {
        match self {
            CodecTag::Raw => 0x0000,
            CodecTag::Zstd => 0x0001,
            CodecTag::Planes => 0x0002,
            CodecTag::DeltaXor => 0x0003,
            CodecTag::DeltaSub => 0x0004,
            CodecTag::SparseEliasDelta => 0x0005,
            CodecTag::SparseFibonacci => 0x0006,
            CodecTag::SparseRice => 0x0007,
            CodecTag::SparsePacked => 0x0008,
            CodecTag::PlanesLanes => 0x0009,
            CodecTag::DeltaXorLanes => 0x000A,
            CodecTag::DeltaSubLanes => 0x000B,
            CodecTag::SparsePackedLanes => 0x000C,
            CodecTag::PlanesContext => 0x000D,
            CodecTag::DeltaXorContext => 0x000E,
            CodecTag::DeltaSubContext => 0x000F,
            CodecTag::DeltaPredicted => 0x0010,
        }
    }

    /// The tag with this value, if registered.
    pub fn from_u16(tag: u16) -> Option<CodecTag> {
        CodecTag::ALL.into_iter().find(|c| c.to_u16() == tag)
    }

    pub(crate) fn parse(tag: u16) -> Result<CodecTag, FormatError> {
        CodecTag::from_u16(tag).ok_or(FormatError::UnknownCodec { tag, location: Position::default() })
    }

    /// The registry name.
    pub const fn name(self) -> &'static str {
        match self {
            CodecTag::Raw => "raw",
            CodecTag::Zstd => "zstd",
            CodecTag::Planes => "planes",
            CodecTag::DeltaXor => "delta-xor",
            CodecTag::DeltaSub => "delta-sub",
            CodecTag::SparseEliasDelta => "sparse-elias-delta",
            CodecTag::SparseFibonacci => "sparse-fibonacci",
            CodecTag::SparseRice => "sparse-rice",
            CodecTag::SparsePacked => "sparse-packed",
            CodecTag::PlanesLanes => "planes-lanes",
            CodecTag::DeltaXorLanes => "delta-xor-lanes",
            CodecTag::DeltaSubLanes => "delta-sub-lanes",
            CodecTag::SparsePackedLanes => "sparse-packed-lanes",
            CodecTag::PlanesContext => "planes-context",
            CodecTag::DeltaXorContext => "delta-xor-context",
            CodecTag::DeltaSubContext => "delta-sub-context",
            CodecTag::DeltaPredicted => "delta-predicted",
        }
    }

    /// Whether the chunk decodes against the base tensor's bytes (spec §6.3): only in a file
    /// with a base, and only with that base at hand.
    pub const fn needs_base(self) -> bool {
        !matches!(
            self,
            CodecTag::Raw | CodecTag::Zstd | CodecTag::Planes | CodecTag::PlanesLanes | CodecTag::PlanesContext
        )
    }

    /// Whether the codec's rANS planes are in lane form (spec §6.2.3, §6.2.4) rather than one
    /// serial stream (§6.2.2). The lane tags are the GPU-decodable forms of the float-aware
    /// codecs.
    pub const fn lanes(self) -> bool {
        matches!(
            self,
            CodecTag::PlanesLanes
                | CodecTag::DeltaXorLanes
                | CodecTag::DeltaSubLanes
                | CodecTag::SparsePackedLanes
                | CodecTag::PlanesContext
                | CodecTag::DeltaXorContext
                | CodecTag::DeltaSubContext
                | CodecTag::DeltaPredicted
        )
    }

    /// Whether every part of the codec decodes in parallel on a GPU (spec §6.7): what
    /// `tpde pack --profile gpu` writes.
    pub const fn gpu_parallel(self) -> bool {
        matches!(self, CodecTag::Raw) || self.lanes()
    }

    /// The lowest minor version of format 1 that registers this tag.
    pub const fn since_minor(self) -> u16 {
        match self {
            CodecTag::Raw | CodecTag::Zstd => 0,
            CodecTag::PlanesContext => 3,
            CodecTag::DeltaXorContext | CodecTag::DeltaSubContext => 4,
            CodecTag::DeltaPredicted => 6,
            t if t.lanes() => 2,
            _ => 1,
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
