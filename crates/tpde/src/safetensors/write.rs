//! Writing a safetensors file piece by piece, for `tpde unpack`.
//!
//! Every tensor's length is known from the TPDE directory, so the header goes first and every
//! tensor's place in the file is known before any is decoded. Each tensor comes in pieces (a
//! TPDE tensor's chunks) that decode side by side on every core, each into a small buffer
//! reused from piece to piece, and each is written at its own offset as soon as it is done.
//! Decoding whole tensors into buffers of their own and writing them from another thread spent
//! a fifth of a one-thread unpack faulting in and zeroing fresh pages, and more unmapping them.
//!
//! The header is built with the safetensors crate's own types, from sorted maps, so that two
//! unpacks of one file write the same bytes.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use rayon::prelude::*;

use safetensors::tensor::TensorInfo;
use safetensors::Dtype;

use crate::Error;
use tpde_format::ErrorKind;

/// A tensor of the file being written: its bytes come later, piece by piece, from the caller.
pub struct Entry {
    /// The tensor's name.
    pub name: String,
    /// Its safetensors dtype.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its length in bytes.
    pub len: usize,
    /// The lengths of the pieces its bytes come in, in order; they sum to `len`.
    pub pieces: Vec<usize>,
}

/// The order tensors are laid out in: descending dtype alignment, then name, the safetensors
/// crate's order, so that every tensor starts aligned to its element size.
fn layout(entries: &[Entry]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&entries[a], &entries[b]);
        b.dtype.cmp(&a.dtype).then_with(|| a.name.cmp(&b.name))
    });
    order
}

/// Logical bytes of the tensors open at a time: whatever the caller's `open` holds for a tensor
/// (a base tensor decoded from a chain of deltas) is held for one group at a time.
const GROUP_BYTES: usize = 64 << 20;

/// `order` cut into runs of about [`GROUP_BYTES`] (a larger tensor is a group of its own).
fn groups<'o>(entries: &[Entry], order: &'o [usize]) -> Vec<&'o [usize]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (k, &i) in order.iter().enumerate() {
        bytes += entries[i].len;
        if bytes >= GROUP_BYTES || k + 1 == order.len() {
            out.push(&order[start..=k]);
            (start, bytes) = (k + 1, 0);
        }
    }
    out
}

/// The header (its `u64` length, then JSON padded with spaces to a multiple of 8) for `entries`
/// laid out in `order`.
fn header(entries: &[Entry], order: &[usize], metadata: &BTreeMap<String, String>) -> Result<Vec<u8>, Error> {
    let json_err = |e: serde_json::Error| Error::new(ErrorKind::InvalidArgument, format!("safetensors header: {e}"));
    // As the safetensors library writes it (so that a file it wrote comes back byte for byte):
    // the metadata first, then the tensors in the order of their data, each as dtype, shape,
    // data_offsets. (A serde_json map would sort the keys.)
    let mut pairs: Vec<(String, String)> = Vec::with_capacity(order.len() + 1);
    if !metadata.is_empty() {
        pairs.push(("__metadata__".into(), serde_json::to_string(metadata).map_err(json_err)?));
    }
    let mut names = std::collections::HashSet::new();
    let mut offset = 0usize;
    for &i in order {
        let e = &entries[i];
        if !names.insert(e.name.as_str()) {
            return Err(Error::new(ErrorKind::InvalidArgument, format!("tensor {:?} appears twice", e.name)));
        }
        let info = TensorInfo { dtype: e.dtype, shape: e.shape.clone(), data_offsets: (offset, offset + e.len) };
        offset += e.len;
        pairs.push((e.name.clone(), serde_json::to_string(&info).map_err(json_err)?));
    }
    let mut json = b"{".to_vec();
    for (k, (key, value)) in pairs.iter().enumerate() {
        if k > 0 {
            json.push(b',');
        }
        json.extend_from_slice(serde_json::to_string(key).map_err(json_err)?.as_bytes());
        json.push(b':');
        json.extend_from_slice(value.as_bytes());
    }
    json.push(b'}');
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    Ok(out)
}

/// One piece to produce: piece `piece` of the tensor at `slot` in its group, of `len` bytes at
/// `offset` in the file.
struct Job {
    slot: usize,
    piece: usize,
    offset: u64,
    len: usize,
}

/// Writes `entries` to `output` atomically ([`tpde_write::AtomicFile`]). `open(i)` readies `entries[i]` once (a group of tensors at a
/// time); `piece(opened, j, buf)` then produces its piece `j`: bytes borrowed from what `open`
/// returned, or written into `buf` (a reused buffer of any length and content). The first error
/// in file order, from either or from writing, is returned, and nothing is left under `output`.
pub fn write<T: Send + Sync>(
    output: &Path,
    entries: &[Entry],
    metadata: &BTreeMap<String, String>,
    open: impl Fn(usize) -> Result<T, Error> + Sync,
    piece: impl for<'p> Fn(&'p T, usize, &'p mut Vec<u8>) -> Result<&'p [u8], Error> + Sync,
) -> Result<(), Error> {
    let order = layout(entries);
    let header = header(entries, &order, metadata)?;
    // A write that fails (a full disk) names the file it was writing.
    let writing = |e: std::io::Error| Error::from(e).context(output.display()).located();
    let tmp = tpde_write::AtomicFile::create(output).map_err(writing)?;
    let file = tmp.file();
    write_at(file, &header, 0).map_err(writing)?;
    let spare = Mutex::new(Vec::new());
    let mut offset = header.len() as u64;
    for group in groups(entries, &order) {
        let mut jobs = Vec::new();
        for (slot, &tensor) in group.iter().enumerate() {
            for (piece, &len) in entries[tensor].pieces.iter().enumerate() {
                jobs.push(Job { slot, piece, offset, len });
                offset += len as u64;
            }
        }
        let opened: Vec<OnceLock<Result<T, Error>>> = group.iter().map(|_| OnceLock::new()).collect();
        // Pieces after a failed one are skipped; those before it still run, so the error
        // reported is the first in file order whatever the scheduling.
        let failed = AtomicUsize::new(usize::MAX);
        let errors = Mutex::new(Vec::new());
        jobs.par_iter().enumerate().for_each(|(n, job)| {
            if n > failed.load(Ordering::Relaxed) {
                return;
            }
            let mut buf = take_buffer(&mut spare.lock().expect("no panics while held"), job.len);
            let done = (|| {
                let t = opened[job.slot].get_or_init(|| open(group[job.slot])).as_ref().map_err(Clone::clone)?;
                let bytes = piece(t, job.piece, &mut buf)?;
                if bytes.len() != job.len {
                    let e = &entries[group[job.slot]];
                    return Err(Error::malformed(format!(
                        "tensor {:?}: {} bytes decoded for piece {}, {} expected",
                        e.name,
                        bytes.len(),
                        job.piece,
                        job.len
                    )));
                }
                write_at(file, bytes, job.offset).map_err(writing)
            })();
            spare.lock().expect("no panics while held").push(buf);
            if let Err(e) = done {
                failed.fetch_min(n, Ordering::Relaxed);
                errors.lock().expect("no panics while held").push((n, e));
            }
        });
        if let Some((_, e)) = errors.into_inner().expect("no panics while held").into_iter().min_by_key(|(n, _)| *n) {
            return Err(e);
        }
    }
    tmp.commit().map(drop).map_err(writing)
}

/// Writes all of `data` at `offset` in `file`, from any thread.
#[cfg(unix)]
fn write_at(file: &File, data: &[u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, data, offset)
}

/// Writes all of `data` at `offset` in `file`, from any thread.
#[cfg(windows)]
fn write_at(file: &File, mut data: &[u8], mut offset: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !data.is_empty() {
        match file.seek_write(data, offset)? {
            0 => return Err(std::io::ErrorKind::WriteZero.into()),
            n => (data, offset) = (&data[n..], offset + n as u64),
        }
    }
    Ok(())
}

/// The spare buffer to decode `len` bytes into: the smallest that holds them, else the largest.
/// A buffer that must grow faults in fresh pages and zeroes them.
fn take_buffer(free: &mut Vec<Vec<u8>>, len: usize) -> Vec<u8> {
    let fits = (0..free.len()).filter(|&k| free[k].capacity() >= len).min_by_key(|&k| free[k].capacity());
    match fits.or_else(|| (0..free.len()).max_by_key(|&k| free[k].capacity())) {
        Some(k) => free.swap_remove(k),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry in pieces of at most 3 bytes.
    fn entry(name: &str, dtype: Dtype, shape: &[usize], size: usize) -> Entry {
        let len = shape.iter().product::<usize>() * size;
        let pieces = (0..len).step_by(3).map(|at| (len - at).min(3)).collect();
        Entry { name: name.into(), dtype, shape: shape.to_vec(), len, pieces }
    }

    #[test]
    fn a_tensor_takes_the_smallest_spare_buffer_that_holds_it_else_the_largest() {
        let mut free: Vec<Vec<u8>> = [10, 40, 20].map(Vec::with_capacity).into();
        assert_eq!(take_buffer(&mut free, 15).capacity(), 20);
        assert_eq!(take_buffer(&mut free, 100).capacity(), 40);
        assert_eq!(take_buffer(&mut free, 1).capacity(), 10);
        assert_eq!(take_buffer(&mut free, 1).capacity(), 0);
    }

    #[test]
    fn written_file_reads_back_and_is_deterministic() {
        let dir = tempfile::tempdir().unwrap();
        let entries = vec![
            entry("b", Dtype::U8, &[3], 1),
            entry("a", Dtype::F32, &[2, 2], 4),
            entry("c", Dtype::F16, &[0], 2),
            entry("d", Dtype::I64, &[], 8),
            entry("e", Dtype::U16, &[1000], 2),
        ];
        let data: Vec<Vec<u8>> =
            entries.iter().enumerate().map(|(i, e)| (0..e.len).map(|j| (i * 31 + j) as u8).collect()).collect();
        let meta: BTreeMap<String, String> = [("z".to_string(), "1".to_string()), ("a".into(), "2".into())].into();
        let mut files = Vec::new();
        for run in 0..2 {
            let path = dir.path().join(format!("out{run}.safetensors"));
            // Borrowed from what `open` gave on one run, written into the reused buffer on the
            // other.
            write(
                &path,
                &entries,
                &meta,
                |i| Ok(&data[i][..]),
                |bytes, j, buf| {
                    let piece = &bytes[j * 3..(j * 3 + 3).min(bytes.len())];
                    if run == 0 {
                        return Ok(piece);
                    }
                    buf.clear();
                    buf.extend_from_slice(piece);
                    Ok(buf)
                },
            )
            .unwrap();
            files.push(std::fs::read(&path).unwrap());
        }
        assert_eq!(files[0], files[1]);
        let st = safetensors::SafeTensors::deserialize(&files[0]).unwrap();
        for (e, d) in entries.iter().zip(&data) {
            let t = st.tensor(&e.name).unwrap();
            assert_eq!((t.dtype(), t.shape(), t.data()), (e.dtype, &e.shape[..], &d[..]));
        }
        let (_, header) = safetensors::SafeTensors::read_metadata(&files[0]).unwrap();
        let meta_back: BTreeMap<String, String> = header.metadata().clone().unwrap().into_iter().collect();
        assert_eq!(meta_back, meta);
        // Descending alignment: the I64 scalar first, the U8 tensor last.
        assert_eq!(header.offset_keys(), ["d", "a", "c", "e", "b"]);
    }

    #[test]
    fn the_first_error_in_file_order_is_returned_and_nothing_is_left_under_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.safetensors");
        // Many pieces, so that the failing ones are decoded side by side, in any order.
        let entries = vec![entry("a", Dtype::U8, &[3000], 1), entry("b", Dtype::U8, &[4], 1)];
        let ok = |_: usize| Ok(());
        fn fill(buf: &mut Vec<u8>, len: usize) -> &[u8] {
            buf.resize(len, 7);
            buf
        }
        for _ in 0..20 {
            let err = write(&path, &entries, &BTreeMap::new(), ok, |_, j, buf| match j {
                300 | 600 | 900 => Err(Error::malformed(format!("piece {j} is corrupt"))),
                _ => Ok(fill(buf, 3)),
            })
            .unwrap_err();
            assert_eq!(err.message, "piece 300 is corrupt");
        }
        let open_err = write(
            &path,
            &entries,
            &BTreeMap::new(),
            |i| if i == 1 { Err(Error::malformed("the base has no b")) } else { Ok(()) },
            |_, j, buf| Ok(fill(buf, entries[0].pieces[j])),
        )
        .unwrap_err();
        assert_eq!(open_err.message, "the base has no b");
        let short = write(&path, &entries, &BTreeMap::new(), ok, |_, _, buf| Ok(fill(buf, 2))).unwrap_err();
        assert!(short.message.contains("\"a\": 2 bytes decoded for piece 0, 3 expected"), "{}", short.message);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no output and no temporary file");
    }
}
