//! The fuzz targets' bodies, one module per target. `fuzz/` (cargo-fuzz, its own workspace)
//! wraps each in `fuzz_target!`; `tests/regressions.rs` replays the committed crash inputs
//! (`fuzz/regressions/<target>/`) and the conformance corpus through them under plain
//! `cargo test`. A body panics only on a bug: a reader that panics, a round trip that is not
//! equal, two ways of reading that disagree.
#![forbid(unsafe_code)]

pub mod codec_decode;
pub mod delta_roundtrip;
pub mod open_and_read;
pub mod roundtrip;
pub mod stream_vs_mmap;

/// A target's body: panics only on a bug.
pub type Body = fn(&[u8]);

/// Every target by name, as `fuzz/Cargo.toml` names them.
pub const TARGETS: [(&str, Body); 5] = [
    ("open_and_read", open_and_read::run),
    ("codec_decode", codec_decode::run),
    ("roundtrip", roundtrip::run),
    ("stream_vs_mmap", stream_vs_mmap::run),
    ("delta_roundtrip", delta_roundtrip::run),
];

/// What one tensor may allocate while fuzzing, as an embedding application would cap it.
pub const MAX_TENSOR_BYTES: u64 = 64 << 20;

/// Seed inputs made from the conformance corpus in `corpus_dir`: (target, name, bytes). Whole
/// files for the targets that read files; every chunk of the valid files (as
/// [`codec_decode::input`]) for the codec target.
pub fn seeds(corpus_dir: &std::path::Path) -> std::io::Result<Vec<(&'static str, String, Vec<u8>)>> {
    let mut out = Vec::new();
    for sub in ["valid", "invalid"] {
        let mut paths: Vec<_> =
            std::fs::read_dir(corpus_dir.join(sub))?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
        paths.sort();
        for path in paths {
            let bytes = std::fs::read(&path)?;
            let name = format!("{sub}-{}", path.file_name().unwrap_or_default().to_string_lossy());
            if sub == "valid" {
                out.extend(
                    chunk_seeds(&bytes)
                        .into_iter()
                        .enumerate()
                        .map(|(i, s)| ("codec_decode", format!("{name}-{i}"), s)),
                );
            }
            out.push(("open_and_read", name.clone(), bytes.clone()));
            out.push(("stream_vs_mmap", name, bytes));
        }
    }
    Ok(out)
}

fn chunk_seeds(file: &[u8]) -> Vec<Vec<u8>> {
    let Ok(r) = tpde_read::Reader::from_source(file) else { return Vec::new() };
    let mut out = Vec::new();
    for t in r.tensors() {
        for c in &t.chunks {
            let stored = &file[c.offset as usize..(c.offset + c.stored_length) as usize];
            let len = u16::try_from(c.decoded_length).ok();
            if let Some(seed) = len.and_then(|len| codec_decode::input(c.codec, t.dtype, len, &c.params, stored)) {
                out.push(seed);
            }
        }
    }
    out
}
