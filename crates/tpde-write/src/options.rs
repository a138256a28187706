//! What a writer is asked to write: its options, and the tensors it is given.

use super::*;

/// The default decoded size of a chunk: large enough that per-chunk overhead is noise, small
/// enough that a tensor of a few chunks already decodes on several cores.
pub const DEFAULT_CHUNK_BYTES: u64 = 4 << 20;

/// How to write a file.
#[derive(Clone, Debug)]
pub struct WriteOptions {
    /// The codec choice for every chunk.
    pub encoder: Encoder,
    /// Target decoded bytes per chunk (rounded down to a multiple of the alignment).
    pub chunk_bytes: u64,
    /// Payload alignment: a power of two, at least 64.
    pub alignment: u32,
    /// The base this file is a delta against (sets the `BASE` feature flag).
    pub base: Option<BaseRef>,
    /// The lowest minor version the header declares, for what the file's metadata uses (a
    /// reserved key a later minor version defines, spec §11); the codecs may raise it.
    pub min_minor_version: u16,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            encoder: Encoder::Raw,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            alignment: 64,
            base: None,
            min_minor_version: 0,
        }
    }
}

/// A tensor for [`Writer::add_tensors`].
#[derive(Clone, Copy, Debug)]
pub struct TensorInput<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its dtype.
    pub dtype: DType,
    /// Its shape.
    pub shape: &'a [u64],
    /// Its logical bytes (little-endian, row-major).
    pub data: &'a [u8],
    /// For a delta: the base tensor's logical bytes and their digest, as
    /// [`Writer::add_tensor_delta_with_digest`] takes them. `None` for a keyframe.
    pub base: Option<(&'a [u8], Digest)>,
    /// A prediction to try for a delta's chunks (spec §6.8; an `f32` delta in a file of format
    /// 1.6 or later). Each chunk is coded against whichever of the prediction and the base
    /// codes smaller.
    pub predict: Option<PredictInput<'a>>,
}

/// A prediction for [`TensorInput::predict`], with the whole tensors it reads, which must be
/// exactly what the file stores (or its base holds) under the names the prediction gives:
/// the reader predicts from those. [`Writer::finish`] checks that the names are in the file.
#[derive(Clone, Copy, Debug)]
pub struct PredictInput<'a> {
    /// What predicts the tensor.
    pub prediction: &'a Prediction,
    /// The logical bytes of tensor `exp_avg` of the file.
    pub exp_avg: &'a [u8],
    /// Predictor 1: those of `exp_avg` in the base; predictor 2: of `exp_avg_sq` in the file.
    pub other: &'a [u8],
}
