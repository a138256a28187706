//! Every codec's decoder on arbitrary stored bytes, params, length and base. The body is `tpde_fuzzing::codec_decode`, which `cargo test` also runs on the committed
//! crash inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tpde_fuzzing::codec_decode::run(data));
