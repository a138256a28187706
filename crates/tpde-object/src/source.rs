//! [`ObjectSource`]: a remote object read by ranged GETs.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use tpde_read::out_of_range;
use tpde_read::Source;

use crate::{block_on, io_error, store, ObjectUrl};

/// Bytes of each end of the object fetched on open: the header at the start; the 32-byte
/// trailer and, for all but very large checkpoints (a directory entry is some 100 bytes a
/// tensor and 40 a chunk), the directory at the end.
const EDGE_BYTES: u64 = 256 << 10;
/// Stored bytes the reader announces at once (see [`Source::prefetch_window`]).
const WINDOW_BYTES: u64 = 64 << 20;
/// Prefetched bytes kept at most: the window being decoded and the one before it.
const CACHE_BYTES: u64 = 2 * WINDOW_BYTES;
/// Ranges closer than this are fetched by one request (what a request costs in latency is
/// worth about this many bytes of transfer).
const COALESCE_GAP: u64 = 1 << 20;
/// The largest single request: larger ranges are cut into pieces fetched side by side, since
/// one connection rarely carries a store's full bandwidth.
const PIECE_BYTES: u64 = 8 << 20;
/// Requests in flight at once for one read.
const CONCURRENCY: usize = 8;
/// Times a request that failed for a reason other than a missing object is sent again, after
/// the store client's own retries.
const ATTEMPTS: usize = 2;

/// Requests an [`ObjectSource`] sent and the bytes they brought.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// GET requests, the ones on open included.
    pub requests: u64,
    /// Bytes received.
    pub bytes: u64,
}

/// A remote object, read by ranged GETs: see the crate documentation.
pub struct ObjectSource {
    url: ObjectUrl,
    store: Arc<dyn ObjectStore>,
    path: object_store::path::Path,
    len: u64,
    /// The object's first bytes (the header), or empty when `tail` holds the whole object.
    head: Bytes,
    /// The object's last bytes, from `tail_start`.
    tail: Bytes,
    tail_start: u64,
    /// Ranges fetched ahead by [`Source::prefetch`], oldest first, at most [`CACHE_BYTES`].
    fetched: Mutex<VecDeque<(u64, Bytes)>>,
    requests: AtomicU64,
    received: AtomicU64,
}

impl ObjectSource {
    /// Opens the object at `url`: one GET of its first [`EDGE_BYTES`], which also tells its
    /// length, and, for a larger object, one of its last (the trailer and, but for very large
    /// checkpoints, the directory). A missing object is an error of kind
    /// [`io::ErrorKind::NotFound`].
    ///
    /// The first request asks for a range from the start, which every S3 clips to a shorter
    /// object; a suffix range longer than the object is refused by some S3-compatible servers.
    pub fn open(url: &ObjectUrl) -> io::Result<Self> {
        let store = store(url)?;
        let path = url.path()?;
        let mut src = ObjectSource {
            url: url.clone(),
            store,
            path,
            len: 0,
            head: Bytes::new(),
            tail: Bytes::new(),
            tail_start: 0,
            fetched: Mutex::new(VecDeque::new()),
            requests: AtomicU64::new(0),
            received: AtomicU64::new(0),
        };
        let options = GetOptions { range: Some(GetRange::Bounded(0..EDGE_BYTES)), ..GetOptions::default() };
        let got = src.retrying(|| async {
            let r = src.store.get_opts(&src.path, options.clone()).await?;
            let (size, range) = (r.meta.size, r.range.clone());
            Ok((size, range, r.bytes().await?))
        });
        let (len, range, head) = match got {
            Ok(got) => got,
            // An empty object has no first byte to give; its length comes from its metadata.
            // Any other failure is the GET's, whatever the HEAD asking that says.
            Err(e) if e.kind() != io::ErrorKind::NotFound && matches!(crate::size(url), Ok(Some(0))) => {
                (0, 0..0, Bytes::new())
            }
            Err(e) => return Err(e),
        };
        if range.start != 0 || range.end != len.min(EDGE_BYTES) || head.len() as u64 != range.end {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{url}: asked for the first {EDGE_BYTES} bytes, the store sent bytes {range:?} of {len}"),
            ));
        }
        src.received.fetch_add(head.len() as u64, Ordering::Relaxed);
        src.len = len;
        if len <= EDGE_BYTES {
            (src.tail_start, src.tail) = (0, head);
        } else {
            src.head = head;
            src.tail_start = len - EDGE_BYTES;
            src.tail = src.fetch(src.tail_start..len)?.into();
        }
        Ok(src)
    }

    /// The object's URL.
    pub fn url(&self) -> &ObjectUrl {
        &self.url
    }

    /// Requests sent so far and the bytes they brought.
    pub fn stats(&self) -> Stats {
        Stats { requests: self.requests.load(Ordering::Relaxed), bytes: self.received.load(Ordering::Relaxed) }
    }

    /// Runs the request `attempt` until it succeeds, the object turns out missing, or
    /// [`ATTEMPTS`] tries have failed; counts each try.
    fn retrying<T, F, Fut>(&self, attempt: F) -> io::Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = object_store::Result<T>>,
    {
        let mut tries = 0;
        loop {
            tries += 1;
            self.requests.fetch_add(1, Ordering::Relaxed);
            match block_on(attempt()) {
                Ok(v) => return Ok(v),
                Err(e @ object_store::Error::NotFound { .. }) => return Err(io_error(&self.url, e)),
                Err(e) if tries >= ATTEMPTS => return Err(io_error(&self.url, e)),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(100 << tries)),
            }
        }
    }

    /// One ranged GET, checked to bring exactly the bytes asked for.
    async fn get_range(&self, range: Range<u64>) -> object_store::Result<Bytes> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let bytes = self.store.get_range(&self.path, range.clone()).await?;
        self.received.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if bytes.len() as u64 != range.end - range.start {
            return Err(object_store::Error::Generic {
                store: "S3",
                source: format!("asked for bytes {range:?}, received {}", bytes.len()).into(),
            });
        }
        Ok(bytes)
    }

    /// The requests that fetch `ranges` (sorted, coalesced when close, cut when large), sent
    /// [`CONCURRENCY`] at a time; returns each request's range and bytes.
    fn fetch_many(&self, ranges: &[Range<u64>]) -> io::Result<Vec<(u64, Bytes)>> {
        let requests = plan(ranges);
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let mut tries = 0;
        loop {
            tries += 1;
            let all = futures::stream::iter(requests.iter().cloned())
                .map(|r| async move { self.get_range(r.clone()).await.map(|b| (r.start, b)) })
                .buffered(CONCURRENCY)
                .try_collect::<Vec<_>>();
            match block_on(all) {
                Ok(v) => return Ok(v),
                Err(e @ object_store::Error::NotFound { .. }) => return Err(io_error(&self.url, e)),
                Err(e) if tries >= ATTEMPTS => return Err(io_error(&self.url, e)),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(100 << tries)),
            }
        }
    }

    /// The bytes of `range`, fetched now (in pieces side by side when it is large), copied once.
    fn fetch(&self, range: Range<u64>) -> io::Result<Vec<u8>> {
        let mut all = Vec::with_capacity((range.end - range.start) as usize);
        for (_, b) in self.fetch_many(std::slice::from_ref(&range))? {
            all.extend_from_slice(&b);
        }
        Ok(all)
    }

    /// The bytes of `range` if the prefetched pieces hold all of them.
    fn copy_fetched(&self, range: &Range<u64>) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity((range.end - range.start) as usize);
        self.walk_fetched(range, |part| out.extend_from_slice(part)).then_some(out)
    }

    /// Whether the tail or the prefetched pieces hold all of `range`.
    fn holds(&self, range: &Range<u64>) -> bool {
        range.start >= self.tail_start || self.walk_fetched(range, |_| {})
    }

    /// Calls `part` with the prefetched bytes of `range`, in order; false if some are missing.
    fn walk_fetched(&self, range: &Range<u64>, mut part: impl FnMut(&[u8])) -> bool {
        let fetched = self.fetched.lock().unwrap_or_else(|p| p.into_inner());
        let mut at = range.start;
        while at < range.end {
            let Some((start, b)) = fetched.iter().find(|(s, b)| *s <= at && at < s + b.len() as u64) else {
                return false;
            };
            let end = range.end.min(start + b.len() as u64);
            part(&b[(at - start) as usize..(end - start) as usize]);
            at = end;
        }
        true
    }
}

impl Source for ObjectSource {
    fn len(&self) -> u64 {
        self.len
    }

    fn get(&self, range: Range<u64>) -> io::Result<Cow<'_, [u8]>> {
        if range.start > range.end || range.end > self.len {
            return Err(out_of_range(&range, self.len));
        }
        if range.start >= self.tail_start {
            let (s, e) = ((range.start - self.tail_start) as usize, (range.end - self.tail_start) as usize);
            return Ok(Cow::Borrowed(&self.tail[s..e]));
        }
        if range.end <= self.head.len() as u64 {
            return Ok(Cow::Borrowed(&self.head[range.start as usize..range.end as usize]));
        }
        if let Some(bytes) = self.copy_fetched(&range) {
            return Ok(Cow::Owned(bytes));
        }
        Ok(Cow::Owned(self.fetch(range)?))
    }

    fn prefetch_window(&self) -> Option<u64> {
        Some(WINDOW_BYTES)
    }

    fn refetch(&self, range: Range<u64>) -> Option<io::Result<Vec<u8>>> {
        Some(self.fetch(range))
    }

    fn prefetch(&self, ranges: &[Range<u64>]) -> io::Result<()> {
        let missing: Vec<Range<u64>> =
            ranges.iter().filter(|r| r.start < r.end && r.end <= self.len && !self.holds(r)).cloned().collect();
        let pieces = self.fetch_many(&missing)?;
        let mut fetched = self.fetched.lock().unwrap_or_else(|p| p.into_inner());
        fetched.extend(pieces);
        let mut held: u64 = fetched.iter().map(|(_, b)| b.len() as u64).sum();
        while held > CACHE_BYTES && fetched.len() > 1 {
            let (_, oldest) = fetched.pop_front().expect("more than one piece");
            held -= oldest.len() as u64;
        }
        Ok(())
    }
}

/// The requests for `ranges`: sorted, merged when less than [`COALESCE_GAP`] apart, then cut
/// into pieces of at most [`PIECE_BYTES`].
fn plan(ranges: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut sorted: Vec<Range<u64>> = ranges.iter().filter(|r| r.start < r.end).cloned().collect();
    sorted.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::new();
    for r in sorted {
        match merged.last_mut() {
            Some(last) if r.start <= last.end + COALESCE_GAP => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    merged
        .into_iter()
        .flat_map(|r| {
            let pieces = (r.end - r.start).div_ceil(PIECE_BYTES);
            (0..pieces).map(move |i| r.start + i * PIECE_BYTES..(r.start + (i + 1) * PIECE_BYTES).min(r.end))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_coalesces_neighbours_and_cuts_large_ranges() {
        assert_eq!(plan(&[]), Vec::<Range<u64>>::new());
        // Out of order, overlapping, within the gap: one request.
        assert_eq!(plan(&[5000..6000, 0..100, 50..4000]), vec![0..6000]);
        // Farther apart than the gap: two.
        let far = COALESCE_GAP + 200;
        assert_eq!(plan(&[0..100, far..far + 10]), vec![0..100, far..far + 10]);
        // A range of 2.5 pieces: three requests that cover it exactly.
        let big = 5 * PIECE_BYTES / 2;
        let p = plan(std::slice::from_ref(&(10..10 + big)));
        assert_eq!(p.len(), 3);
        assert_eq!((p[0].start, p[2].end), (10, 10 + big));
        assert!(p.windows(2).all(|w| w[0].end == w[1].start));
        // Empty ranges ask for nothing.
        assert_eq!(plan(std::slice::from_ref(&(7..7))), Vec::<Range<u64>>::new());
    }
}
