//! Writing a safetensors file one tensor at a time, for `tpde unpack`.
//!
//! Every tensor's length is known from the TPDE directory, so the header goes first and each
//! tensor's bytes follow as they are decoded. Tensors are decoded in groups, side by side on
//! every core, and written on a thread of their own, so that the next group decodes while this
//! one is written, as `zstd -d` overlaps its output. A few groups are held at a time, in buffers
//! reused from group to group: collecting the whole checkpoint before writing held all of it, in
//! pages faulted in fresh.
//!
//! The header is built with the safetensors crate's own types, from sorted maps, so that two
//! unpacks of one file write the same bytes.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::mpsc;

use rayon::prelude::*;

use safetensors::tensor::TensorInfo;
use safetensors::Dtype;

use crate::CliError;

/// A tensor of the file being written: its bytes come later, from the caller's `decode`.
pub struct Entry {
    /// The tensor's name.
    pub name: String,
    /// Its safetensors dtype.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its length in bytes.
    pub len: usize,
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

/// Logical bytes decoded as one group, tensors side by side: enough to keep every core busy,
/// and at most three groups (one decoding, one queued, one being written) are held.
const GROUP_BYTES: usize = 32 << 20;

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
fn header(entries: &[Entry], order: &[usize], metadata: &BTreeMap<String, String>) -> Result<Vec<u8>, CliError> {
    let json_err = |e: serde_json::Error| CliError::failed(format!("safetensors header: {e}"));
    let mut map = serde_json::Map::new();
    if !metadata.is_empty() {
        map.insert("__metadata__".into(), serde_json::to_value(metadata).map_err(json_err)?);
    }
    let mut offset = 0usize;
    for &i in order {
        let e = &entries[i];
        let info = TensorInfo { dtype: e.dtype, shape: e.shape.clone(), data_offsets: (offset, offset + e.len) };
        offset += e.len;
        if map.insert(e.name.clone(), serde_json::to_value(info).map_err(json_err)?).is_some() {
            return Err(CliError::failed(format!("tensor {:?} appears twice", e.name)));
        }
    }
    let mut json = serde_json::to_vec(&map).map_err(json_err)?;
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    Ok(out)
}

/// Writes `entries` to `output` atomically (a temporary file in the same folder, renamed into
/// place once complete and synced). `decode(i, buf)` produces the bytes of `entries[i]`: either
/// it returns them borrowed, or it fills `buf` (a reused buffer of any length and content) with
/// exactly them and returns `None`. The first error, from `decode` or from writing, stops the
/// write and leaves nothing under `output`.
pub fn write<'a>(
    output: &Path,
    entries: &[Entry],
    metadata: &BTreeMap<String, String>,
    decode: impl Fn(usize, &mut Vec<u8>) -> Result<Option<&'a [u8]>, CliError> + Sync,
) -> Result<(), CliError> {
    let order = layout(entries);
    let header = header(entries, &order, metadata)?;
    let dir = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::Builder::new().prefix(".tpde-unpack.").suffix(".partial").tempfile_in(dir)?;
    let mut file = tmp.as_file();
    file.write_all(&header)?;
    std::thread::scope(|s| -> Result<(), CliError> {
        // One group queued while one is written; buffers come back to be decoded into again.
        let (full, to_write) = mpsc::sync_channel::<Vec<Cow<'a, [u8]>>>(1);
        let (give_back, spare) = mpsc::channel::<Vec<u8>>();
        let writer = s.spawn(move || -> std::io::Result<()> {
            for group in to_write {
                for data in group {
                    file.write_all(&data)?;
                    if let Cow::Owned(buf) = data {
                        // The decoder may have finished; then the buffer is simply dropped.
                        let _ = give_back.send(buf);
                    }
                }
            }
            Ok(())
        });
        let mut free: Vec<Vec<u8>> = Vec::new();
        let mut decoded = Ok(());
        'groups: for group in groups(entries, &order) {
            free.extend(spare.try_iter());
            let mut bufs: Vec<Vec<u8>> = group.iter().map(|&i| take_buffer(&mut free, entries[i].len)).collect();
            // The group's tensors side by side: most are one chunk, which decodes on one core.
            let results: Vec<_> = group.par_iter().zip(bufs.par_iter_mut()).map(|(&i, buf)| decode(i, buf)).collect();
            let mut out = Vec::with_capacity(group.len());
            for ((&i, buf), result) in group.iter().zip(bufs).zip(results) {
                match result {
                    Ok(Some(borrowed)) => {
                        free.push(buf);
                        out.push(Cow::Borrowed(borrowed));
                    }
                    Ok(None) if buf.len() == entries[i].len => out.push(Cow::Owned(buf)),
                    Ok(None) => {
                        let e = &entries[i];
                        decoded = Err(CliError::failed(format!(
                            "tensor {:?}: {} bytes decoded, {} expected",
                            e.name,
                            buf.len(),
                            e.len
                        )));
                        break 'groups;
                    }
                    Err(e) => {
                        decoded = Err(e);
                        break 'groups;
                    }
                }
            }
            if full.send(out).is_err() {
                break; // The writer stopped on an error.
            }
        }
        drop(full);
        let written = writer.join().expect("the writer thread does not panic");
        decoded?;
        Ok(written?)
    })?;
    file.sync_all()?;
    tmp.persist(output).map_err(|e| CliError::from(e.error))?;
    Ok(())
}

/// The spare buffer to decode `len` bytes into: the smallest that holds them, else the largest.
/// A buffer that must grow faults in fresh pages and zeroes them, which measured a tenth of an
/// unpack's time when each tensor took whichever buffer came back first.
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

    fn entry(name: &str, dtype: Dtype, shape: &[usize], size: usize) -> Entry {
        Entry { name: name.into(), dtype, shape: shape.to_vec(), len: shape.iter().product::<usize>() * size }
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
        ];
        let data: Vec<Vec<u8>> =
            entries.iter().enumerate().map(|(i, e)| (0..e.len).map(|j| (i * 31 + j) as u8).collect()).collect();
        let meta: BTreeMap<String, String> = [("z".to_string(), "1".to_string()), ("a".into(), "2".into())].into();
        let mut files = Vec::new();
        for run in 0..2 {
            let path = dir.path().join(format!("out{run}.safetensors"));
            // Borrowed on one run, decoded into the reused buffer on the other.
            write(&path, &entries, &meta, |i, buf| {
                Ok(if run == 0 {
                    Some(&data[i][..])
                } else {
                    buf.clear();
                    buf.extend_from_slice(&data[i]);
                    None
                })
            })
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
        assert_eq!(header.offset_keys(), ["d", "a", "c", "b"]);
    }

    #[test]
    fn a_failed_decode_leaves_nothing_under_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.safetensors");
        let entries = vec![entry("a", Dtype::U8, &[4], 1), entry("b", Dtype::U8, &[4], 1)];
        let err = write(&path, &entries, &BTreeMap::new(), |i, buf| {
            if i == 1 {
                return Err(CliError::failed("chunk 0 of b is corrupt"));
            }
            buf.resize(4, 7);
            Ok(None)
        })
        .unwrap_err();
        assert!(err.message.contains("corrupt"), "{}", err.message);
        let short = write(&path, &entries, &BTreeMap::new(), |_, buf| {
            buf.resize(3, 0);
            Ok(None)
        })
        .unwrap_err();
        assert!(short.message.contains("3 bytes decoded, 4 expected"), "{}", short.message);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no output and no temporary file");
    }
}
