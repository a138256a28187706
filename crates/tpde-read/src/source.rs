//! Random access to a file's bytes by range, written once for every backing: an mmap, bytes
//! in memory, or anything else that can hand out borrowed ranges.

use std::ops::Range;

/// Bytes the reader can borrow ranges of.
pub trait Source: Sync {
    /// Total length in bytes.
    fn len(&self) -> u64;
    /// The bytes in `range`, or `None` if it is not inside the source.
    fn get(&self, range: Range<u64>) -> Option<&[u8]>;
    /// Whether the source is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn slice_get(bytes: &[u8], range: Range<u64>) -> Option<&[u8]> {
    let start = usize::try_from(range.start).ok()?;
    let end = usize::try_from(range.end).ok()?;
    bytes.get(start..end)
}

impl Source for [u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
    fn get(&self, range: Range<u64>) -> Option<&[u8]> {
        slice_get(self, range)
    }
}

impl Source for Vec<u8> {
    fn len(&self) -> u64 {
        self.as_slice().len() as u64
    }
    fn get(&self, range: Range<u64>) -> Option<&[u8]> {
        slice_get(self, range)
    }
}

impl Source for memmap2::Mmap {
    fn len(&self) -> u64 {
        (**self).len() as u64
    }
    fn get(&self, range: Range<u64>) -> Option<&[u8]> {
        slice_get(self, range)
    }
}

impl<S: Source + ?Sized> Source for &S {
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn get(&self, range: Range<u64>) -> Option<&[u8]> {
        (**self).get(range)
    }
}
