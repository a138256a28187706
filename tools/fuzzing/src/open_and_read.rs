//! Arbitrary bytes as a whole file: open, read every tensor, verify. Any outcome but a panic,
//! an out-of-bounds read or a runaway allocation is fine.

use tpde_read::{ReadOptions, Reader};

pub fn run(data: &[u8]) {
    let options = ReadOptions { max_tensor_bytes: crate::MAX_TENSOR_BYTES, ..ReadOptions::default() };
    let Ok(r) = Reader::with_options(data, options) else { return };
    for t in r.tensors() {
        if let Ok(bytes) = r.read_tensor(t) {
            assert_eq!(bytes.len() as u64, t.byte_length);
        }
    }
    let _ = r.verify();
    let _ = r.content_digest();
}
