//! binrw helpers for reading hostile input: every count and length read from the file is
//! checked against the bytes that remain before anything is allocated from it, and every
//! failure is a [`FormatError`] with the byte offset where it happened.

use binrw::{BinRead, BinResult, Endian};
use std::io::{Read, Seek, SeekFrom};

use crate::error::{FormatError, Position};

/// Bytes left in the stream after the current position.
fn remaining<R: Read + Seek>(reader: &mut R) -> BinResult<(u64, u64)> {
    let pos = reader.stream_position()?;
    let end = reader.seek(SeekFrom::End(0))?;
    reader.seek(SeekFrom::Start(pos))?;
    Ok((pos, end.saturating_sub(pos)))
}

pub(crate) fn custom(pos: u64, err: FormatError) -> binrw::Error {
    binrw::Error::Custom { pos, err: Box::new(err) }
}

/// Reads `count` items, each at least `min_len` bytes, after checking that they can fit.
pub(crate) fn read_vec<R, T>(
    reader: &mut R,
    endian: Endian,
    (count, min_len, what): (u64, u64, &'static str),
) -> BinResult<Vec<T>>
where
    R: Read + Seek,
    T: for<'a> BinRead<Args<'a> = ()>,
{
    let (pos, left) = remaining(reader)?;
    if count.checked_mul(min_len).is_none_or(|need| need > left) {
        return Err(custom(
            pos,
            FormatError::Malformed {
                what: "directory",
                location: Position::at(pos),
                detail: format!(
                    "{what} count {count} needs at least {min_len} bytes each, but only {left} bytes remain"
                ),
            },
        ));
    }
    let mut items = Vec::with_capacity(count as usize);
    for _ in 0..count {
        items.push(T::read_options(reader, endian, ())?);
    }
    Ok(items)
}

/// Reads `len` bytes after checking that they exist and that `len` is within `limit`.
pub(crate) fn read_bytes<R: Read + Seek>(
    reader: &mut R,
    _: Endian,
    (len, limit, what): (u64, u64, &'static str),
) -> BinResult<Vec<u8>> {
    let (pos, left) = remaining(reader)?;
    if len > limit {
        return Err(custom(pos, FormatError::LimitExceeded { what, found: len, limit, location: Position::at(pos) }));
    }
    if len > left {
        return Err(custom(
            pos,
            FormatError::Malformed {
                what: "directory",
                location: Position::at(pos),
                detail: format!("{what} of {len} bytes runs past the end of the directory ({left} bytes remain)"),
            },
        ));
    }
    let mut buf = vec![0; len as usize];
    reader.read_exact(&mut buf)?;
    Ok(buf)
}

/// Reads a UTF-8 string of `len` bytes (see [`read_bytes`]).
pub(crate) fn read_utf8<R: Read + Seek>(
    reader: &mut R,
    endian: Endian,
    args: (u64, u64, &'static str),
) -> BinResult<String> {
    let pos = reader.stream_position()?;
    let bytes = read_bytes(reader, endian, args)?;
    String::from_utf8(bytes).map_err(|e| {
        custom(
            pos,
            FormatError::Malformed {
                what: "directory",
                location: Position::at(pos),
                detail: format!("{} is not UTF-8 ({e})", args.2),
            },
        )
    })
}

/// Turns a binrw error into the [`FormatError`] it carries, or a truncation/malformation
/// error at the position binrw reports. Offsets are relative to the parsed buffer.
pub(crate) fn into_format_error(err: binrw::Error, what: &'static str, len: u64) -> FormatError {
    match err {
        // Errors from nested structures arrive wrapped with binrw's context frames.
        binrw::Error::Backtrace(bt) => into_format_error(*bt.error, what, len),
        binrw::Error::Custom { pos, err } => match err.downcast::<FormatError>() {
            Ok(e) => match *e {
                // Registry lookups inside try_map know no position; give them binrw's.
                FormatError::UnknownCodec { tag, location } if location.offset.is_none() => {
                    FormatError::UnknownCodec { tag, location: location.with_offset(pos) }
                }
                FormatError::UnknownDType { code, location } if location.offset.is_none() => {
                    FormatError::UnknownDType { code, location: location.with_offset(pos) }
                }
                FormatError::Malformed { what, location, detail } if location.offset.is_none() => {
                    FormatError::Malformed { what, location: location.with_offset(pos), detail }
                }
                e => e,
            },
            Err(other) => FormatError::Malformed { what, location: Position::at(pos), detail: other.to_string() },
        },
        binrw::Error::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => FormatError::Malformed {
            what,
            location: Position::at(len),
            detail: "a structure runs past the end of the directory".into(),
        },
        other => FormatError::Malformed { what, location: Position::default(), detail: other.to_string() },
    }
}
