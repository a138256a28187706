//! Unpacking: a `.tpde` file decoded back into safetensors. One way out, [`unpack`]: one file,
//! or the folder of shards a sharded folder was packed from. The pieces below it write any
//! selection of tensors, decoded chunk by chunk (the Python binding and the GPU unpack use
//! them).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use tpde_format::metadata::RESERVED_PREFIX;
use tpde_format::{ErrorKind, TensorEntry};
use tpde_read::TensorChunks;
use tpde_write::AtomicFolder;

use crate::location::{FileReader, Location, Stored};
use crate::open::{open_reader, open_tpde_with, OpenOptions};
use crate::safetensors::{dtype_to_safetensors, write as safetensors_out};
use crate::sharded::{Layout, KEY_INDEX, KEY_SHARDS};
use crate::{Error, Progress};

/// What an unpack did.
#[derive(Clone, Copy, Debug, Default)]
pub struct UnpackReport {
    /// Tensors written.
    pub tensors: u64,
    /// Logical tensor bytes.
    pub logical_bytes: u64,
    /// Wall time.
    pub seconds: f64,
}

/// The safetensors `__metadata__` map a TPDE file carries: every non-reserved entry but a
/// model folder's layout ([`crate::sharded`]), strings as they are and other types in their
/// text form.
pub fn safetensors_metadata<S: tpde_read::Source>(r: &tpde_read::Reader<S>) -> BTreeMap<String, String> {
    r.directory()
        .metadata
        .iter()
        .filter(|m| !m.key.starts_with(RESERVED_PREFIX) && m.key != KEY_INDEX && m.key != KEY_SHARDS)
        .map(|m| (m.key.clone(), m.value.to_string()))
        .collect()
}

/// Whether the TPDE file at `at` was packed from a model folder (it records a layout).
pub fn is_sharded(at: &Location) -> Result<bool, Error> {
    let r = open_reader(at)?;
    Ok(r.directory().metadata.iter().any(|m| m.key == KEY_SHARDS))
}

/// Whether `tpde unpack` of `input` to `output` writes a folder: when the file was packed from a
/// model folder, unless `output` ends in `.safetensors` (then one file holds every tensor).
pub fn unpacks_to_folder(input: &Location, output: &Path) -> Result<bool, Error> {
    Ok(folder_output(output) && is_sharded(input)?)
}

fn folder_output(output: &Path) -> bool {
    output.extension().is_none_or(|e| e != "safetensors")
}

/// Decodes every tensor of the TPDE file at `source` (CRCs checked) and writes it to `target`,
/// chunk by chunk: one safetensors file, written atomically (see [`safetensors_out`]); or, for a
/// file packed from a model folder and a `target` that does not end in `.safetensors`, that
/// folder again ([`crate::sharded`]: the files beside the weights, every shard, then the index). A delta decodes against
/// `base` if given, else against the chain its path hints name. The one way out, for every
/// front end.
pub fn unpack(
    source: &Location,
    base: Option<&Location>,
    target: &Path,
    bar: &dyn Progress,
) -> Result<UnpackReport, Error> {
    unpack_with(source, base, target, &OpenOptions::default(), false, bar)
}

/// [`unpack`], opening `source` and its bases with `opts` (which hints to follow); a folder
/// `target` that has files is replaced whole if `replace`, else refused.
pub fn unpack_with(
    source: &Location,
    base: Option<&Location>,
    target: &Path,
    opts: &OpenOptions,
    replace: bool,
    bar: &dyn Progress,
) -> Result<UnpackReport, Error> {
    let start = Instant::now();
    let r = open_tpde_with(source, base, opts)?;
    let layout = match folder_output(target) {
        true => Layout::of(&r).map_err(|e| e.context(source))?,
        false => None,
    };
    match layout {
        Some(layout) => write_folder(&r, &layout, target, replace, bar)?,
        None => unpack_open(&r, target, bar)?,
    }
    Ok(unpack_report(&r, start))
}

/// Writes every tensor of a file already open to the safetensors file `output`.
pub(crate) fn unpack_open(r: &FileReader, output: &Path, bar: &dyn Progress) -> Result<(), Error> {
    let all: Vec<usize> = (0..r.tensors().len()).collect();
    bar.set_length(r.tensors().iter().map(|t| t.byte_length).sum());
    unpack_tensors(r, &all, &safetensors_metadata(r), output, bar)?;
    bar.finish();
    Ok(())
}

/// Writes the tensors `select` (indices into `r.tensors()`) of an open file, with `metadata`,
/// to the safetensors file `output`, decoding chunk by chunk.
pub fn unpack_tensors(
    r: &FileReader,
    select: &[usize],
    metadata: &BTreeMap<String, String>,
    output: &Path,
    bar: &dyn Progress,
) -> Result<(), Error> {
    // A tensor stored `raw` in one run is written straight from the map, in one piece.
    enum Opened<'r> {
        Whole(Cow<'r, [u8]>),
        Chunks(TensorChunks<'r, Stored>),
    }
    let pieces = |t: &TensorEntry| match r.is_zero_copy(t) {
        true => vec![t.byte_length],
        false => t.chunks.iter().map(|c| c.decoded_length).collect(),
    };
    write_unpacked(
        r,
        select,
        metadata,
        output,
        bar,
        pieces,
        |t| Ok(if r.is_zero_copy(t) { Opened::Whole(r.read_tensor(t)?) } else { Opened::Chunks(r.tensor_chunks(t)?) }),
        |opened, i, buf| match opened {
            Opened::Whole(bytes) => Ok(bytes),
            Opened::Chunks(chunks) => {
                // Validation bounds a chunk's decoded length (MAX_CHUNK_DECODED_LEN, 1 GiB).
                buf.resize(chunks.tensor().chunks[i].decoded_length as usize, 0);
                chunks.decode_into(i, buf)?;
                Ok(buf)
            }
        },
    )
}

/// Writes the tensors `select` of `r` to a safetensors file with `metadata`, as
/// [`safetensors_out::write`] does: each tensor in the pieces of `pieces(t)`, readied by `open`
/// and produced by `piece`. Progress goes to `bar` (whose length the caller sets).
#[allow(clippy::too_many_arguments)]
pub fn write_unpacked<'r, T: Send + Sync>(
    r: &'r FileReader,
    select: &[usize],
    metadata: &BTreeMap<String, String>,
    output: &Path,
    bar: &dyn Progress,
    pieces: impl Fn(&TensorEntry) -> Vec<u64>,
    open: impl Fn(&'r TensorEntry) -> Result<T, Error> + Sync,
    piece: impl for<'p> Fn(&'p T, usize, &'p mut Vec<u8>) -> Result<&'p [u8], Error> + Sync,
) -> Result<(), Error> {
    let too_large = |t: &TensorEntry| {
        Error::new(ErrorKind::LimitExceeded, format!("tensor {:?}: too large for this platform", t.name))
    };
    let entries = select
        .iter()
        .map(|&i| {
            let t = &r.tensors()[i];
            let shape = t.shape.iter().map(|&d| usize::try_from(d)).collect::<Result<Vec<_>, _>>();
            let shape = shape.map_err(|_| {
                Error::new(ErrorKind::LimitExceeded, format!("tensor {:?}: shape does not fit this platform", t.name))
            })?;
            let len = usize::try_from(t.byte_length).map_err(|_| too_large(t))?;
            let pieces =
                pieces(t).into_iter().map(usize::try_from).collect::<Result<_, _>>().map_err(|_| too_large(t))?;
            Ok(safetensors_out::Entry {
                name: t.name.clone(),
                dtype: dtype_to_safetensors(t.dtype),
                shape,
                len,
                pieces,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    safetensors_out::write(
        output,
        &entries,
        metadata,
        |i| open(&r.tensors()[select[i]]),
        |opened, j, buf| {
            if bar.cancelled() {
                return Err(crate::interrupted()); // the unfinished file goes with the error
            }
            let bytes = piece(opened, j, buf)?;
            bar.inc(bytes.len() as u64);
            Ok(bytes)
        },
    )
}

/// The report of an unpack of `r` that started at `start`.
pub fn unpack_report(r: &FileReader, start: Instant) -> UnpackReport {
    UnpackReport {
        tensors: r.tensors().len() as u64,
        logical_bytes: r.tensors().iter().map(|t| t.byte_length).sum(),
        seconds: start.elapsed().as_secs_f64(),
    }
}

/// The refusal of an unpack into a folder that has files, naming the way to ask for it.
fn refuse_folder(output: &Path) -> Error {
    Error::usage(format!(
        "{}: a folder with files is there; an unpack replaces a folder whole, never mixing two versions: \
         pass --replace (Python: replace=True) to replace it, or unpack into a new folder",
        output.display()
    ))
}

/// Writes the folder `layout` records from the open file `r` into `output`: the files beside
/// the weights (`tpde.files`), every shard, and the index, written from the layout (spec §5.5: a
/// file table never carries it). The whole table is checked before anything is written, and the
/// folder is written beside its place and put there only when whole, replacing a folder with
/// files only if `replace` (in one exchange), so a refused, failed or killed unpack leaves the
/// old folder or the new one, never a mix (see [`AtomicFolder`]).
fn write_folder(
    r: &FileReader,
    layout: &Layout,
    output: &Path,
    replace: bool,
    bar: &dyn Progress,
) -> Result<(), Error> {
    if !replace && std::fs::read_dir(output).is_ok_and(|mut d| d.next().is_some()) {
        return Err(refuse_folder(output));
    }
    let files = r.files()?;
    // Shards and the index have plain names (checked by `Layout::of`): only the table's paths
    // have folders.
    crate::files::check_destination(files.iter().map(|f| f.path.as_str()), layout)?;
    let folder = AtomicFolder::create(output).map_err(|e| Error::from(e).context(output.display()))?;
    let staging = folder.staging();
    crate::files::write(staging, &files)?;
    let index_of: std::collections::HashMap<&str, usize> =
        r.tensors().iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
    bar.set_length(r.tensors().iter().map(|t| t.byte_length).sum());
    for shard in &layout.shards {
        let select: Vec<usize> = shard.tensors.iter().map(|t| index_of[t.as_str()]).collect();
        unpack_tensors(r, &select, &shard.metadata.clone().unwrap_or_default(), &staging.join(&shard.file), bar)?;
    }
    if let Some(index_name) = &layout.index_name {
        let path = staging.join(index_name);
        let io = |e: std::io::Error| Error::from(e).context(output.join(index_name).display());
        let mut f = tpde_write::AtomicFile::create(&path).map_err(io)?;
        std::io::Write::write_all(&mut f, layout.index_text()?.as_bytes()).map_err(io)?;
        f.commit().map_err(io)?;
    }
    folder.commit(replace).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => refuse_folder(output),
        _ => Error::from(e).context(output.display()),
    })?;
    bar.finish();
    Ok(())
}
