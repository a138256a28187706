//! What TPDE's test suites share, as a dev-dependency: checkpoints held in memory and written as
//! keyframes or deltas ([`write`]), and a real S3-compatible server process behind a
//! fault-injecting proxy ([`s3`]), and model folders as frameworks save them ([`folder`]).
#![forbid(unsafe_code)]

pub mod folder;
pub mod s3;

use tpde_codec::Encoder;
use tpde_format::digest::{content_digest, tensor_digest, DigestInput};
use tpde_format::{BaseRef, DType};
use tpde_write::{WriteOptions, Writer};

/// A checkpoint in memory: (name, dtype, shape, little-endian bytes) per tensor, in order.
pub type Checkpoint = Vec<(String, DType, Vec<u64>, Vec<u8>)>;

/// Little-endian bytes of `f32` values.
pub fn f32s(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The content digest (spec §7.2) of `ck`.
pub fn digest_of(ck: &Checkpoint) -> [u8; 32] {
    let d: Vec<[u8; 32]> = ck.iter().map(|t| tensor_digest(&t.3)).collect();
    content_digest(ck.iter().zip(&d).map(|(t, d)| DigestInput { name: &t.0, dtype: t.1, shape: &t.2, digest: d }))
}

/// Writes `ck` with `encoder` in chunks of `chunk` bytes: a keyframe, or with `base` (the
/// checkpoint and the hint recorded for it) a delta, each tensor whose base counterpart has its
/// name, dtype and shape coded against it.
pub fn write(ck: &Checkpoint, base: Option<(&Checkpoint, &str)>, encoder: Encoder, chunk: u64) -> Vec<u8> {
    write_in(ck, base, encoder, chunk, 0)
}

/// [`write`] into a file that declares at least minor version `minor` (which the encoder may
/// use: from 1.8, `auto`'s sparse plane records).
pub fn write_in(
    ck: &Checkpoint,
    base: Option<(&Checkpoint, &str)>,
    encoder: Encoder,
    chunk: u64,
    minor: u16,
) -> Vec<u8> {
    let base_ref = base.map(|(b, hint)| BaseRef { digest: digest_of(b), path_hint: hint.into() });
    let opts = WriteOptions {
        encoder,
        chunk_bytes: chunk,
        base: base_ref,
        min_minor_version: minor,
        ..WriteOptions::default()
    };
    let mut w = Writer::new(Vec::new(), opts).unwrap();
    for (name, dtype, shape, bytes) in ck {
        match base.and_then(|(b, _)| b.iter().find(|t| &t.0 == name && t.1 == *dtype && &t.2 == shape)) {
            Some(bt) => w.add_tensor_delta(name, *dtype, shape, bytes, &bt.3).unwrap(),
            None => w.add_tensor(name, *dtype, shape, bytes).unwrap(),
        };
    }
    w.finish().unwrap()
}
