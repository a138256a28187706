//! Decoded chunks of the tensors that predictions read (spec §6.8), kept so that each is decoded
//! once: a weight's prediction reads its moments, the second moment's prediction reads the first
//! again, the moments are read themselves, and in a chain the file above reads them as its base
//! (a first moment both as its own base and for its second moment's prediction). The oldest
//! chunks leave when the cache holds more than its limit; what left is decoded again if needed.

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

    /// Keeps `chunk` at `key`, dropping the oldest chunks past the limit.
    pub fn insert(&self, key: Key, chunk: Arc<[u8]>) {
        let mut inner = self.inner.lock().expect("not poisoned");
        inner.bytes += chunk.len();
        match inner.chunks.insert(key.clone(), chunk) {
            Some(old) => inner.bytes -= old.len(), // decoded twice at once: one place in the order
            None => inner.order.push_back(key),
        }
        while inner.bytes > LIMIT {
            let Some(oldest) = inner.order.pop_front() else { break };
            if let Some(old) = inner.chunks.remove(&oldest) {
                inner.bytes -= old.len();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_chunks_leave_past_the_limit() {
        let cache = InputCache::default();
        let key = |i: u64| ("m".to_owned(), i, i + 1);
        for i in 0..3 {
            cache.insert(key(i), vec![0u8; LIMIT / 2].into());
        }
        assert!(cache.get(&key(0)).is_none(), "the oldest left");
        assert!(cache.get(&key(1)).is_some() && cache.get(&key(2)).is_some());
    }
}
