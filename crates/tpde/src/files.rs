//! The files of a model folder beside its weights (`config.json`, the tokenizer, the README):
//! gathered when a folder is packed, carried in the file's `tpde.files` table (spec §5.5), and
//! written back, byte for byte, when it is unpacked into a folder.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use tpde_format::files::{check_path, names_weights, FileEntry, MAX_TABLE_LEN};

use crate::sharded::Layout;
use crate::Error;

/// Extensions of weights in other frameworks' formats beyond the spec's (a Hub repository often
/// holds the same model several times): not carried, since the `.tpde` holds the weights.
const OTHER_WEIGHTS: &[&str] = &["ot"];

/// What [`gather`] found: the files to carry, and the paths it left out.
#[derive(Debug, Default)]
pub struct Gathered {
    /// The files, in path order.
    pub files: Vec<FileEntry>,
    /// Left out: weights and their indexes (spec §5.5), weights in other formats, hidden
    /// folders (`.git`, `.cache`), links to folders or to nothing.
    pub skipped: Vec<String>,
    /// Carried files that are links, each with where it leads: inside the folder, or a
    /// Hugging Face cache's blob.
    pub links: Vec<(String, PathBuf)>,
}

/// The files of the model folder `dir` other than its weights (spec §5.5: no weight file nor
/// index of one; unpack writes the layout's index from the tensors), every folder below it
/// included except hidden ones. Links to files are read through only where they stay inside
/// `dir` or lead to a blob of a Hugging Face cache (a cache snapshot is all links); one that
/// leads elsewhere (`/etc/passwd`, `/proc/self/environ`) is an error, and so is anything that
/// is neither a file nor a folder (a FIFO, a device). Links to folders are not followed. At most
/// [`MAX_TABLE_LEN`] bytes are read in all, whatever sizes the files claim (`/proc` files say 0).
pub fn gather(dir: &Path, layout: &Layout) -> Result<Gathered, Error> {
    let weights = layout_files(layout);
    let root = fs::canonicalize(dir).map_err(|e| Error::from(e).context(dir.display()))?;
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
            // What a link leads to; a link that leads nowhere is left out, like a folder link.
            let meta = match fs::metadata(entry.path()) {
                Ok(m) => m,
                Err(_) if link => {
                    out.skipped.push(path);
                    continue;
                }
                Err(e) => return Err(Error::from(e).context(entry.path().display())),
            };
            let other_weights =
                Path::new(name).extension().is_some_and(|e| OTHER_WEIGHTS.contains(&&*e.to_string_lossy()));
            if weights.contains(&path) {
                continue;
            } else if meta.is_dir() {
                match link || name.starts_with('.') {
                    true => out.skipped.push(path),
                    false => pending.push(rel.join(name)),
                }
                continue;
            } else if names_weights(&path) || other_weights {
                out.skipped.push(path);
                continue;
            } else if !meta.is_file() {
                return Err(Error::usage(format!(
                    "{}: not a file or a folder (a FIFO, a socket or a device); a packed folder holds files",
                    entry.path().display()
                )));
            }
            check_path(&path).map_err(|e| Error::usage(format!("{}: {e}", entry.path().display())))?;
            if link {
                let target =
                    fs::canonicalize(entry.path()).map_err(|e| Error::from(e).context(entry.path().display()))?;
                if !target.starts_with(&root) && !is_hub_blob(&target) {
                    return Err(Error::usage(format!(
                        "{}: a link to {}, outside the folder; a pack follows links only inside the folder or into a Hugging Face cache's blobs (copy the file in, or remove the link)",
                        entry.path().display(),
                        target.display()
                    )));
                }
                out.links.push((path.clone(), target));
            }
            let data = read_bounded(&entry.path(), MAX_TABLE_LEN - total).map_err(|e| match e {
                Some(e) => Error::from(e).context(entry.path().display()),
                None => Error::new(
                    tpde_format::ErrorKind::LimitExceeded,
                    format!(
                        "{}: the files beside the weights pass {} MiB at {path}; a .tpde carries configs and tokenizers, not data",
                        dir.display(),
                        MAX_TABLE_LEN >> 20
                    ),
                ),
            })?;
            total += data.len() as u64;
            out.files.push(FileEntry { path, data });
        }
    }
    out.files.sort_by(|a, b| a.path.cmp(&b.path));
    out.skipped.sort();
    out.links.sort();
    Ok(out)
}

/// The bytes of the file at `path`, at most `limit` of them: `Err(None)` if it holds more. Read
/// to its end rather than trusting its size (a `/proc` file says 0 and reads on and on).
fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, Option<std::io::Error>> {
    use std::io::Read;
    let mut data = Vec::new();
    fs::File::open(path).and_then(|f| f.take(limit + 1).read_to_end(&mut data)).map_err(Some)?;
    match data.len() as u64 > limit {
        true => Err(None),
        false => Ok(data),
    }
}

/// Whether `target` (a canonical path) is a blob of a Hugging Face cache:
/// `…/models--ORG--NAME/blobs/HASH`, where the links of its `snapshots/REV/` lead.
fn is_hub_blob(target: &Path) -> bool {
    let mut up = target.ancestors().skip(1).filter_map(|a| a.file_name()).map(|n| n.to_string_lossy());
    matches!((up.next(), up.next()), (Some(blobs), Some(repo)) if blobs == "blobs" && ["models--", "datasets--", "spaces--"].iter().any(|p| repo.starts_with(p)))
}

/// The files a layout writes from tensors: its shards.
fn layout_files(layout: &Layout) -> HashSet<String> {
    layout.shards.iter().map(|s| s.file.clone()).collect()
}

/// Checks, before anything is written, that no path in `paths` (relative, checked by the
/// reader) names a file of the weights' layout: a table cannot replace the weights. (Nothing is
/// written into an existing folder, so no link found there is ever written through: the folder
/// is written beside its place and put there whole, see [`crate::unpack`].)
pub fn check_destination<'a>(paths: impl IntoIterator<Item = &'a str>, layout: &Layout) -> Result<(), Error> {
    let weights = layout_files(layout);
    match paths.into_iter().find(|p| weights.contains(*p)) {
        Some(path) => Err(Error::malformed(format!("the file table holds {path:?}, a file of the weights' layout"))),
        None => Ok(()),
    }
}

/// Writes `files` into `folder`, a new folder of its own (an unpack's staging folder, see
/// [`tpde_write::AtomicFolder`]), creating the folders on their paths.
pub fn write<'a>(folder: &Path, files: impl IntoIterator<Item = &'a FileEntry>) -> Result<(), Error> {
    for f in files {
        // The reader checked every path (spec §5.5); checked again here, where it matters.
        check_path(&f.path).map_err(tpde_read::ReadError::from)?;
        let path = folder.join(&f.path);
        let io = |e: std::io::Error| Error::from(e).context(path.display());
        fs::create_dir_all(path.parent().expect("a path inside the folder")).map_err(io)?;
        // Never one file over another: paths that differ only in case (`Config.json`,
        // `config.json`, allowed by §5.5) are one file on a case-insensitive file system (macOS,
        // Windows), where this refuses the table rather than keep whichever came last.
        let mut file = match fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(Error::usage(format!(
                    "{}: the file table's {:?} is a file written already: this file system does not tell apart \
                     paths that differ only in case",
                    path.display(),
                    f.path
                )))
            }
            opened => opened.map_err(io)?,
        };
        std::io::Write::write_all(&mut file, &f.data).map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharded::Shard;

    #[test]
    fn a_table_cannot_replace_the_weights_or_leave_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout {
            index_name: None,
            index_metadata: Default::default(),
            shards: vec![Shard { file: "model.safetensors".into(), tensors: vec![], metadata: None }],
        };
        assert!(check_destination(["model.safetensors"], &layout).is_err());
        check_destination(["a/b/c.json", "config.json"], &layout).unwrap();
        for bad in ["../escape", "/abs"] {
            let file = FileEntry { path: bad.into(), data: b"x".to_vec() };
            assert!(write(dir.path(), [&file]).is_err(), "{bad}");
        }
        assert!(!dir.path().parent().unwrap().join("escape").exists());
        write(dir.path(), [&FileEntry { path: "a/b/c.json".into(), data: b"x".to_vec() }]).unwrap();
        assert_eq!(std::fs::read(dir.path().join("a/b/c.json")).unwrap(), b"x");
        // A path that is a file there already (what `Config.json` after `config.json` meets on a
        // case-insensitive file system) is refused, and the first file stays.
        let e = write(dir.path(), [&FileEntry { path: "a/b/c.json".into(), data: b"y".to_vec() }]).unwrap_err();
        assert!(e.message().contains("differ only in case"), "{e}");
        assert_eq!(std::fs::read(dir.path().join("a/b/c.json")).unwrap(), b"x");
    }
}
