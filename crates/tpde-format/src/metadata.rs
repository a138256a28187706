//! Typed file metadata (spec §5.2): key/value pairs. Keys beginning `tpde.` are reserved for
//! this spec; other keys belong to the producer (`tpde pack` copies safetensors metadata there).
//!
//! ```text
//! MetadataEntry
//!   u16 key_len; key_len bytes UTF-8 key
//!   u8  type     0x01 bool | 0x02 u64 | 0x03 i64 | 0x04 f64 | 0x05 string | 0x06 bytes
//!   u32 value_len; value_len bytes of value (LE for numbers, 1 byte 0/1 for bool)
//! ```
//! A reader keeps values of a type code it does not know as [`MetadataValue::Unknown`]: every
//! value is length-prefixed, so new types can be added in a minor version.

use binrw::{binrw, BinResult, Endian};
use std::io::{Read, Seek};

use crate::binio::{custom, read_bytes, read_utf8};
use crate::error::{FormatError, Position};
use crate::limits::MAX_KEY_LEN;

/// Reserved key: the training step of the checkpoint (`u64`).
pub const KEY_STEP: &str = "tpde.step";
/// Reserved key: the program that wrote the file (`string`).
pub const KEY_PRODUCER: &str = "tpde.producer";
/// Reserved key: the container the tensors were packed from, e.g. `safetensors` (`string`).
pub const KEY_SOURCE_FORMAT: &str = "tpde.source_format";
/// Reserved key: the bound τ of a lossy file (`f64`, spec §6.6). Every float element decodes to
/// within τ of the tensor it was packed from; without this key a file is lossless.
pub const KEY_MAX_ABS_ERROR: &str = "tpde.max_abs_error";
/// Reserved key: the relative bound ρ of a lossy file (`f64`, spec §6.6, since 1.5). Every
/// float element decodes to within τ + ρ·|x| of the element x it was packed from (τ from
/// `tpde.max_abs_error`, 0 when absent).
pub const KEY_MAX_REL_ERROR: &str = "tpde.max_rel_error";
/// Reserved key: the files of a model folder that are not tensors (`bytes`, spec §5.5, since
/// 1.7), defined with their table in [`crate::files`].
pub use crate::files::KEY_FILES;
/// The reserved key prefix.
pub const RESERVED_PREFIX: &str = "tpde.";

/// The minor version of format 1 that defines reserved key `key` (spec §11): a file that holds
/// it declares at least this one. 0 for every other key.
pub fn since_minor(key: &str) -> u16 {
    match key {
        KEY_MAX_REL_ERROR => 5,
        KEY_FILES => 7,
        _ => 0,
    }
}

/// The type the spec gives a reserved key, if the key is one this version defines.
pub fn reserved_type(key: &str) -> Option<&'static str> {
    match key {
        KEY_STEP => Some("u64"),
        KEY_PRODUCER | KEY_SOURCE_FORMAT => Some("string"),
        KEY_MAX_ABS_ERROR | KEY_MAX_REL_ERROR => Some("f64"),
        KEY_FILES => Some("bytes"),
        _ => None,
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataValue {
    /// `0x01`.
    Bool(bool),
    /// `0x02`.
    U64(u64),
    /// `0x03`.
    I64(i64),
    /// `0x04`, any bit pattern (NaN payloads are kept).
    F64(f64),
    /// `0x05`, UTF-8.
    String(String),
    /// `0x06`.
    Bytes(Vec<u8>),
    /// A type code this reader does not know, kept as its bytes.
    Unknown {
        /// The type code.
        type_code: u8,
        /// The value bytes.
        bytes: Vec<u8>,
    },
}

impl MetadataValue {
    /// The on-disk type code.
    pub fn type_code(&self) -> u8 {
        match self {
            MetadataValue::Bool(_) => 0x01,
            MetadataValue::U64(_) => 0x02,
            MetadataValue::I64(_) => 0x03,
            MetadataValue::F64(_) => 0x04,
            MetadataValue::String(_) => 0x05,
            MetadataValue::Bytes(_) => 0x06,
            MetadataValue::Unknown { type_code, .. } => *type_code,
        }
    }

    /// The registry name of the type.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetadataValue::Bool(_) => "bool",
            MetadataValue::U64(_) => "u64",
            MetadataValue::I64(_) => "i64",
            MetadataValue::F64(_) => "f64",
            MetadataValue::String(_) => "string",
            MetadataValue::Bytes(_) => "bytes",
            MetadataValue::Unknown { .. } => "unknown",
        }
    }

    /// The value bytes as stored.
    pub fn payload(&self) -> Vec<u8> {
        match self {
            MetadataValue::Bool(b) => vec![u8::from(*b)],
            MetadataValue::U64(v) => v.to_le_bytes().to_vec(),
            MetadataValue::I64(v) => v.to_le_bytes().to_vec(),
            MetadataValue::F64(v) => v.to_bits().to_le_bytes().to_vec(),
            MetadataValue::String(s) => s.as_bytes().to_vec(),
            MetadataValue::Bytes(b) => b.clone(),
            MetadataValue::Unknown { bytes, .. } => bytes.clone(),
        }
    }

    fn decode(type_code: u8, bytes: Vec<u8>) -> Result<MetadataValue, String> {
        let eight = |b: &[u8]| -> Result<[u8; 8], String> {
            b.try_into().map_err(|_| format!("a {}-byte value for an 8-byte type", b.len()))
        };
        Ok(match type_code {
            0x01 => match bytes.as_slice() {
                [0] => MetadataValue::Bool(false),
                [1] => MetadataValue::Bool(true),
                other => return Err(format!("bool value must be one byte 0 or 1, found {other:?}")),
            },
            0x02 => MetadataValue::U64(u64::from_le_bytes(eight(&bytes)?)),
            0x03 => MetadataValue::I64(i64::from_le_bytes(eight(&bytes)?)),
            0x04 => MetadataValue::F64(f64::from_bits(u64::from_le_bytes(eight(&bytes)?))),
            0x05 => {
                MetadataValue::String(String::from_utf8(bytes).map_err(|e| format!("string value is not UTF-8 ({e})"))?)
            }
            0x06 => MetadataValue::Bytes(bytes),
            type_code => MetadataValue::Unknown { type_code, bytes },
        })
    }

    /// Equality of the stored bytes (for `F64`, bit equality, so NaN equals itself).
    pub fn same_bits(&self, other: &MetadataValue) -> bool {
        self.type_code() == other.type_code() && self.payload() == other.payload()
    }
}

impl std::fmt::Display for MetadataValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetadataValue::Bool(b) => write!(f, "{b}"),
            MetadataValue::U64(v) => write!(f, "{v}"),
            MetadataValue::I64(v) => write!(f, "{v}"),
            MetadataValue::F64(v) => write!(f, "{v}"),
            MetadataValue::String(s) => f.write_str(s),
            MetadataValue::Bytes(b) | MetadataValue::Unknown { bytes: b, .. } => {
                write!(f, "0x{}", crate::error::hex(b))
            }
        }
    }
}

#[binrw::parser(reader, endian)]
fn read_value(type_code: u8, len: u32) -> BinResult<MetadataValue> {
    let pos = reader.stream_position()?;
    // §8 sets no limit of its own on a value: one longer than the directory's remaining bytes
    // breaks the directory's syntax (R12), whatever its length.
    let bytes = read_bytes(reader, endian, (len.into(), u64::MAX, "metadata value"))?;
    MetadataValue::decode(type_code, bytes).map_err(|detail| {
        custom(pos, FormatError::Malformed { what: "metadata value", location: Position::at(pos), detail })
    })
}

fn read_key<R: Read + Seek>(reader: &mut R, endian: Endian, len: u16) -> BinResult<String> {
    read_utf8(reader, endian, (len.into(), MAX_KEY_LEN, "metadata key"))
}

/// One key/value pair.
#[binrw]
#[brw(little)]
#[derive(Clone, Debug, PartialEq)]
pub struct MetadataEntry {
    #[br(temp)]
    #[bw(calc = key.len() as u16)]
    key_len: u16,
    /// UTF-8 key, unique within the file.
    #[br(parse_with = |r, e, _: ()| read_key(r, e, key_len))]
    #[bw(map = |k: &String| k.as_bytes().to_vec())]
    pub key: String,
    #[br(temp)]
    #[bw(calc = value.type_code())]
    type_code: u8,
    #[br(temp)]
    #[bw(calc = value.payload().len() as u32)]
    value_len: u32,
    /// The value.
    #[br(parse_with = read_value, args(type_code, value_len))]
    #[bw(map = |v: &MetadataValue| v.payload())]
    pub value: MetadataValue,
}

impl MetadataEntry {
    /// The smallest encoded entry.
    pub const MIN_LEN: u64 = 2 + 1 + 4;

    /// A new entry.
    pub fn new(key: impl Into<String>, value: MetadataValue) -> Self {
        MetadataEntry { key: key.into(), value }
    }
}
