//! Digests (spec §7). A tensor's digest is BLAKE3 of its logical bytes. A checkpoint's
//! content digest covers every tensor's name, dtype, shape and logical bytes, and nothing
//! else: not the codecs, chunking, alignment, metadata or file layout. So the same tensors
//! have the same content digest whether they sit in a `.safetensors` file, a keyframe, or a
//! delta, and a delta names its base by it.
//!
//! ```text
//! content_digest = BLAKE3(
//!     "tpde-content-v1" 0x00                       16 bytes
//!     for each tensor, in ascending byte order of its UTF-8 name:
//!         u64 LE name length, name bytes,
//!         u8 dtype code, u8 rank, rank x u64 LE dims,
//!         32-byte tensor digest = BLAKE3(logical bytes)
//! )
//! ```

use crate::dtype::DType;

/// A 32-byte BLAKE3 digest.
pub type Digest = [u8; 32];

/// Domain separation prefix of the content digest.
pub const CONTENT_DIGEST_DOMAIN: &[u8; 16] = b"tpde-content-v1\0";

/// Below this, hashing on one thread beats splitting the work.
const PARALLEL_HASH_MIN: usize = 1 << 20;

/// BLAKE3 of a tensor's logical bytes (multi-threaded for large tensors).
pub fn tensor_digest(bytes: &[u8]) -> Digest {
    let mut h = StreamDigest::new();
    h.update(bytes);
    h.finalize()
}

/// A tensor digest computed piece by piece, for tensors that are streamed.
#[derive(Default)]
pub struct StreamDigest(blake3::Hasher);

impl StreamDigest {
    /// An empty digest.
    pub fn new() -> Self {
        StreamDigest(blake3::Hasher::new())
    }
    /// Adds the next bytes of the tensor.
    pub fn update(&mut self, bytes: &[u8]) {
        if bytes.len() >= PARALLEL_HASH_MIN {
            self.0.update_rayon(bytes);
        } else {
            self.0.update(bytes);
        }
    }
    /// The digest of all bytes added.
    pub fn finalize(&self) -> Digest {
        *self.0.finalize().as_bytes()
    }
}

/// What the content digest needs of one tensor.
#[derive(Clone, Copy, Debug)]
pub struct DigestInput<'a> {
    /// Name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: &'a [u64],
    /// [`tensor_digest`] of the logical bytes.
    pub digest: &'a Digest,
}

/// The content digest of a set of tensors, in any order.
///
/// ```
/// use tpde_format::digest::{content_digest, tensor_digest, DigestInput};
/// use tpde_format::DType;
/// let d = tensor_digest(&[0, 0, 128, 63]);
/// let a = DigestInput { name: "w", dtype: DType::F32, shape: &[1], digest: &d };
/// let b = DigestInput { name: "b", dtype: DType::F32, shape: &[], digest: &d };
/// assert_eq!(content_digest([a, b]), content_digest([b, a]));
/// ```
pub fn content_digest<'a>(tensors: impl IntoIterator<Item = DigestInput<'a>>) -> Digest {
    let mut tensors: Vec<DigestInput<'a>> = tensors.into_iter().collect();
    tensors.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    let mut h = blake3::Hasher::new();
    h.update(CONTENT_DIGEST_DOMAIN);
    for t in tensors {
        h.update(&(t.name.len() as u64).to_le_bytes());
        h.update(t.name.as_bytes());
        h.update(&[t.dtype.code(), t.shape.len() as u8]);
        for d in t.shape {
            h.update(&d.to_le_bytes());
        }
        h.update(t.digest);
    }
    *h.finalize().as_bytes()
}

/// Lower-case hex of a digest.
pub fn to_hex(d: &Digest) -> String {
    crate::error::hex(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test vector for other implementations (also in spec §7).
    #[test]
    fn content_digest_vector() {
        let d = tensor_digest(&1.0f32.to_le_bytes());
        assert_eq!(to_hex(&d), to_hex(blake3::hash(&[0x00, 0x00, 0x80, 0x3f]).as_bytes()));
        let one = DigestInput { name: "w", dtype: DType::F32, shape: &[1], digest: &d };
        let mut manual = Vec::new();
        manual.extend_from_slice(b"tpde-content-v1\0");
        manual.extend_from_slice(&1u64.to_le_bytes());
        manual.extend_from_slice(b"w");
        manual.extend_from_slice(&[0x12, 1]);
        manual.extend_from_slice(&1u64.to_le_bytes());
        manual.extend_from_slice(&d);
        assert_eq!(content_digest([one]), *blake3::hash(&manual).as_bytes());
    }

    #[test]
    fn parallel_and_serial_hash_agree() {
        let data: Vec<u8> = (0..3 * PARALLEL_HASH_MIN).map(|i| (i * 31 % 251) as u8).collect();
        assert_eq!(tensor_digest(&data), *blake3::hash(&data).as_bytes());
    }
}
