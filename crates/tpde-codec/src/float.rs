//! The float-aware codecs: `planes` (keyframes, spec §6.2), the dense deltas `delta-xor` and
//! `delta-sub` (§6.4) and the four sparse deltas (§6.5).
//!
//! Deltas work on bit patterns only, never on float values: XOR, or wrapping subtraction of
//! the patterns as unsigned integers, both exactly invertible for every pattern, NaNs included.

use tpde_format::{CodecTag, DType};

use crate::planes::{self, with_word, Finish, PlaneForm, Records};
use crate::positions::PositionCoder;
use crate::{no_params, ChunkCodec, ChunkContext, CodecError};

/// Sparse payloads: u32 count, u32 positions_len (little-endian), then the positions, then the
/// changed values' planes.
const SPARSE_HEADER: usize = 8;

/// `planes`, `planes-lanes` and `planes-context`: the keyframe codec.
#[derive(Clone, Copy, Debug)]
pub struct Planes(pub PlaneForm);

impl Planes {
    /// [`ChunkCodec::encode`], with the newer plane records `records` allowed.
    pub fn encode_planes(
        &self,
        ctx: ChunkContext,
        input: &[u8],
        records: Records,
        out: &mut Vec<u8>,
    ) -> Result<Vec<u8>, CodecError> {
        let w = width(ctx.dtype);
        // A chunk of a keyframe file, or a delta file's chunk coded as a keyframe.
        let encode = if ctx.base.is_none() { planes::encode_keyframe } else { planes::encode };
        if !planes::rotates(ctx.dtype) {
            encode(input, w, self.0, records, out);
            return Ok(Vec::new());
        }
        ELEMENTS.with_borrow_mut(|elements| {
            planes::rotated_into(input, w, elements);
            encode(elements, w, self.0, records, out);
        });
        Ok(Vec::new())
    }
}

impl ChunkCodec for Planes {
    fn tag(&self) -> CodecTag {
        match self.0 {
            PlaneForm::Serial => CodecTag::Planes,
            PlaneForm::Lanes => CodecTag::PlanesLanes,
            PlaneForm::Contexts => CodecTag::PlanesContext,
            PlaneForm::BaseContexts => panic!("the keyframe codec has no base-context form"),
        }
    }

    fn encode(&self, ctx: ChunkContext, input: &[u8], out: &mut Vec<u8>) -> Result<Vec<u8>, CodecError> {
        self.encode_planes(ctx, input, Records::FIRST, out)
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
        let end = planes::decode(self.tag(), stored, 0, w, Finish::keyframe(ctx.dtype), None, out)?;
        trailing(self.tag(), stored, end)
    }
}

thread_local! {
    /// This thread's buffer for a chunk's transformed elements, reused from chunk to chunk
    /// (one allocated per chunk faulted in fresh pages every time).
    static ELEMENTS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// This thread's buffer for a chunk's base contexts (spec §6.4.1).
    static CONTEXTS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// How a dense delta combines an element with the base's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseOp {
    /// `cur ^ base`, then rotated like a keyframe for floats.
    Xor,
    /// `zigzag(cur − base)` on the patterns as unsigned integers, wrapping.
    Sub,
}

/// `delta-xor` and `delta-sub` (and their lane forms): every element against the base's, then
/// planes.
#[derive(Clone, Copy, Debug)]
pub struct Dense(pub DenseOp, pub PlaneForm);

impl Dense {
    /// The delta elements of `input` against `base`.
    pub fn forward(op: DenseOp, dtype: DType, input: &[u8], base: &[u8]) -> Vec<u8> {
        let mut d = Vec::new();
        Dense::forward_into(op, dtype, input, base, &mut d);
        d
    }

    /// [`Dense::forward`] into `d`, a buffer of any length and content.
    pub fn forward_into(op: DenseOp, dtype: DType, input: &[u8], base: &[u8], d: &mut Vec<u8>) {
        let w = width(dtype);
        d.clear();
        d.extend_from_slice(input);
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
    }
}

impl Dense {
    /// [`ChunkCodec::encode`], with the newer plane records `records` allowed: sparse ones
    /// (spec §6.2.5) in the base-context form where they are smaller, blocks (§6.2.6).
    pub fn encode_planes(
        &self,
        ctx: ChunkContext,
        input: &[u8],
        records: Records,
        out: &mut Vec<u8>,
    ) -> Result<Vec<u8>, CodecError> {
        let base = base_for(self.tag(), ctx, input.len())?;
        ELEMENTS.with_borrow_mut(|d| {
            Dense::forward_into(self.0, ctx.dtype, input, base, d);
            if self.1 == PlaneForm::BaseContexts {
                CONTEXTS.with_borrow_mut(|contexts| {
                    planes::base_contexts(ctx.dtype, base, contexts);
                    planes::encode_against_base(d, width(ctx.dtype), contexts, records, out);
                });
            } else {
                planes::encode(d, width(ctx.dtype), self.1, records, out);
            }
        });
        Ok(Vec::new())
    }
}

impl ChunkCodec for Dense {
    fn tag(&self) -> CodecTag {
        match self {
            Dense(DenseOp::Xor, PlaneForm::Serial) => CodecTag::DeltaXor,
            Dense(DenseOp::Sub, PlaneForm::Serial) => CodecTag::DeltaSub,
            Dense(DenseOp::Xor, PlaneForm::Lanes) => CodecTag::DeltaXorLanes,
            Dense(DenseOp::Sub, PlaneForm::Lanes) => CodecTag::DeltaSubLanes,
            Dense(DenseOp::Xor, PlaneForm::BaseContexts) => CodecTag::DeltaXorContext,
            Dense(DenseOp::Sub, PlaneForm::BaseContexts) => CodecTag::DeltaSubContext,
            Dense(_, PlaneForm::Contexts) => panic!("the dense deltas have no neighbour-context form"),
        }
    }

    fn encode(&self, ctx: ChunkContext, input: &[u8], out: &mut Vec<u8>) -> Result<Vec<u8>, CodecError> {
        self.encode_planes(ctx, input, Records::FIRST, out)
    }

    fn check_lengths(&self, _stored: u64, _decoded: u64) -> Result<(), CodecError> {
        Ok(()) // the base tensor, not the stored bytes, justifies the decoded length
    }

    fn decode(&self, ctx: ChunkContext, params: &[u8], stored: &[u8], out: &mut [u8]) -> Result<(), CodecError> {
        no_params(self.tag(), params)?;
        let base = base_for(self.tag(), ctx, out.len())?;
        let w = width(ctx.dtype);
        let context_base =
            (self.1 == PlaneForm::BaseContexts).then_some(planes::BaseElements { dtype: ctx.dtype, elements: base });
        let finish = Finish::Delta { op: self.0, float: ctx.dtype.is_float(), base };
        let end = planes::decode(self.tag(), stored, 0, w, finish, context_base, out)?;
        trailing(self.tag(), stored, end)
    }
}

/// The sparse deltas: positions of the changed elements, then their XOR with the base. Only
/// the packed coder has a lane form (`sparse-packed-lanes`).
#[derive(Clone, Copy, Debug)]
pub struct Sparse(pub PositionCoder, pub PlaneForm);

/// Where a sparse payload's parts lie in the chunk's stored bytes (spec §6.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SparseLayout {
    /// Changed elements.
    pub count: usize,
    /// The coded positions.
    pub positions: std::ops::Range<usize>,
    /// Offset of the values' plane records.
    pub values: usize,
}

impl SparseLayout {
    /// Reads a sparse payload's header for a chunk of `n` elements.
    pub fn read(codec: CodecTag, stored: &[u8], n: usize) -> Result<SparseLayout, CodecError> {
        let corrupt = |detail: String| CodecError::Corrupt { codec, detail };
        let header = stored.get(..SPARSE_HEADER).ok_or_else(|| corrupt("sparse header is cut short".into()))?;
        let count = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let pos_len = u32::from_le_bytes(header[4..].try_into().expect("4 bytes")) as usize;
        if count > n {
            return Err(corrupt(format!("{count} changed positions in a chunk of {n} elements")));
        }
        let end = SPARSE_HEADER + pos_len;
        if end > stored.len() {
            return Err(corrupt(format!("position stream of {pos_len} bytes runs past the chunk")));
        }
        Ok(SparseLayout { count, positions: SPARSE_HEADER..end, values: end })
    }
}

impl Sparse {
    /// How many elements of `w` bytes differ between `input` and `base`: the changed elements.
    pub fn count_changed(input: &[u8], base: &[u8], w: usize) -> usize {
        with_word!(w, T => {
            let word = |c: &[u8]| T::from_le_bytes(c.try_into().expect("w bytes"));
            input.chunks_exact(w).zip(base.chunks_exact(w)).filter(|(c, b)| word(c) != word(b)).count()
        })
    }

    /// Where `input` differs from `base`, element by element.
    pub fn positions(input: &[u8], base: &[u8], w: usize) -> Vec<u32> {
        // A mask of which of 64 elements changed, then one push per set bit: the fixed-size
        // compare vectorises, and the work follows the changes (bf16 weights: an eighth of
        // the elements), where a slot written for every element cost a share of a delta pack.
        const BLOCK: usize = 64;
        let mut positions = Vec::new();
        with_word!(w, T => {
            let word = |c: &[u8]| T::from_le_bytes(c.try_into().expect("w bytes"));
            let blocks = input.chunks(BLOCK * w).zip(base.chunks(BLOCK * w));
            for (k, (c, b)) in blocks.enumerate() {
                let mut mask = 0u64;
                for (j, (c, b)) in c.chunks_exact(w).zip(b.chunks_exact(w)).enumerate() {
                    mask |= u64::from(word(c) != word(b)) << j;
                }
                while mask != 0 {
                    positions.push((k * BLOCK) as u32 + mask.trailing_zeros());
                    mask &= mask - 1;
                }
            }
        });
        positions
    }

    /// Appends the sparse payload of the changes at `positions` (found by
    /// [`Sparse::positions`]): the coded positions, then the changed elements' `delta-xor`
    /// values split into planes.
    pub fn write(self, dtype: DType, input: &[u8], base: &[u8], positions: &[u32], out: &mut Vec<u8>) {
        let w = width(dtype);
        let gather = |bytes: &[u8]| -> Vec<u8> {
            positions.iter().flat_map(|&p| &bytes[p as usize * w..][..w]).copied().collect()
        };
        let values = Dense::forward(DenseOp::Xor, dtype, &gather(input), &gather(base));
        out.extend_from_slice(&(positions.len() as u32).to_le_bytes());
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        self.0.encode(positions, out);
        let len = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&len.to_le_bytes());
        planes::encode(&values, w, self.1, Records::FIRST, out);
    }
}

impl ChunkCodec for Sparse {
    fn tag(&self) -> CodecTag {
        match self {
            Sparse(coder, PlaneForm::Serial) => coder.tag(),
            Sparse(PositionCoder::Packed, PlaneForm::Lanes) => CodecTag::SparsePackedLanes,
            Sparse(coder, PlaneForm::Lanes) => panic!("the {coder:?} position coder has no lane form"),
            Sparse(_, PlaneForm::Contexts | PlaneForm::BaseContexts) => {
                panic!("the sparse deltas have no context form")
            }
        }
    }

    fn encode(&self, ctx: ChunkContext, input: &[u8], out: &mut Vec<u8>) -> Result<Vec<u8>, CodecError> {
        let base = base_for(self.tag(), ctx, input.len())?;
        let positions = Sparse::positions(input, base, width(ctx.dtype));
        self.write(ctx.dtype, input, base, &positions, out);
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
        let layout = SparseLayout::read(tag, stored, n)?;
        let count = layout.count;
        let mut positions = Vec::new();
        self.0.decode(&stored[layout.positions], count, n as u64, &mut positions).map_err(corrupt)?;
        let mut values = vec![0u8; count * w];
        let end = planes::decode(tag, stored, layout.values, w, Finish::Keep, None, &mut values)?;
        trailing(tag, stored, end)?;
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

/// Checks that the encoding ends at `end`, the end of the chunk's stored bytes.
pub fn trailing(codec: CodecTag, stored: &[u8], end: usize) -> Result<(), CodecError> {
    if end == stored.len() {
        Ok(())
    } else {
        Err(CodecError::Corrupt { codec, detail: format!("{} bytes follow the last plane", stored.len() - end) })
    }
}
