//! The encode pipeline: a batch's chunks encoded in parallel (each against its base or
//! prediction where that is smaller), handed back in order, and chunks shared between tensors
//! with the same bytes.

use super::*;

/// Where a tensor's chunks already are.
#[derive(Clone, Copy)]
pub(crate) enum Reuse {
    /// The directory's tensor at this index.
    Written(usize),
    /// The batch's tensor at this index (an earlier one).
    Batch(usize),
}

/// One chunk to encode: its logical bytes, the base bytes it may decode against, and the
/// prediction it may be coded against with its inputs over the same elements.
pub(crate) struct Part<'a> {
    pub(crate) dtype: DType,
    pub(crate) data: &'a [u8],
    pub(crate) base: Option<&'a [u8]>,
    pub(crate) predict: Option<(&'a Prediction, &'a [u8], &'a [u8])>,
}

/// The next chunk encoding to arrive. A caller on a thread of the pool (inside
/// `ThreadPool::install`) runs the pool's queued work while it waits, since the chunks it
/// waits for may be queued behind it (with one thread, nothing else would run them); any
/// other caller blocks.
pub(crate) fn receive<T>(finished: &mpsc::Receiver<T>) -> T {
    const EXPECT: &str = "every chunk sends its encoding";
    loop {
        let next = match rayon::yield_now() {
            None => return finished.recv().expect(EXPECT),
            Some(rayon::Yield::Executed) => finished.try_recv().ok(),
            Some(rayon::Yield::Idle) => finished.recv_timeout(Duration::from_millis(1)).ok(),
        };
        if let Some(next) = next {
            return next;
        }
    }
}

/// Encodes `parts` in parallel, for a file of minor version `minor`.
pub(crate) fn encode_parts(encoder: Encoder, minor: u16, parts: &[Part<'_>]) -> Vec<Encoded> {
    parts.par_iter().map(|p| encode_part(encoder, minor, p)).collect()
}

/// Encodes one chunk, for a file of minor version `minor` (what its records may use).
pub(crate) fn encode_part(encoder: Encoder, minor: u16, p: &Part<'_>) -> Encoded {
    if encoder == Encoder::Raw {
        // Raw chunks are written straight from the input; only the CRC here.
        let crc32 = crc32fast::hash(p.data);
        return Ok(EncodedChunk { stored: None, tag: CodecTag::Raw, params: Vec::new(), crc32 });
    }
    // Room for the chunk stored whole and its plane headers: growing the buffer copies what is
    // already coded.
    let mut stored = Vec::with_capacity(p.data.len() + 4096);
    let ctx = ChunkContext { dtype: p.dtype, base: p.base };
    let (mut tag, mut params) = encoder.encode_in(ctx, p.data, minor, &mut stored)?;
    if let (Some((prediction, exp_avg, other)), Some(base)) = (p.predict, p.base) {
        // Coded against the prediction where that is smaller: a wrong guess about the
        // optimizer costs the time of one more encoding, never bytes.
        let mut predicted = vec![0u8; p.data.len()];
        tpde_codec::predicted::predict(prediction, Inputs { base, exp_avg, other }, &mut predicted);
        let mut alt = Vec::with_capacity(stored.len());
        let records =
            Records { sparse: minor >= tpde_codec::predicted::SPARSE_IN_PREDICTED_SINCE_MINOR, ..Records::of(minor) };
        Predicted::encode_against(p.dtype, &predicted, p.data, records, &mut alt)?;
        let params_alt = prediction.to_bytes();
        if alt.len() + params_alt.len() < stored.len() + params.len() {
            (stored, tag, params) = (alt, CodecTag::DeltaPredicted, params_alt);
        }
    }
    let crc32 = crc32fast::hash(&stored);
    Ok(EncodedChunk { stored: Some(stored), tag, params, crc32 })
}

/// A chunk to encode: its tensor's index in the batch and its first byte.
pub(crate) type Job = (usize, usize);

/// A chunk's encoding, or why it failed.
pub(crate) type Encoded = Result<EncodedChunk, CodecError>;

/// One chunk after encoding (for `raw`, only its CRC: the bytes are the input's).
pub(crate) struct EncodedChunk {
    /// `None` for the input's own bytes.
    pub(crate) stored: Option<Vec<u8>>,
    pub(crate) tag: tpde_format::CodecTag,
    pub(crate) params: Vec<u8>,
    pub(crate) crc32: u32,
}

/// What makes a written tensor's chunks reusable for another tensor.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct DedupKey {
    pub(crate) digest: [u8; 32],
    pub(crate) dtype: DType,
    /// The digest of the base bytes the chunks may decode against.
    pub(crate) base: Option<[u8; 32]>,
}
