//! Decoded chunks of the tensors that predictions read (spec §6.8), kept so that each is decoded
//! once: a weight's prediction reads its moments, the second moment's prediction reads the first
//! again, and the moments are then read themselves. A chunk leaves when it is read directly, or,
//! oldest first, when the cache holds more than its limit; what leaves is decoded again if needed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// A chunk's place: the tensor and its byte range.
pub(crate) type Key = (String, u64, u64);

/// The bytes a cache holds at most.
const LIMIT: usize = 256 << 20;

#[derive(Default)]
pub(crate) struct InputCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    chunks: HashMap<Key, Arc<[u8]>>,
    order: VecDeque<Key>,
    bytes: usize,
}

impl InputCache {
    /// The chunk at `key`, kept.
    pub fn get(&self, key: &Key) -> Option<Arc<[u8]>> {
        self.inner.lock().expect("not poisoned").chunks.get(key).cloned()
    }

    /// The chunk at `key`, no longer kept.
    pub fn take(&self, key: &Key) -> Option<Arc<[u8]>> {
        let mut inner = self.inner.lock().expect("not poisoned");
        let chunk = inner.chunks.remove(key)?;
        inner.bytes -= chunk.len();
        Some(chunk)
    }

    /// Keeps `chunk` at `key`, dropping the oldest chunks past the limit.
    pub fn insert(&self, key: Key, chunk: Arc<[u8]>) {
        let mut inner = self.inner.lock().expect("not poisoned");
        inner.bytes += chunk.len();
        if let Some(old) = inner.chunks.insert(key.clone(), chunk) {
            inner.bytes -= old.len();
        }
        inner.order.push_back(key);
        while inner.bytes > LIMIT {
            let Some(oldest) = inner.order.pop_front() else { break };
            if let Some(old) = inner.chunks.remove(&oldest) {
                inner.bytes -= old.len();
            }
        }
        // Keys of chunks already taken stay in `order` until they reach its front; keep it short.
        if inner.order.len() > 2 * inner.chunks.len() + 64 {
            let Inner { chunks, order, .. } = &mut *inner;
            order.retain(|k| chunks.contains_key(k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_leave_when_taken_or_past_the_limit() {
        let cache = InputCache::default();
        let key = |i: u64| ("m".to_owned(), i, i + 1);
        cache.insert(key(0), vec![1u8; 10].into());
        assert_eq!(cache.get(&key(0)).unwrap().len(), 10);
        assert_eq!(cache.take(&key(0)).unwrap().len(), 10);
        assert!(cache.get(&key(0)).is_none());
        for i in 0..3 {
            cache.insert(key(i), vec![0u8; LIMIT / 2].into());
        }
        assert!(cache.get(&key(0)).is_none(), "the oldest left");
        assert!(cache.get(&key(1)).is_some() && cache.get(&key(2)).is_some());
    }
}
