//! The generator of the conformance corpus (`conformance/`).
//!
//! Valid files are written by `tpde-write` from inputs made here, and their expected content is
//! taken from those inputs, never from the reader, so a reader bug cannot freeze itself into
//! the manifest. Invalid files are valid files edited with [`tpde_format::surgery`] to break one
//! rule of spec §9 each (or hand-built chunk payloads for the codec rules).
//!
//! Everything is deterministic: the same writer gives the same bytes, which is what lets CI
//! hold the committed corpus to the generator (`tests/frozen.rs`).
#![forbid(unsafe_code)]

mod blocks;
mod context_blocks;
mod invalid;
mod isolation;
mod reverse;
mod sparse;
mod unchanged;
mod valid;

use std::collections::HashMap;

use tpde_codec::Encoder;
use tpde_conformance::{Case, Expect, ExpectedFile, ExpectedMetadata, ExpectedTensor, Manifest, SCHEMA};
use tpde_format::digest::{content_digest, tensor_digest, DigestInput};
use tpde_format::files::{FileEntry, KEY_FILES};
use tpde_format::{BaseRef, DType, MetadataValue, Operand, Prediction};
use tpde_write::{PredictInput, TensorInput, WriteOptions, Writer};

/// The spec version the corpus is generated for.
pub const SPEC_VERSION: &str = "1.11";

/// The generated corpus: files (path relative to the corpus folder, bytes) and the manifest.
pub struct Corpus {
    /// Every file, valid ones first.
    pub files: Vec<(String, Vec<u8>)>,
    /// What a reader must make of them.
    pub manifest: Manifest,
}

impl Corpus {
    /// The manifest as committed: pretty JSON with a final newline.
    pub fn manifest_json(&self) -> String {
        serde_json::to_string_pretty(&self.manifest).expect("manifest serializes") + "\n"
    }
}

/// Builds the whole corpus.
pub fn generate() -> Corpus {
    let mut g = Gen::default();
    valid::all(&mut g);
    reverse::valid(&mut g);
    blocks::valid(&mut g);
    blocks::elsewhere(&mut g);
    context_blocks::valid(&mut g);
    unchanged::valid(&mut g);
    sparse::valid(&mut g);
    invalid::all(&mut g);
    reverse::invalid(&mut g);
    blocks::invalid(&mut g);
    context_blocks::invalid(&mut g);
    unchanged::invalid(&mut g);
    sparse::invalid(&mut g);
    g.check_predictions_isolated();
    Corpus {
        files: g.files,
        manifest: Manifest { schema: SCHEMA.into(), spec_version: SPEC_VERSION.into(), files: g.cases },
    }
}

/// One tensor of a file to write.
#[derive(Clone, Debug)]
pub(crate) struct T {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub data: Vec<u8>,
    /// Written with `add_tensor_delta` against the base file's tensor of the same name.
    pub delta: bool,
    /// The encoder for this tensor (default: the file's).
    pub encoder: Option<Encoder>,
    /// For a delta: a prediction its chunks may be coded against (spec §6.8).
    pub predict: Option<Prediction>,
}

impl T {
    pub fn new(name: &str, dtype: DType, shape: &[u64], data: Vec<u8>) -> T {
        T { name: name.into(), dtype, shape: shape.to_vec(), data, delta: false, encoder: None, predict: None }
    }
    pub fn with(mut self, encoder: Encoder) -> T {
        self.encoder = Some(encoder);
        self
    }
}

/// A valid file to write.
pub(crate) struct Spec<'a> {
    pub path: &'a str,
    pub rule: &'a str,
    pub description: &'a str,
    pub options: WriteOptions,
    pub metadata: Vec<(String, MetadataValue)>,
    pub tensors: Vec<T>,
    /// The corpus file it is a delta against.
    pub base: Option<&'a str>,
    /// The files of its file table (spec §5.5), for the manifest; the table itself is a
    /// metadata entry like any other.
    pub files: Vec<FileEntry>,
}

impl<'a> Spec<'a> {
    pub fn new(path: &'a str, rule: &'a str, description: &'a str) -> Self {
        Spec {
            path,
            rule,
            description,
            options: WriteOptions::default(),
            metadata: Vec::new(),
            tensors: Vec::new(),
            base: None,
            files: Vec::new(),
        }
    }
    pub fn encoder(mut self, encoder: Encoder) -> Self {
        self.options.encoder = encoder;
        self
    }
    /// The lowest minor version the header declares (for a reserved key of a later minor).
    pub fn minor(mut self, minor: u16) -> Self {
        self.options.min_minor_version = minor;
        self
    }
    pub fn chunk_bytes(mut self, n: u64) -> Self {
        self.options.chunk_bytes = n;
        self
    }
    pub fn meta(mut self, key: &str, value: MetadataValue) -> Self {
        self.metadata.push((key.into(), value));
        self
    }
    pub fn tensor(mut self, t: T) -> Self {
        self.tensors.push(t);
        self
    }
    pub fn tensors(mut self, ts: impl IntoIterator<Item = T>) -> Self {
        self.tensors.extend(ts);
        self
    }
    /// A file table (spec §5.5) of `files` in the frame `frame`, declaring 1.7.
    pub fn files(mut self, files: Vec<FileEntry>, frame: Vec<u8>) -> Self {
        self.files = files;
        self.minor(7).meta(KEY_FILES, MetadataValue::Bytes(frame))
    }
    pub fn base(mut self, base: &'a str) -> Self {
        self.base = Some(base);
        self
    }
}

/// A file already generated, kept for the files derived from it.
#[derive(Clone)]
pub(crate) struct Built {
    pub bytes: Vec<u8>,
    pub tensors: Vec<T>,
    pub expect: Expect,
    pub base: Option<String>,
}

#[derive(Default)]
pub(crate) struct Gen {
    files: Vec<(String, Vec<u8>)>,
    cases: Vec<Case>,
    built: HashMap<String, Built>,
}

impl Gen {
    /// A generated file by path.
    pub fn get(&self, path: &str) -> &Built {
        self.built.get(path).unwrap_or_else(|| panic!("{path} is generated before it is used"))
    }

    /// Writes a valid file and records its expected content.
    pub fn valid(&mut self, spec: Spec) -> Vec<u8> {
        let mut options = spec.options.clone();
        let base_tensors = spec.base.map(|b| self.get(b).tensors.clone());
        if let Some(base) = &base_tensors {
            let hint = spec.base.unwrap().rsplit('/').next().unwrap().to_owned();
            options.base = Some(BaseRef { digest: digest_of(base), path_hint: hint });
        }
        let mut w = Writer::new(Vec::new(), options.clone()).expect("writer starts");
        for (k, v) in &spec.metadata {
            w.add_metadata(k.clone(), v.clone()).expect("metadata");
        }
        for t in &spec.tensors {
            w.set_encoder(t.encoder.unwrap_or(options.encoder)).expect("encoder of the file's version");
            let base_of = |name: &str| {
                base_tensors.as_ref().and_then(|b| b.iter().find(|b| b.name == name)).expect("base tensor")
            };
            let this = |name: &str| &spec.tensors.iter().find(|t| t.name == name).expect("named tensor").data;
            let r = if let (true, Some(p)) = (t.delta, &t.predict) {
                let b = base_of(&t.name);
                let operand = |(name, at): (&str, Operand)| match at {
                    Operand::File => this(name),
                    Operand::Base => &base_of(name).data,
                };
                let [first, second] = p.operands();
                let (exp_avg, other) = (operand(first), operand(second));
                let predict = Some(PredictInput { prediction: p, exp_avg, other });
                let base = Some((&b.data[..], tensor_digest(&b.data)));
                let input =
                    TensorInput { name: &t.name, dtype: t.dtype, shape: &t.shape, data: &t.data, base, predict };
                w.add_tensors(&[input])
            } else if t.delta {
                let b = base_of(&t.name);
                w.add_tensor_delta(&t.name, t.dtype, &t.shape, &t.data, &b.data).map(|_| ())
            } else {
                w.add_tensor(&t.name, t.dtype, &t.shape, &t.data).map(|_| ())
            };
            r.unwrap_or_else(|e| panic!("{}: {e}", spec.path));
        }
        let bytes = w.finish().expect("finish");
        let expect = expect_of(&spec.tensors, &spec.metadata, &spec.files);
        let case = Case { base: spec.base.map(str::to_owned), ..case(spec.path, spec.rule, spec.description, expect) };
        self.add(case, bytes.clone(), spec.tensors);
        bytes
    }

    /// Adds a valid file made from `from` by surgery that keeps its content.
    pub fn valid_derived(&mut self, path: &str, rule: &str, description: &str, from: &str, bytes: Vec<u8>) {
        let src = self.get(from).clone();
        self.add(Case { base: src.base, ..case(path, rule, description, src.expect) }, bytes, src.tensors);
    }

    /// The isolation rule for §6.8: every file with a prediction breaks none of its conditions
    /// if valid, exactly one if it is an invalid file of R29 or R30 about predictions.
    fn check_predictions_isolated(&self) {
        let dir = |path: &str| tpde_format::surgery::directory(&self.get(path).bytes).ok();
        let mut refused = Vec::new();
        for case in &self.cases {
            let Some(file) = dir(&case.file) else { continue };
            if !file.tensors.iter().flat_map(|t| &t.chunks).any(|c| c.codec == tpde_format::CodecTag::DeltaPredicted) {
                continue;
            }
            let base = case.base.as_deref().and_then(dir);
            let broken = isolation::broken_prediction_conditions(&file, base.as_ref());
            let name = case.file.as_str();
            let about_predictions =
                name.starts_with("invalid/r29-predicted") || name.starts_with("invalid/r30-predicted");
            let isolated = match (name.starts_with("valid/"), about_predictions) {
                (true, _) => broken.is_empty(),
                (false, true) => broken.len() == 1,
                (false, false) => true,
            };
            if !isolated {
                refused.push(format!("{name}: {broken:?}"));
            }
        }
        assert!(
            refused.is_empty(),
            "files that break other than one condition of §6.8 (none if valid):\n{}",
            refused.join("\n")
        );
    }

    /// Adds an invalid file; `case` holds the error category a reader must give.
    pub fn invalid(&mut self, case: Case, bytes: Vec<u8>) {
        self.add(case, bytes, Vec::new());
    }

    fn add(&mut self, case: Case, bytes: Vec<u8>, tensors: Vec<T>) {
        let path = case.file.clone();
        assert!(!self.built.contains_key(&path), "{path} generated twice");
        let built = Built { bytes: bytes.clone(), tensors, expect: case.expect.clone(), base: case.base.clone() };
        self.cases.push(case);
        self.files.push((path.clone(), bytes));
        self.built.insert(path, built);
    }
}

/// A manifest entry with no base.
pub(crate) fn case(file: &str, rule: &str, description: &str, expect: Expect) -> Case {
    Case {
        file: file.into(),
        rule: rule.into(),
        description: description.into(),
        base: None,
        follow_hints: false,
        expect,
    }
}

/// The content digest (spec §7) of these tensors, from their bytes.
pub(crate) fn digest_of(tensors: &[T]) -> [u8; 32] {
    let digests: Vec<[u8; 32]> = tensors.iter().map(|t| tensor_digest(&t.data)).collect();
    content_digest(tensors.iter().zip(&digests).map(|(t, d)| DigestInput {
        name: &t.name,
        dtype: t.dtype,
        shape: &t.shape,
        digest: d,
    }))
}

fn expect_of(tensors: &[T], metadata: &[(String, MetadataValue)], files: &[FileEntry]) -> Expect {
    Expect::Valid {
        tensors: tensors.iter().map(|t| ExpectedTensor::new(&t.name, t.dtype, &t.shape, &t.data)).collect(),
        metadata: metadata.iter().map(|(k, v)| ExpectedMetadata::new(k, v)).collect(),
        files: files.iter().map(|f| ExpectedFile::new(&f.path, &f.data)).collect(),
    }
}

/// A small deterministic generator (xorshift64*): the corpus must not change when a random
/// number crate does.
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Roughly normal with this standard deviation (sum of four uniforms).
    pub fn normal(&mut self, sd: f64) -> f64 {
        let s: f64 = (0..4).map(|_| self.unit()).sum::<f64>() - 2.0;
        s * sd * 1.732
    }
}

/// A difference between the generated corpus and the one in a folder.
#[derive(Debug, PartialEq)]
pub enum Drift {
    /// Generated, not in the folder.
    Missing(String),
    /// In both, with other bytes.
    Changed(String),
    /// In the folder's valid/ or invalid/, no longer generated.
    Extra(String),
}

impl Drift {
    /// The path the drift is about.
    pub fn path(&self) -> &str {
        match self {
            Drift::Missing(p) | Drift::Changed(p) | Drift::Extra(p) => p,
        }
    }
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Drift::Missing(p) => write!(f, "{p}: generated, not committed"),
            Drift::Changed(p) => write!(f, "{p}: the generator now writes other bytes"),
            Drift::Extra(p) => write!(f, "{p}: committed, no longer generated"),
        }
    }
}

impl Corpus {
    /// Every file to commit, the manifest last: (path in the corpus folder, bytes).
    pub fn entries(&self) -> impl Iterator<Item = (&str, std::borrow::Cow<'_, [u8]>)> {
        let manifest = (tpde_conformance::MANIFEST, self.manifest_json().into_bytes().into());
        self.files.iter().map(|(p, b)| (p.as_str(), b.as_slice().into())).chain([manifest])
    }

    /// Compares this corpus with the one in `dir`, manifest included.
    pub fn drift(&self, dir: &std::path::Path) -> Vec<Drift> {
        let mut out = Vec::new();
        for (path, bytes) in self.entries() {
            let path = path.to_owned();
            match std::fs::read(dir.join(&path)) {
                Ok(committed) if committed == *bytes => {}
                Ok(_) => out.push(Drift::Changed(path)),
                Err(_) => out.push(Drift::Missing(path)),
            }
        }
        let generated: std::collections::HashSet<&str> = self.files.iter().map(|(p, _)| p.as_str()).collect();
        for sub in ["valid", "invalid"] {
            let Ok(entries) = std::fs::read_dir(dir.join(sub)) else { continue };
            let mut extra: Vec<String> = entries
                .filter_map(Result::ok)
                .map(|e| format!("{sub}/{}", e.file_name().to_string_lossy()))
                .filter(|p| !generated.contains(p.as_str()))
                .collect();
            extra.sort();
            out.extend(extra.into_iter().map(Drift::Extra));
        }
        out
    }
}

/// The table of spec §9.1: each rejection rule and the corpus files that break it, in the
/// manifest's order. The spec must contain exactly this (`tests/frozen.rs`).
pub fn spec_table(manifest: &Manifest) -> String {
    let mut rules: Vec<(u32, Vec<&str>)> = Vec::new();
    for case in &manifest.files {
        let Some(n) = case.rule.strip_prefix('R').and_then(|n| n.parse::<u32>().ok()) else { continue };
        let file = case.file.strip_prefix("invalid/").unwrap_or(&case.file);
        match rules.iter_mut().find(|(r, _)| *r == n) {
            Some((_, files)) => files.push(file),
            None => rules.push((n, vec![file])),
        }
    }
    rules.sort_by_key(|(n, _)| *n);
    let mut out = String::from("| rule | files in `conformance/invalid/` |\n|---|---|\n");
    for (n, files) in rules {
        let list: Vec<String> = files.iter().map(|f| format!("`{f}`")).collect();
        out.push_str(&format!("| R{n} | {} |\n", list.join(", ")));
    }
    out
}
