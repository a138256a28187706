//! The dtype registry (spec §4). Codes are stable; a new dtype is a minor version.

use crate::error::{FormatError, Position};

/// An element type. All multi-byte types are stored little-endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DType {
    /// One byte, 0 or 1.
    Bool,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16: the top 16 bits of a binary32.
    BF16,
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary64.
    F64,
    /// OCP FP8 E4M3 (the "fn" variant: no infinities, one NaN pattern per sign).
    F8E4M3,
    /// OCP FP8 E5M2.
    F8E5M2,
}

impl DType {
    /// Every dtype of this version of the registry, in code order.
    pub const ALL: [DType; 15] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::U16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::F8E4M3,
        DType::F8E5M2,
    ];

    /// The on-disk code.
    pub const fn code(self) -> u8 {
        match self {
            DType::Bool => 0x01,
            DType::U8 => 0x02,
            DType::I8 => 0x03,
            DType::I16 => 0x04,
            DType::U16 => 0x05,
            DType::I32 => 0x06,
            DType::U32 => 0x07,
            DType::I64 => 0x08,
            DType::U64 => 0x09,
            DType::F16 => 0x10,
            DType::BF16 => 0x11,
            DType::F32 => 0x12,
            DType::F64 => 0x13,
            DType::F8E4M3 => 0x14,
            DType::F8E5M2 => 0x15,
        }
    }

    /// The dtype with this code, if this registry has one.
    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }

    pub(crate) fn parse(code: u8) -> Result<DType, FormatError> {
        DType::from_code(code).ok_or(FormatError::UnknownDType { code, location: Position::default() })
    }

    /// Bytes per element.
    pub const fn size(self) -> u64 {
        match self {
            DType::Bool | DType::U8 | DType::I8 | DType::F8E4M3 | DType::F8E5M2 => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }

    /// The registry name (lower case, as in the spec and `tpde-inspect`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F8E4M3 => "f8_e4m3",
            DType::F8E5M2 => "f8_e5m2",
        }
    }

    /// The dtype with this registry name.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::F8E4M3 | DType::F8E5M2)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_are_unique_and_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()), Some(d));
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        let mut codes: Vec<u8> = DType::ALL.iter().map(|d| d.code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), DType::ALL.len());
        assert_eq!(DType::from_code(0x00), None);
        assert_eq!(DType::from_code(0xff), None);
    }
}
