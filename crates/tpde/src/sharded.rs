//! Hugging Face sharded folders: `model-0000k-of-0000n.safetensors` files and the
//! `model.safetensors.index.json` that maps each tensor to its shard.
//!
//! [`crate::pack::pack`] packs every tensor of such a folder into one TPDE file (a delta with a base,
//! as for one file) and records the layout in two metadata entries (strings, outside the
//! reserved `tpde.` namespace, so any reader sees them as user metadata):
//!
//! - `safetensors.index`: `{"name": INDEX FILE NAME, "metadata": THE INDEX'S "metadata"}`;
//! - `safetensors.shards`: `[{"file": SHARD, "tensors": [NAMES IN FILE ORDER], "metadata":
//!   THE SHARD'S __metadata__ OR null}, ...]`.
//!
//! [`crate::unpack::unpack`] writes the same shards back (same names, the same tensors in each, the
//! same metadata) and then the index, so that a folder with its index is complete.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{json, Map, Value};
use tpde_format::digest::{content_digest, Digest, DigestInput};
use tpde_format::ErrorKind;
use tpde_read::{Base, BaseTensor, ReadError};

use crate::location::FileReader;
use crate::safetensors::SafetensorsFile;
use crate::Error;

/// The metadata key of the index's name and metadata.
pub const KEY_INDEX: &str = "safetensors.index";
/// The metadata key of the shards' layout.
pub const KEY_SHARDS: &str = "safetensors.shards";
/// How a sharded folder's index file name ends.
pub const INDEX_SUFFIX: &str = ".safetensors.index.json";
/// `tpde.source_format` of a packed folder.
pub const SOURCE_FORMAT: &str = "safetensors-sharded";

/// One shard of a folder: its file name, its tensors in file order and its `__metadata__`.
#[derive(Clone, Debug, PartialEq)]
pub struct Shard {
    /// The shard's file name (no folder).
    pub file: String,
    /// Its tensors, in the shard's order.
    pub tensors: Vec<String>,
    /// Its safetensors `__metadata__`, if it had one.
    pub metadata: Option<BTreeMap<String, String>>,
}

/// The layout of a model folder, as recorded in a TPDE file: its shards and their index, or
/// its one `.safetensors` file (no index).
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    /// The index file's name; `None` for a folder with one `.safetensors` file and no index.
    pub index_name: Option<String>,
    /// The index's `metadata` object (`total_size`, ...), as it was.
    pub index_metadata: Map<String, Value>,
    /// The shards, in name order.
    pub shards: Vec<Shard>,
}

/// The index file of `dir` if it is a sharded folder (exactly one `*.safetensors.index.json`).
pub fn index_file(dir: &Path) -> Result<Option<PathBuf>, Error> {
    if !dir.is_dir() {
        return Ok(None);
    }
    let io = |e: std::io::Error| Error::from(e).context(dir.display());
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(io)? {
        let name = entry.map_err(io)?.file_name();
        if name.to_string_lossy().ends_with(INDEX_SUFFIX) {
            found.push(dir.join(name));
        }
    }
    found.sort();
    match found.len() {
        0 => Err(Error::usage(format!(
            "{}: a folder without a *{INDEX_SUFFIX} file is not a sharded checkpoint",
            dir.display()
        ))),
        1 => Ok(found.pop()),
        _ => Err(Error::usage(format!(
            "{}: {} index files ({}); pack one model at a time",
            dir.display(),
            found.len(),
            found.iter().map(|p| p.file_name().unwrap_or_default().to_string_lossy()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// A shard file name may name only a file beside the index: no folder, no `..`, no hidden
/// file, so that unpacking a file never writes outside its output folder.
fn check_file_name(name: &str, what: &str, suffix: &str) -> Result<(), Error> {
    let plain = !name.is_empty()
        && !name.starts_with('.')
        && !name.contains(['/', '\\', '\0'])
        && name.ends_with(suffix)
        && name.len() <= 255;
    match plain {
        true => Ok(()),
        false => Err(Error::malformed(format!("{what} {name:?} is not a plain *{suffix} file name"))),
    }
}

/// A model folder opened: its shards (or its one `.safetensors` file), in name order, and its
/// layout. It is also a base a delta decodes against ([`Base`]): the tensors of all its shards,
/// whose content digest is that of a `.tpde` packed from it.
pub struct Folder {
    /// The shards, mapped, in the layout's order.
    pub shards: Vec<SafetensorsFile>,
    /// What a packed file records to write the folder back.
    pub layout: Layout,
    /// Which shard holds each tensor.
    shard_of: HashMap<String, usize>,
    /// The content digest, computed when first asked for.
    digest: OnceLock<Digest>,
}

impl Folder {
    /// Every tensor, in shard order and each shard's in its file order: what a pack writes.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, tpde_format::DType, &[u64], &[u8])> {
        self.shards.iter().flat_map(|s| s.tensors())
    }
}

/// Opens the sharded folder `dir` (its index and every shard it names), checking that the index
/// and the shards agree.
pub fn open_folder(dir: &Path) -> Result<Folder, Error> {
    let index_path = index_file(dir)?.expect("index_file of a folder");
    let malformed = |msg: String| Error::malformed(format!("{}: {msg}", index_path.display()));
    let text = fs::read_to_string(&index_path).map_err(|e| Error::from(e).context(index_path.display()))?;
    let index: Value = serde_json::from_str(&text).map_err(|e| malformed(format!("not JSON: {e}")))?;
    let weight_map = index
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| malformed("no \"weight_map\" object".into()))?;
    let index_metadata = match index.get("metadata") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(malformed("\"metadata\" is not an object".into())),
    };
    let mut files: Vec<&str> = Vec::new();
    for (name, file) in weight_map {
        let file = file.as_str().ok_or_else(|| malformed(format!("tensor {name:?}: its shard is not a string")))?;
        check_file_name(file, "shard", ".safetensors")?;
        files.push(file);
    }
    files.sort_unstable();
    files.dedup();
    let opened: Vec<(&str, SafetensorsFile)> =
        files.iter().map(|&f| Ok((f, SafetensorsFile::open(&dir.join(f))?))).collect::<Result<_, Error>>()?;
    let mut shards = Vec::new();
    let mut tensors = Vec::new();
    for (file, st) in &opened {
        let names: Vec<String> = st.tensors().map(|t| t.0.to_string()).collect();
        for n in &names {
            if weight_map.get(n).and_then(Value::as_str) != Some(*file) {
                return Err(malformed(format!("tensor {n:?} is in {file} but the index does not map it there")));
            }
        }
        tensors.extend(st.tensors());
        shards.push(Shard {
            file: file.to_string(),
            tensors: names,
            metadata: st.metadata().map(|m| m.clone().into_iter().collect()),
        });
    }
    if tensors.len() != weight_map.len() {
        let present: HashSet<&str> = tensors.iter().map(|t| t.0).collect();
        let missing = weight_map.keys().find(|n| !present.contains(n.as_str())).map(String::as_str).unwrap_or("?");
        return Err(malformed(format!("tensor {missing:?} is in the index but in none of its shards")));
    }
    let layout = Layout {
        index_name: Some(index_path.file_name().unwrap_or_default().to_string_lossy().into_owned()),
        index_metadata,
        shards,
    };
    Ok(Folder::new(opened.into_iter().map(|(_, st)| st).collect(), layout))
}

/// Opens the model folder `dir`: a sharded folder (see [`open_folder`]), or one with a single
/// `.safetensors` file and no index (a model small enough for one file).
pub fn open_model_folder(dir: &Path) -> Result<Folder, Error> {
    let Some(file) = lone_safetensors(dir)? else {
        return open_folder(dir);
    };
    let st = SafetensorsFile::open(&file)?;
    let shard = Shard {
        file: file.file_name().unwrap_or_default().to_string_lossy().into_owned(),
        tensors: st.tensors().map(|t| t.0.to_string()).collect(),
        metadata: st.metadata().map(|m| m.clone().into_iter().collect()),
    };
    Ok(Folder::new(vec![st], Layout { index_name: None, index_metadata: Map::new(), shards: vec![shard] }))
}

impl Folder {
    fn new(shards: Vec<SafetensorsFile>, layout: Layout) -> Folder {
        let shard_of =
            layout.shards.iter().enumerate().flat_map(|(i, s)| s.tensors.iter().map(move |t| (t.clone(), i))).collect();
        Folder { shards, layout, shard_of, digest: OnceLock::new() }
    }

    /// Whether the folder has one `.safetensors` file and no index.
    pub fn is_one_file(&self) -> bool {
        self.layout.index_name.is_none()
    }
}

impl Base for Folder {
    fn content_digest(&self) -> Result<Digest, ReadError> {
        Ok(*self.digest.get_or_init(|| {
            let digests: Vec<&[Digest]> = self.shards.iter().map(SafetensorsFile::tensor_digests).collect();
            content_digest(self.shards.iter().zip(digests).flat_map(|(s, ds)| {
                s.tensors().zip(ds).map(|((name, dtype, shape, _), digest)| DigestInput { name, dtype, shape, digest })
            }))
        }))
    }

    fn tensor(&self, name: &str) -> Result<Option<BaseTensor<'_>>, ReadError> {
        match self.shard_of.get(name) {
            Some(&i) => self.shards[i].tensor(name),
            None => Ok(None),
        }
    }
}

impl Layout {
    /// The two metadata entries that record this layout.
    pub fn to_metadata(&self) -> Vec<(String, String)> {
        let shards: Vec<Value> =
            self.shards.iter().map(|s| json!({"file": s.file, "tensors": s.tensors, "metadata": s.metadata})).collect();
        let mut out = vec![(KEY_SHARDS.to_string(), Value::Array(shards).to_string())];
        if let Some(name) = &self.index_name {
            let index = json!({"name": name, "metadata": self.index_metadata});
            out.insert(0, (KEY_INDEX.into(), index.to_string()));
        }
        out
    }

    /// The layout a file records, if it was packed from a sharded folder; checked against the
    /// file's tensors (each in exactly one shard) and for plain file names.
    pub fn of(r: &FileReader) -> Result<Option<Layout>, Error> {
        let get = |key: &str| r.directory().metadata.iter().find(|m| m.key == key).map(|m| m.value.to_string());
        let Some(shards) = get(KEY_SHARDS) else {
            return Ok(None);
        };
        let bad = |what: &str| Error::malformed(format!("the {what} metadata of a sharded layout is not valid"));
        let (index_name, index_metadata) = match get(KEY_INDEX) {
            None => (None, Map::new()),
            Some(index) => {
                let index: Value = serde_json::from_str(&index).map_err(|_| bad(KEY_INDEX))?;
                let name = index.get("name").and_then(Value::as_str).ok_or_else(|| bad(KEY_INDEX))?.to_string();
                check_file_name(&name, "index", INDEX_SUFFIX)?;
                let metadata =
                    index.get("metadata").and_then(Value::as_object).cloned().ok_or_else(|| bad(KEY_INDEX))?;
                (Some(name), metadata)
            }
        };
        let shards: Vec<Value> = serde_json::from_str(&shards).map_err(|_| bad(KEY_SHARDS))?;
        let names: HashMap<&str, usize> = r.tensors().iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
        let mut seen = HashSet::new();
        let mut files = HashSet::new();
        let mut out = Vec::new();
        for s in shards {
            let file = s.get("file").and_then(Value::as_str).ok_or_else(|| bad(KEY_SHARDS))?.to_string();
            check_file_name(&file, "shard", ".safetensors")?;
            if !files.insert(file.clone()) {
                return Err(Error::malformed(format!("shard {file:?} is listed twice")));
            }
            let tensors: Vec<String> = serde_json::from_value(s.get("tensors").cloned().unwrap_or(Value::Null))
                .map_err(|_| bad(KEY_SHARDS))?;
            for t in &tensors {
                if !names.contains_key(t.as_str()) || !seen.insert(t.clone()) {
                    return Err(Error::malformed(format!(
                        "shard {file:?}: tensor {t:?} is not in the file, or in two shards"
                    )));
                }
            }
            let metadata = serde_json::from_value(s.get("metadata").cloned().unwrap_or(Value::Null))
                .map_err(|_| bad(KEY_SHARDS))?;
            out.push(Shard { file, tensors, metadata });
        }
        if seen.len() != r.tensors().len() {
            return Err(Error::malformed("the sharded layout leaves tensors of the file out"));
        }
        if index_name.is_none() && out.len() != 1 {
            return Err(Error::malformed(format!("a layout without {KEY_INDEX} has one file, not {}", out.len())));
        }
        Ok(Some(Layout { index_name, index_metadata, shards: out }))
    }

    /// The `*.safetensors.index.json` that names every tensor's shard, as the folder had it
    /// (with [`Layout::index_name`]).
    pub fn index_text(&self) -> Result<String, Error> {
        let weight_map: BTreeMap<&str, &str> =
            self.shards.iter().flat_map(|s| s.tensors.iter().map(|t| (t.as_str(), s.file.as_str()))).collect();
        let index = json!({"metadata": self.index_metadata, "weight_map": weight_map});
        let text =
            serde_json::to_string_pretty(&index).map_err(|e| Error::new(ErrorKind::InvalidArgument, e.to_string()))?;
        Ok(text + "\n")
    }
}

/// The one `.safetensors` file of a model folder that has no index (a model small enough for
/// one file, as the Hub stores it: `model.safetensors` beside its config), if that is what
/// `dir` is.
pub(crate) fn lone_safetensors(dir: &Path) -> Result<Option<PathBuf>, Error> {
    let io = |e: std::io::Error| Error::from(e).context(dir.display());
    let (mut files, mut index) = (Vec::new(), false);
    for entry in fs::read_dir(dir).map_err(io)? {
        let name = entry.map_err(io)?.file_name();
        let name = name.to_string_lossy();
        index |= name.ends_with(INDEX_SUFFIX);
        if name.ends_with(".safetensors") && !name.starts_with('.') {
            files.push(dir.join(&*name));
        }
    }
    Ok(match (index, files.len()) {
        (false, 1) => files.pop(),
        _ => None,
    })
}
