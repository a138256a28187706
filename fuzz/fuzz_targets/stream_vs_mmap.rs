//! Arbitrary bytes read through a memory map, a stream and a slice: the same outcome. The body is `tpde_fuzzing::stream_vs_mmap`, which `cargo test` also runs on the committed
//! crash inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tpde_fuzzing::stream_vs_mmap::run(data));
