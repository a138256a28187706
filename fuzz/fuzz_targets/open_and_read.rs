//! Arbitrary bytes as a whole file: open, read every tensor, verify. Any outcome but a panic,
//! an out-of-bounds read or a runaway allocation is fine.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpde_read::{ReadOptions, Reader};

fuzz_target!(|data: &[u8]| {
    // Cap what one tensor may allocate, as an embedding application would.
    let options = ReadOptions { max_tensor_bytes: 64 << 20, ..ReadOptions::default() };
    let Ok(r) = Reader::with_options(data, options) else { return };
    for t in r.tensors() {
        if let Ok(bytes) = r.read_tensor(t) {
            assert_eq!(bytes.len() as u64, t.byte_length);
        }
    }
    let _ = r.verify();
    let _ = r.content_digest();
});
