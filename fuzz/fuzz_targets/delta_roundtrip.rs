//! A delta against an arbitrary base, written with an arbitrary delta codec, read back bit-exact. The body is `tpde_fuzzing::delta_roundtrip`, which `cargo test` also runs on the committed
//! crash inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tpde_fuzzing::delta_roundtrip::run(data));
