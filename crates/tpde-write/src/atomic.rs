//! Files that appear whole or not at all, and leave nothing behind when their writer dies.
//!
//! On Linux the bytes go to an unnamed file (`O_TMPFILE`) in the destination's folder, which
//! the kernel frees by itself if the process dies; [`AtomicFile::commit`] syncs it and links it
//! into place (`linkat` through `/proc/self/fd`). Where the filesystem has no unnamed files
//! (and on other systems) the bytes go to a hidden file beside the destination,
//! `.NAME.HOST-PID.RANDOM.partial`, renamed into place on commit and removed on drop; a writer
//! killed before either leaves it behind, so every new [`AtomicFile`] in that folder first
//! removes the partial files of writers of this host whose process is gone.
//!
//! Either way the folder is synced after the file appears, so the name survives a power loss.
//! [`AtomicFolder`] does the same for a folder of files (an unpacked model folder).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// A file being written that appears under its final name only on [`AtomicFile::commit`].
#[derive(Debug)]
pub struct AtomicFile {
    file: File,
    path: PathBuf,
    /// The hidden name the bytes are under until commit; `None` for an unnamed file.
    partial: Option<PathBuf>,
}

impl AtomicFile {
    /// Starts a file that will appear at `path` (which may exist: commit replaces it).
    pub fn create(path: impl AsRef<Path>) -> io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let dir = folder_of(&path);
        remove_orphans(dir);
        if let Some(file) = unnamed::create(dir)? {
            return Ok(AtomicFile { file, path, partial: None });
        }
        let (file, partial) = create_partial(dir, &path)?;
        Ok(AtomicFile { file, path, partial: Some(partial) })
    }

    /// The file, open for reading and writing.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The final path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Syncs the bytes, puts the file under its final name (replacing what was there) and
    /// syncs the folder. Returns the file, open.
    pub fn commit(mut self) -> io::Result<File> {
        self.file.sync_all()?;
        let dir = folder_of(&self.path).to_path_buf();
        match self.partial.take() {
            Some(partial) => {
                if let Err(e) = fs::rename(&partial, &self.path) {
                    let _ = fs::remove_file(&partial);
                    return Err(e);
                }
            }
            None => unnamed::link(&self.file, &dir, &self.path)?,
        }
        sync_folder(&dir)?;
        // `self` has no partial name any more, so its drop removes nothing; the file is
        // cloned out because `AtomicFile` implements Drop.
        self.file.try_clone()
    }
}

impl io::Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if let Some(p) = self.partial.take() {
            let _ = fs::remove_file(p);
        }
    }
}

fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn sync_folder(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// The suffix every partial file's name ends with.
pub const PARTIAL_SUFFIX: &str = ".partial";

/// This host's name, so that a writer never judges the partial files of another host (a
/// shared folder) by its own process table.
fn host() -> String {
    #[cfg(unix)]
    {
        let u = rustix::system::uname();
        let name: String = u.nodename().to_string_lossy().chars().filter(|c| c.is_ascii_alphanumeric()).collect();
        if !name.is_empty() {
            return name;
        }
    }
    "host".into()
}

fn create_partial(dir: &Path, path: &Path) -> io::Result<(File, PathBuf)> {
    new_partial(dir, path, |p| OpenOptions::new().read(true).write(true).create_new(true).open(p))
}

/// `create(partial)` under a fresh partial name for `path` in `dir` (create fails where the name
/// exists, so two writers never share one).
fn new_partial<T>(dir: &Path, path: &Path, create: impl Fn(&Path) -> io::Result<T>) -> io::Result<(T, PathBuf)> {
    let stem = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let owner = format!("{}-{}", host(), std::process::id());
    let mut last = None;
    for _ in 0..16 {
        let partial = dir.join(format!(".{stem}.{owner}.{:08x}{PARTIAL_SUFFIX}", random_u32()));
        match create(&partial) {
            Ok(made) => return Ok((made, partial)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free partial name")))
}

/// A folder being written that appears at its final path only on [`AtomicFolder::commit`]: its
/// files go to a hidden partial folder beside it (named as partial files are, so a writer that
/// dies leaves nothing the next one does not remove), dropped whole on failure.
#[derive(Debug)]
pub struct AtomicFolder {
    partial: Option<PathBuf>,
    path: PathBuf,
}

impl AtomicFolder {
    /// Starts a folder that will appear at `path`; its parent is created if need be.
    pub fn create(path: impl AsRef<Path>) -> io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let dir = folder_of(&path);
        fs::create_dir_all(dir)?;
        remove_orphans(dir);
        let ((), partial) = new_partial(dir, &path, |p| fs::create_dir(p))?;
        Ok(AtomicFolder { partial: Some(partial), path })
    }

    /// Where the folder's files are written until commit.
    pub fn staging(&self) -> &Path {
        self.partial.as_deref().expect("a folder not yet committed")
    }

    /// Puts the folder in place, whole: renamed to its path where nothing is there (or an empty
    /// folder). A folder with entries there is never merged with (a mix of two versions, or a
    /// stale file beside the new ones, would load as the model): it is refused
    /// ([`io::ErrorKind::AlreadyExists`]) unless `replace`, and then exchanged with the new one
    /// in one step (`renameat2(RENAME_EXCHANGE)`) and removed, so a kill at any moment leaves the
    /// old folder or the new one (a kill before the old one is removed leaves it under a
    /// partial name, which the next writer in that folder removes). Syncs the parent.
    pub fn commit(mut self, replace: bool) -> io::Result<()> {
        let partial = self.partial.take().expect("a folder not yet committed");
        let placed = match fs::rename(&partial, &self.path) {
            Ok(()) => Ok(None),
            Err(_) if fs::symlink_metadata(&self.path).is_ok_and(|m| m.is_dir()) && !replace => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a folder with files is there: it is replaced only whole, when asked to",
            )),
            Err(_) if fs::symlink_metadata(&self.path).is_ok_and(|m| m.is_dir()) => {
                exchange(&partial, &self.path).map(Some)
            }
            Err(e) => Err(e),
        };
        match placed {
            Err(e) => {
                let _ = fs::remove_dir_all(&partial);
                Err(e)
            }
            Ok(old) => {
                sync_folder(folder_of(&self.path))?;
                if let Some(old) = old {
                    fs::remove_dir_all(old)?;
                }
                Ok(())
            }
        }
    }
}

/// Puts the folder `new` where the folder `at` is in one step, and returns where the old one
/// went (`new`'s partial name).
#[cfg(target_os = "linux")]
fn exchange(new: &Path, at: &Path) -> io::Result<PathBuf> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    renameat_with(CWD, new, CWD, at, RenameFlags::EXCHANGE)?;
    Ok(new.to_path_buf())
}

/// Without an exchange: the old folder moves aside to a partial name, then the new one into
/// place (a kill between the two leaves no folder there, and both under partial names).
#[cfg(not(target_os = "linux"))]
fn exchange(new: &Path, at: &Path) -> io::Result<PathBuf> {
    let ((), aside) = new_partial(folder_of(at), at, |p| fs::create_dir(p))?;
    fs::remove_dir(&aside)?;
    fs::rename(at, &aside)?;
    fs::rename(new, at)?;
    Ok(aside)
}

impl Drop for AtomicFolder {
    fn drop(&mut self) {
        if let Some(p) = self.partial.take() {
            let _ = fs::remove_dir_all(p);
        }
    }
}

fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS per process and per instance; enough to make two
    // writers' names differ, which create_new then guarantees.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64));
    h.finish() as u32
}

/// The process that owns a partial file, if the name is one of ours from this host.
fn partial_owner(name: &str, host: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?.strip_suffix(PARTIAL_SUFFIX)?;
    let mut parts = rest.rsplitn(3, '.');
    let _random = parts.next()?;
    let owner = parts.next()?;
    let (h, pid) = owner.rsplit_once('-')?;
    (h == host).then(|| pid.parse().ok()).flatten()
}

/// Removes the partial files in `dir` whose writer, a process of this host, is gone. Best
/// effort: a folder that cannot be listed is left as it is.
pub fn remove_orphans(dir: &Path) {
    let host = host();
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| partial_owner(n, &host)) else { continue };
        if pid != std::process::id() && !process_alive(pid) {
            let _ = match entry.file_type().is_ok_and(|t| t.is_dir()) {
                true => fs::remove_dir_all(entry.path()),
                false => fs::remove_file(entry.path()),
            };
        }
    }
}

fn process_alive(pid: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        Path::new("/proc").join(pid.to_string()).exists()
    }
    #[cfg(not(target_os = "linux"))]
    {
        // Without a process table to ask, assume the writer may still be alive.
        let _ = pid;
        true
    }
}

#[cfg(target_os = "linux")]
mod unnamed {
    use std::fs::File;
    use std::io;
    use std::os::fd::AsRawFd;
    use std::path::Path;

    use rustix::fs::{AtFlags, Mode, OFlags, CWD};
    use rustix::io::Errno;

    /// An unnamed file in `dir`, or `None` where the filesystem has none.
    pub fn create(dir: &Path) -> io::Result<Option<File>> {
        match rustix::fs::openat(CWD, dir, OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC, Mode::from(0o644)) {
            Ok(fd) => Ok(Some(File::from(fd))),
            // EOPNOTSUPP: the filesystem has no O_TMPFILE; EISDIR/EINVAL: an old kernel.
            Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Gives `file` the name `path`, replacing what is there. linkat cannot replace, so an
    /// existing name is replaced through a partial name and a rename (a crash between the two
    /// leaves a partial file, which the next writer's sweep removes).
    pub fn link(file: &File, dir: &Path, path: &Path) -> io::Result<()> {
        let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
        match rustix::fs::linkat(CWD, proc_path.as_str(), CWD, path, AtFlags::SYMLINK_FOLLOW) {
            Ok(()) => Ok(()),
            Err(Errno::EXIST) => {
                let (placeholder, partial) = super::create_partial(dir, path)?;
                drop(placeholder);
                std::fs::remove_file(&partial)?;
                rustix::fs::linkat(CWD, proc_path.as_str(), CWD, &partial, AtFlags::SYMLINK_FOLLOW)?;
                std::fs::rename(&partial, path).inspect_err(|_| {
                    let _ = std::fs::remove_file(&partial);
                })
            }
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod unnamed {
    use std::fs::File;
    use std::io;
    use std::path::Path;

    pub fn create(_dir: &Path) -> io::Result<Option<File>> {
        Ok(None)
    }

    pub fn link(_file: &File, _dir: &Path, _path: &Path) -> io::Result<()> {
        unreachable!("no unnamed files are created on this system")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn appears_only_on_commit_and_replaces() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.tpde");
        let f = AtomicFile::create(&p).unwrap();
        f.file().write_all(b"first").unwrap();
        assert!(!p.exists(), "nothing under the final name before commit");
        f.commit().unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"first");
        let f = AtomicFile::create(&p).unwrap();
        f.file().write_all(b"second").unwrap();
        let mut back = f.commit().unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"second");
        let mut s = String::new();
        back.rewind().unwrap();
        back.read_to_string(&mut s).unwrap();
        assert_eq!(s, "second", "the committed file stays open and readable");
        assert_eq!(names(d.path()), ["a.tpde"], "no partial file left beside it");
    }

    #[test]
    fn dropped_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let f = AtomicFile::create(d.path().join("b.tpde")).unwrap();
        f.file().write_all(b"half").unwrap();
        drop(f);
        assert!(names(d.path()).is_empty());
    }

    #[test]
    fn orphans_of_dead_writers_are_removed_and_others_kept() {
        let d = tempfile::tempdir().unwrap();
        let host = host();
        // A pid above the kernel's maximum (2^22) is never alive.
        let dead = format!(".c.tpde.{host}-4194999.0000abcd{PARTIAL_SUFFIX}");
        let alive = format!(".c.tpde.{host}-{}.0000abce{PARTIAL_SUFFIX}", std::process::id());
        let other_host = format!(".c.tpde.elsewhere-4194999.0000abcf{PARTIAL_SUFFIX}");
        let unrelated = "notes.partial".to_string();
        for n in [&dead, &alive, &other_host, &unrelated] {
            fs::write(d.path().join(n), b"x").unwrap();
        }
        remove_orphans(d.path());
        let mut want = vec![alive, other_host, unrelated];
        want.sort();
        assert_eq!(names(d.path()), want);
    }

    #[test]
    fn a_folder_replaces_a_folder_with_files_whole_and_only_when_asked() {
        let d = tempfile::tempdir().unwrap();
        let at = d.path().join("model");
        fs::create_dir_all(at.join("sub")).unwrap();
        fs::write(at.join("model.safetensors"), b"old weights").unwrap();
        fs::write(at.join("sub/config.json"), b"old").unwrap();
        let new = |text: &[u8]| {
            let f = AtomicFolder::create(&at).unwrap();
            fs::create_dir(f.staging().join("sub")).unwrap();
            fs::write(f.staging().join("sub/config.json"), text).unwrap();
            fs::write(f.staging().join("model-00001-of-00001.safetensors"), text).unwrap();
            f
        };
        let e = new(b"new").commit(false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
        assert_eq!(fs::read(at.join("sub/config.json")).unwrap(), b"old", "refused: the old folder as it was");
        assert_eq!(names(d.path()), ["model"], "nothing beside it");
        new(b"new").commit(true).unwrap();
        assert_eq!(names(&at), ["model-00001-of-00001.safetensors", "sub"], "no stale file of the old folder");
        assert_eq!(fs::read(at.join("sub/config.json")).unwrap(), b"new");
        assert_eq!(names(d.path()), ["model"], "the old folder is gone");
        // A missing or empty folder is not "with files": no need to ask.
        fs::remove_dir_all(&at).unwrap();
        fs::create_dir(&at).unwrap();
        new(b"again").commit(false).unwrap();
        assert_eq!(fs::read(at.join("sub/config.json")).unwrap(), b"again");
    }

    #[test]
    fn partial_names_parse() {
        assert_eq!(partial_owner(".x.tpde.h1-42.0badf00d.partial", "h1"), Some(42));
        assert_eq!(partial_owner(".x.tpde.h2-42.0badf00d.partial", "h1"), None);
        assert_eq!(partial_owner("x.tpde.h1-42.0badf00d.partial", "h1"), None);
        assert_eq!(partial_owner(".x.h1-nope.0badf00d.partial", "h1"), None);
    }
}
