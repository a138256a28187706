//! Following a delta back to its keyframe through the path hints its files record (spec §7.3):
//! the one walk every front end uses (this crate's [`open_chain`], the GPU crate's
//! `Gpu::load_chain`, the facade's chains over paths and URLs), with its limits, its loop check
//! and the rule of which hints may be followed.
//!
//! A path hint is data from the file: a hostile file can name any path (`/etc/passwd`,
//! `../../secret.tpde`, `/proc/self/mem`). [`PathHints`] says which a reader follows.

use std::collections::HashMap;
use std::hash::Hash;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tpde_format::digest::to_hex;

use crate::{ReadError, Reader, Source};

/// The longest chain of deltas a walk follows: a safeguard against hint loops that a path
/// check cannot see (links, mounts), far above any sensible keyframe interval.
pub const MAX_CHAIN: usize = 1024;

/// Which local path hints a reader follows (spec §7.3 and its security note).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PathHints {
    /// Every hint: relative (from the folder of the file that holds it), absolute or
    /// `file://`. The default: the files are the user's own (a training run's folder).
    #[default]
    Follow,
    /// Only hints that lead, links resolved, to a file inside one of these folders: for files
    /// from elsewhere (an upload, a shared bucket), so that a hint cannot make the reader open
    /// a path of its choosing.
    Within(Vec<PathBuf>),
    /// Only hints that lead into the folder of the file the chain was opened at (for a file
    /// opened by URL, into its bucket): what a front end opening a file from elsewhere follows
    /// by default. Resolved to [`PathHints::Within`] by [`PathHints::for_start`].
    WithinStart,
    /// None: a delta's base must be given by the caller.
    Ignore,
}

impl PathHints {
    /// Hints confined to the folder of `file` (and the folders below it).
    pub fn within_folder_of(file: &Path) -> PathHints {
        let folder = file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        PathHints::Within(vec![folder.to_path_buf()])
    }

    /// These hints for a chain opened at `start`, a local file (`None`: a URL, whose chain
    /// reaches no local folder under [`PathHints::WithinStart`]).
    pub fn for_start(&self, start: Option<&Path>) -> PathHints {
        match (self, start) {
            (PathHints::WithinStart, Some(file)) => PathHints::within_folder_of(file),
            (PathHints::WithinStart, None) => PathHints::Within(Vec::new()),
            (other, _) => other.clone(),
        }
    }

    /// Checks that the hint `hint`, resolved to `path`, may be followed. A refused hint is a
    /// `base-missing` error that names the hint and says why, without touching `path` beyond
    /// resolving its links (it is not opened, so an error cannot tell what it holds).
    pub fn check(&self, hint: &str, path: &Path) -> Result<(), ReadError> {
        let refuse = |why: String| ReadError::HintRefused { hint: hint.to_owned(), why };
        match self {
            PathHints::Follow => Ok(()),
            PathHints::Ignore => Err(refuse("the reader follows no path hints; give the base explicitly".into())),
            PathHints::WithinStart => Err(refuse("no chain start to confine it to".into())),
            PathHints::Within(roots) if roots.is_empty() => {
                Err(refuse("the file was opened by URL, and a confined reader follows no local path from it".into()))
            }
            PathHints::Within(roots) => {
                // Resolved by the file system (links followed), not lexically: a link inside a
                // root that points out of it leads out of it.
                // A path that does not exist is placed by its folder, so that a base missing
                // inside the roots reads as missing, not as refused.
                let resolved = path.canonicalize().ok().or_else(|| {
                    let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
                    Some(folder.canonicalize().ok()?.join(path.file_name()?))
                });
                let inside = resolved.as_ref().is_some_and(|p| {
                    roots.iter().filter_map(|r| r.canonicalize().ok()).any(|root| p.starts_with(root))
                });
                match inside {
                    true => Ok(()),
                    false => Err(refuse(format!(
                        "it does not lead to a file inside the allowed folders ({})",
                        roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
                    ))),
                }
            }
        }
    }
}

/// Walks a chain from `first` (a file at `start`) back to the file that decodes on its own:
/// `next` gives the base of a link (its place and the file, opened as it is) or `None` at the
/// keyframe; `identity` names a place for the loop check (a resolved path, a URL). Returns the
/// links, `start`'s first, the keyframe last. A file met twice, or a chain of more than
/// [`MAX_CHAIN`] files, is a `base-chain` error, found before the next link is opened.
pub fn walk<L, R, K, E>(
    start: L,
    first: R,
    identity: impl Fn(&L) -> Result<K, E>,
    mut next: impl FnMut(&L, &R) -> Result<Option<(L, R)>, E>,
) -> Result<Vec<(L, R)>, E>
where
    K: Eq + Hash,
    E: From<ReadError>,
    L: std::fmt::Display,
{
    // Each place met, with its position in the chain: a loop is named from where it starts.
    let mut seen = HashMap::new();
    let mut links: Vec<(L, R)> = Vec::new();
    let mut link = Some((start, first));
    while let Some((at, reader)) = link.take() {
        if let Some(&from) = seen.get(&identity(&at)?) {
            let detail = match links.len() - from {
                1 => format!("{at} names itself as its base"),
                _ => {
                    let names: Vec<String> = links[from..].iter().map(|(l, _)| l.to_string()).collect();
                    format!("the chain loops: {} -> {at}", names.join(" -> "))
                }
            };
            return Err(ReadError::BaseChain { detail }.into());
        }
        seen.insert(identity(&at)?, links.len());
        if seen.len() > MAX_CHAIN {
            return Err(ReadError::BaseChain { detail: format!("more than {MAX_CHAIN} files in the chain") }.into());
        }
        link = next(&at, &reader)?;
        links.push((at, reader));
    }
    Ok(links)
}

/// The path hint of a file that decodes against a base, if it records one: `Ok(None)` for a
/// file that needs no base, a `base-missing` error for a delta without a hint.
pub fn base_hint<S: Source>(reader: &Reader<S>) -> Result<Option<&str>, ReadError> {
    match reader.directory().base.as_ref().filter(|_| reader.uses_base()) {
        None => Ok(None),
        Some(b) if b.path_hint.is_empty() => Err(reader.base_missing()),
        Some(b) => Ok(Some(&b.path_hint)),
    }
}

/// The local path that hint `hint` of the file at `path` names.
pub fn resolve_path_hint(path: &Path, hint: &str) -> PathBuf {
    let hint = hint.strip_prefix("file://").unwrap_or(hint);
    path.parent().unwrap_or(Path::new(".")).join(hint)
}

/// The local base of the file at `path` (opened as `reader`) through its hint, under `hints`:
/// `Ok(None)` at a keyframe, `base-missing` when the hint is refused or leads to no file.
fn next_local<S: Source>(
    path: &Path,
    reader: &Reader<S>,
    hints: &PathHints,
) -> Result<Option<(PathBuf, Reader)>, ReadError> {
    let Some(hint) = base_hint(reader)? else { return Ok(None) };
    let base_path = resolve_path_hint(path, hint);
    hints.check(hint, &base_path)?;
    if !base_path.is_file() {
        let b = reader.directory().base.as_ref().expect("base_hint found one");
        return Err(ReadError::BaseMissing { digest: to_hex(&b.digest), hint: base_path.display().to_string() });
    }
    Ok(Some((base_path.clone(), Reader::open(&base_path)?)))
}

/// The file at `path` and its local bases through their hints, under `hints`, each opened as
/// it is (no base attached): the file first, its keyframe last. The walk behind
/// [`open_chain_with`] and the GPU crate's `Gpu::load_chain_with`.
pub fn local_links(path: impl AsRef<Path>, hints: &PathHints) -> Result<Vec<(PathBuf, Reader)>, ReadError> {
    let path = path.as_ref().to_path_buf();
    let hints = &hints.for_start(Some(&path));
    let first = Reader::open(&path)?;
    let identity = |p: &Displayed| p.0.canonicalize().map_err(|source| ReadError::Io { path: p.0.clone(), source });
    let links =
        walk(Displayed(path), first, identity, |p, r| Ok(next_local(&p.0, r, hints)?.map(|(p, r)| (Displayed(p), r))))?;
    Ok(links.into_iter().map(|(p, r)| (p.0, r)).collect())
}

/// Opens the file at `path` and, if it decodes against a base, the chain of bases behind it,
/// following every path hint: each base is found through the hint of the file that refers to
/// it (relative to that file's folder) and checked against the recorded content digest.
pub fn open_chain(path: impl AsRef<Path>) -> Result<Reader, ReadError> {
    open_chain_with(path, &PathHints::Follow)
}

/// [`open_chain`], following only the hints `hints` allows.
pub fn open_chain_with(path: impl AsRef<Path>, hints: &PathHints) -> Result<Reader, ReadError> {
    let mut links = local_links(path, hints)?;
    let (_, mut reader) = links.pop().expect("a chain holds its first file");
    while let Some((_, next)) = links.pop() {
        reader = next.with_base(Arc::new(reader))?;
    }
    Ok(reader)
}

/// A path that displays itself, as a link of a walk.
struct Displayed(PathBuf);

impl std::fmt::Display for Displayed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.display())
    }
}

#[cfg(test)]
mod tests {
    //! The walk's limits and loop checks, on links that are plain numbers: what every front end
    //! (local paths, URLs, the GPU loader) inherits.
    use super::*;

    /// A chain over numbers: `next[i]` is the base of link i (`None` at the keyframe); the
    /// identity of link i is `id[i]`. Returns the links visited, or the error.
    fn run(next: &[Option<usize>], id: &[usize]) -> Result<Vec<usize>, ReadError> {
        let links =
            walk(Link(0), (), |l: &Link| Ok::<_, ReadError>(id[l.0]), |l, _| Ok(next[l.0].map(|n| (Link(n), ()))))?;
        Ok(links.into_iter().map(|(l, _)| l.0).collect())
    }

    struct Link(usize);
    impl std::fmt::Display for Link {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "link {}", self.0)
        }
    }

    fn chain_of(n: usize) -> Vec<Option<usize>> {
        (0..n).map(|i| (i + 1 < n).then_some(i + 1)).collect()
    }

    #[test]
    fn a_chain_is_walked_to_its_keyframe_in_order() {
        assert_eq!(run(&[None], &[0]).unwrap(), [0]);
        assert_eq!(run(&chain_of(5), &[0, 1, 2, 3, 4]).unwrap(), [0, 1, 2, 3, 4]);
    }

    #[test]
    fn loops_are_base_chain_errors_found_before_the_next_open() {
        let is_chain = |r: Result<Vec<usize>, ReadError>| match r {
            Err(ReadError::BaseChain { detail }) => detail,
            other => panic!("expected base-chain, got {other:?}"),
        };
        // A file naming itself, a loop of two, and a loop far down a long chain.
        assert!(is_chain(run(&[Some(0)], &[0])).contains("link 0 names itself as its base"));
        assert_eq!(is_chain(run(&[Some(1), Some(0)], &[0, 1])), "the chain loops: link 0 -> link 1 -> link 0");
        let mut long = chain_of(100);
        long[99] = Some(50);
        assert!(is_chain(run(&long, &(0..100).collect::<Vec<_>>())).contains("link 50"));
        // Two places with one identity (a link, a second name for one file) are one file.
        assert!(is_chain(run(&[Some(1), None], &[7, 7])).contains("link 1"));
    }

    #[test]
    fn the_chain_bound_is_exact() {
        let ids: Vec<usize> = (0..MAX_CHAIN + 2).collect();
        assert_eq!(run(&chain_of(MAX_CHAIN), &ids).unwrap().len(), MAX_CHAIN);
        match run(&chain_of(MAX_CHAIN + 1), &ids) {
            Err(ReadError::BaseChain { detail }) => assert!(detail.contains(&format!("more than {MAX_CHAIN}"))),
            other => panic!("expected base-chain, got {:?}", other.map(|l| l.len())),
        }
    }

    #[test]
    fn errors_of_identity_and_next_stop_the_walk() {
        let r = walk(Link(0), (), |_| Err::<usize, _>(ReadError::NotADelta), |_, _| Ok(None));
        assert!(matches!(r, Err(ReadError::NotADelta)));
        let mut calls = 0;
        let r = walk(
            Link(0),
            (),
            |l: &Link| Ok::<_, ReadError>(l.0),
            |l, _| {
                calls += 1;
                match l.0 {
                    2 => Err(ReadError::NotADelta),
                    n => Ok(Some((Link(n + 1), ()))),
                }
            },
        );
        assert!(matches!(r, Err(ReadError::NotADelta)));
        assert_eq!(calls, 3, "the walk stops at the first error");
    }
}
