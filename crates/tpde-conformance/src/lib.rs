//! The conformance corpus's manifest (`conformance/manifest.json`): what every corpus file is
//! and what a reader must make of it. Shared by the generator (`tools/corpus`) and the runner
//! (`tpde conformance`), so that neither builds the other; `conformance/README.md` explains the
//! manifest to people writing an implementation.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The manifest's `schema` value.
pub const SCHEMA: &str = "tpde-conformance/1";
/// The manifest's file name inside the corpus folder.
pub const MANIFEST: &str = "manifest.json";

/// `manifest.json`: every corpus file and what a reader must make of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`SCHEMA`].
    pub schema: String,
    /// The spec version the corpus was frozen at.
    pub spec_version: String,
    /// The files, valid ones first.
    pub files: Vec<Case>,
}

/// One corpus file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// Path relative to the corpus folder (`valid/…` or `invalid/…`).
    pub file: String,
    /// The spec rule (`R14`) or section (`§6.5.1`) the file tests.
    pub rule: String,
    /// What it holds, in a sentence.
    pub description: String,
    /// The corpus file this one decodes against, if any (that file's own base, per its entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Find the base through the file's path hints instead (spec §7.3), as a tool does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub follow_hints: bool,
    /// What reading it must give.
    pub expect: Expect,
}

/// The outcome a conforming reader must reach.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum Expect {
    /// The file reads, verifies, and decodes to exactly this.
    Valid {
        /// Tensors in directory order.
        tensors: Vec<ExpectedTensor>,
        /// Metadata entries in directory order.
        metadata: Vec<ExpectedMetadata>,
        /// The files of its file table (`tpde.files`, spec §5.5), in table order; listed only
        /// for a file that carries one.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        files: Vec<ExpectedFile>,
    },
    /// Opening, reading every tensor in directory order, or verifying fails first with this
    /// error category (spec §9).
    Invalid {
        /// The category, as the spec spells it (`checksum-mismatch`).
        error: String,
    },
}

/// A tensor as it must decode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpectedTensor {
    /// Name.
    pub name: String,
    /// Dtype, as the spec names it.
    pub dtype: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// SHA-256 of the decoded logical bytes (little-endian, row-major), lowercase hex.
    pub sha256: String,
}

/// A metadata entry as it must read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpectedMetadata {
    /// Key.
    pub key: String,
    /// Type code (spec §5).
    #[serde(rename = "type")]
    pub type_code: u8,
    /// The value's bytes as stored, lowercase hex.
    pub bytes: String,
    /// The value as text, for people; not compared.
    pub text: String,
}

/// A file of a file table as it must decode (spec §5.5).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExpectedFile {
    /// Its path.
    pub path: String,
    /// Its length in bytes.
    pub length: u64,
    /// SHA-256 of its bytes, lowercase hex.
    pub sha256: String,
}

impl ExpectedFile {
    /// The entry for a file with these bytes.
    pub fn new(path: &str, data: &[u8]) -> Self {
        ExpectedFile { path: path.into(), length: data.len() as u64, sha256: sha256_hex(data) }
    }
}

impl ExpectedTensor {
    /// The entry for a tensor with these decoded bytes.
    pub fn new(name: &str, dtype: tpde_format::DType, shape: &[u64], data: &[u8]) -> Self {
        ExpectedTensor { name: name.into(), dtype: dtype.to_string(), shape: shape.to_vec(), sha256: sha256_hex(data) }
    }
}

impl ExpectedMetadata {
    /// The entry for this metadata value.
    pub fn new(key: &str, value: &tpde_format::MetadataValue) -> Self {
        ExpectedMetadata {
            key: key.into(),
            type_code: value.type_code(),
            bytes: hex(&value.payload()),
            text: value.to_string(),
        }
    }
}

/// SHA-256 of `data`, lowercase hex.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Reads the manifest of the corpus in `dir`.
pub fn load_manifest(dir: &Path) -> Result<Manifest, String> {
    let path = dir.join(MANIFEST);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let m: Manifest = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if m.schema != SCHEMA {
        return Err(format!("{}: schema {:?}, this runner reads {SCHEMA:?}", path.display(), m.schema));
    }
    Ok(m)
}
