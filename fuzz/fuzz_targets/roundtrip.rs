//! Arbitrary tensors and metadata written, read back, equal. The body is `tpde_fuzzing::roundtrip`, which `cargo test` also runs on the committed
//! crash inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tpde_fuzzing::roundtrip::run(data));
