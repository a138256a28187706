//! Where a `.tpde` file lives: a local path or an object in a bucket (`s3://bucket/key`), and
//! the one way every front end opens, creates, lists and removes files at either.
//!
//! A local file is read through its memory map and written through an
//! [`AtomicFile`](tpde_write::atomic::AtomicFile); an object through ranged GETs
//! (`ObjectSource`) and a multipart upload (`ObjectWriter`). Both appear under their name
//! only when complete.

use std::borrow::Cow;
use std::fmt;
use std::io::{self, BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

#[cfg(feature = "object")]
use tpde_object::{ObjectSource, ObjectUrl, ObjectWriter};
use tpde_read::{Reader, Source};
use tpde_write::atomic::AtomicFile;

use crate::Error;

/// A file's place: a local path, or an object named by URL.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// A path on this machine (`file://` URLs become paths).
    Local(PathBuf),
    /// An object in S3 or a store that speaks its API (the `object` feature).
    #[cfg(feature = "object")]
    Object(ObjectUrl),
}

/// A reader of a file at a [`Location`].
pub type FileReader = Reader<Stored>;

impl Location {
    /// Parses a path or a URL: `s3://bucket/key`, `file:///path`, or a plain path. A URL of
    /// another scheme is an `unsupported-feature` error.
    pub fn parse(s: &str) -> Result<Location, Error> {
        if let Some(path) = s.strip_prefix("file://") {
            return Ok(Location::Local(PathBuf::from(path)));
        }
        #[cfg(not(feature = "object"))]
        if s.contains("://") {
            return Err(Error::new(
                crate::ErrorKind::UnsupportedFeature,
                format!("{s}: a URL, and this build of tpde reads no object storage (its `object` feature)"),
            ));
        }
        #[cfg(feature = "object")]
        if ObjectUrl::is_url(s) {
            return ObjectUrl::parse(s).map(Location::Object).map_err(|e| {
                let kind = match e.kind() {
                    io::ErrorKind::InvalidInput if s.starts_with("s3") => crate::ErrorKind::InvalidArgument,
                    _ => crate::ErrorKind::UnsupportedFeature,
                };
                Error::caused_by(kind, e)
            });
        }
        Ok(Location::Local(PathBuf::from(s)))
    }

    /// The local path, if this is one.
    pub fn as_path(&self) -> Option<&Path> {
        match self {
            Location::Local(p) => Some(p),
            #[cfg(feature = "object")]
            Location::Object(_) => None,
        }
    }

    /// The file `name` in this location taken as a folder.
    pub fn join(&self, name: &str) -> Result<Location, Error> {
        Ok(match self {
            Location::Local(p) => Location::Local(p.join(name)),
            #[cfg(feature = "object")]
            Location::Object(u) => Location::Object(u.join(name).map_err(io_err)?),
        })
    }

    /// The last component of the path or key.
    pub fn file_name(&self) -> String {
        match self {
            Location::Local(p) => p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            #[cfg(feature = "object")]
            Location::Object(u) => u.file_name().to_owned(),
        }
    }

    /// The base a file here names by path hint `hint` (spec §7.3): a URL as it is, an
    /// absolute path as it is, a relative one from this file's folder.
    pub fn resolve_hint(&self, hint: &str) -> Result<Location, Error> {
        if hint.contains("://") || Path::new(hint).is_absolute() {
            return Location::parse(hint);
        }
        Ok(match self {
            Location::Local(p) => Location::Local(p.parent().unwrap_or(Path::new("")).join(hint)),
            // A hint that climbs out of the bucket leads nowhere (spec §7.3).
            #[cfg(feature = "object")]
            Location::Object(u) => Location::Object(u.parent().join(hint).map_err(|e| {
                Error::new(crate::ErrorKind::BaseMissing, format!("base path hint {hint:?} not followed: {e}"))
            })?),
        })
    }

    /// The path hint a file written here records for its base at `base`: relative when both
    /// are local or in one bucket (a folder of checkpoints moved as a whole keeps its chains),
    /// else the base's URL or absolute path.
    pub fn hint_to(&self, base: &Location) -> String {
        match (self, base) {
            (Location::Local(out), Location::Local(b)) => path_hint(b, out),
            #[cfg(feature = "object")]
            (Location::Object(out), Location::Object(b)) => out.relative_hint(b).unwrap_or_else(|| b.to_string()),
            #[cfg(feature = "object")]
            (Location::Object(_), Location::Local(b)) => {
                b.canonicalize().unwrap_or_else(|_| b.clone()).display().to_string()
            }
            #[cfg(feature = "object")]
            (Location::Local(_), Location::Object(b)) => b.to_string(),
        }
    }

    /// Whether a file (not a folder) is here.
    pub fn is_file(&self) -> Result<bool, Error> {
        match self {
            Location::Local(p) => Ok(p.is_file()),
            #[cfg(feature = "object")]
            Location::Object(u) => Ok(tpde_object::size(u).map_err(io_err)?.is_some()),
        }
    }

    /// Opens the file for reading.
    pub fn open(&self) -> Result<Stored, Error> {
        match self {
            Location::Local(p) => {
                tpde_read::map_file(p).map(Stored::Map).map_err(|e| Error::from(e).context(p.display()))
            }
            #[cfg(feature = "object")]
            Location::Object(u) => ObjectSource::open(u).map(|o| Stored::Object(Box::new(o))).map_err(io_err),
        }
    }

    /// Starts a file that appears here, whole, on [`Sink::commit`].
    pub fn create(&self) -> Result<Sink, Error> {
        match self {
            Location::Local(p) => AtomicFile::create(p)
                .map(|f| Sink::File(BufWriter::with_capacity(1 << 20, f)))
                .map_err(|e| Error::from(e).context(p.display()).located()),
            #[cfg(feature = "object")]
            Location::Object(u) => ObjectWriter::create(u).map(Sink::Object).map_err(io_err),
        }
    }

    /// [`Location::create`] of a file that appears only if the object here is still what
    /// `expect` says when it is committed (a local file: no condition, its writers are fenced
    /// by the folder's lock).
    #[cfg(feature = "object")]
    pub fn create_expecting(&self, expect: &tpde_object::Expect) -> Result<Sink, Error> {
        match self {
            Location::Object(u) => ObjectWriter::create_expecting(u, expect.clone()).map(Sink::Object).map_err(io_err),
            Location::Local(_) => self.create(),
        }
    }

    /// Makes the folder this location names, if local (buckets have no folders).
    pub fn create_dir_all(&self) -> Result<(), Error> {
        match self {
            Location::Local(p) => std::fs::create_dir_all(p).map_err(|e| Error::from(e).context(p.display())),
            #[cfg(feature = "object")]
            Location::Object(_) => Ok(()),
        }
    }

    /// The files of this folder (not recursive for a local folder; every key below it for an
    /// object prefix), by name, sorted. A missing folder has none.
    pub fn list(&self) -> Result<Vec<String>, Error> {
        match self {
            Location::Local(p) => match std::fs::read_dir(p) {
                Ok(entries) => {
                    let mut names: Vec<String> =
                        entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
                    names.sort();
                    Ok(names)
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
                Err(e) => Err(Error::from(e).context(p.display())),
            },
            #[cfg(feature = "object")]
            Location::Object(u) => Ok(tpde_object::list(u).map_err(io_err)?.into_iter().map(|(k, _)| k).collect()),
        }
    }

    /// Removes the file (a missing one is not an error).
    pub fn remove(&self) -> Result<(), Error> {
        match self {
            Location::Local(p) => match std::fs::remove_file(p) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(Error::from(e).context(p.display())),
                _ => Ok(()),
            },
            #[cfg(feature = "object")]
            Location::Object(u) => tpde_object::delete(u).map_err(io_err),
        }
    }

    /// What identifies the file for loop detection in a chain: the resolved path, or the URL.
    pub(crate) fn identity(&self) -> Result<String, Error> {
        match self {
            Location::Local(p) => {
                let canonical = p.canonicalize().map_err(|e| Error::from(e).context(p.display()))?;
                Ok(canonical.display().to_string())
            }
            #[cfg(feature = "object")]
            Location::Object(u) => Ok(u.to_string()),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            #[cfg(feature = "object")]
            Location::Object(u) => write!(f, "{u}"),
        }
    }
}

impl From<&Path> for Location {
    fn from(p: &Path) -> Self {
        Location::Local(p.to_path_buf())
    }
}

impl From<PathBuf> for Location {
    fn from(p: PathBuf) -> Self {
        Location::Local(p)
    }
}

/// Bytes [`copy`] reads at once: a remote source fetches them as concurrent pieces.
const COPY_BYTES: u64 = 64 << 20;

/// Copies the file at `from` to `to` (either a path or a URL), streaming: a download, an upload,
/// or a copy within one kind of storage, with the same guarantee as every write here (the file
/// appears whole or not at all). Returns the bytes copied.
pub fn copy(from: &Location, to: &Location) -> Result<u64, Error> {
    // An object's errors name its URL already; a local file's get its path here.
    let named = |e: io::Error, at: &Location| match at {
        Location::Local(p) => Error::from(e).context(p.display()),
        #[cfg(feature = "object")]
        Location::Object(_) => io_err(e),
    };
    let src = from.open()?;
    let mut sink = to.create()?;
    let mut at = 0;
    while at < src.len() {
        let end = src.len().min(at + COPY_BYTES);
        let piece = src.get(at..end).map_err(|e| named(e, from))?;
        sink.write_all(&piece).map_err(|e| named(e, to))?;
        at = end;
    }
    sink.commit()
}

/// An object-store error (its message names the URL) as the facade's error.
#[cfg(feature = "object")]
fn io_err(e: io::Error) -> Error {
    let kind = match e.kind() {
        io::ErrorKind::NotFound => crate::ErrorKind::NotFound,
        io::ErrorKind::InvalidInput => crate::ErrorKind::InvalidArgument,
        _ => crate::ErrorKind::Io,
    };
    Error::caused_by(kind, e)
}

/// The bytes of an open file: a local file's memory map, or a remote object.
pub enum Stored {
    /// A mapped local file.
    Map(memmap2::Mmap),
    /// An object read by ranged GETs (boxed: it holds its cache and counters).
    #[cfg(feature = "object")]
    Object(Box<ObjectSource>),
}

impl Stored {
    /// The remote object's request counts, `None` for a local file.
    #[cfg(feature = "object")]
    pub fn object_stats(&self) -> Option<tpde_object::Stats> {
        match self {
            Stored::Map(_) => None,
            #[cfg(feature = "object")]
            Stored::Object(o) => Some(o.stats()),
        }
    }
}

impl Source for Stored {
    fn len(&self) -> u64 {
        match self {
            Stored::Map(m) => Source::len(m),
            #[cfg(feature = "object")]
            Stored::Object(o) => o.len(),
        }
    }
    fn get(&self, range: Range<u64>) -> io::Result<Cow<'_, [u8]>> {
        match self {
            Stored::Map(m) => m.get(range),
            #[cfg(feature = "object")]
            Stored::Object(o) => o.get(range),
        }
    }
    fn prefetch_window(&self) -> Option<u64> {
        match self {
            Stored::Map(_) => None,
            #[cfg(feature = "object")]
            Stored::Object(o) => o.prefetch_window(),
        }
    }
    fn prefetch(&self, ranges: &[Range<u64>]) -> io::Result<()> {
        let _ = ranges; // a mapped file needs no prefetch
        match self {
            Stored::Map(_) => Ok(()),
            #[cfg(feature = "object")]
            Stored::Object(o) => o.prefetch(ranges),
        }
    }
    fn refetch(&self, range: Range<u64>) -> Option<io::Result<Vec<u8>>> {
        let _ = &range; // a mapped file's bytes are at hand
        match self {
            Stored::Map(_) => None,
            #[cfg(feature = "object")]
            Stored::Object(o) => o.refetch(range),
        }
    }
}

/// A file being written at a [`Location`]; it appears there only on [`Sink::commit`], and a
/// sink dropped before that leaves nothing (no partial file, no object, no upload parts).
pub enum Sink {
    /// A local file.
    File(BufWriter<AtomicFile>),
    /// An object being uploaded.
    #[cfg(feature = "object")]
    Object(ObjectWriter),
}

impl Sink {
    /// Puts the file in place; returns its length.
    pub fn commit(self) -> Result<u64, Error> {
        match self {
            Sink::File(w) => {
                let file = w.into_inner().map_err(|e| Error::from(e.into_error()))?;
                let path = file.path().to_path_buf();
                let file = file.commit().map_err(|e| Error::from(e).context(path.display()).located())?;
                Ok(file.metadata()?.len())
            }
            #[cfg(feature = "object")]
            Sink::Object(o) => o.commit().map_err(io_err),
        }
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::File(w) => w.write(buf),
            #[cfg(feature = "object")]
            Sink::Object(o) => o.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::File(w) => w.flush(),
            #[cfg(feature = "object")]
            Sink::Object(o) => o.flush(),
        }
    }
}

/// The path hint to record for `base` in a file written at `output`: the base's path relative
/// to the output's folder (`base.tpde`, `../step-100/rank-0.tpde`), so that a folder of
/// checkpoints copied elsewhere keeps its chains; the absolute path when there is no relative
/// one (another drive), or when either folder cannot be resolved.
pub fn path_hint(base: &Path, output: &Path) -> String {
    let dir_of = |p: &Path| {
        let d = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        d.canonicalize().ok()
    };
    let absolute = || base.canonicalize().unwrap_or_else(|_| base.to_path_buf()).display().to_string();
    let (Some(from), Some(to), Some(name)) = (dir_of(output), dir_of(base), base.file_name()) else {
        return absolute();
    };
    let (mut a, mut b) = (from.components().peekable(), to.components().peekable());
    if a.peek() != b.peek() {
        return absolute(); // no common root
    }
    while a.peek().is_some() && a.peek() == b.peek() {
        a.next();
        b.next();
    }
    // Spec §7.3: components separated by `/` whatever the platform's separator.
    let mut rel: Vec<String> = a.map(|_| "..".to_string()).collect();
    rel.extend(b.map(|c| c.as_os_str().to_string_lossy().into_owned()));
    rel.push(name.to_string_lossy().into_owned());
    rel.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn paths_and_urls_parse_by_feature() {
        assert_eq!(Location::parse("a/b.tpde").unwrap(), Location::Local(PathBuf::from("a/b.tpde")));
        assert_eq!(Location::parse("file:///x/y.tpde").unwrap(), Location::Local(PathBuf::from("/x/y.tpde")));
        let url = Location::parse("s3://bucket/run/step-1.tpde");
        #[cfg(feature = "object")]
        assert_eq!(url.unwrap().to_string(), "s3://bucket/run/step-1.tpde");
        // Without object storage a URL is refused by name, never taken for a relative path.
        #[cfg(not(feature = "object"))]
        {
            let e = url.unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::UnsupportedFeature);
            assert!(e.message().contains("`object` feature"), "{e}");
        }
    }

    #[test]
    fn path_hints_are_relative_to_the_output_folder() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("step-1"), root.path().join("step-2/deep"));
        fs::create_dir_all(&a).unwrap();
        fs::create_dir_all(&b).unwrap();
        let base = a.join("rank-0.tpde");
        fs::write(&base, b"").unwrap();
        assert_eq!(path_hint(&base, &a.join("next.tpde")), "rank-0.tpde");
        let up = path_hint(&base, &b.join("rank-0.tpde"));
        assert_eq!(std::path::Path::new(&up), std::path::Path::new("../../step-1/rank-0.tpde"));
        // A hint resolves from the output's folder to the base.
        assert_eq!(b.join(&up).canonicalize().unwrap(), base.canonicalize().unwrap());
        let down = path_hint(&b.join("x.tpde"), &root.path().join("y.tpde"));
        assert_eq!(std::path::Path::new(&down), std::path::Path::new("step-2/deep/x.tpde"));
    }
}
