//! Arbitrary bytes as a whole file: open, read every tensor, verify. The body is `tpde_fuzzing::open_and_read`, which `cargo test` also runs on the committed
//! crash inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tpde_fuzzing::open_and_read::run(data));
