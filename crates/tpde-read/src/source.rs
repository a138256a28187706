//! Random access to a file's bytes by range, written once for every backing: an mmap or bytes
//! in memory, which lend their ranges, a stream (`Read + Seek`), which copies them, and remote
//! objects (the `tpde-object` crate), which fetch them ahead through [`Source::prefetch`].

use std::borrow::Cow;
use std::io::{self, Read, Seek, SeekFrom};
use std::ops::Range;
use std::sync::Mutex;

/// Bytes the reader can fetch by range.
pub trait Source: Sync {
    /// Total length in bytes.
    fn len(&self) -> u64;
    /// The bytes in `range`. A range not inside the source is an error of kind
    /// [`io::ErrorKind::UnexpectedEof`] (the reader reports it as a truncated file); any other
    /// error is a failure to read (a disk, a network), reported as such. Sources in memory
    /// lend the bytes; others return a copy.
    fn get(&self, range: Range<u64>) -> io::Result<Cow<'_, [u8]>>;
    /// Whether the source is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// For a source that fetches over a network: the stored bytes a reader should announce
    /// at once through [`Source::prefetch`] before it `get`s them. `None` (the default) for
    /// sources whose bytes are at hand, which are never asked to prefetch.
    fn prefetch_window(&self) -> Option<u64> {
        None
    }
    /// Fetches `ranges` ahead of the `get`s that follow, so that a remote source can coalesce
    /// neighbours into few requests and send independent ones concurrently.
    fn prefetch(&self, _ranges: &[Range<u64>]) -> io::Result<()> {
        Ok(())
    }
    /// For a source that fetches over a network: the bytes in `range` fetched again, past any
    /// copy it holds, after they failed their CRC (a response damaged in transit). `None` (the
    /// default) for sources whose bytes are at hand: a CRC that fails there fails for good.
    fn refetch(&self, _range: Range<u64>) -> Option<io::Result<Vec<u8>>> {
        None
    }
}

/// The error for a range outside a source of `len` bytes.
pub fn out_of_range(range: &Range<u64>, len: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("bytes {}..{} are not inside the {len} bytes of the source", range.start, range.end),
    )
}

fn slice_get(bytes: &[u8], range: Range<u64>) -> io::Result<Cow<'_, [u8]>> {
    let len = bytes.len() as u64;
    let fits = |r: &Range<u64>| Some((usize::try_from(r.start).ok()?, usize::try_from(r.end).ok()?));
    fits(&range)
        .and_then(|(start, end)| bytes.get(start..end))
        .map(Cow::Borrowed)
        .ok_or_else(|| out_of_range(&range, len))
}

impl Source for [u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
    fn get(&self, range: Range<u64>) -> io::Result<Cow<'_, [u8]>> {
        slice_get(self, range)
    }
}

impl Source for Vec<u8> {
    fn len(&self) -> u64 {
        self.as_slice().len() as u64
    }
    fn get(&self, range: Range<u64>) -> io::Result<Cow<'_, [u8]>> {
        slice_get(self, range)
    }
}

impl Source for memmap2::Mmap {
    fn len(&self) -> u64 {
        (**self).len() as u64
    }
    fn get(&self, range: Range<u64>) -> io::Result<Cow<'_, [u8]>> {
        slice_get(self, range)
    }
}

impl<S: Source + ?Sized> Source for &S {
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn get(&self, range: Range<u64>) -> io::Result<Cow<'_, [u8]>> {
        (**self).get(range)
    }
    fn prefetch_window(&self) -> Option<u64> {
        (**self).prefetch_window()
    }
    fn prefetch(&self, ranges: &[Range<u64>]) -> io::Result<()> {
        (**self).prefetch(ranges)
    }
}

/// A file read through `Read + Seek` (a pipe-free stream, a network object behind a seekable
/// adapter, a file without mmap): each range is read into a fresh buffer under a lock. The
/// reader only asks for ranges inside the length found at construction, so what it allocates
/// is what the stream holds.
pub struct StreamSource<R> {
    inner: Mutex<R>,
    len: u64,
}

impl<R: Read + Seek> StreamSource<R> {
    /// Wraps `inner`, finding its length by seeking to its end.
    pub fn new(mut inner: R) -> std::io::Result<Self> {
        let len = inner.seek(SeekFrom::End(0))?;
        Ok(StreamSource { inner: Mutex::new(inner), len })
    }

    /// The stream back.
    pub fn into_inner(self) -> R {
        self.inner.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<R: Read + Seek + Send> Source for StreamSource<R> {
    fn len(&self) -> u64 {
        self.len
    }

    fn get(&self, range: Range<u64>) -> io::Result<Cow<'_, [u8]>> {
        if range.start > range.end || range.end > self.len {
            return Err(out_of_range(&range, self.len));
        }
        let len = usize::try_from(range.end - range.start).map_err(|_| out_of_range(&range, self.len))?;
        let mut buf = vec![0u8; len];
        // A panic while holding the lock cannot leave the stream worse than a failed seek.
        let mut inner = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        inner.seek(SeekFrom::Start(range.start))?;
        inner.read_exact(&mut buf)?;
        Ok(Cow::Owned(buf))
    }
}
