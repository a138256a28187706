//! The files of a model folder beside its weights (`config.json`, the tokenizer, the README):
//! gathered when a folder is packed, carried in the file's `tpde.files` table (spec §5.5), and
//! written back, byte for byte, when it is unpacked into a folder.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use tpde_format::files::{check_path, FileEntry, MAX_TABLE_LEN};

use crate::sharded::Layout;
use crate::Error;

/// Extensions of weights in other frameworks' formats (a Hub repository often holds the same
/// model several times): not carried, since the `.tpde` holds the weights.
const OTHER_WEIGHTS: &[&str] = &["bin", "pt", "pth", "h5", "msgpack", "onnx", "ot", "ckpt", "gguf", "safetensors"];

/// What [`gather`] found: the files to carry, and the paths it left out.
#[derive(Debug, Default)]
pub struct Gathered {
    /// The files, in path order.
    pub files: Vec<FileEntry>,
    /// Left out: weights in other formats, hidden folders (`.git`, `.cache`), links to folders
    /// or to nothing, and anything that is not a file.
    pub skipped: Vec<String>,
}

/// The files of the model folder `dir` other than the weights `layout` names (its shards; the
/// index is carried, so that it comes back byte for byte), every folder below it included
/// except hidden ones. Links to files are read through
/// (a Hugging Face cache snapshot is all links); links to folders are not followed.
pub fn gather(dir: &Path, layout: &Layout) -> Result<Gathered, Error> {
    let weights = layout_files(layout);
    let mut out = Gathered::default();
    let mut total = 0u64;
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        let folder = dir.join(&rel);
        let io = |e: std::io::Error| Error::from(e).context(folder.display());
        let mut entries: Vec<_> = fs::read_dir(&folder).map_err(io)?.collect::<Result<_, _>>().map_err(io)?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                return Err(Error::usage(format!("{}: a file name that is not UTF-8", entry.path().display())));
            };
            let path = match rel.as_os_str().is_empty() {
                true => name.to_string(),
                false => format!("{}/{name}", rel.to_string_lossy()),
            };
            let link = entry.file_type().map_err(io)?.is_symlink();
            // What a link leads to; a link that leads nowhere is left out, like anything else
            // that is not a file or a folder.
            let (is_dir, is_file, len) = match fs::metadata(entry.path()) {
                Ok(m) => (m.is_dir(), m.is_file(), m.len()),
                Err(_) if link => (false, false, 0),
                Err(e) => return Err(Error::from(e).context(entry.path().display())),
            };
            let other_weights =
                Path::new(name).extension().is_some_and(|e| OTHER_WEIGHTS.contains(&&*e.to_string_lossy()));
            if is_dir && !link && !name.starts_with('.') {
                pending.push(rel.join(name));
            } else if is_file && !weights.contains(&path) && !other_weights {
                check_path(&path).map_err(|e| Error::usage(format!("{}: {e}", entry.path().display())))?;
                total += len;
                if total > MAX_TABLE_LEN {
                    return Err(Error::new(
                        tpde_format::ErrorKind::LimitExceeded,
                        format!(
                            "{}: the files beside the weights pass {} MiB at {path} ({} bytes); a .tpde carries configs and tokenizers, not data",
                            dir.display(),
                            MAX_TABLE_LEN >> 20,
                            len
                        ),
                    ));
                }
                let data = fs::read(entry.path()).map_err(|e| Error::from(e).context(entry.path().display()))?;
                out.files.push(FileEntry { path, data });
            } else if !weights.contains(&path) {
                out.skipped.push(path);
            }
        }
    }
    out.files.sort_by(|a, b| a.path.cmp(&b.path));
    out.skipped.sort();
    Ok(out)
}

/// The files a layout writes from tensors: its shards.
fn layout_files(layout: &Layout) -> HashSet<String> {
    layout.shards.iter().map(|s| s.file.clone()).collect()
}

/// Writes `files` into the folder `output`, each atomically (a temporary file renamed into
/// place, which replaces a link rather than following it). Folders are created as needed and
/// one that exists must be a real folder, not a link, so nothing is written outside `output`.
/// A file the layout writes from tensors is refused: a table cannot replace the weights.
pub fn write<'a>(output: &Path, files: impl IntoIterator<Item = &'a FileEntry>, layout: &Layout) -> Result<(), Error> {
    let weights = layout_files(layout);
    for f in files {
        // The reader checked every path (spec §5.5); checked again here, where it matters.
        check_path(&f.path).map_err(tpde_read::ReadError::from)?;
        if weights.contains(&f.path) {
            return Err(Error::malformed(format!("the file table holds {:?}, a file of the weights' layout", f.path)));
        }
        let mut folder = output.to_path_buf();
        let components: Vec<&str> = f.path.split('/').collect();
        for c in &components[..components.len() - 1] {
            folder.push(c);
            match fs::symlink_metadata(&folder) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(Error::usage(format!(
                        "{}: not a folder (a link or a file); {} is not written through it",
                        folder.display(),
                        f.path
                    )))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    fs::create_dir(&folder).map_err(|e| Error::from(e).context(folder.display()))?
                }
                Err(e) => return Err(Error::from(e).context(folder.display())),
            }
        }
        let path = output.join(&f.path);
        let io = |e: std::io::Error| Error::from(e).context(path.display());
        let mut file = tpde_write::AtomicFile::create(&path).map_err(io)?;
        std::io::Write::write_all(&mut file, &f.data).map_err(io)?;
        file.commit().map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharded::Shard;

    #[test]
    fn a_table_cannot_replace_the_weights_or_leave_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout {
            index_name: None,
            index_metadata: Default::default(),
            shards: vec![Shard { file: "model.safetensors".into(), tensors: vec![], metadata: None }],
        };
        let file = |path: &str| FileEntry { path: path.into(), data: b"x".to_vec() };
        for bad in ["model.safetensors", "../escape", "/abs"] {
            assert!(write(dir.path(), [&file(bad)], &layout).is_err(), "{bad}");
        }
        assert!(!dir.path().join("model.safetensors").exists());
        assert!(!dir.path().parent().unwrap().join("escape").exists());
        write(dir.path(), [&file("a/b/c.json")], &layout).unwrap();
        assert_eq!(std::fs::read(dir.path().join("a/b/c.json")).unwrap(), b"x");
    }
}
