//! The files of a model folder that are not tensors (spec §5.5, since 1.7): `config.json`, the
//! tokenizer, the README. They travel in the reserved metadata entry `tpde.files` (`bytes`), one
//! Zstandard frame whose content is a file table:
//!
//! ```text
//! FileTable                         the frame's content, at most 64 MiB
//!   u32 file_count                  at most 4096
//!   FileEntry[file_count]
//!     u16 path_len; path_len bytes  UTF-8 relative path, `/`-separated (§5.5 path rules)
//!     u64 length; length bytes      the file's bytes
//! ```
//!
//! This module holds the table's syntax, its limits, the path rules and the frame header check
//! that bounds memory before anything is decompressed; the reader decompresses and the writer
//! compresses (they hold the Zstandard library).

use std::collections::HashSet;

use crate::error::{FormatError, Position};

/// The reserved metadata key of the file table (`bytes`).
pub const KEY_FILES: &str = "tpde.files";
/// The largest file table (the frame's content), in bytes.
pub const MAX_TABLE_LEN: u64 = 64 << 20;
/// The largest Zstandard window a table's frame may ask for, in bytes.
pub const MAX_WINDOW: u64 = 64 << 20;
/// The most files a table holds.
pub const MAX_FILES: u64 = 4096;
/// The longest path, in bytes of UTF-8.
pub const MAX_PATH_LEN: u64 = 1024;
/// The longest component of a path, in bytes (what common file systems allow).
pub const MAX_COMPONENT_LEN: u64 = 255;

/// Extensions of weight files (spec §5.5): a table never carries a file whose name ends in one,
/// nor the index of one (`*.EXT.index.json`), since the weights are the file's tensors and an
/// index decides which weights a framework loads.
pub const WEIGHT_EXTENSIONS: &[&str] = &["safetensors", "bin", "pt", "pth", "ckpt", "h5", "msgpack", "gguf", "onnx"];

/// One file of a table: its path and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileEntry {
    /// Relative, `/`-separated, checked by [`check_path`].
    pub path: String,
    /// The file's bytes.
    pub data: Vec<u8>,
}

fn malformed(detail: impl Into<String>) -> FormatError {
    FormatError::malformed("file table (tpde.files)", Position::default(), detail)
}

fn over(what: &'static str, found: u64, limit: u64) -> FormatError {
    FormatError::LimitExceeded { what, found, limit, location: Position::default() }
}

/// Checks a path against the rules of spec §5.5: relative, `/`-separated components, none
/// empty, `.` or `..`, no `\`, `:`, NUL or other control character, not naming weights
/// ([`names_weights`]); at most [`MAX_PATH_LEN`] bytes, each component at most
/// [`MAX_COMPONENT_LEN`].
pub fn check_path(path: &str) -> Result<(), FormatError> {
    if path.len() as u64 > MAX_PATH_LEN {
        return Err(over("file path length", path.len() as u64, MAX_PATH_LEN));
    }
    for component in path.split('/') {
        if component.len() as u64 > MAX_COMPONENT_LEN {
            return Err(over("file path component length", component.len() as u64, MAX_COMPONENT_LEN));
        }
    }
    let bad = |why: &str| Err(malformed(format!("path {path:?}: {why}")));
    if path.is_empty() {
        return bad("empty");
    }
    if let Some(c) = path.chars().find(|&c| c == '\\' || c == ':' || c.is_control()) {
        return bad(&format!("holds {c:?}"));
    }
    if path.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return bad("not a relative path of plain components (an empty component, `.`, `..`, or a leading `/`)");
    }
    if names_weights(path) {
        return bad("names weights (a weight file or its index), which only the file's tensors may hold");
    }
    Ok(())
}

/// Whether `path` names weights (spec §5.5): its last component ends in `.EXT` or
/// `.EXT.index.json` for an EXT of [`WEIGHT_EXTENSIONS`], in any ASCII case (a folder on a
/// case-insensitive file system sees `MODEL.SAFETENSORS` as `model.safetensors`).
pub fn names_weights(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    let name = name.strip_suffix(".index.json").unwrap_or(&name);
    name.rsplit_once('.').is_some_and(|(_, ext)| WEIGHT_EXTENSIONS.contains(&ext))
}

/// The content size and window size a Zstandard frame header declares (RFC 8878 §3.1.1.1),
/// checked against the table's limits, so that a reader sizes its buffer before decompressing.
/// Parsed here, by hand, because the limits must be checked before the library allocates.
pub fn check_frame_header(value: &[u8]) -> Result<u64, FormatError> {
    const MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
    if value.len() < 5 || value[..4] != MAGIC {
        return Err(malformed("not a Zstandard frame"));
    }
    let descriptor = value[4];
    let fcs_flag = descriptor >> 6;
    let single_segment = descriptor & 0x20 != 0;
    if descriptor & 0x08 != 0 {
        return Err(malformed("the frame header's reserved bit is set"));
    }
    let dict_len = [0, 1, 2, 4][usize::from(descriptor & 0x03)];
    let fcs_len = match (fcs_flag, single_segment) {
        (0, false) => return Err(malformed("the frame does not declare its content size")),
        (0, true) => 1,
        (1, _) => 2,
        (2, _) => 4,
        _ => 8,
    };
    let mut at = 5;
    let window_descriptor = match single_segment {
        true => None,
        false => {
            at += 1;
            Some(*value.get(5).ok_or_else(|| malformed("the frame header is cut short"))?)
        }
    };
    at += dict_len;
    let fcs_bytes = value.get(at..at + fcs_len).ok_or_else(|| malformed("the frame header is cut short"))?;
    let mut size = [0u8; 8];
    size[..fcs_len].copy_from_slice(fcs_bytes);
    let content = u64::from_le_bytes(size) + if fcs_len == 2 { 256 } else { 0 };
    if content > MAX_TABLE_LEN {
        return Err(over("file table length", content, MAX_TABLE_LEN));
    }
    if let Some(w) = window_descriptor {
        let base = 1u64 << (10 + (w >> 3));
        let window = base + (base / 8) * u64::from(w & 7);
        if window > MAX_WINDOW {
            return Err(over("file table frame window", window, MAX_WINDOW));
        }
    }
    if value[at - dict_len..at].iter().any(|&b| b != 0) {
        return Err(malformed("the frame needs a dictionary"));
    }
    Ok(content)
}

/// Parses a decompressed file table, checking its syntax, limits and path rules, and that no
/// path repeats or is a folder of another.
pub fn parse_table(table: &[u8]) -> Result<Vec<FileEntry>, FormatError> {
    let mut rest = table;
    let mut take = |n: u64, what: &str| -> Result<&[u8], FormatError> {
        if n > rest.len() as u64 {
            return Err(malformed(format!("{what} runs past the end of the table")));
        }
        let (head, tail) = rest.split_at(n as usize);
        rest = tail;
        Ok(head)
    };
    let count = u32::from_le_bytes(take(4, "the file count")?.try_into().expect("4 bytes"));
    if u64::from(count) > MAX_FILES {
        return Err(over("file count", count.into(), MAX_FILES));
    }
    let mut files = Vec::new();
    for i in 0..count {
        let path_len = u16::from_le_bytes(take(2, "a path length")?.try_into().expect("2 bytes"));
        if u64::from(path_len) > MAX_PATH_LEN {
            return Err(over("file path length", path_len.into(), MAX_PATH_LEN));
        }
        let path = std::str::from_utf8(take(path_len.into(), "a path")?)
            .map_err(|_| malformed(format!("the path of file {i} is not UTF-8")))?
            .to_owned();
        check_path(&path)?;
        let len = u64::from_le_bytes(take(8, "a file length")?.try_into().expect("8 bytes"));
        let data = take(len, &format!("file {path:?}"))?.to_vec();
        files.push(FileEntry { path, data });
    }
    if !rest.is_empty() {
        return Err(malformed(format!("{} bytes follow the last file", rest.len())));
    }
    check_tree(&files)?;
    Ok(files)
}

/// No path repeats, and none is a folder of another (`a` and `a/b`): the files can all be
/// written side by side.
fn check_tree(files: &[FileEntry]) -> Result<(), FormatError> {
    let paths: HashSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
    if paths.len() != files.len() {
        let mut seen = HashSet::new();
        let dup = files.iter().find(|f| !seen.insert(f.path.as_str())).expect("a repeat");
        return Err(malformed(format!("path {:?} is listed twice", dup.path)));
    }
    for f in files {
        let mut folder = f.path.as_str();
        while let Some((parent, _)) = folder.rsplit_once('/') {
            if paths.contains(parent) {
                return Err(malformed(format!("path {:?} is a file and the folder of {:?}", parent, f.path)));
            }
            folder = parent;
        }
    }
    Ok(())
}

/// The table of `files` (the frame's content), checked as a reader checks it.
pub fn encode_table(files: &[FileEntry]) -> Result<Vec<u8>, FormatError> {
    if files.len() as u64 > MAX_FILES {
        return Err(over("file count", files.len() as u64, MAX_FILES));
    }
    let mut out = (files.len() as u32).to_le_bytes().to_vec();
    for f in files {
        check_path(&f.path)?;
        out.extend_from_slice(&(f.path.len() as u16).to_le_bytes());
        out.extend_from_slice(f.path.as_bytes());
        out.extend_from_slice(&(f.data.len() as u64).to_le_bytes());
        out.extend_from_slice(&f.data);
    }
    if out.len() as u64 > MAX_TABLE_LEN {
        return Err(over("file table length", out.len() as u64, MAX_TABLE_LEN));
    }
    check_tree(files)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn file(path: &str, data: &[u8]) -> FileEntry {
        FileEntry { path: path.into(), data: data.into() }
    }

    #[test]
    fn tables_round_trip() {
        let files = vec![file("config.json", b"{}"), file("1_Pooling/config.json", b"{\"a\": 1}"), file("empty", b"")];
        assert_eq!(parse_table(&encode_table(&files).unwrap()).unwrap(), files);
        assert_eq!(parse_table(&encode_table(&[]).unwrap()).unwrap(), vec![]);
    }

    /// Frame headers at the edges that no corpus file can hold (cargo-mutants,
    /// conformance/mutants.md): a content size of exactly 64 MiB passes, and a value of the magic
    /// and a descriptor alone is a cut header, not some other bytes.
    #[test]
    fn frame_headers_at_their_edges() {
        let mut at_limit = vec![0x28, 0xB5, 0x2F, 0xFD, 0x80, 16 << 3];
        at_limit.extend((MAX_TABLE_LEN as u32).to_le_bytes());
        assert_eq!(check_frame_header(&at_limit).unwrap(), MAX_TABLE_LEN);
        let cut = check_frame_header(&[0x28, 0xB5, 0x2F, 0xFD, 0x80]).unwrap_err().to_string();
        assert!(cut.contains("cut short"), "{cut}");
    }

    #[test]
    fn paths_that_leave_the_folder_are_refused() {
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a/", "./a", "a\\b", "C:x", "a\0b", "a\nb"] {
            assert_eq!(check_path(bad).unwrap_err().kind(), ErrorKind::Malformed, "{bad:?}");
        }
        for weights in [
            "model.safetensors",
            "model.safetensors.index.json",
            "sub/pytorch_model.bin",
            "pytorch_model.bin.index.json",
            "MODEL.SafeTensors",
            "a.pt",
            "a.pth",
            "last.ckpt",
            "tf_model.h5",
            "flax_model.msgpack",
            "m.gguf",
            "m.onnx",
            "tf_model.h5.index.json",
        ] {
            assert!(names_weights(weights), "{weights}");
            assert_eq!(check_path(weights).unwrap_err().kind(), ErrorKind::Malformed, "{weights:?}");
        }
        for good in [
            "config.json",
            "1_Pooling/config.json",
            ".gitattributes",
            "a b/ü.txt",
            "..a",
            "index.json",
            "safetensors",
            "bin/x.txt",
            "a.bin.json",
            "model.safetensors.txt",
        ] {
            check_path(good).unwrap();
        }
        assert_eq!(check_path(&"a".repeat(1025)).unwrap_err().kind(), ErrorKind::LimitExceeded);
        assert_eq!(check_path(&"a".repeat(256)).unwrap_err().kind(), ErrorKind::LimitExceeded);
    }

    #[test]
    fn repeats_and_files_used_as_folders_are_refused() {
        for files in [vec![file("a", b""), file("a", b"x")], vec![file("a", b""), file("a/b", b"")]] {
            let mut table = (files.len() as u32).to_le_bytes().to_vec();
            for f in &files {
                table.extend_from_slice(&(f.path.len() as u16).to_le_bytes());
                table.extend_from_slice(f.path.as_bytes());
                table.extend_from_slice(&(f.data.len() as u64).to_le_bytes());
                table.extend_from_slice(&f.data);
            }
            assert_eq!(parse_table(&table).unwrap_err().kind(), ErrorKind::Malformed);
            assert!(encode_table(&files).is_err());
        }
    }

    #[test]
    fn a_repeat_is_named() {
        // The path listed twice, not the first path of the table (a mutant cargo-mutants found
        // that the corpus cannot see: the category is the same, the message names another path).
        let err = encode_table(&[file("b", b""), file("a", b""), file("a", b"x")]).unwrap_err();
        assert!(err.to_string().contains("\"a\" is listed twice"), "{err}");
    }

    #[test]
    fn cut_and_padded_tables_are_refused() {
        let table = encode_table(&[file("a", b"xyz")]).unwrap();
        for cut in 0..table.len() {
            assert_eq!(parse_table(&table[..cut]).unwrap_err().kind(), ErrorKind::Malformed, "cut at {cut}");
        }
        let mut padded = table.clone();
        padded.push(0);
        assert_eq!(parse_table(&padded).unwrap_err().kind(), ErrorKind::Malformed);
    }

    #[test]
    fn frame_headers_are_bounded_before_decompressing() {
        // Single segment, 4-byte content size of 10.
        assert_eq!(check_frame_header(&[0x28, 0xB5, 0x2F, 0xFD, 0xA0, 10, 0, 0, 0]).unwrap(), 10);
        // 2-byte content size: 256 + value.
        assert_eq!(check_frame_header(&[0x28, 0xB5, 0x2F, 0xFD, 0x60, 1, 0]).unwrap(), 257);
        // No content size.
        assert_eq!(check_frame_header(&[0x28, 0xB5, 0x2F, 0xFD, 0x00, 0x00]).unwrap_err().kind(), ErrorKind::Malformed);
        // Content size over the limit.
        let big = (MAX_TABLE_LEN + 1).to_le_bytes();
        let mut h = vec![0x28, 0xB5, 0x2F, 0xFD, 0xE0];
        h.extend_from_slice(&big);
        assert_eq!(check_frame_header(&h).unwrap_err().kind(), ErrorKind::LimitExceeded);
        // A 1 GiB window for 10 bytes.
        assert_eq!(
            check_frame_header(&[0x28, 0xB5, 0x2F, 0xFD, 0x80, 20 << 3, 10, 0, 0, 0]).unwrap_err().kind(),
            ErrorKind::LimitExceeded
        );
        assert_eq!(check_frame_header(b"PK\x03\x04zz").unwrap_err().kind(), ErrorKind::Malformed);
    }
}
