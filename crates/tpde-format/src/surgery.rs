//! Editing an encoded file in place of a writer: change one structure, reseal its checksums,
//! keep everything else. This is how the conformance corpus and the tests build files that
//! break exactly one rule of the spec; a real writer never needs it.
//!
//! Every function takes the bytes of a well-formed file (header, payload, directory, trailer,
//! with the trailer's `directory_offset` right) and returns new bytes.

use crate::{Directory, FormatError, Header, Position, Trailer};

/// Where the directory of `file` begins, read from the trailer without checking it.
pub fn directory_offset(file: &[u8]) -> Result<usize, FormatError> {
    let malformed = || FormatError::Malformed {
        what: "trailer",
        location: Position::at(file.len() as u64),
        detail: "no directory offset to edit".into(),
    };
    let at = file.len().checked_sub(Trailer::LEN).ok_or_else(malformed)?;
    let offset = u64::from_le_bytes(file[at..at + 8].try_into().expect("8 bytes"));
    usize::try_from(offset).ok().filter(|&o| (Header::LEN..=at).contains(&o)).ok_or_else(malformed)
}

/// The parsed directory of `file`.
pub fn directory(file: &[u8]) -> Result<Directory, FormatError> {
    let at = directory_offset(file)?;
    Directory::parse(&file[at..file.len() - Trailer::LEN])
}

/// Rewrites header fields and reseals the header CRC.
pub fn with_header(file: &[u8], edit: impl FnOnce(&mut Header)) -> Result<Vec<u8>, FormatError> {
    let mut h = Header::parse(file, file.len() as u64)?;
    edit(&mut h);
    h.header_crc32 = crc32fast::hash(&h.to_bytes()[..60]);
    let mut out = file.to_vec();
    out[..Header::LEN].copy_from_slice(&h.to_bytes());
    Ok(out)
}

/// Replaces the directory bytes with what `edit` makes of them, and writes a fresh trailer
/// (directory length and CRC, trailer CRC) after them.
pub fn with_directory_bytes(file: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Result<Vec<u8>, FormatError> {
    let at = directory_offset(file)?;
    let mut dir = file[at..file.len() - Trailer::LEN].to_vec();
    edit(&mut dir);
    let mut out = file[..at].to_vec();
    out.extend_from_slice(&dir);
    out.extend_from_slice(&Trailer::new(at as u64, &dir).to_bytes());
    Ok(out)
}

/// Parses the directory, lets `edit` change it, and writes it back with a fresh trailer.
pub fn with_directory(file: &[u8], edit: impl FnOnce(&mut Directory)) -> Result<Vec<u8>, FormatError> {
    let mut dir = directory(file)?;
    edit(&mut dir);
    with_directory_bytes(file, |bytes| *bytes = dir.to_bytes())
}

/// Rewrites the trailer's fields as `edit` leaves them, then reseals the trailer CRC (but not
/// the directory CRC: set `directory_crc32` to break or keep it).
pub fn with_trailer(file: &[u8], edit: impl FnOnce(&mut Trailer)) -> Result<Vec<u8>, FormatError> {
    let at = directory_offset(file)?;
    let mut t = Trailer::new(at as u64, &file[at..file.len() - Trailer::LEN]);
    edit(&mut t);
    t.trailer_crc32 = crc32fast::hash(&t.to_bytes()[..20]);
    let mut out = file[..file.len() - Trailer::LEN].to_vec();
    out.extend_from_slice(&t.to_bytes());
    Ok(out)
}

/// Replaces the stored bytes of chunk `chunk` of tensor `tensor` (directory order) with
/// `stored`: the old bytes are zeroed, the new ones go after the last chunk at the file's
/// alignment, and the chunk's offset, stored length and CRC are updated. Other tensors that
/// shared the old range keep it.
pub fn with_chunk(file: &[u8], tensor: usize, chunk: usize, stored: &[u8]) -> Result<Vec<u8>, FormatError> {
    let header = Header::parse(file, file.len() as u64)?;
    let at = directory_offset(file)?;
    let mut dir = directory(file)?;
    let missing = || FormatError::Malformed {
        what: "chunk",
        location: Position::at(at as u64),
        detail: format!("no chunk {chunk} of tensor {tensor} to replace"),
    };
    let old = dir.tensors.get(tensor).and_then(|t| t.chunks.get(chunk)).ok_or_else(missing)?.clone();
    let align = header.alignment as usize;
    let new_at = at.div_ceil(align) * align;
    let mut out = file[..at].to_vec();
    let (start, end) = (old.offset as usize, (old.offset + old.stored_length) as usize);
    let still_used = dir.tensors.iter().enumerate().any(|(ti, t)| {
        t.chunks.iter().enumerate().any(|(ci, c)| (ti, ci) != (tensor, chunk) && c.offset == old.offset)
    });
    if !still_used {
        out[start..end].fill(0);
    }
    out.resize(new_at, 0);
    out.extend_from_slice(stored);
    let dir_at = out.len();
    let c = &mut dir.tensors[tensor].chunks[chunk];
    c.offset = new_at as u64;
    c.stored_length = stored.len() as u64;
    c.crc32 = crc32fast::hash(stored);
    let bytes = dir.to_bytes();
    out.extend_from_slice(&bytes);
    out.extend_from_slice(&Trailer::new(dir_at as u64, &bytes).to_bytes());
    Ok(out)
}
