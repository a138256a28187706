//! The directory (spec §5): everything needed to find and decode every tensor, written after
//! the payloads so a writer can stream tensors of unknown number and size. All integers LE.
//!
//! ```text
//! Directory
//!   u32 metadata_count
//!   u32 tensor_count
//!   u8  base_kind                0 = no base, 1 = BLAKE3 content digest (v1)
//!   BaseRef                      only if base_kind = 1
//!   MetadataEntry[metadata_count]
//!   TensorEntry[tensor_count]
//!
//! BaseRef
//!   [u8; 32] digest              content digest of the base (spec §7)
//!   u16 hint_len; UTF-8 path hint (may be empty; advisory only)
//!
//! TensorEntry
//!   u16 name_len; UTF-8 name     unique, 1..=4096 bytes
//!   u8  dtype                    dtype registry code
//!   u8  rank                     0..=32 (0 is a scalar)
//!   u64[rank] shape
//!   u64 byte_length              product(shape) * dtype size
//!   [u8; 32] digest              BLAKE3 of the tensor's logical bytes
//!   u32 chunk_count
//!   ChunkEntry[chunk_count]
//!
//! ChunkEntry (48 bytes + params)
//!   u64 element_start            first element (row-major) the chunk decodes to
//!   u64 element_count            >= 1
//!   u64 offset                   absolute file offset of the stored bytes, aligned
//!   u64 stored_length
//!   u64 decoded_length           element_count * dtype size
//!   u32 crc32                    CRC-32 (IEEE) of the stored bytes
//!   u16 codec                    codec registry tag
//!   u16 params_len; params       codec parameters
//! ```

use binrw::{binrw, BinRead, BinWrite, Endian};
use std::io::{Cursor, Read, Seek};

use crate::binio::{custom, into_format_error, read_bytes, read_utf8, read_vec};
use crate::codec::CodecTag;
use crate::dtype::DType;
use crate::error::{FormatError, Position};
use crate::limits::{MAX_CODEC_PARAMS_LEN, MAX_NAME_LEN, MAX_PATH_HINT_LEN};
use crate::metadata::{MetadataEntry, MetadataValue};

/// The reference a delta file holds to the checkpoint it decodes against.
#[binrw]
#[brw(little)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseRef {
    /// The base's content digest ([`crate::content_digest`]).
    pub digest: [u8; 32],
    #[br(temp)]
    #[bw(calc = path_hint.len() as u16)]
    hint_len: u16,
    /// Where the base was when this file was written; advisory, never trusted.
    #[br(parse_with = |r, e, _: ()| read_utf8(r, e, (hint_len.into(), MAX_PATH_HINT_LEN, "base path hint")))]
    #[bw(map = |s: &String| s.as_bytes().to_vec())]
    pub path_hint: String,
}

/// One chunk: a contiguous run of a tensor's elements, stored with one codec.
#[binrw]
#[brw(little)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkEntry {
    /// First element the chunk decodes to.
    pub element_start: u64,
    /// Number of elements.
    pub element_count: u64,
    /// Absolute file offset of the stored bytes.
    pub offset: u64,
    /// Stored byte length.
    pub stored_length: u64,
    /// Decoded byte length.
    pub decoded_length: u64,
    /// CRC-32 of the stored bytes.
    pub crc32: u32,
    /// Codec tag.
    #[br(try_map = CodecTag::parse)]
    #[bw(map = |c: &CodecTag| c.to_u16())]
    pub codec: CodecTag,
    #[br(temp)]
    #[bw(calc = params.len() as u16)]
    params_len: u16,
    /// Codec parameters.
    #[br(parse_with = |r, e, _: ()| read_bytes(r, e, (params_len.into(), MAX_CODEC_PARAMS_LEN, "codec parameters")))]
    pub params: Vec<u8>,
}

impl ChunkEntry {
    /// The smallest encoded chunk entry.
    pub const MIN_LEN: u64 = 48;

    /// The stored byte range, if it does not overflow.
    pub fn stored_range(&self) -> Option<std::ops::Range<u64>> {
        Some(self.offset..self.offset.checked_add(self.stored_length)?)
    }
}

fn read_shape<R: Read + Seek>(reader: &mut R, endian: Endian, rank: u8) -> binrw::BinResult<Vec<u64>> {
    // P5: a rank over its limit (R15) is reported before the bytes its shape would need (R12).
    if u64::from(rank) > crate::limits::MAX_RANK {
        let pos = reader.stream_position()?.saturating_sub(1);
        let location = crate::error::Position::at(pos);
        let found = rank.into();
        return Err(crate::binio::custom(
            pos,
            FormatError::LimitExceeded { what: "rank", found, limit: crate::limits::MAX_RANK, location },
        ));
    }
    // rank is at most 32 here, so this allocates at most 256 bytes whatever the file says.
    let mut shape = Vec::with_capacity(rank.into());
    for _ in 0..rank {
        shape.push(u64::read_options(reader, endian, ())?);
    }
    Ok(shape)
}

/// One tensor.
#[binrw]
#[brw(little)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    #[br(temp)]
    #[bw(calc = name.len() as u16)]
    name_len: u16,
    /// UTF-8 name, unique within the file.
    #[br(parse_with = |r, e, _: ()| read_utf8(r, e, (name_len.into(), MAX_NAME_LEN, "tensor name")))]
    #[bw(map = |s: &String| s.as_bytes().to_vec())]
    pub name: String,
    /// Element type.
    #[br(try_map = DType::parse)]
    #[bw(map = |d: &DType| d.code())]
    pub dtype: DType,
    #[br(temp)]
    #[bw(calc = shape.len() as u8)]
    rank: u8,
    /// Dimensions, outermost first; empty for a scalar.
    #[br(parse_with = |r, e, _: ()| read_shape(r, e, rank))]
    pub shape: Vec<u64>,
    /// `product(shape) * dtype.size()`.
    pub byte_length: u64,
    /// BLAKE3 of the logical bytes.
    pub digest: [u8; 32],
    #[br(temp)]
    #[bw(calc = chunks.len() as u32)]
    chunk_count: u32,
    /// Chunks in element order.
    #[br(parse_with = read_vec, args(chunk_count.into(), ChunkEntry::MIN_LEN, "chunk"))]
    pub chunks: Vec<ChunkEntry>,
}

impl TensorEntry {
    /// The smallest encoded tensor entry.
    pub const MIN_LEN: u64 = 2 + 1 + 1 + 8 + 32 + 4;

    /// Number of elements, or `None` if the product overflows `u64`.
    pub fn element_count(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Sum of the chunks' stored lengths (saturating; validated files do not overflow).
    pub fn stored_length(&self) -> u64 {
        self.chunks.iter().fold(0u64, |acc, c| acc.saturating_add(c.stored_length))
    }
}

/// The directory.
#[binrw]
#[brw(little)]
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Directory {
    #[br(temp)]
    #[bw(calc = metadata.len() as u32)]
    metadata_count: u32,
    #[br(temp)]
    #[bw(calc = tensors.len() as u32)]
    tensor_count: u32,
    #[br(temp)]
    #[br(assert(base_kind <= 1, custom(8, FormatError::Malformed {
        what: "directory",
        location: Position::at(8),
        detail: format!("base_kind {base_kind} is not 0 (no base) or 1 (BLAKE3 content digest)"),
    })))]
    #[bw(calc = u8::from(base.is_some()))]
    base_kind: u8,
    /// The base this file is a delta against, if any.
    #[br(if(base_kind == 1))]
    pub base: Option<BaseRef>,
    /// File metadata.
    #[br(parse_with = read_vec, args(metadata_count.into(), MetadataEntry::MIN_LEN, "metadata entry"))]
    pub metadata: Vec<MetadataEntry>,
    /// Tensors, in the order they were written.
    #[br(parse_with = read_vec, args(tensor_count.into(), TensorEntry::MIN_LEN, "tensor"))]
    pub tensors: Vec<TensorEntry>,
}

impl Directory {
    /// Parses directory bytes. Byte offsets in errors are relative to the directory's start;
    /// the caller adds the directory's file offset ([`FormatError::offset_by`]). Only syntax is
    /// checked here; [`crate::validate`] checks the rules that relate fields to each other.
    pub fn parse(bytes: &[u8]) -> Result<Directory, FormatError> {
        let len = bytes.len() as u64;
        let mut cur = Cursor::new(bytes);
        let dir = Directory::read(&mut cur).map_err(|e| into_format_error(e, "directory", len))?;
        if cur.position() != len {
            return Err(FormatError::Malformed {
                what: "directory",
                location: Position::at(cur.position()),
                detail: format!("{} bytes follow the last tensor entry", len - cur.position()),
            });
        }
        Ok(dir)
    }

    /// The encoded directory.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        self.write(&mut out).expect("writing to a Vec cannot fail");
        out.into_inner()
    }

    /// The tensor with this name.
    pub fn tensor(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The metadata value for this key.
    pub fn metadata_value(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata.iter().find(|m| m.key == key).map(|m| &m.value)
    }
}

#[cfg(test)]
mod tests {
    use super::Directory;
    use crate::ErrorKind;

    /// §8 sets no limit on a metadata value: one longer than the directory breaks its syntax
    /// (R12, `malformed`) at every length, 300 MiB included.
    #[test]
    fn an_overlong_metadata_value_is_malformed() {
        for value_len in [9u32, 1 << 20, 300 << 20, u32::MAX] {
            let mut d = Vec::new();
            d.extend(1u32.to_le_bytes()); // metadata_count
            d.extend(0u32.to_le_bytes()); // tensor_count
            d.push(0); // base_kind
            d.extend(1u16.to_le_bytes());
            d.push(b'k');
            d.push(0x05); // string
            d.extend(value_len.to_le_bytes());
            d.extend(b"12345678");
            let e = Directory::parse(&d).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Malformed, "value_len {value_len}: {e}");
        }
    }
}
