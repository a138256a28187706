//! Chunk codecs (spec §6), one module per codec tag, behind one registry: [`decoder`] finds
//! the codec for a tag read from a file, and [`Encoder`] is the writer's choice of codec and
//! settings.
//!
//! A codec turns a chunk's logical bytes into stored bytes plus an optional parameter block,
//! and back. Decoding writes into a buffer of exactly the chunk's decoded length, so a
//! hostile chunk can never make a decoder allocate or write more than the directory (already
//! validated against the spec's limits) declares.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod float;
pub mod isa;
pub mod planes;
pub mod positions;
pub mod predicted;
pub mod rans;
mod raw;
mod select;
mod shuffle;
mod zstd_codec;

use tpde_format::{CodecTag, DType, ErrorKind};

pub use float::{trailing, Dense, DenseOp, Planes, Sparse, SparseLayout};
pub use planes::{PlaneForm, Records};
pub use positions::PositionCoder;
pub use predicted::Predicted;
pub use raw::Raw;
pub use zstd_codec::Zstd;

/// What a codec may know about the chunk besides its bytes.
#[derive(Clone, Copy, Debug)]
pub struct ChunkContext<'a> {
    /// The tensor's element type.
    pub dtype: DType,
    /// The base tensor's bytes over the same elements, for the delta codecs (spec §6.3); for
    /// `delta-predicted`, the chunk's prediction (§6.8).
    pub base: Option<&'a [u8]>,
}

impl ChunkContext<'_> {
    /// A context without a base.
    pub fn keyframe(dtype: DType) -> ChunkContext<'static> {
        ChunkContext { dtype, base: None }
    }
}

/// A codec failed on a chunk.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The stored bytes are not a valid encoding.
    #[error("{codec} stored bytes do not decode: {detail}")]
    Corrupt {
        /// The codec.
        codec: CodecTag,
        /// What the decoder found.
        detail: String,
    },
    /// The stored bytes decode to a different length than the directory declares.
    #[error("{codec} chunk decodes to {found} bytes, the directory declares {expected}")]
    LengthMismatch {
        /// The codec.
        codec: CodecTag,
        /// Bytes produced.
        found: u64,
        /// Bytes declared.
        expected: u64,
    },
    /// The parameter block is not valid for the codec.
    #[error("{codec} parameters are invalid: {detail}")]
    BadParams {
        /// The codec.
        codec: CodecTag,
        /// What is wrong.
        detail: String,
    },
    /// A delta chunk was given no base to decode against.
    #[error("{codec} chunk needs the base tensor, and none was given")]
    MissingBase {
        /// The codec.
        codec: CodecTag,
    },
    /// The base bytes given for a delta chunk are not the chunk's length.
    #[error("{codec} chunk of {expected} bytes was given {found} base bytes")]
    BaseLength {
        /// The codec.
        codec: CodecTag,
        /// Base bytes given.
        found: u64,
        /// The chunk's decoded length.
        expected: u64,
    },
    /// The decoder could not allocate what a chunk declares (the system's memory, not the
    /// file, is short): `limit-exceeded`, never an abort.
    #[error("could not allocate {bytes} bytes to decode the chunk")]
    OutOfMemory {
        /// The bytes asked for.
        bytes: u64,
    },
    /// The encoder itself failed (not a property of any file).
    #[error("{codec} encoder failed: {detail}")]
    Encode {
        /// The codec.
        codec: CodecTag,
        /// What failed.
        detail: String,
    },
}

impl CodecError {
    /// The category of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            CodecError::Encode { .. } => ErrorKind::InvalidArgument,
            CodecError::MissingBase { .. } => ErrorKind::BaseMissing,
            CodecError::BaseLength { .. } => ErrorKind::BaseMismatch,
            CodecError::OutOfMemory { .. } => ErrorKind::LimitExceeded,
            _ => ErrorKind::Malformed,
        }
    }
}

/// One codec: encode for the writer, decode for the reader.
pub trait ChunkCodec: Send + Sync {
    /// The tag this codec is registered under.
    fn tag(&self) -> CodecTag;

    /// Appends the stored form of `input` to `out` and returns the parameter block.
    fn encode(&self, ctx: ChunkContext, input: &[u8], out: &mut Vec<u8>) -> Result<Vec<u8>, CodecError>;

    /// Checks, before any byte is read or allocated, that a chunk of `stored` bytes can decode
    /// to `decoded` bytes with this codec (spec §6: each codec bounds its expansion).
    fn check_lengths(&self, stored: u64, decoded: u64) -> Result<(), CodecError>;

    /// Decodes `stored` into `out`, which is exactly the chunk's decoded length, filling all
    /// of it or failing.
    fn decode(&self, ctx: ChunkContext, params: &[u8], stored: &[u8], out: &mut [u8]) -> Result<(), CodecError>;
}

/// The registry: the decoder for a tag. Every registered tag has one.
pub fn decoder(tag: CodecTag) -> &'static dyn ChunkCodec {
    match tag {
        CodecTag::Raw => &Raw,
        CodecTag::Zstd => &Zstd { level: zstd_codec::DEFAULT_LEVEL },
        CodecTag::Planes => &Planes(PlaneForm::Serial),
        CodecTag::DeltaXor => &Dense(DenseOp::Xor, PlaneForm::Serial),
        CodecTag::DeltaSub => &Dense(DenseOp::Sub, PlaneForm::Serial),
        CodecTag::SparseEliasDelta => &Sparse(PositionCoder::EliasDelta, PlaneForm::Serial),
        CodecTag::SparseFibonacci => &Sparse(PositionCoder::Fibonacci, PlaneForm::Serial),
        CodecTag::SparseRice => &Sparse(PositionCoder::Rice, PlaneForm::Serial),
        CodecTag::SparsePacked => &Sparse(PositionCoder::Packed, PlaneForm::Serial),
        CodecTag::PlanesLanes => &Planes(PlaneForm::Lanes),
        CodecTag::DeltaXorLanes => &Dense(DenseOp::Xor, PlaneForm::Lanes),
        CodecTag::DeltaSubLanes => &Dense(DenseOp::Sub, PlaneForm::Lanes),
        CodecTag::SparsePackedLanes => &Sparse(PositionCoder::Packed, PlaneForm::Lanes),
        CodecTag::PlanesContext => &Planes(PlaneForm::Contexts),
        CodecTag::DeltaXorContext => &Dense(DenseOp::Xor, PlaneForm::BaseContexts),
        CodecTag::DeltaSubContext => &Dense(DenseOp::Sub, PlaneForm::BaseContexts),
        CodecTag::DeltaPredicted => &Predicted,
        // `CodecTag` is non-exhaustive only across crates; every tag the format crate
        // registers is matched above.
        #[allow(unreachable_patterns)]
        other => unreachable!("codec tag {other} is registered in tpde-format but has no codec"),
    }
}

/// Decodes one chunk through the registry.
pub fn decode(
    tag: CodecTag,
    ctx: ChunkContext,
    params: &[u8],
    stored: &[u8],
    out: &mut [u8],
) -> Result<(), CodecError> {
    decoder(tag).decode(ctx, params, stored, out)
}

/// The writer's choice of codec and its settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoder {
    /// Store as is.
    Raw,
    /// Zstandard at this level (1..=22; negative levels are the fast modes).
    Zstd {
        /// Compression level.
        level: i32,
    },
    /// One codec for every chunk. A codec that needs a base falls back to `planes` for a tensor
    /// that has none (new in this checkpoint, or changed in shape or dtype).
    Codec(CodecTag),
    /// The default: per chunk, the smallest lossless form in lane form (spec §6.2.3), which a
    /// CPU decodes several lanes at a time and a GPU decodes in parallel (§6.7):
    /// `planes-context` without a base; with one, whichever of `delta-xor-context`,
    /// `delta-sub-context`, `sparse-packed-lanes` and `planes-context` is estimated smallest.
    Auto,
    /// The smallest lossless form per chunk among the 1.1 codecs (one serial rANS stream per
    /// plane): `planes` without a base; with one, whichever of `delta-xor`, `delta-sub`, the
    /// four sparse forms and `planes` is estimated smallest. Files are slightly smaller than
    /// [`Encoder::Auto`]'s and readable by a 1.1 reader, but each plane decodes as one chain.
    AutoSerial,
}

impl Encoder {
    /// Encodes one chunk, appending its stored bytes to `out`; returns the tag and parameters.
    /// What a file of any minor version may hold (see [`Encoder::encode_in`]).
    pub fn encode(self, ctx: ChunkContext, input: &[u8], out: &mut Vec<u8>) -> Result<(CodecTag, Vec<u8>), CodecError> {
        self.encode_in(ctx, input, 0, out)
    }

    /// [`Encoder::encode`] for a file that declares minor version `minor`: from 1.8,
    /// [`Encoder::Auto`]'s dense deltas may code a plane that is almost all one byte as a sparse
    /// record (spec §6.2.5), where that is smaller.
    pub fn encode_in(
        self,
        ctx: ChunkContext,
        input: &[u8],
        minor: u16,
        out: &mut Vec<u8>,
    ) -> Result<(CodecTag, Vec<u8>), CodecError> {
        let records = planes::Records::of(minor);
        let tag = match self {
            Encoder::Raw => CodecTag::Raw,
            Encoder::Zstd { level } => return Ok((CodecTag::Zstd, Zstd { level }.encode(ctx, input, out)?)),
            Encoder::Codec(tag) if tag.needs_base() && ctx.base.is_none() => match PlaneForm::of(tag) {
                PlaneForm::Serial => CodecTag::Planes,
                _ => CodecTag::PlanesLanes,
            },
            Encoder::Codec(tag) => tag,
            Encoder::Auto => return select::encode_best(ctx, input, PlaneForm::Lanes, records, out),
            Encoder::AutoSerial => return select::encode_best(ctx, input, PlaneForm::Serial, Records::FIRST, out),
        };
        Ok((tag, decoder(tag).encode(ctx, input, out)?))
    }

    /// The lowest minor version of format 1 whose codecs this encoder may write, in a file with
    /// a base (`with_base`) or without: without one, [`Encoder::Auto`] writes no delta tag.
    pub fn since_minor(self, with_base: bool) -> u16 {
        match self {
            Encoder::Raw | Encoder::Zstd { .. } => 0,
            Encoder::Codec(tag) => tag.since_minor(),
            Encoder::AutoSerial => 1,
            Encoder::Auto if with_base => 4,
            Encoder::Auto => 3,
        }
    }
    /// Whether a GPU decodes every chunk this encoder writes in parallel (spec §6.7): `raw`,
    /// [`Encoder::Auto`] (lane forms only) and the lane-form tags.
    pub fn gpu_parallel(self) -> bool {
        match self {
            Encoder::Raw | Encoder::Auto => true,
            Encoder::Codec(tag) => tag.gpu_parallel(),
            Encoder::Zstd { .. } | Encoder::AutoSerial => false,
        }
    }

    /// Zstandard's level when a name does not give one.
    pub const DEFAULT_ZSTD_LEVEL: i32 = 3;
}

/// Parses an encoder's name: `auto`, `auto-serial`, `raw`, `zstd` (at
/// [`Encoder::DEFAULT_ZSTD_LEVEL`]) or any codec tag's name (spec §6). Front ends add their own
/// words for levels and profiles.
impl std::str::FromStr for Encoder {
    type Err = UnknownEncoder;

    fn from_str(name: &str) -> Result<Encoder, UnknownEncoder> {
        Ok(match name {
            "auto" => Encoder::Auto,
            "auto-serial" => Encoder::AutoSerial,
            "raw" => Encoder::Raw,
            "zstd" => Encoder::Zstd { level: Encoder::DEFAULT_ZSTD_LEVEL },
            _ => match CodecTag::from_name(name) {
                Some(tag) if tag != CodecTag::DeltaPredicted => Encoder::Codec(tag),
                _ => return Err(UnknownEncoder { name: name.to_owned() }),
            },
        })
    }
}

/// A name that is no encoder: unknown, or `delta-predicted`, which codes a tensor against a
/// prediction its writer is given per tensor (spec §6.8), never a file's codec of choice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownEncoder {
    /// The name given.
    pub name: String,
}

impl std::fmt::Display for UnknownEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.name == CodecTag::DeltaPredicted.name() {
            return write!(
                f,
                "delta-predicted codes a tensor against an optimizer's prediction (spec §6.8), which the writer is \
                 given per tensor; it is not a codec to choose for a file"
            );
        }
        let names: Vec<&str> =
            CodecTag::ALL.iter().filter(|&&t| t != CodecTag::DeltaPredicted).map(|t| t.name()).collect();
        write!(f, "unknown codec {:?}: expected auto, auto-serial, {}", self.name, names.join(", "))
    }
}

impl std::error::Error for UnknownEncoder {}

fn no_params(codec: CodecTag, params: &[u8]) -> Result<(), CodecError> {
    if params.is_empty() {
        Ok(())
    } else {
        Err(CodecError::BadParams { codec, detail: format!("expected no parameters, found {} bytes", params.len()) })
    }
}

#[cfg(test)]
mod encoder_names {
    use super::*;

    #[test]
    fn every_tag_name_parses_but_delta_predicted() {
        for tag in CodecTag::ALL {
            let parsed = tag.name().parse::<Encoder>();
            match tag {
                CodecTag::DeltaPredicted => assert!(parsed.unwrap_err().to_string().contains("§6.8")),
                CodecTag::Raw => assert_eq!(parsed.unwrap(), Encoder::Raw),
                CodecTag::Zstd => assert_eq!(parsed.unwrap(), Encoder::Zstd { level: Encoder::DEFAULT_ZSTD_LEVEL }),
                _ => assert_eq!(parsed.unwrap(), Encoder::Codec(tag)),
            }
        }
        assert_eq!("zstd".parse::<Encoder>().unwrap(), Encoder::Zstd { level: Encoder::DEFAULT_ZSTD_LEVEL });
        assert_eq!("auto".parse::<Encoder>().unwrap(), Encoder::Auto);
        let e = "lz4".parse::<Encoder>().unwrap_err().to_string();
        assert!(e.starts_with("unknown codec \"lz4\": expected auto, auto-serial, raw, zstd"), "{e}");
        assert!(Encoder::Auto.gpu_parallel() && !Encoder::AutoSerial.gpu_parallel());
    }
}
