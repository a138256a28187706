//! The files of a model folder a TPDE file carries (spec §5.5, since 1.7): the reserved entry
//! `tpde.files`, one Zstandard frame of a file table ([`tpde_format::files`]). Read only when
//! asked for: a reader of tensors ignores it, as a 1.6 reader does (R31 belongs to reading).

use tpde_format::files::{check_frame_header, parse_table, FileEntry, KEY_FILES, MAX_WINDOW};
use tpde_format::{FormatError, MetadataValue, Position};

use crate::{ReadError, Reader, Source};

impl<S: Source> Reader<S> {
    /// The files the file carries, in table order; none when it has no `tpde.files` entry.
    /// The table's frame header is checked against the limits before anything is allocated.
    pub fn files(&self) -> Result<Vec<FileEntry>, ReadError> {
        match self.metadata(KEY_FILES) {
            None => Ok(Vec::new()),
            Some(MetadataValue::Bytes(value)) => Ok(decode_files(value)?),
            // Validation at open already refused another type (R17); never a panic.
            Some(other) => Err(FormatError::Malformed {
                what: "metadata",
                location: Position::default(),
                detail: format!("{KEY_FILES} is {}, the spec gives it bytes", other.type_name()),
            }
            .into()),
        }
    }
}

/// Decompresses and parses the value of a `tpde.files` entry.
pub fn decode_files(value: &[u8]) -> Result<Vec<FileEntry>, FormatError> {
    let malformed = |detail: String| FormatError::Malformed {
        what: "file table (tpde.files)",
        location: Position::default(),
        detail,
    };
    let content = check_frame_header(value)?;
    let frame_len = zstd::zstd_safe::find_frame_compressed_size(value)
        .map_err(|e| malformed(format!("not one whole Zstandard frame: {}", zstd::zstd_safe::get_error_name(e))))?;
    if frame_len != value.len() {
        return Err(malformed(format!("{} bytes follow the frame", value.len() - frame_len)));
    }
    let mut table = vec![0u8; content as usize]; // bounded by MAX_TABLE_LEN above
    let mut dctx = zstd::bulk::Decompressor::new().map_err(|e| malformed(e.to_string()))?;
    dctx.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(MAX_WINDOW.trailing_zeros()))
        .map_err(|e| malformed(e.to_string()))?;
    let n = dctx
        .decompress_to_buffer(value, &mut table[..])
        .map_err(|e| malformed(format!("the frame does not decode: {e}")))?;
    if n as u64 != content {
        return Err(malformed(format!("the frame decodes to {n} bytes, its header says {content}")));
    }
    parse_table(&table)
}
