//! What the reader touches: opening reads only the header, trailer and directory; reading a
//! tensor reads only that tensor's chunks. A recording source logs every range asked for.

mod common;

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Mutex;
use tpde_codec::Encoder;
use tpde_read::{Reader, Source, StreamSource};

struct Recording {
    bytes: Vec<u8>,
    log: Mutex<Vec<Range<u64>>>,
}

impl Source for Recording {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn get(&self, range: Range<u64>) -> std::io::Result<Cow<'_, [u8]>> {
        self.log.lock().unwrap().push(range.clone());
        Source::get(self.bytes.as_slice(), range)
    }
}

#[test]
fn open_and_read_touch_only_what_they_need() {
    for encoder in [Encoder::Raw, Encoder::Zstd { level: 3 }] {
        let bytes = common::small_file(encoder);
        let len = bytes.len() as u64;
        let src = Recording { bytes, log: Mutex::new(Vec::new()) };
        let r = Reader::from_source(&src).unwrap();
        let dir = r.trailer().directory_offset..len - 32;
        let opened: Vec<_> = std::mem::take(&mut *src.log.lock().unwrap());
        assert_eq!(opened, vec![0..64, len - 32..len, dir.clone()], "open reads header, trailer, directory");

        let t = r.tensor("ünïcode/名前").unwrap();
        r.read_tensor(t).unwrap();
        // The tensor's chunks, with adjacent ones merged (a raw tensor is read as one slice).
        let mut allowed: Vec<Range<u64>> = Vec::new();
        for c in &t.chunks {
            match allowed.last_mut() {
                Some(last) if last.end == c.offset => last.end += c.stored_length,
                _ => allowed.push(c.offset..c.offset + c.stored_length),
            }
        }
        let read = std::mem::take(&mut *src.log.lock().unwrap());
        assert!(!read.is_empty());
        for range in read {
            assert!(
                allowed.iter().any(|a| a.start <= range.start && range.end <= a.end),
                "{range:?} is outside the tensor's chunks {allowed:?}"
            );
        }
    }
}

#[test]
fn a_stream_reads_what_the_map_reads() {
    for encoder in [Encoder::Raw, Encoder::Zstd { level: 3 }, Encoder::Auto, Encoder::AutoSerial] {
        let bytes = common::small_file(encoder);
        let in_memory = Reader::from_source(bytes.as_slice()).unwrap();
        let stream = Reader::from_source(StreamSource::new(std::io::Cursor::new(bytes.clone())).unwrap()).unwrap();
        assert_eq!(stream.directory(), in_memory.directory());
        for t in in_memory.tensors() {
            assert_eq!(stream.read_tensor(t).unwrap(), in_memory.read_tensor(t).unwrap(), "{}", t.name);
        }
        stream.verify().unwrap();
        // A stream that ends early is truncated, not a panic.
        let short = StreamSource::new(std::io::Cursor::new(bytes[..bytes.len() - 1].to_vec())).unwrap();
        assert_eq!(Reader::from_source(short).err().unwrap().kind(), tpde_format::ErrorKind::Truncated);
    }
}
