//! Opening checkpoints: a `.tpde` file with the chain of bases behind it (through the one walk
//! of `tpde_read::chain`, over paths and URLs), under a policy of which base hints to follow;
//! or a file of either container as the base of a delta.

use std::path::Path;
use std::sync::Arc;

use tpde_format::digest::to_hex;
use tpde_format::TensorEntry;
use tpde_read::{Base, PathHints, ReadError, ReadOptions, Reader};

use crate::location::{FileReader, Location};
use crate::safetensors::SafetensorsFile;
use crate::{Error, ErrorKind};

/// Whether the file at `path` starts with the TPDE magic.
pub fn is_tpde(path: &Path) -> Result<bool, Error> {
    use std::io::Read;
    let mut magic = [0u8; 8];
    let named = |e: std::io::Error| Error::from(e).context(path.display());
    let n = std::fs::File::open(path).and_then(|mut f| f.read(&mut magic)).map_err(named)?;
    Ok(n == 8 && magic == tpde_format::header::MAGIC)
}

/// What a delta written at `output` with the base hint `hint` will need to be read, when a
/// reader with the default, confined hints (`tpde unpack`, Python's loads) would not follow the
/// hint (a base outside the file's folder); `None` when it would. Said by `tpde pack` and
/// Python's `pack`, so that pack and unpack agree.
pub fn hint_note(output: &Location, hint: &str) -> Option<String> {
    let confined = OpenOptions { hints: HintPolicy::confined(), ..Default::default() };
    if confined.hints.follow(output, hint).is_ok() {
        return None;
    }
    Some(format!(
        "the base is recorded as {hint:?}, outside the folder of {output}; a default unpack follows hints only \
         inside it: unpack with `--base {hint}` (Python: base=), or allow the base's folder with `--hint-root DIR` \
         (hints=[DIR])"
    ))
}

/// How the readers here open a file: which base hints they follow, and the reader's settings
/// (checksums, the largest tensor decoded), for the file and every base behind it.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Which hints are followed.
    pub hints: HintPolicy,
    /// The reader's settings.
    pub read: ReadOptions,
}

/// Which base path hints the readers here follow (spec §7.3): local paths by
/// [`PathHints`], URLs by [`UrlHints`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HintPolicy {
    /// Local paths (relative, absolute, `file://`).
    pub paths: PathHints,
    /// `s3://` URLs.
    pub urls: UrlHints,
}

/// When a base hint that is a URL is followed. A URL hint reaches the network, and a client
/// without settings looks for credentials on the cloud's metadata endpoint, so a reader never
/// follows one the user has not asked for (spec §7.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UrlHints {
    /// When the user opted into object storage: the chain starts at a URL the user opened, or
    /// object storage is configured in the environment (`tpde::object::configured`).
    #[default]
    WhenOptedIn,
    /// Always.
    Always,
    /// Never: a base in object storage must be given by the caller.
    Never,
}

impl HintPolicy {
    /// No hints at all: every delta's base is given by the caller.
    pub fn none() -> HintPolicy {
        HintPolicy { paths: PathHints::Ignore, urls: UrlHints::Never }
    }

    /// Hints that lead into the folder (or, for a file opened by URL, the bucket) of the file
    /// a chain is opened at: what the command line and Python follow by default, since a file
    /// from elsewhere must not make the reader open a path of its choosing (spec §7.3).
    pub fn confined() -> HintPolicy {
        HintPolicy { paths: PathHints::WithinStart, urls: UrlHints::WhenOptedIn }
    }

    /// The base that hint `hint` of the file at `at` names, if this policy lets it be followed
    /// from there (`base-missing`, saying why, if not).
    pub fn follow(&self, at: &Location, hint: &str) -> Result<Location, Error> {
        self.resolve(at, at, hint)
    }

    /// The base that hint `hint` of the file at `at` names, if this policy lets it be followed
    /// on a chain that started at `start`.
    fn resolve(&self, start: &Location, at: &Location, hint: &str) -> Result<Location, Error> {
        let base_at = at.resolve_hint(hint)?;
        self.permit(start, hint, &base_at)?;
        Ok(base_at)
    }

    /// Whether this policy follows no hint of `base_at`'s kind (local or URL) at all.
    fn ignores(&self, base_at: &Location) -> bool {
        match base_at {
            Location::Local(_) => self.paths == PathHints::Ignore,
            #[cfg(feature = "object")]
            Location::Object(_) => self.urls == UrlHints::Never,
        }
    }

    /// Checks that hint `hint`, resolved to `base_at`, may be followed on a chain that started
    /// at `start`; a refusal is `base-missing`, saying why.
    fn permit(&self, start: &Location, hint: &str, base_at: &Location) -> Result<(), Error> {
        let paths = self.paths.for_start(start.as_path());
        match base_at {
            Location::Local(p) => paths.check(hint, p)?,
            #[cfg(feature = "object")]
            Location::Object(url) => {
                // A confined reader follows only files within its folder or bucket (spec
                // §7.3): a URL hint only from a chain opened in that URL's bucket, whatever
                // the environment configures.
                if let PathHints::Within(roots) = &paths {
                    if !matches!(start, Location::Object(s) if s.bucket() == url.bucket()) {
                        let roots: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
                        return Err(ReadError::HintRefused {
                            hint: hint.to_owned(),
                            why: format!(
                                "the reader is confined to {} and follows no URL out of the bucket it opened; give the base explicitly",
                                if roots.is_empty() { "the bucket it opened".to_owned() } else { roots.join(", ") }
                            ),
                        }
                        .into());
                    }
                }
                let opted_in = matches!(start, Location::Object(_)) || tpde_object::configured();
                let follow = match self.urls {
                    UrlHints::Always => true,
                    UrlHints::WhenOptedIn => opted_in,
                    UrlHints::Never => false,
                };
                if !follow {
                    let why = match self.urls {
                        UrlHints::Never => "the reader follows no URL hints",
                        _ => "object storage is not configured (no AWS_ENDPOINT_URL or AWS credentials in the environment) and the file was not opened by URL",
                    };
                    return Err(ReadError::HintRefused {
                        hint: hint.to_owned(),
                        why: format!("{why}; give the base explicitly"),
                    }
                    .into());
                }
            }
        }
        Ok(())
    }
}

/// Opens a checkpoint to use as a base: a `.tpde` file, local or remote, with its own chain
/// found through its path hints, a local `.safetensors` file, or a local model folder (its
/// shards, or its one `.safetensors` file: [`crate::sharded::Folder`]).
pub fn open_base(at: &Location) -> Result<Arc<dyn Base>, Error> {
    open_base_with(at, &OpenOptions::default())
}

/// [`open_base`], following the hints `hints` allows.
pub fn open_base_with(at: &Location, opts: &OpenOptions) -> Result<Arc<dyn Base>, Error> {
    match at {
        Location::Local(path) if path.is_dir() => Ok(Arc::new(crate::sharded::open_model_folder(path)?)),
        Location::Local(path) if !is_tpde(path)? => Ok(Arc::new(SafetensorsFile::open(path)?)),
        _ => Ok(Arc::new(open_chain_with(at, opts)?)),
    }
}

/// Opens the `.tpde` file at `at` and, if it decodes against a base, the chain of bases
/// behind it, each attached to the file after it (see [`chain_readers`]).
pub fn open_chain(at: &Location) -> Result<FileReader, Error> {
    open_chain_with(at, &OpenOptions::default())
}

/// [`open_chain`], following the hints `hints` allows.
pub fn open_chain_with(at: &Location, opts: &OpenOptions) -> Result<FileReader, Error> {
    let mut links = chain_readers_with(at, opts)?;
    let (mut base_at, mut reader) = links.pop().expect("a chain holds its first file");
    while let Some((loc, next)) = links.pop() {
        let context = format!("{loc}: base {base_at}");
        reader = next.with_base(Arc::new(reader)).map_err(|e| Error::from(e).context(context))?;
        base_at = loc;
    }
    Ok(reader)
}

/// The file at `at` and the bases behind it, each opened as it is (no base attached): the
/// file first, the one that decodes on its own (its keyframe) last. Each base is found
/// through the path hint of the file that refers to it (relative to that file's folder or
/// bucket key, spec §7.3); its content digest is checked when it is attached. A loop, or a
/// chain longer than [`tpde_read::MAX_CHAIN`], is a `base-chain` error.
pub fn chain_readers(at: &Location) -> Result<Vec<(Location, FileReader)>, Error> {
    chain_readers_with(at, &OpenOptions::default())
}

/// [`chain_readers`], following the hints `hints` allows (a refused one is `base-missing`).
pub fn chain_readers_with(at: &Location, opts: &OpenOptions) -> Result<Vec<(Location, FileReader)>, Error> {
    tpde_read::chain::walk(at.clone(), open_reader_with(at, opts.read)?, Location::identity, |link, reader| {
        let Some(hint) = tpde_read::chain::base_hint(reader).map_err(|e| Error::from(e).context(link))? else {
            return Ok(None);
        };
        let base_at = opts.hints.resolve(at, link, hint).map_err(|e| e.context(link))?;
        match open_present(&base_at, opts.read)? {
            Some(base_reader) => Ok(Some((base_at, base_reader))),
            None => Err(Error::from(ReadError::BaseMissing {
                digest: to_hex(&reader.directory().base.as_ref().expect("a hint has a base").digest),
                hint: base_at.to_string(),
            })
            .context(link)),
        }
    })
}

/// The file at `at` opened, or `None` when there is none: a stat for a local path; for an
/// object, opening it (its first GET answers "not found"), with no HEAD request before it.
fn open_present(at: &Location, read: ReadOptions) -> Result<Option<FileReader>, Error> {
    match at {
        Location::Local(p) if !p.is_file() => Ok(None),
        #[cfg(feature = "object")]
        Location::Object(_) => match open_reader_with(at, read) {
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            opened => opened.map(Some),
        },
        Location::Local(_) => open_reader_with(at, read).map(Some),
    }
}

/// Opens the `.tpde` file at `at` as it is (no base attached); errors name the file.
pub fn open_reader(at: &Location) -> Result<FileReader, Error> {
    open_reader_with(at, ReadOptions::default())
}

/// [`open_reader`] with the reader's settings.
pub fn open_reader_with(at: &Location, read: ReadOptions) -> Result<FileReader, Error> {
    Reader::with_options(at.open()?, read).map_err(|e| Error::from(e).context(at))
}

/// Opens a `.tpde` file for decoding: with `base` given, attached to it; otherwise, if it is a
/// delta, to the base its path hint names (a `.tpde` with its own chain, a `.safetensors`, or a
/// model folder).
/// When the hint leads nowhere the reader is returned as it is, and decoding a delta chunk fails
/// naming the base's digest and hint.
pub fn open_tpde(at: &Location, base: Option<&Location>) -> Result<FileReader, Error> {
    open_tpde_with(at, base, &OpenOptions::default())
}

/// [`open_tpde`], following the hints `hints` allows: a hint it refuses is a `base-missing`
/// error at once, saying why, rather than a file opened without its base.
pub fn open_tpde_with(at: &Location, base: Option<&Location>, opts: &OpenOptions) -> Result<FileReader, Error> {
    let reader = open_reader_with(at, opts.read)?;
    if let Some(b) = base {
        return reader.with_base(open_base_with(b, opts)?).map_err(|e| Error::from(e).context(at));
    }
    let Some(hint) = tpde_read::chain::base_hint(&reader).ok().flatten() else {
        return Ok(reader);
    };
    let base_at = at.resolve_hint(hint).map_err(|e| e.context(at))?;
    // Told to follow no hints of this kind: the file opens as it is, and a delta chunk read
    // without its base fails then (`base-missing`). A hint refused for where it leads is an
    // error now, saying why.
    if opts.hints.ignores(&base_at) {
        return Ok(reader);
    }
    opts.hints.permit(at, hint, &base_at).map_err(|e| e.context(at))?;
    // A hinted base that is not there leaves the reader as it is; a remote one is found
    // missing by opening it, not by a HEAD request first.
    match base_at {
        Location::Local(p) if !p.is_file() && !p.is_dir() => Ok(reader),
        base_at => match open_base_with(&base_at, opts) {
            Err(e) if e.kind() == ErrorKind::NotFound && base_at.as_path().is_none() => Ok(reader),
            opened => {
                reader.with_base(opened?).map_err(|e| Error::from(e).context(format_args!("{at}: base {base_at}")))
            }
        },
    }
}

/// Decodes the bytes `start..start + out.len()` of tensor `t` into `out`, touching only the
/// chunks that overlap them (a slice of a large tensor), in the file and, for a delta, in its
/// chain of TPDE bases. The range must lie within the tensor.
pub fn read_range(r: &FileReader, t: &TensorEntry, start: u64, out: &mut [u8]) -> Result<(), Error> {
    Ok(r.read_range_into(t, start..start + out.len() as u64, out)?)
}
