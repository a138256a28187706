//! Random access to a file's bytes by range, written once for every backing: an mmap or bytes
//! in memory, which lend their ranges, and a stream (`Read + Seek`), which copies them.

use std::borrow::Cow;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::sync::Mutex;

/// Bytes the reader can fetch by range.
pub trait Source: Sync {
    /// Total length in bytes.
    fn len(&self) -> u64;
    /// The bytes in `range`, or `None` if it is not inside the source (or cannot be read).
    /// Sources in memory lend them; streams return a copy.
    fn get(&self, range: Range<u64>) -> Option<Cow<'_, [u8]>>;
    /// Whether the source is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn slice_get(bytes: &[u8], range: Range<u64>) -> Option<Cow<'_, [u8]>> {
    let start = usize::try_from(range.start).ok()?;
    let end = usize::try_from(range.end).ok()?;
    bytes.get(start..end).map(Cow::Borrowed)
}

impl Source for [u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
    fn get(&self, range: Range<u64>) -> Option<Cow<'_, [u8]>> {
        slice_get(self, range)
    }
}

impl Source for Vec<u8> {
    fn len(&self) -> u64 {
        self.as_slice().len() as u64
    }
    fn get(&self, range: Range<u64>) -> Option<Cow<'_, [u8]>> {
        slice_get(self, range)
    }
}

impl Source for memmap2::Mmap {
    fn len(&self) -> u64 {
        (**self).len() as u64
    }
    fn get(&self, range: Range<u64>) -> Option<Cow<'_, [u8]>> {
        slice_get(self, range)
    }
}

impl<S: Source + ?Sized> Source for &S {
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn get(&self, range: Range<u64>) -> Option<Cow<'_, [u8]>> {
        (**self).get(range)
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

    fn get(&self, range: Range<u64>) -> Option<Cow<'_, [u8]>> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        let mut buf = vec![0u8; usize::try_from(range.end - range.start).ok()?];
        // A panic while holding the lock cannot leave the stream worse than a failed seek.
        let mut inner = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        inner.seek(SeekFrom::Start(range.start)).ok()?;
        inner.read_exact(&mut buf).ok()?;
        Some(Cow::Owned(buf))
    }
}
