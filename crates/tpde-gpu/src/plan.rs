//! The host half of GPU decoding, free of any GPU API: a tensor's chunks become [`Batch`]es of
//! jobs for the kernels of `shaders/decode.wgsl`. Another backend (CUDA, say) would run the same
//! batches with its own kernels; nothing here depends on wgpu.
//!
//! Per chunk, what decodes in parallel (spec §6.7) is left to the device: rANS lanes and blocks, packed
//! position blocks, the plane merge and inverse transforms, the sparse XOR. What does not is done
//! here, on the CPU: `zstd`, serial rANS planes (§6.2.2) and the variable-length position coders;
//! their output is uploaded in place of the stored bytes, and the device finishes the chunk.

mod jobs;

use std::ops::Range;

use tpde_codec::planes::{self, PlaneRecord, SparsePlane};
use tpde_codec::positions::PACKED_BLOCK;
use tpde_codec::rans;
use tpde_codec::{ChunkContext, CodecError, PositionCoder, SparseLayout};
use tpde_format::{ChunkEntry, CodecTag, DType};

use jobs::{LaneJob, RansBlockJob};

/// `finish` modes (the kernel's `M_*`).
const M_COPY: u32 = 0;
const M_COPY_BASE: u32 = 1;
const M_MERGE: u32 = 2;
const M_XOR: u32 = 3;
const M_SUB: u32 = 4;

/// Record sizes in u32s, as the kernels read them.
const LANE_REC: usize = 11;
const PACKED_REC: usize = 8;
const FINISH_REC: usize = 16;
const SPARSE_REC: usize = 16;
const PLANE_REC: usize = 4;
const RANS_BLOCK_REC: usize = 13;
const HEADER: usize = 23;

/// A lane job with one table, or whose contexts are not the base's (the kernel's `NO_MAP`).
const NO_MAP: u32 = u32::MAX;

/// A source offset in the scratch buffer rather than the upload (the kernel's `SCRATCH`).
const SCRATCH: u32 = 1 << 31;
/// A source that is a sparse plane record (the kernel's `SPARSE_PLANE`), by its index in the
/// batch; bit 31 clear. Upload offsets stay under 2^28 (a batch's upload is at most 256 MiB).
const SPARSE_PLANE: u32 = 1 << 30;

/// What the device can take in one batch.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The largest storage-buffer binding, in bytes (at most 2^31, so offsets keep bit 31 free).
    pub max_binding: u64,
    /// The alignment of a binding's offset.
    pub offset_align: u64,
}

/// The messages of the kernels' error codes (`E_*`), index = code − 1.
pub const KERNEL_ERRORS: [&str; 11] = [
    "a rANS lane ends before its symbols do",
    "a rANS lane does not end where its symbols do",
    "a packed block's bit width is over 32, or 0 for a block of several positions",
    "the packed blocks' sizes do not add up to the position stream's length",
    "a position gap is 0",
    "a position is at or past the chunk's end",
    "a packed block's padding bits are not zero",
    "a packed block does not start after the previous block's last position",
    "an element listed as changed has a delta of 0",
    "a rANS block runs out of words before its symbols end",
    "a rANS block does not end where its symbols do (words left over, or a state not back at 2^16)",
];

/// Where a plane's (or the positions') bytes are, relative to the chunk's own upload or scratch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Src {
    #[default]
    None,
    Blob(u64),
    Scratch(u64),
    /// The chunk's sparse plane (spec §6.2.5) of this index in [`ChunkWork::sparse_planes`].
    SparsePlane(usize),
}

/// A sparse plane record (spec §6.2.5): its positions (u32s) and their bytes decoded here, a
/// few bytes per listed position, uploaded; the device expands the plane as it reads it.
#[derive(Debug)]
struct SparsePlaneJob {
    fill: u8,
    count: u32,
    positions: u64,
    values: u64,
}

#[derive(Debug)]
struct PackedJob {
    at: u64,
    len: u32,
    count: u32,
    n: u32,
    offsets_word: u64,
    positions_word: u64,
}

#[derive(Debug)]
struct SparseJob {
    count: u32,
    positions: Src,
    values: [Src; 8],
}

/// One chunk's share of a batch, with offsets relative to its own upload and scratch.
#[derive(Debug)]
pub struct ChunkWork {
    /// The chunk's index in its tensor.
    pub index: usize,
    /// The chunk's logical bytes within the tensor.
    pub out: Range<u64>,
    blob: Vec<u8>,
    scratch_words: u64,
    tables: Vec<[u32; 256]>,
    lanes: Vec<LaneJob>,
    rans_blocks: Vec<RansBlockJob>,
    packed: Option<PackedJob>,
    mode: u32,
    planes: [Src; 8],
    sparse: Option<SparseJob>,
    sparse_planes: Vec<SparsePlaneJob>,
    w: u32,
    float: bool,
    n: u32,
    /// The tensor's last chunk: the output buffer's padding follows it.
    last: bool,
}

impl ChunkWork {
    /// For a chunk whose logical bytes are already on the host (`raw`, or decoded here) and
    /// start on a 4-byte boundary: those bytes, zero-padded to a multiple of 4, to copy straight
    /// into the output at `out.start` with no kernel.
    pub fn direct_upload(&self) -> Option<&[u8]> {
        let len = (self.out.end - self.out.start) as usize;
        let ends_aligned = len.is_multiple_of(4) || self.last;
        (self.mode == M_COPY && self.out.start.is_multiple_of(4) && ends_aligned)
            .then(|| &self.blob[..len.next_multiple_of(4)])
    }

    /// Moves the chunk's output `by` bytes on: where its tensor starts in a buffer of several
    /// tensors (a multiple of 4, so that no two tensors share a word).
    pub fn shift(&mut self, by: u64) {
        debug_assert!(by.is_multiple_of(4));
        self.out = self.out.start + by..self.out.end + by;
    }

    fn append_blob(&mut self, bytes: &[u8]) -> Result<u64, CodecError> {
        let at = self.blob.len().next_multiple_of(4);
        let grow = at - self.blob.len() + bytes.len();
        self.blob.try_reserve(grow).map_err(|_| CodecError::OutOfMemory { bytes: bytes.len() as u64 })?;
        self.blob.resize(at, 0);
        self.blob.extend_from_slice(bytes);
        Ok(at as u64)
    }

    fn alloc_scratch(&mut self, words: u64) -> u64 {
        let at = self.scratch_words;
        self.scratch_words += words;
        at
    }

    /// The plane records at `at` of `stored`: stored planes are read in place, serial rANS
    /// planes decoded here, lane planes left to the device.
    fn planes(
        &mut self,
        tag: CodecTag,
        stored_at: u64,
        stored: &[u8],
        at: usize,
        n: usize,
    ) -> Result<[Src; 8], CodecError> {
        let w = self.w as usize;
        let (records, end) = planes::parse(tag, stored, at, w, n)?;
        tpde_codec::trailing(tag, stored, end)?;
        let mut src = [Src::None; 8];
        for (j, record) in records.into_iter().enumerate() {
            src[j] = match record {
                PlaneRecord::Stored(at) => Src::Blob(stored_at + at as u64),
                PlaneRecord::Serial(table, stream) => {
                    let mut plane = zeros(n)?;
                    rans::decode(&table, &stored[stream], &mut plane).map_err(rans::corrupt(tag))?;
                    Src::Blob(self.append_blob(&plane)?)
                }
                PlaneRecord::Lanes(table, layout) => self.lane_job(&[table], None, false, &layout, stored_at, n),
                PlaneRecord::Blocks(table, layout) => {
                    self.rans_block_job(std::slice::from_ref(&table), None, false, false, &layout, stored_at, n)
                }
                PlaneRecord::BaseContextBlocks(model, layout) => {
                    let map = self.append_blob(model.map())?;
                    self.rans_block_job(model.tables(), Some(map), true, model.has_unchanged(), &layout, stored_at, n)
                }
                PlaneRecord::ContextBlocks(model, layout) => {
                    let map = self.append_blob(model.map())?;
                    self.rans_block_job(model.tables(), Some(map), false, false, &layout, stored_at, n)
                }
                PlaneRecord::Sparse(sparse) => self.sparse_plane(tag, stored, &sparse, n)?,
                PlaneRecord::Contexts(model, layout) => {
                    let map = self.append_blob(model.map())?;
                    self.lane_job(model.tables(), Some(map), false, &layout, stored_at, n)
                }
                PlaneRecord::BaseContexts(model, layout) => {
                    let map = self.append_blob(model.map())?;
                    self.lane_job(model.tables(), Some(map), true, &layout, stored_at, n)
                }
            };
        }
        Ok(src)
    }

    /// A sparse plane record (spec §6.2.5): its positions and listed bytes decoded and checked
    /// here (as the CPU reader checks them), uploaded for the device to expand.
    fn sparse_plane(
        &mut self,
        tag: CodecTag,
        stored: &[u8],
        sparse: &SparsePlane,
        n: usize,
    ) -> Result<Src, CodecError> {
        let (mut positions, mut decoded) = (Vec::new(), Vec::new());
        let values = sparse.listed(stored, n, &mut positions, &mut decoded).map_err(rans::corrupt(tag))?.to_vec();
        let words: Vec<u8> = positions.iter().flat_map(|p| p.to_le_bytes()).collect();
        let job = SparsePlaneJob {
            fill: sparse.fill,
            count: sparse.count as u32,
            positions: self.append_blob(&words)?,
            values: self.append_blob(&values)?,
        };
        self.sparse_planes.push(job);
        Ok(Src::SparsePlane(self.sparse_planes.len() - 1))
    }
}

/// Plans chunk `index` of a `dtype` tensor from its (CRC-checked) stored bytes; `last` says
/// whether it is the tensor's last chunk.
pub fn plan_chunk(
    dtype: DType,
    index: usize,
    last: bool,
    c: &ChunkEntry,
    stored: &[u8],
) -> Result<ChunkWork, CodecError> {
    let size = dtype.size();
    let w = size as u32;
    let n = c.element_count as usize;
    let mut work = ChunkWork {
        index,
        out: c.element_start * size..(c.element_start + c.element_count) * size,
        blob: Vec::new(),
        scratch_words: 0,
        tables: Vec::new(),
        lanes: Vec::new(),
        rans_blocks: Vec::new(),
        packed: None,
        mode: M_COPY,
        planes: [Src::None; 8],
        sparse: None,
        sparse_planes: Vec::new(),
        w,
        float: dtype.is_float(),
        n: n as u32,
        last,
    };
    let tag = c.codec;
    // A prediction's params were validated at open (R30); the prediction is the base here.
    if !c.params.is_empty() && tag != CodecTag::DeltaPredicted {
        return Err(CodecError::BadParams {
            codec: tag,
            detail: format!("expected no parameters, found {} bytes", c.params.len()),
        });
    }
    match tag {
        CodecTag::Raw => {
            if stored.len() as u64 != c.decoded_length {
                return Err(CodecError::LengthMismatch {
                    codec: tag,
                    found: stored.len() as u64,
                    expected: c.decoded_length,
                });
            }
            work.planes[0] = Src::Blob(work.append_blob(stored)?);
        }
        CodecTag::Zstd => {
            let mut out = zeros(c.decoded_length as usize)?;
            tpde_codec::decode(tag, ChunkContext::keyframe(dtype), &c.params, stored, &mut out)?;
            work.planes[0] = Src::Blob(work.append_blob(&out)?);
        }
        CodecTag::Planes
        | CodecTag::PlanesLanes
        | CodecTag::PlanesContext
        | CodecTag::DeltaXor
        | CodecTag::DeltaXorLanes
        | CodecTag::DeltaSub
        | CodecTag::DeltaSubLanes
        | CodecTag::DeltaXorContext
        | CodecTag::DeltaSubContext
        | CodecTag::DeltaPredicted => {
            let at = work.append_blob(stored)?;
            work.planes = work.planes(tag, at, stored, 0, n)?;
            work.mode = match tag {
                CodecTag::Planes | CodecTag::PlanesLanes | CodecTag::PlanesContext => M_MERGE,
                CodecTag::DeltaXor | CodecTag::DeltaXorLanes | CodecTag::DeltaXorContext => M_XOR,
                _ => M_SUB,
            };
        }
        _ => {
            let coder = PositionCoder::of(tag)
                .ok_or_else(|| CodecError::Corrupt { codec: tag, detail: "this codec has no GPU plan".into() })?;
            let layout = SparseLayout::read(tag, stored, n)?;
            let at = work.append_blob(stored)?;
            let count = layout.count;
            let positions = if coder == PositionCoder::Packed {
                let blocks = count.div_ceil(PACKED_BLOCK);
                if layout.positions.len() < 5 * blocks {
                    return Err(CodecError::Corrupt {
                        codec: tag,
                        detail: format!("{blocks} block headers do not fit the stream"),
                    });
                }
                let offsets_word = work.alloc_scratch(blocks as u64);
                let positions_word = work.alloc_scratch(count as u64);
                work.packed = Some(PackedJob {
                    at: at + layout.positions.start as u64,
                    len: layout.positions.len() as u32,
                    count: count as u32,
                    n: n as u32,
                    offsets_word,
                    positions_word,
                });
                Src::Scratch(positions_word * 4)
            } else {
                let mut p = Vec::new();
                coder.decode(&stored[layout.positions.clone()], count, n as u64, &mut p).map_err(rans::corrupt(tag))?;
                let bytes: Vec<u8> = p.iter().flat_map(|x| x.to_le_bytes()).collect();
                Src::Blob(work.append_blob(&bytes)?)
            };
            let values = work.planes(tag, at, stored, layout.values, count)?;
            work.mode = M_COPY_BASE;
            work.sparse = Some(SparseJob { count: count as u32, positions, values });
        }
    }
    // The kernels read up to 4 bytes past a stream (bit reader, unaligned u32s).
    work.blob.extend_from_slice(&[0; 8]);
    Ok(work)
}

/// Chunks of one tensor that the device decodes in one go: one upload, one set of dispatches.
#[derive(Debug, Default)]
pub struct Batch {
    /// Tensor chunk indices, in order; `err[i]` of the batch is about chunk `chunks[i]`.
    pub chunks: Vec<usize>,
    /// The tensor bytes the output (and base) binding covers; its start is aligned.
    pub window: Range<u64>,
    /// The upload.
    pub blob: Vec<u8>,
    /// The job records (`jobs` in the kernels).
    pub meta: Vec<u32>,
    /// Scratch words the kernels need.
    pub scratch_words: u64,
    /// rANS tables to build.
    pub tables: u32,
    /// Lanes to decode.
    pub lanes: u32,
    /// rANS blocks to decode (one `decode_blocks` workgroup each).
    pub rans_blocks: u32,
    /// Packed-position chunks (one `scan_blocks` workgroup each).
    pub packed: u32,
    /// Packed-position blocks to unpack.
    pub blocks: u32,
    /// Output words to finish.
    pub words: u32,
    /// Changed elements to scatter.
    pub changed: u32,
}

/// Groups planned chunks into batches that fit `limits`, in chunk order.
pub struct Batcher {
    limits: Limits,
    pending: Vec<ChunkWork>,
}

impl Batcher {
    /// An empty batcher.
    pub fn new(limits: Limits) -> Batcher {
        Batcher { limits, pending: Vec::new() }
    }

    /// Adds a chunk; returns a full batch when this chunk does not fit the pending one.
    pub fn push(&mut self, work: ChunkWork) -> Result<Option<Batch>, String> {
        let alone = window(&self.limits, [&work].into_iter());
        if !self.fits(&[&work], alone.end - alone.start) {
            return Err(format!(
                "chunk {} needs more than the device's {}-byte binding limit",
                work.index, self.limits.max_binding
            ));
        }
        let mut all: Vec<&ChunkWork> = self.pending.iter().collect();
        all.push(&work);
        let win = window(&self.limits, all.iter().copied());
        let full = if self.fits(&all, win.end - win.start) { None } else { self.flush() };
        self.pending.push(work);
        Ok(full)
    }

    /// The pending chunks as a batch, if any.
    pub fn flush(&mut self) -> Option<Batch> {
        if self.pending.is_empty() {
            return None;
        }
        let chunks = std::mem::take(&mut self.pending);
        Some(assemble(&self.limits, &chunks))
    }

    fn fits(&self, chunks: &[&ChunkWork], window: u64) -> bool {
        let max = self.limits.max_binding;
        let blob: u64 = chunks.iter().map(|c| c.blob.len() as u64 + 4).sum();
        let scratch: u64 = chunks.iter().map(|c| c.scratch_words * 4).sum();
        let tables: usize = chunks.iter().map(|c| c.tables.len()).sum();
        let packed = chunks.iter().filter(|c| c.packed.is_some()).count();
        // Bounds on one batch's host memory and dispatch sizes, as well as the bindings.
        window <= max
            && blob <= max.min(256 << 20)
            && scratch <= max
            && (tables as u64) * 4096 * 4 <= max
            && tables < 65_535
            && packed < 65_535
            && chunks.len() < 1 << 16
    }
}

/// The aligned tensor byte range that covers the chunks' output.
fn window<'a>(limits: &Limits, chunks: impl Iterator<Item = &'a ChunkWork>) -> Range<u64> {
    let (mut lo, mut hi) = (u64::MAX, 0);
    for c in chunks {
        lo = lo.min(c.out.start);
        hi = hi.max(c.out.end);
    }
    let lo = lo / limits.offset_align * limits.offset_align;
    lo..hi.next_multiple_of(4).max(lo + 4)
}

fn assemble(limits: &Limits, chunks: &[ChunkWork]) -> Batch {
    let win = window(limits, chunks.iter());
    let mut b = Batch { window: win.clone(), meta: vec![0; HEADER], ..Batch::default() };
    // The batch's sparse planes, and the index of the first of the chunk being assembled.
    let mut planes: Vec<u32> = Vec::new();
    let mut planes_at = 0usize;
    let src = |s: Src, blob_at: u64, scratch_at: u64, planes_at: usize| -> u32 {
        match s {
            Src::None => 0,
            Src::Blob(o) => (blob_at + o) as u32,
            Src::Scratch(o) => SCRATCH | (scratch_at * 4 + o) as u32,
            Src::SparsePlane(j) => SPARSE_PLANE | (planes_at + j) as u32,
        }
    };
    let mut tables = Vec::new();
    let (mut lanes, mut packed, mut finish, mut sparse) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut rans_blocks, mut rans_block_prefix) = (Vec::new(), vec![0u32]);
    let (mut lane_prefix, mut block_prefix, mut word_prefix, mut changed_prefix) =
        (vec![0u32], vec![0u32], vec![0u32], vec![0u32]);
    for (ci, c) in chunks.iter().enumerate() {
        let ci = ci as u32;
        while !b.blob.len().is_multiple_of(4) {
            b.blob.push(0);
        }
        let blob_at = b.blob.len() as u64;
        b.blob.extend_from_slice(&c.blob);
        let scratch_at = b.scratch_words;
        b.scratch_words += c.scratch_words;
        let table_at = tables.len();
        tables.extend_from_slice(&c.tables);
        // The chunk's bytes, and its base's, in the output and base bindings.
        let out = (c.out.start - win.start) as u32;
        for l in &c.lanes {
            lanes.extend([
                (table_at + l.table) as u32,
                l.n,
                l.lanes,
                (blob_at + l.states) as u32,
                (blob_at + l.ends) as u32,
                (blob_at + l.bytes) as u32,
                (scratch_at + l.out_word) as u32,
                ci,
                l.map.map_or(NO_MAP, |m| (blob_at + m) as u32),
                if l.base_contexts { out } else { NO_MAP },
                c.w | u32::from(c.float) << 8,
            ]);
            lane_prefix.push(lane_prefix.last().unwrap() + l.lanes);
        }
        for r in &c.rans_blocks {
            rans_blocks.extend([
                (table_at + r.table) as u32,
                r.n,
                r.blocks,
                (blob_at + r.ends) as u32,
                (blob_at + r.states) as u32,
                (blob_at + r.words) as u32,
                (scratch_at + r.out_word) as u32,
                ci,
                r.map.map_or(NO_MAP, |m| (blob_at + m) as u32),
                if r.base_contexts { out } else { NO_MAP },
                c.w | u32::from(c.float) << 8,
                r.size,
                r.list.map_or(NO_MAP, |l| (scratch_at + l) as u32),
            ]);
            rans_block_prefix.push(rans_block_prefix.last().unwrap() + r.blocks);
        }
        if let Some(p) = &c.packed {
            packed.extend([
                (blob_at + p.at) as u32,
                p.len,
                p.count,
                p.n,
                (scratch_at + p.offsets_word) as u32,
                (scratch_at + p.positions_word) as u32,
                ci,
                0,
            ]);
            block_prefix.push(block_prefix.last().unwrap() + p.count.div_ceil(PACKED_BLOCK as u32));
        }
        for p in &c.sparse_planes {
            planes.extend([u32::from(p.fill), p.count, (blob_at + p.positions) as u32, (blob_at + p.values) as u32]);
        }
        let mut rec = vec![c.mode, c.w, u32::from(c.float), c.n, out, out, ci, 0];
        rec.extend(c.planes.iter().map(|&s| src(s, blob_at, scratch_at, planes_at)));
        finish.extend(rec);
        let bytes = u64::from(c.n) * u64::from(c.w);
        let words = if bytes == 0 { 0 } else { (u64::from(out) + bytes).div_ceil(4) - u64::from(out) / 4 };
        word_prefix.push(word_prefix.last().unwrap() + words as u32);
        if let Some(s) = &c.sparse {
            let mut rec = vec![
                c.w,
                u32::from(c.float),
                c.n,
                s.count,
                src(s.positions, blob_at, scratch_at, planes_at),
                out,
                ci,
                0,
            ];
            rec.extend(s.values.iter().map(|&v| src(v, blob_at, scratch_at, planes_at)));
            sparse.extend(rec);
            changed_prefix.push(changed_prefix.last().unwrap() + s.count);
        }
        planes_at += c.sparse_planes.len();
        b.chunks.push(c.index);
    }
    b.blob.extend_from_slice(&[0; 4]);
    b.tables = tables.len() as u32;
    b.lanes = *lane_prefix.last().unwrap();
    b.rans_blocks = *rans_block_prefix.last().unwrap();
    b.packed = (packed.len() / PACKED_REC) as u32;
    b.blocks = *block_prefix.last().unwrap();
    b.words = *word_prefix.last().unwrap();
    b.changed = *changed_prefix.last().unwrap();
    let put = |meta: &mut Vec<u32>, slot: usize, data: &[u32]| {
        meta[slot] = meta.len() as u32;
        meta.extend_from_slice(data);
    };
    let m = &mut b.meta;
    m[0] = b.tables;
    put(m, 1, &tables.concat());
    m[2] = (lanes.len() / LANE_REC) as u32;
    put(m, 3, &lanes);
    put(m, 4, &lane_prefix);
    m[5] = b.lanes;
    m[6] = b.packed;
    put(m, 7, &packed);
    put(m, 8, &block_prefix);
    m[9] = b.blocks;
    m[10] = (finish.len() / FINISH_REC) as u32;
    put(m, 11, &finish);
    put(m, 12, &word_prefix);
    m[13] = b.words;
    m[14] = (sparse.len() / SPARSE_REC) as u32;
    put(m, 15, &sparse);
    put(m, 16, &changed_prefix);
    m[17] = b.changed;
    debug_assert_eq!(planes.len() / PLANE_REC, planes_at);
    put(m, 18, &planes);
    m[19] = (rans_blocks.len() / RANS_BLOCK_REC) as u32;
    put(m, 20, &rans_blocks);
    put(m, 21, &rans_block_prefix);
    m[22] = b.rans_blocks;
    b
}

/// `n` zero bytes, the allocation fallible: a chunk's declared length the system cannot give
/// is an error, never an abort.
fn zeros(n: usize) -> Result<Vec<u8>, CodecError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| CodecError::OutOfMemory { bytes: n as u64 })?;
    v.resize(n, 0);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_respect_the_binding_limit_and_keep_chunk_order() {
        let limits = Limits { max_binding: 4096, offset_align: 256 };
        let chunk = |i: u64| ChunkEntry {
            element_start: i * 256,
            element_count: 256,
            codec: CodecTag::Raw,
            params: Vec::new(),
            offset: 0,
            stored_length: 1024,
            decoded_length: 1024,
            crc32: 0,
        };
        let mut batcher = Batcher::new(limits);
        let mut batches = Vec::new();
        for i in 0..10 {
            let c = chunk(i);
            let work = plan_chunk(DType::F32, i as usize, i == 9, &c, &vec![i as u8; 1024]).unwrap();
            batches.extend(batcher.push(work).unwrap());
        }
        batches.extend(batcher.flush());
        let order: Vec<usize> = batches.iter().flat_map(|b| b.chunks.clone()).collect();
        assert_eq!(order, (0..10).collect::<Vec<_>>());
        for b in &batches {
            assert!(b.window.end - b.window.start <= 4096 && b.window.start % 256 == 0, "{:?}", b.window);
            assert!(b.blob.len() as u64 <= 4096 + 64);
        }
        assert!(batches.len() >= 3, "{} batches", batches.len());
    }
}
