//! Every registered codec's decoder on arbitrary stored bytes and params, into a buffer of an
//! arbitrary declared length (a whole number of elements, as the directory guarantees), with a
//! base of that length for the delta codecs: errors are fine, panics are not.
//!
//! Input: `[selector, len_lo, len_hi, params_len, params…, stored…]`.

use tpde_codec::{decode, decoder, ChunkContext};
use tpde_format::{CodecTag, DType};

pub fn run(data: &[u8]) {
    let Some((&[sel, len_lo, len_hi, params_len], rest)) = data.split_first_chunk::<4>() else { return };
    let tag = CodecTag::ALL[(sel as usize % 16) % CodecTag::ALL.len()];
    let dtype = DType::ALL[(sel as usize / 16) % DType::ALL.len()];
    let (params, stored) = rest.split_at((params_len as usize % 4).min(rest.len()));
    let decoded_len = u16::from_le_bytes([len_lo, len_hi]) as u64 / dtype.size() * dtype.size();
    if decoder(tag).check_lengths(stored.len() as u64, decoded_len).is_err() {
        return;
    }
    let mut out = vec![0u8; decoded_len as usize];
    let base: Vec<u8> = (0..decoded_len).map(|i| (i as u8).wrapping_mul(sel | 1)).collect();
    let _ = decode(tag, ChunkContext { dtype, base: Some(&base) }, params, stored, &mut out);
}

/// The target's input for one chunk: how the seeds made from the corpus are written.
pub fn input(tag: CodecTag, dtype: DType, decoded_len: u16, params: &[u8], stored: &[u8]) -> Option<Vec<u8>> {
    let t = CodecTag::ALL.iter().position(|&c| c == tag)?;
    let d = DType::ALL.iter().position(|&x| x == dtype)?;
    let sel = u8::try_from(d * 16 + t).ok()?;
    let params_len = u8::try_from(params.len()).ok().filter(|&n| n < 4)?;
    let [lo, hi] = decoded_len.to_le_bytes();
    Some([&[sel, lo, hi, params_len][..], params, stored].concat())
}
