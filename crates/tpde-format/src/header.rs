//! The file header (spec §2): the first 64 bytes of every TPDE file.
//!
//! ```text
//! offset size field
//!      0    8 magic              89 54 50 44 45 0D 0A 1A  ("\x89TPDE\r\n\x1a")
//!      8    2 major_version      u16 LE, 1
//!     10    2 minor_version      u16 LE, 0
//!     12    4 alignment          u32 LE, payload alignment in bytes: a power of two, 64..=1 MiB
//!     16    8 required_features  u64 LE, must-understand flags
//!     24    8 optional_features  u64 LE, may-ignore flags
//!     32   28 reserved           zero
//!     60    4 header_crc32       u32 LE, CRC-32 (IEEE) of bytes 0..60
//! ```

use binrw::{BinRead, BinWrite};
use std::io::Cursor;

use crate::error::{hex, FormatError, Position};
use crate::limits::{MAX_ALIGNMENT, MIN_ALIGNMENT};

/// The eight magic bytes that open every TPDE file. Like PNG's, the high first byte and the
/// CR LF / SUB bytes catch 7-bit and text-mode transfers.
pub const MAGIC: [u8; 8] = [0x89, b'T', b'P', b'D', b'E', 0x0D, 0x0A, 0x1A];
/// The major version this crate reads and writes.
pub const FORMAT_MAJOR: u16 = 1;
/// The newest minor version this crate knows. A writer puts the lowest minor version that
/// covers what the file uses in the header (spec §11), so a file that needs only 1.0 reads as 1.0.
pub const FORMAT_MINOR: u16 = 11;

/// Must-understand feature flags (`required_features`). A reader MUST reject a file that sets
/// a bit it does not know.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequiredFeatures(pub u64);

impl RequiredFeatures {
    /// Bit 0, `BASE`: the file is a delta; its directory holds a base reference, and its tensors
    /// decode only against that base.
    pub const BASE: u64 = 1 << 0;
    /// Every bit this version defines.
    pub const KNOWN: u64 = Self::BASE;
}

/// May-ignore feature flags (`optional_features`). A reader MUST ignore bits it does not know.
/// Version 1.0 defines none; later minor versions may, for hints that change no meaning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OptionalFeatures(pub u64);

/// The file header.
#[derive(BinRead, BinWrite, Clone, Debug, PartialEq, Eq)]
#[brw(little)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// Major version.
    pub major_version: u16,
    /// Minor version.
    pub minor_version: u16,
    /// Payload alignment in bytes.
    pub alignment: u32,
    /// Must-understand flags.
    pub required_features: u64,
    /// May-ignore flags.
    pub optional_features: u64,
    /// Zero.
    pub reserved: [u8; 28],
    /// CRC-32 of bytes 0..60.
    pub header_crc32: u32,
}

const _: () = assert!(Header::LEN == 64);

impl Header {
    /// The header's size in bytes.
    pub const LEN: usize = 64;

    /// A header for a new file of version 1.`minor_version`.
    pub fn new(minor_version: u16, alignment: u32, required_features: u64) -> Header {
        let mut h = Header {
            magic: MAGIC,
            major_version: FORMAT_MAJOR,
            minor_version,
            alignment,
            required_features,
            optional_features: 0,
            reserved: [0; 28],
            header_crc32: 0,
        };
        h.header_crc32 = crc32fast::hash(&h.to_bytes()[..60]);
        h
    }

    /// The 64 bytes of this header, as they are on disk.
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut out = Cursor::new([0u8; 64]);
        // Writing a fixed-size struct into a buffer of exactly its size cannot fail.
        self.write(&mut out).expect("header is 64 bytes");
        out.into_inner()
    }

    /// Parses and validates a header from the first bytes of a file (`bytes` may be the whole
    /// file or just its start; `file_len` is the whole file's length).
    ///
    /// Checks in the order the spec gives: magic (R1), major version (R2), length (R5),
    /// CRC (R3), reserved bytes and alignment (R8), must-understand flags (R4).
    ///
    /// ```
    /// use tpde_format::{Header, ErrorKind};
    /// let h = Header::new(0, 64, 0);
    /// let bytes = h.to_bytes();
    /// assert_eq!(&bytes[..12], b"\x89TPDE\r\n\x1a\x01\x00\x00\x00");
    /// assert_eq!(Header::parse(&bytes, 64).unwrap(), h);
    /// let err = Header::parse(b"PK\x03\x04 not a tpde file at all", 30).unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::NotTpde);
    /// ```
    pub fn parse(bytes: &[u8], file_len: u64) -> Result<Header, FormatError> {
        let prefix = &bytes[..bytes.len().min(8)];
        if prefix != &MAGIC[..prefix.len()] || (prefix.is_empty() && file_len == 0) {
            return Err(FormatError::NotTpde { found: prefix.to_vec(), expected: MAGIC });
        }
        // R2 needs only bytes 8..10 (the minor version is reported when there).
        if bytes.len() >= 10 {
            let major = u16::from_le_bytes([bytes[8], bytes[9]]);
            let minor = bytes.get(10..12).map_or(0, |m| u16::from_le_bytes([m[0], m[1]]));
            if major != FORMAT_MAJOR {
                return Err(FormatError::UnsupportedVersion { major, minor, supported: FORMAT_MAJOR });
            }
        }
        let Some(fixed) = bytes.get(..Header::LEN) else {
            return Err(FormatError::Truncated { what: "header", start: 0, end: Header::LEN as u64, file_len });
        };
        let h = Header::read(&mut Cursor::new(fixed)).expect("64 bytes parse as a header");
        let computed = crc32fast::hash(&fixed[..60]);
        if computed != h.header_crc32 {
            return Err(FormatError::ChecksumMismatch {
                what: "header",
                location: Position::at(60),
                stored: hex(&h.header_crc32.to_be_bytes()),
                computed: hex(&computed.to_be_bytes()),
            });
        }
        if h.reserved.iter().any(|&b| b != 0) {
            return Err(FormatError::malformed("header", Position::at(32), "reserved bytes are not zero"));
        }
        let a = u64::from(h.alignment);
        if !a.is_power_of_two() || !(MIN_ALIGNMENT..=MAX_ALIGNMENT).contains(&a) {
            return Err(FormatError::malformed(
                "header",
                Position::at(12),
                format!("alignment {a} is not a power of two in {MIN_ALIGNMENT}..={MAX_ALIGNMENT}"),
            ));
        }
        let unknown = h.required_features & !RequiredFeatures::KNOWN;
        if unknown != 0 {
            return Err(FormatError::UnknownRequiredFeatures { unknown, known: RequiredFeatures::KNOWN });
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn reseal(mut b: [u8; 64]) -> [u8; 64] {
        let crc = crc32fast::hash(&b[..60]);
        b[60..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    #[test]
    fn each_rule_alone() {
        let good = Header::new(0, 64, 0).to_bytes();
        let mut b = good;
        b[9] = 2; // major 0x0201
        assert_eq!(Header::parse(&b, 64).unwrap_err().kind(), ErrorKind::UnsupportedVersion);
        let mut b = good;
        b[10] = 7; // newer minor, CRC not resealed
        assert_eq!(Header::parse(&b, 64).unwrap_err().kind(), ErrorKind::ChecksumMismatch);
        assert!(Header::parse(&reseal(b), 64).is_ok(), "a newer minor version is read");
        let mut b = good;
        b[16] = 0x02;
        assert_eq!(Header::parse(&reseal(b), 64).unwrap_err().kind(), ErrorKind::UnsupportedFeature);
        let mut b = good;
        b[24] = 0xff; // unknown optional flags are ignored
        assert!(Header::parse(&reseal(b), 64).is_ok());
        let mut b = good;
        b[40] = 1;
        assert_eq!(Header::parse(&reseal(b), 64).unwrap_err().kind(), ErrorKind::Malformed);
        let mut b = good;
        b[12] = 48;
        assert_eq!(Header::parse(&reseal(b), 64).unwrap_err().kind(), ErrorKind::Malformed);
        assert_eq!(Header::parse(&good[..20], 20).unwrap_err().kind(), ErrorKind::Truncated);
    }

    /// Spec §9's precedences P1–P3 between the header's rules, on headers breaking several.
    #[test]
    fn precedence_between_header_rules() {
        let good = Header::new(0, 64, 0).to_bytes();
        let kind = |b: &[u8]| Header::parse(b, b.len() as u64).unwrap_err().kind();
        // P1: R1 first; a short file is R1 unless it is the start of the magic (then R5).
        assert_eq!(kind(b""), ErrorKind::NotTpde);
        assert_eq!(kind(&good[..3]), ErrorKind::Truncated);
        assert_eq!(kind(&good[..8]), ErrorKind::Truncated);
        assert_eq!(kind(b"\x89TPX"), ErrorKind::NotTpde);
        let mut b = good;
        b[0] = b'P'; // wrong magic and a wrong major version: R1
        b[8] = 2;
        assert_eq!(kind(&b), ErrorKind::NotTpde);
        // P2: R2 needs bytes 8..10 only, and comes before R3 and R5.
        let mut b = good;
        b[8] = 2;
        assert_eq!(kind(&b[..10]), ErrorKind::UnsupportedVersion);
        assert_eq!(kind(&b[..11]), ErrorKind::UnsupportedVersion);
        assert_eq!(kind(&b), ErrorKind::UnsupportedVersion, "before the header CRC");
        assert_eq!(kind(&good[..9]), ErrorKind::Truncated);
        // P3: R5 before R3; R3 before R4 and R8 (fields are acted on once the CRC matches).
        let mut b = good;
        b[60] ^= 1;
        assert_eq!(kind(&b[..40]), ErrorKind::Truncated);
        let mut b = good;
        b[16] = 0x02; // an unknown required flag, CRC not resealed
        assert_eq!(kind(&b), ErrorKind::ChecksumMismatch);
        let mut b = good;
        b[40] = 1; // a reserved byte, CRC not resealed
        assert_eq!(kind(&b), ErrorKind::ChecksumMismatch);
    }
}
