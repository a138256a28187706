//! The trailer (spec §3): the last 32 bytes of every complete TPDE file. It is written last;
//! a file without a valid trailer is incomplete and MUST be rejected.
//!
//! ```text
//! offset size field
//!      0    8 directory_offset   u64 LE, absolute offset of the directory
//!      8    8 directory_length   u64 LE, its length in bytes
//!     16    4 directory_crc32    u32 LE, CRC-32 (IEEE) of the directory bytes
//!     20    4 trailer_crc32      u32 LE, CRC-32 of trailer bytes 0..20
//!     24    8 end_magic          "TPDE-END"
//! ```

use binrw::{BinRead, BinWrite};
use std::io::Cursor;

use crate::error::{hex, FormatError, Position};
use crate::header::Header;
use crate::limits::MAX_DIRECTORY_LEN;

/// The trailer's closing eight bytes.
pub const END_MAGIC: [u8; 8] = *b"TPDE-END";

/// The trailer.
#[derive(BinRead, BinWrite, Clone, Debug, PartialEq, Eq)]
#[brw(little)]
pub struct Trailer {
    /// Absolute offset of the directory.
    pub directory_offset: u64,
    /// Directory length in bytes.
    pub directory_length: u64,
    /// CRC-32 of the directory bytes.
    pub directory_crc32: u32,
    /// CRC-32 of trailer bytes 0..20.
    pub trailer_crc32: u32,
    /// [`END_MAGIC`].
    pub end_magic: [u8; 8],
}

const _: () = assert!(Trailer::LEN == 32);

impl Trailer {
    /// The trailer's size in bytes.
    pub const LEN: usize = 32;

    /// A trailer for a directory at `offset` with these bytes.
    pub fn new(directory_offset: u64, directory: &[u8]) -> Trailer {
        let mut t = Trailer {
            directory_offset,
            directory_length: directory.len() as u64,
            directory_crc32: crc32fast::hash(directory),
            trailer_crc32: 0,
            end_magic: END_MAGIC,
        };
        t.trailer_crc32 = crc32fast::hash(&t.to_bytes()[..20]);
        t
    }

    /// The 32 bytes of this trailer.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut out = Cursor::new([0u8; 32]);
        self.write(&mut out).expect("trailer is 32 bytes");
        out.into_inner()
    }

    /// Parses the last 32 bytes of a file of `file_len` bytes and checks that the directory
    /// range it names lies between the header and the trailer (R6, R7, R9).
    ///
    /// ```
    /// use tpde_format::Trailer;
    /// let t = Trailer::new(64, b"dir!");
    /// let bytes = t.to_bytes();
    /// assert_eq!(&bytes[24..], b"TPDE-END");
    /// assert_eq!(Trailer::parse(&bytes, 64 + 4 + 32).unwrap(), t);
    /// ```
    pub fn parse(bytes: &[u8; 32], file_len: u64) -> Result<Trailer, FormatError> {
        let Some(trailer_at) = file_len.checked_sub(Trailer::LEN as u64) else {
            return Err(FormatError::Truncated { what: "trailer", start: 0, end: Trailer::LEN as u64, file_len });
        };
        let t = Trailer::read(&mut Cursor::new(&bytes[..])).expect("32 bytes parse as a trailer");
        if t.end_magic != END_MAGIC {
            return Err(FormatError::Truncated {
                what: "no trailer where the file ends (no end magic \"TPDE-END\"): the file is incomplete",
                start: trailer_at,
                end: file_len,
                file_len,
            });
        }
        let computed = crc32fast::hash(&bytes[..20]);
        if computed != t.trailer_crc32 {
            return Err(FormatError::ChecksumMismatch {
                what: "trailer",
                location: Position::at(trailer_at + 20),
                stored: hex(&t.trailer_crc32.to_be_bytes()),
                computed: hex(&computed.to_be_bytes()),
            });
        }
        if t.directory_length > MAX_DIRECTORY_LEN {
            return Err(FormatError::LimitExceeded {
                what: "directory length",
                found: t.directory_length,
                limit: MAX_DIRECTORY_LEN,
                location: Position::at(trailer_at + 8),
            });
        }
        let end = t.directory_offset.checked_add(t.directory_length);
        if t.directory_offset < Header::LEN as u64 || end != Some(trailer_at) {
            return Err(FormatError::malformed(
                "trailer",
                Position::at(trailer_at),
                format!(
                    "directory {}+{} must lie in {}..{} and end where the trailer begins",
                    t.directory_offset,
                    t.directory_length,
                    Header::LEN,
                    trailer_at
                ),
            ));
        }
        Ok(t)
    }
}
