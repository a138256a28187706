//! The float-aware codecs: `planes` (keyframes, spec §6.2), the dense deltas `delta-xor` and
//! `delta-sub` (§6.4) and the four sparse deltas (§6.5).
//!
//! Deltas work on bit patterns only, never on float values: XOR, or wrapping subtraction of
//! the patterns as unsigned integers, both exactly invertible for every pattern, NaNs included.

use tpde_format::{CodecTag, DType};

use crate::planes::{self, with_word};
use crate::positions::PositionCoder;
use crate::{no_params, ChunkCodec, ChunkContext, CodecError};

/// Sparse payloads: u32 count, u32 positions_len (little-endian), then the positions, then the
/// changed values' planes.
const SPARSE_HEADER: usize = 8;

/// `planes`: the keyframe codec.
#[derive(Clone, Copy, Debug, Default)]
pub struct Planes;

impl ChunkCodec for Planes {
    fn tag(&self) -> CodecTag {
        CodecTag::Planes
    }

    fn encode(&self, ctx: ChunkContext, input: &[u8], out: &mut Vec<u8>) -> Result<Vec<u8>, CodecError> {
        let w = width(ctx.dtype);
        let mut elements = input.to_vec();
        if planes::rotates(ctx.dtype) {
            planes::rotate(&mut elements, w, true);
        }
        planes::encode(&elements, w, out);
        Ok(Vec::new())
    }

    fn check_lengths(&self, stored: u64, decoded: u64) -> Result<(), CodecError> {
        if decoded > stored.saturating_mul(planes::MAX_EXPANSION) {
            return Err(CodecError::Corrupt {
                codec: self.tag(),
                detail: format!("{stored} stored bytes cannot hold {decoded} decoded bytes of planes"),
            });
        }
        Ok(())
    }

    fn decode(&self, ctx: ChunkContext, params: &[u8], stored: &[u8], out: &mut [u8]) -> Result<(), CodecError> {
        no_params(self.tag(), params)?;
        let w = width(ctx.dtype);
        let rest = planes::decode(self.tag(), stored, w, out)?;
        trailing(self.tag(), rest)?;
        if planes::rotates(ctx.dtype) {
            planes::rotate(out, w, false);
        }
        Ok(())
    }
}

/// How a dense delta combines an element with the base's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseOp {
    /// `cur ^ base`, then rotated like a keyframe for floats.
    Xor,
    /// `zigzag(cur − base)` on the patterns as unsigned integers, wrapping.
    Sub,
}

/// `delta-xor` and `delta-sub`: every element against the base's, then planes.
#[derive(Clone, Copy, Debug)]
pub struct Dense(pub DenseOp);

impl Dense {
    /// The delta elements of `input` against `base`.
    pub fn forward(op: DenseOp, dtype: DType, input: &[u8], base: &[u8]) -> Vec<u8> {
        let w = width(dtype);
        let mut d = input.to_vec();
        with_word!(w, T => {
            for (c, b) in d.chunks_exact_mut(w).zip(base.chunks_exact(w)) {
                let x = T::from_le_bytes((&*c).try_into().expect("w bytes"));
                let y = T::from_le_bytes(b.try_into().expect("w bytes"));
                let e = match op {
                    DenseOp::Xor if dtype.is_float() => (x ^ y).rotate_left(1),
                    DenseOp::Xor => x ^ y,
                    DenseOp::Sub => {
                        let s = x.wrapping_sub(y);
                        (s << 1) ^ (0 as T).wrapping_sub(s >> (T::BITS - 1))
                    }
                };
                c.copy_from_slice(&e.to_le_bytes());
            }
        });
        d
    }

    /// Undoes [`Dense::forward`] in place: `out` holds the delta elements on entry.
    fn inverse(op: DenseOp, dtype: DType, out: &mut [u8], base: &[u8]) {
        let w = width(dtype);
        with_word!(w, T => {
            for (c, b) in out.chunks_exact_mut(w).zip(base.chunks_exact(w)) {
                let e = T::from_le_bytes((&*c).try_into().expect("w bytes"));
                let y = T::from_le_bytes(b.try_into().expect("w bytes"));
                let x = match op {
                    DenseOp::Xor if dtype.is_float() => e.rotate_right(1) ^ y,
                    DenseOp::Xor => e ^ y,
                    DenseOp::Sub => ((e >> 1) ^ (0 as T).wrapping_sub(e & 1)).wrapping_add(y),
                };
                c.copy_from_slice(&x.to_le_bytes());
            }
        });
    }
}

impl ChunkCodec for Dense {
    fn tag(&self) -> CodecTag {
        match self.0 {
            DenseOp::Xor => CodecTag::DeltaXor,
            DenseOp::Sub => CodecTag::DeltaSub,
        }
    }

    fn encode(&self, ctx: ChunkContext, input: &[u8], out: &mut Vec<u8>) -> Result<Vec<u8>, CodecError> {
        let base = base_for(self.tag(), ctx, input.len())?;
        planes::encode(&Dense::forward(self.0, ctx.dtype, input, base), width(ctx.dtype), out);
        Ok(Vec::new())
    }

    fn check_lengths(&self, _stored: u64, _decoded: u64) -> Result<(), CodecError> {
        Ok(()) // the base tensor, not the stored bytes, justifies the decoded length
    }

    fn decode(&self, ctx: ChunkContext, params: &[u8], stored: &[u8], out: &mut [u8]) -> Result<(), CodecError> {
        no_params(self.tag(), params)?;
        let base = base_for(self.tag(), ctx, out.len())?;
        let rest = planes::decode(self.tag(), stored, width(ctx.dtype), out)?;
        trailing(self.tag(), rest)?;
        Dense::inverse(self.0, ctx.dtype, out, base);
        Ok(())
    }
}

/// The sparse deltas: positions of the changed elements, then their XOR with the base.
#[derive(Clone, Copy, Debug)]
pub struct Sparse(pub PositionCoder);

impl Sparse {
    /// The changed positions and their XOR values (rotated for floats), element by element.
    pub fn changes(dtype: DType, input: &[u8], base: &[u8]) -> (Vec<u32>, Vec<u8>) {
        let w = width(dtype);
        let mut positions = Vec::new();
        let mut values = Vec::new();
        with_word!(w, T => {
            for (i, (c, b)) in input.chunks_exact(w).zip(base.chunks_exact(w)).enumerate() {
                let x = T::from_le_bytes(c.try_into().expect("w bytes"));
                let y = T::from_le_bytes(b.try_into().expect("w bytes"));
                if x != y {
                    positions.push(i as u32);
                    let e = if dtype.is_float() { (x ^ y).rotate_left(1) } else { x ^ y };
                    values.extend_from_slice(&e.to_le_bytes());
                }
            }
        });
        (positions, values)
    }

    /// Appends the sparse payload of changes found by [`Sparse::changes`], the values split
    /// into planes.
    pub fn write_planed(coder: PositionCoder, positions: &[u32], values: &planes::Planed, out: &mut Vec<u8>) {
        out.extend_from_slice(&(positions.len() as u32).to_le_bytes());
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        coder.encode(positions, out);
        let len = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&len.to_le_bytes());
        values.encode(out);
    }
}

impl ChunkCodec for Sparse {
    fn tag(&self) -> CodecTag {
        self.0.tag()
    }

    fn encode(&self, ctx: ChunkContext, input: &[u8], out: &mut Vec<u8>) -> Result<Vec<u8>, CodecError> {
        let base = base_for(self.tag(), ctx, input.len())?;
        let (positions, values) = Sparse::changes(ctx.dtype, input, base);
        Sparse::write_planed(self.0, &positions, &planes::Planed::new(&values, width(ctx.dtype)), out);
        Ok(Vec::new())
    }

    fn check_lengths(&self, stored: u64, _decoded: u64) -> Result<(), CodecError> {
        if stored < SPARSE_HEADER as u64 {
            return Err(CodecError::Corrupt { codec: self.tag(), detail: format!("{stored} bytes hold no header") });
        }
        Ok(()) // the base tensor, not the stored bytes, justifies the decoded length
    }

    fn decode(&self, ctx: ChunkContext, params: &[u8], stored: &[u8], out: &mut [u8]) -> Result<(), CodecError> {
        let tag = self.tag();
        no_params(tag, params)?;
        let base = base_for(tag, ctx, out.len())?;
        let corrupt = |detail: String| CodecError::Corrupt { codec: tag, detail };
        let w = width(ctx.dtype);
        let n = out.len() / w;
        let header = stored.get(..SPARSE_HEADER).ok_or_else(|| corrupt("sparse header is cut short".into()))?;
        let count = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let pos_len = u32::from_le_bytes(header[4..].try_into().expect("4 bytes")) as usize;
        if count > n {
            return Err(corrupt(format!("{count} changed positions in a chunk of {n} elements")));
        }
        let pos_bytes = stored
            .get(SPARSE_HEADER..SPARSE_HEADER + pos_len)
            .ok_or_else(|| corrupt(format!("position stream of {pos_len} bytes runs past the chunk")))?;
        let mut positions = Vec::new();
        self.0.decode(pos_bytes, count, n as u64, &mut positions).map_err(corrupt)?;
        let mut values = vec![0u8; count * w];
        let rest = planes::decode(tag, &stored[SPARSE_HEADER + pos_len..], w, &mut values)?;
        trailing(tag, rest)?;
        out.copy_from_slice(base);
        with_word!(w, T => {
            for (&p, v) in positions.iter().zip(values.chunks_exact(w)) {
                let at = p as usize * w;
                let e = T::from_le_bytes(v.try_into().expect("w bytes"));
                let x = if ctx.dtype.is_float() { e.rotate_right(1) } else { e };
                if x == 0 {
                    return Err(corrupt(format!("position {p} is listed as changed but its delta is 0")));
                }
                let y = T::from_le_bytes(out[at..at + w].try_into().expect("w bytes"));
                out[at..at + w].copy_from_slice(&(x ^ y).to_le_bytes());
            }
        });
        Ok(())
    }
}

/// The element width of a dtype, in bytes.
pub fn width(dtype: DType) -> usize {
    dtype.size() as usize
}

fn base_for<'a>(codec: CodecTag, ctx: ChunkContext<'a>, len: usize) -> Result<&'a [u8], CodecError> {
    let base = ctx.base.ok_or(CodecError::MissingBase { codec })?;
    if base.len() != len {
        return Err(CodecError::BaseLength { codec, found: base.len() as u64, expected: len as u64 });
    }
    Ok(base)
}

fn trailing(codec: CodecTag, rest: &[u8]) -> Result<(), CodecError> {
    if rest.is_empty() {
        Ok(())
    } else {
        Err(CodecError::Corrupt { codec, detail: format!("{} bytes follow the last plane", rest.len()) })
    }
}
