//! `tpde-inspect`: what a file holds, as a table for people or as JSON for programs.
//!
//! The JSON schema is versioned by its `schema` field (`"tpde-inspect/1"`). Within a schema
//! version fields are only ever added, never renamed, removed or retyped.

use std::fmt::Write as _;

use indicatif::HumanBytes;
use serde::Serialize;
use tpde::format::digest::to_hex;
use tpde::format::TensorEntry;
use tpde::read::{Reader, Source};

use crate::ratio;

/// The widest the NAME column of `inspect`'s table grows.
const MAX_NAME_WIDTH: usize = 60;

/// The JSON schema name and version.
pub const SCHEMA: &str = "tpde-inspect/1";

/// The whole report.
#[derive(Serialize, Debug)]
pub struct Report {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// The path inspected.
    pub file: String,
    /// File size in bytes.
    pub file_bytes: u64,
    /// `{"major": 1, "minor": 0}`.
    pub format_version: Version,
    /// Must-understand flags, as a number.
    pub required_features: u64,
    /// May-ignore flags, as a number.
    pub optional_features: u64,
    /// Payload alignment.
    pub alignment: u32,
    /// Number of tensors.
    pub tensor_count: u64,
    /// Sum of logical tensor bytes.
    pub logical_bytes: u64,
    /// Sum of stored chunk bytes.
    pub stored_bytes: u64,
    /// `stored_bytes / logical_bytes`.
    pub ratio: f64,
    /// The base reference of a delta, or null.
    pub base: Option<Base>,
    /// The content digest (spec §7), hex.
    pub content_digest: String,
    /// Metadata entries in file order.
    pub metadata: Vec<Metadata>,
    /// The files of its file table (`tpde.files`, spec §5.5), in table order.
    pub files: Vec<FileRow>,
    /// Why the file table could not be read, if it could not (spec R31).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files_error: Option<String>,
    /// Tensors in file order.
    pub tensors: Vec<Tensor>,
}

/// A file of the file table.
#[derive(Serialize, Debug)]
pub struct FileRow {
    /// Its path in the folder.
    pub path: String,
    /// Its length in bytes.
    pub bytes: u64,
}

/// Format version.
#[derive(Serialize, Debug)]
pub struct Version {
    /// Major.
    pub major: u16,
    /// Minor.
    pub minor: u16,
}

/// A base reference.
#[derive(Serialize, Debug)]
pub struct Base {
    /// Hex content digest.
    pub digest: String,
    /// Advisory path.
    pub path_hint: String,
}

/// A metadata entry.
#[derive(Serialize, Debug)]
pub struct Metadata {
    /// Key.
    pub key: String,
    /// Type name (`bool`, `u64`, `i64`, `f64`, `string`, `bytes`, `unknown`).
    #[serde(rename = "type")]
    pub type_name: &'static str,
    /// Value in text form (bytes as 0x-hex).
    pub value: String,
}

/// A tensor row.
#[derive(Serialize, Debug)]
pub struct Tensor {
    /// Name.
    pub name: String,
    /// Dtype registry name.
    pub dtype: &'static str,
    /// Shape.
    pub shape: Vec<u64>,
    /// Logical bytes.
    pub logical_bytes: u64,
    /// Stored bytes.
    pub stored_bytes: u64,
    /// `stored / logical`.
    pub ratio: f64,
    /// Distinct codecs used by the chunks, in first-use order.
    pub codecs: Vec<&'static str>,
    /// Number of chunks.
    pub chunk_count: u64,
    /// BLAKE3 of the logical bytes, hex.
    pub digest: String,
    /// Per-chunk rows, only with `--chunks`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chunks: Option<Vec<Chunk>>,
}

/// A chunk row.
#[derive(Serialize, Debug)]
pub struct Chunk {
    /// First element.
    pub element_start: u64,
    /// Elements.
    pub element_count: u64,
    /// File offset.
    pub offset: u64,
    /// Stored bytes.
    pub stored_bytes: u64,
    /// Decoded bytes.
    pub decoded_bytes: u64,
    /// Codec name.
    pub codec: &'static str,
    /// CRC-32 of the stored bytes, hex.
    pub crc32: String,
}

fn tensor_row(t: &TensorEntry, with_chunks: bool) -> Tensor {
    let mut codecs = Vec::new();
    for c in &t.chunks {
        if !codecs.contains(&c.codec.name()) {
            codecs.push(c.codec.name());
        }
    }
    Tensor {
        name: t.name.clone(),
        dtype: t.dtype.name(),
        shape: t.shape.clone(),
        logical_bytes: t.byte_length,
        stored_bytes: t.stored_length(),
        ratio: ratio(t.stored_length(), t.byte_length),
        codecs,
        chunk_count: t.chunks.len() as u64,
        digest: to_hex(&t.digest),
        chunks: with_chunks.then(|| {
            t.chunks
                .iter()
                .map(|c| Chunk {
                    element_start: c.element_start,
                    element_count: c.element_count,
                    offset: c.offset,
                    stored_bytes: c.stored_length,
                    decoded_bytes: c.decoded_length,
                    codec: c.codec.name(),
                    crc32: format!("{:08x}", c.crc32),
                })
                .collect()
        }),
    }
}

/// Builds the report of an open file.
pub fn report<S: Source>(file: &str, r: &Reader<S>, with_chunks: bool) -> Report {
    let h = r.header();
    let logical: u64 = r.tensors().iter().map(|t| t.byte_length).sum();
    // A chunk two tensors share (a tied weight stored once) counts once.
    let mut chunks = std::collections::HashSet::new();
    let stored: u64 = r
        .tensors()
        .iter()
        .flat_map(|t| &t.chunks)
        .filter(|c| chunks.insert((c.offset, c.stored_length)))
        .map(|c| c.stored_length)
        .sum();
    let (files, files_error) = match r.files() {
        Ok(f) => (Some(f.into_iter().map(|f| FileRow { path: f.path, bytes: f.data.len() as u64 }).collect()), None),
        Err(e) => (None, Some(e.to_string())),
    };
    Report {
        schema: SCHEMA,
        file: file.to_owned(),
        file_bytes: r.file_len(),
        format_version: Version { major: h.major_version, minor: h.minor_version },
        required_features: h.required_features,
        optional_features: h.optional_features,
        alignment: h.alignment,
        tensor_count: r.tensors().len() as u64,
        logical_bytes: logical,
        stored_bytes: stored,
        ratio: ratio(stored, logical),
        base: r.directory().base.as_ref().map(|b| Base { digest: to_hex(&b.digest), path_hint: b.path_hint.clone() }),
        content_digest: to_hex(&r.content_digest()),
        metadata: r
            .directory()
            .metadata
            .iter()
            .map(|m| Metadata { key: m.key.clone(), type_name: m.value.type_name(), value: m.value.to_string() })
            .collect(),
        files: files.unwrap_or_default(),
        files_error,
        tensors: r.tensors().iter().map(|t| tensor_row(t, with_chunks)).collect(),
    }
}

/// Characters of a metadata value the table shows unless asked for all of it.
const METADATA_SHOWN: usize = 100;

/// The report as a human-readable table; metadata values cut to a line unless `full` (the JSON
/// report always holds them whole).
pub fn render_text(rep: &Report, full: bool) -> String {
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "file        {} ({})", rep.file, HumanBytes(rep.file_bytes));
    let _ = writeln!(
        w,
        "format      TPDE {}.{}  required flags {:#x}  optional flags {:#x}  alignment {}",
        rep.format_version.major, rep.format_version.minor, rep.required_features, rep.optional_features, rep.alignment
    );
    let _ = writeln!(w, "tensors     {}", rep.tensor_count);
    let _ = writeln!(
        w,
        "bytes       {} logical, {} stored, ratio {:.3}",
        HumanBytes(rep.logical_bytes),
        HumanBytes(rep.stored_bytes),
        rep.ratio
    );
    match &rep.base {
        Some(b) => {
            let _ = writeln!(w, "base        {} {}", b.digest, b.path_hint);
        }
        None => {
            let _ = writeln!(w, "base        none (keyframe)");
        }
    }
    let _ = writeln!(w, "content     {}", rep.content_digest);
    if !rep.metadata.is_empty() {
        let _ = writeln!(w, "metadata");
        let kw = rep.metadata.iter().map(|m| m.key.chars().count()).max().unwrap_or(0);
        let mut cut = false;
        for m in &rep.metadata {
            let value: String = m.value.chars().filter(|c| !c.is_control()).collect();
            let value = match value.chars().nth(METADATA_SHOWN) {
                Some(_) if !full => {
                    cut = true;
                    let head: String = value.chars().take(METADATA_SHOWN).collect();
                    format!("{head}... ({} characters in all)", m.value.chars().count())
                }
                _ => value,
            };
            let _ = writeln!(w, "  {:kw$}  {:6}  {value}", m.key, m.type_name);
        }
        if cut {
            let _ = writeln!(w, "  (values cut to a line: --full or --json shows them whole)");
        }
    }
    if !rep.files.is_empty() {
        let total: u64 = rep.files.iter().map(|f| f.bytes).sum();
        let _ = writeln!(
            w,
            "files       {} ({}), written back by `tpde unpack` into a folder",
            rep.files.len(),
            HumanBytes(total)
        );
        for f in &rep.files {
            let _ = writeln!(w, "  {:>10}  {}", HumanBytes(f.bytes).to_string(), f.path);
        }
    }
    if let Some(e) = &rep.files_error {
        let _ = writeln!(w, "files       unreadable: {e}");
    }
    let rows: Vec<[String; 7]> = rep
        .tensors
        .iter()
        .map(|t| {
            [
                t.name.clone(),
                t.dtype.to_string(),
                format!("{:?}", t.shape),
                t.codecs.join("+"),
                t.chunk_count.to_string(),
                HumanBytes(t.stored_bytes).to_string(),
                format!("{:.3}", t.ratio),
            ]
        })
        .collect();
    let head = ["NAME", "DTYPE", "SHAPE", "CODEC", "CHUNKS", "STORED", "RATIO"];
    let mut widths = head.map(|h| h.len());
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    // One long name (a state's path, an escaped key) must not pad every row to its width: past
    // this, that row alone is wider.
    widths[0] = widths[0].min(MAX_NAME_WIDTH);
    let line = |w: &mut String, cells: &[String; 7]| {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            let pad = widths[i].saturating_sub(c.chars().count());
            if i >= 4 {
                out.push_str(&" ".repeat(pad));
                out.push_str(c);
            } else {
                out.push_str(c);
                out.push_str(&" ".repeat(pad));
            }
            out.push_str("  ");
        }
        let _ = writeln!(w, "{}", out.trim_end());
    };
    let _ = writeln!(w);
    line(w, &head.map(String::from));
    for (r, t) in rows.iter().zip(&rep.tensors) {
        line(w, r);
        for (i, c) in t.chunks.iter().flatten().enumerate() {
            let _ = writeln!(
                w,
                "    chunk {i}: elements {}+{}  offset {}  stored {}  decoded {}  {}  crc32 {}",
                c.element_start, c.element_count, c.offset, c.stored_bytes, c.decoded_bytes, c.codec, c.crc32
            );
        }
    }
    s
}

/// `tpde inspect FOLDER`: each TPDE file under it, the file it needs and the files that need it
/// (what deleting it makes unloadable), from the directories alone.
pub fn render_chains(links: &[tpde::verify::ChainLink]) -> String {
    let mut w = String::new();
    for l in links {
        let needs = match (&l.base, &l.base_file) {
            (Err(e), _) => format!("unreadable: {e}"),
            (Ok(None), _) => "keyframe".to_owned(),
            (Ok(Some(_)), Some(b)) => format!("needs {}", b.display()),
            (Ok(Some(h)), None) => format!("needs {h:?}, which is not a TPDE file of this folder"),
        };
        // A long chain's first files are needed by thousands: the nearest few are named.
        const NAMED: usize = 8;
        let by = match l.needed_by.len() {
            0 => "needed by none".to_owned(),
            n => {
                let named: Vec<String> =
                    l.needed_by.iter().take(NAMED).map(|&i| links[i].path.display().to_string()).collect();
                let more = if n > NAMED { format!(" and {} more", n - NAMED) } else { String::new() };
                format!("needed by {n}: {}{more}", named.join(", "))
            }
        };
        let _ = writeln!(w, "{}  {needs}; {by}", l.path.display());
    }
    let keyframes = links.iter().filter(|l| matches!(l.base, Ok(None))).count();
    let _ = writeln!(
        w,
        "{} files, {keyframes} keyframes; a file another needs must stay (`tpde verify FOLDER` checks every chain)",
        links.len()
    );
    w
}

/// [`render_chains`] as JSON (schema "tpde-inspect-folder/1").
pub fn chains_json(folder: &std::path::Path, links: &[tpde::verify::ChainLink]) -> serde_json::Value {
    let files: Vec<_> = links
        .iter()
        .map(|l| {
            serde_json::json!({
                "path": l.path.display().to_string(),
                "base_hint": l.base.as_ref().ok().cloned().flatten(),
                "base_file": l.base_file.as_ref().map(|b| b.display().to_string()),
                "error": l.base.as_ref().err().map(|e| e.to_string()),
                "needed_by": l.needed_by.iter().map(|&i| links[i].path.display().to_string()).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({ "schema": "tpde-inspect-folder/1", "folder": folder.display().to_string(), "files": files })
}
