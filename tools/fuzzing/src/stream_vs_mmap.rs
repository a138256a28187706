//! Arbitrary bytes read three ways (a memory map of a file, a `Read + Seek` stream, a slice):
//! every outcome, from open to verify, must be the same.

use std::io::Write;

use tpde_read::{ReadError, ReadOptions, Reader, Source, StreamSource};

/// What a reader made of a file: comparable across sources.
#[derive(Debug, PartialEq)]
enum Seen {
    Rejected(&'static str),
    Read {
        /// The directory re-encoded: bit equality (a NaN metadata value equals itself).
        directory: Vec<u8>,
        tensors: Vec<Result<Vec<u8>, &'static str>>,
        verify: Result<(), &'static str>,
    },
}

fn kind(e: ReadError) -> &'static str {
    e.kind().as_str()
}

fn see<S: Source>(opened: Result<Reader<S>, ReadError>) -> Seen {
    let r = match opened {
        Ok(r) => r,
        Err(e) => return Seen::Rejected(kind(e)),
    };
    let tensors = r.tensors().iter().map(|t| r.read_tensor(t).map(|b| b.into_owned()).map_err(kind)).collect();
    Seen::Read { directory: r.directory().to_bytes(), tensors, verify: r.verify().map(|_| ()).map_err(kind) }
}

pub fn run(data: &[u8]) {
    let options = ReadOptions { max_tensor_bytes: crate::MAX_TENSOR_BYTES, ..ReadOptions::default() };
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(data).expect("write");
    file.flush().expect("flush");
    let slice = see(Reader::with_options(data, options));
    // A zero-length file cannot be mapped on every platform; the reader reports that as I/O.
    if !data.is_empty() {
        let mapped = see(Reader::open_with(file.path(), options));
        assert_eq!(mapped, slice, "memory map and slice disagree");
    }
    let stream = StreamSource::new(file.reopen().expect("reopen")).expect("stream");
    let streamed = see(Reader::with_options(stream, options));
    assert_eq!(streamed, slice, "stream and slice disagree");
}
