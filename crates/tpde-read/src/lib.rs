//! The TPDE reader.
//!
//! [`Reader::open`] maps the file and reads only the header (first 64 bytes), the trailer
//! (last 32 bytes) and the directory the trailer points to; it validates all of it against the
//! spec before returning. Reading a tensor touches only that tensor's chunks, and for a delta
//! the same chunks of its base: a TPDE base decodes each delta chunk's base range on its own
//! ([`Base::read_range_into`]), so a chain is decoded a chunk at a time through all its files and
//! a slice ([`Reader::read_range_into`]) touches only the chunks it covers in each; other bases
//! (a `.safetensors` file) hand over whole tensors. A tensor whose
//! chunks are all `raw` and adjacent comes back as a slice borrowed from the map, without a
//! copy; other tensors decode their chunks in parallel into one buffer.
//!
//! Every length and offset from the file is checked before use; any byte string given to
//! [`Reader::from_source`] yields a [`ReadError`], never a panic.
//!
//! ```
//! use tpde_read::Reader;
//! use tpde_write::{Writer, WriteOptions};
//! use tpde_format::DType;
//! let mut w = Writer::new(Vec::new(), WriteOptions::default())?;
//! w.add_tensor("bias", DType::U8, &[4], &[1, 2, 3, 4])?;
//! let file = w.finish()?;
//!
//! let r = Reader::from_source(file)?;
//! let bias = r.read("bias")?;
//! assert!(matches!(bias, std::borrow::Cow::Borrowed(_)), "raw tensors are not copied");
//! assert_eq!(&*bias, &[1, 2, 3, 4]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

mod base;
pub mod chain;
mod error;
mod inputs;
mod source;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;
use tpde_codec::predicted::Inputs;
use tpde_codec::ChunkContext;
use tpde_format::digest::{content_digest, tensor_digest, to_hex, Digest, DigestInput};
use tpde_format::validate::validate;
use tpde_format::{
    ChunkEntry, CodecTag, DType, Directory, FormatError, Header, MetadataValue, Position, Prediction, TensorEntry,
    Trailer,
};

pub use base::{Base, BaseTensor};
pub use chain::{open_chain, open_chain_with, PathHints, MAX_CHAIN};
pub use error::ReadError;
pub use source::{out_of_range, Source, StreamSource};

use inputs::InputCache;

/// Whether chunk CRCs are checked on read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChecksumPolicy {
    /// Check every chunk's CRC-32 before decoding it (the default).
    #[default]
    Verify,
    /// Skip chunk CRCs: for input already verified or produced by a trusted process. The
    /// header, trailer and directory are still checked, and decoding still never panics.
    Trust,
}

/// Reader settings.
#[derive(Clone, Copy, Debug)]
pub struct ReadOptions {
    /// Chunk CRC policy.
    pub checksums: ChecksumPolicy,
    /// The largest tensor the reader decodes, in logical bytes: a larger one is a
    /// `limit-exceeded` error before anything is allocated or decoded. A file can declare a
    /// tensor far larger than itself (chunks that decode to 1 GiB from a few bytes, or many
    /// chunk entries naming one stored range, R22), so this, not the file's size, bounds what
    /// reading it costs.
    pub max_tensor_bytes: u64,
}

/// The default [`ReadOptions::max_tensor_bytes`]: 16 GiB, above the largest tensor of today's
/// released models (a 128k x 16k embedding in fp32 is 8 GiB) and below what a file can claim.
pub const DEFAULT_MAX_TENSOR_BYTES: u64 = 16 << 30;

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions { checksums: ChecksumPolicy::Verify, max_tensor_bytes: DEFAULT_MAX_TENSOR_BYTES }
    }
}

/// Logical bytes [`Reader::stream_tensor`] decodes at once (whole chunks, so a window may
/// hold one chunk more: at most 1 GiB by §8, 4 MiB as the writer chunks by default).
const STREAM_WINDOW: u64 = 64 << 20;

/// What [`Reader::verify`] checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Tensors decoded and matched against their digests.
    pub tensors: u64,
    /// Chunks whose CRC matched and that decoded.
    pub chunks: u64,
    /// Stored payload bytes.
    pub stored_bytes: u64,
    /// Logical tensor bytes.
    pub logical_bytes: u64,
}

/// An open TPDE file.
pub struct Reader<S: Source = memmap2::Mmap> {
    src: S,
    header: Header,
    trailer: Trailer,
    directory: Directory,
    index: HashMap<String, usize>,
    options: ReadOptions,
    /// The base a delta file decodes against, once attached and its digest checked.
    base: Option<Arc<dyn Base>>,
    /// The tensors that predictions read (spec §6.8): their decoded chunks are kept in `inputs`.
    predicted_inputs: HashSet<String>,
    inputs: InputCache,
}

impl Reader<memmap2::Mmap> {
    /// Maps the file at `path` and reads its header, trailer and directory.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ReadError> {
        Self::open_with(path, ReadOptions::default())
    }

    /// [`Reader::open`] with settings.
    pub fn open_with(path: impl AsRef<Path>, options: ReadOptions) -> Result<Self, ReadError> {
        let path = path.as_ref();
        let io = |source| ReadError::Io { path: path.to_path_buf(), source };
        let map = map_file(path).map_err(io)?;
        Reader::with_options(map, options)
    }
}

/// Maps a file read-only: the one place this workspace uses `unsafe`.
pub fn map_file(path: &Path) -> std::io::Result<memmap2::Mmap> {
    let file = File::open(path)?;
    // SAFETY: the map is read-only. Like every mmap reader (safetensors, object), it relies on
    // no other process truncating or rewriting the file while it is mapped; TPDE files are
    // written once, to a temporary name, then renamed into place, so they are not rewritten.
    unsafe { memmap2::Mmap::map(&file) }
}

impl<S: Source> Reader<S> {
    /// Reads the header, trailer and directory of `src`.
    pub fn from_source(src: S) -> Result<Self, ReadError> {
        Self::with_options(src, ReadOptions::default())
    }

    /// [`Reader::from_source`] with settings.
    pub fn with_options(src: S, options: ReadOptions) -> Result<Self, ReadError> {
        let len = src.len();
        let head = bytes(&src, 0..len.min(Header::LEN as u64), "header")?;
        let header = Header::parse(&head, len)?;
        let min_len = (Header::LEN + Trailer::LEN) as u64;
        if len < min_len {
            return Err(FormatError::Truncated {
                what: "trailer",
                start: Header::LEN as u64,
                end: min_len,
                file_len: len,
            }
            .into());
        }
        let tail: [u8; 32] = bytes(&src, len - Trailer::LEN as u64..len, "trailer")?
            .as_ref()
            .try_into()
            .expect("bytes() returns the length asked for");
        let trailer = Trailer::parse(&tail, len)?;
        let dir_at = trailer.directory_offset;
        let dir_bytes = bytes(&src, dir_at..dir_at + trailer.directory_length, "directory")?;
        let crc = crc32fast::hash(&dir_bytes);
        if crc != trailer.directory_crc32 {
            return Err(FormatError::ChecksumMismatch {
                what: "directory",
                location: Position::at(dir_at),
                stored: format!("{:08x}", trailer.directory_crc32),
                computed: format!("{crc:08x}"),
            }
            .into());
        }
        let directory = Directory::parse(&dir_bytes).map_err(|e| e.offset_by(dir_at))?;
        validate(&header, &directory, dir_at)?;
        for t in &directory.tensors {
            for (i, c) in t.chunks.iter().enumerate() {
                tpde_codec::decoder(c.codec)
                    .check_lengths(c.stored_length, c.decoded_length)
                    .map_err(|source| ReadError::Codec { location: chunk_location(t, i, c), source })?;
            }
        }
        let index = directory.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        let predicted_inputs = directory
            .tensors
            .iter()
            .flat_map(|t| &t.chunks)
            .filter(|c| c.codec == CodecTag::DeltaPredicted)
            .filter_map(|c| Prediction::parse(&c.params).ok())
            .flat_map(|p| p.inputs().into_iter().map(str::to_owned).collect::<Vec<_>>())
            .collect();
        Ok(Reader {
            src,
            header,
            trailer,
            directory,
            index,
            options,
            base: None,
            predicted_inputs,
            inputs: InputCache::default(),
        })
    }

    /// Attaches the base this delta file was written against (spec §6.3). Fails, naming both
    /// digests, if the base's content digest is not the one the file records.
    pub fn with_base(mut self, base: Arc<dyn Base>) -> Result<Self, ReadError> {
        let Some(want) = &self.directory.base else {
            return Err(ReadError::NotADelta);
        };
        let found = base.content_digest()?;
        if found != want.digest {
            return Err(ReadError::BaseMismatch { expected: to_hex(&want.digest), found: to_hex(&found) });
        }
        self.base = Some(base);
        Ok(self)
    }

    /// Whether any chunk of the file decodes against a base.
    pub fn uses_base(&self) -> bool {
        self.tensors().iter().any(|t| self.tensor_uses_base(t))
    }

    /// Whether any chunk of `t` decodes against the base.
    pub fn tensor_uses_base(&self, t: &TensorEntry) -> bool {
        t.chunks.iter().any(|c| c.codec.needs_base())
    }

    /// The source the file is read from.
    pub fn source(&self) -> &S {
        &self.src
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The trailer.
    pub fn trailer(&self) -> &Trailer {
        &self.trailer
    }

    /// The directory.
    pub fn directory(&self) -> &Directory {
        &self.directory
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> &[TensorEntry] {
        &self.directory.tensors
    }

    /// The file's metadata value for `key`.
    pub fn metadata(&self, key: &str) -> Option<&MetadataValue> {
        self.directory.metadata_value(key)
    }

    /// The file's length in bytes.
    pub fn file_len(&self) -> u64 {
        self.src.len()
    }

    /// The settings.
    pub fn options(&self) -> ReadOptions {
        self.options
    }

    /// The tensor entry named `name`.
    pub fn tensor(&self, name: &str) -> Result<&TensorEntry, ReadError> {
        self.index
            .get(name)
            .map(|&i| &self.directory.tensors[i])
            .ok_or_else(|| ReadError::NotFound { name: name.to_owned() })
    }

    /// The content digest of the file's tensors (spec §7), from the directory alone.
    pub fn content_digest(&self) -> Digest {
        content_digest(self.directory.tensors.iter().map(|t| DigestInput {
            name: &t.name,
            dtype: t.dtype,
            shape: &t.shape,
            digest: &t.digest,
        }))
    }

    /// The logical bytes of the tensor named `name`.
    pub fn read(&self, name: &str) -> Result<Cow<'_, [u8]>, ReadError> {
        self.read_tensor(self.tensor(name)?)
    }

    /// The logical bytes of a tensor: borrowed from the source when its chunks are all `raw`
    /// and adjacent, decoded into a new buffer otherwise.
    pub fn read_tensor(&self, t: &TensorEntry) -> Result<Cow<'_, [u8]>, ReadError> {
        self.read_tensor_with(t, self.options.checksums)
    }

    /// Decodes a tensor into `out`, which must be exactly its logical length.
    pub fn read_into(&self, t: &TensorEntry, out: &mut [u8]) -> Result<(), ReadError> {
        if out.len() as u64 != t.byte_length {
            return Err(ReadError::BufferLength {
                name: t.name.clone(),
                found: out.len() as u64,
                expected: t.byte_length,
            });
        }
        self.decode_into(t, out, self.options.checksums)
    }

    /// Decodes several tensors, each into its buffer (exactly its logical length), in one
    /// parallel pass over all their chunks. Reading a checkpoint tensor by tensor leaves cores
    /// idle: most tensors are one chunk (on a 2-core machine, MiniLM's 319 tensors decoded
    /// 1.09x as fast on 2 cores as on 1 that way, 1.8x this way). A remote source still reads
    /// tensor by tensor, a window at a time. The error returned is the first in the order given.
    pub fn read_many_into(&self, tensors: Vec<(&TensorEntry, &mut [u8])>) -> Result<(), ReadError> {
        for (t, out) in &tensors {
            if out.len() as u64 != t.byte_length {
                return Err(ReadError::BufferLength {
                    name: t.name.clone(),
                    found: out.len() as u64,
                    expected: t.byte_length,
                });
            }
        }
        let policy = self.options.checksums;
        if self.src.prefetch_window().is_some() {
            return tensors.into_iter().try_for_each(|(t, out)| self.decode_into(t, out, policy));
        }
        let bases = tensors.iter().map(|(t, _)| self.chunk_base(t)).collect::<Result<Vec<_>, _>>()?;
        let mut jobs = Vec::new();
        for ((t, out), base) in tensors.into_iter().zip(&bases) {
            jobs.extend(span_jobs(t, &(0..t.byte_length), out).into_iter().map(|job| (t, base, job)));
        }
        let results: Vec<Result<(), ReadError>> =
            jobs.into_par_iter().map(|(t, base, job)| self.decode_job(t, job, base, policy)).collect();
        results.into_iter().collect()
    }

    /// The stored bytes of chunk `i` of `t`, CRC-checked under the reader's policy: for decoders
    /// outside this crate (the GPU decoder), which then own R25 for the chunk.
    pub fn chunk_bytes(&self, t: &TensorEntry, i: usize) -> Result<Cow<'_, [u8]>, ReadError> {
        let c = t.chunks.get(i).ok_or_else(|| ReadError::NotFound { name: format!("{}[chunk {i}]", t.name) })?;
        self.stored(t, i, c, self.options.checksums)
    }

    /// The tensor `t`, ready to be decoded chunk by chunk into the caller's buffers (a chunk at
    /// a time per core, written out as each is done, rather than a whole tensor held at once).
    /// Its base tensor, if any chunk needs one, is fetched and checked here, once.
    pub fn tensor_chunks<'r>(&'r self, t: &'r TensorEntry) -> Result<TensorChunks<'r, S>, ReadError> {
        Ok(TensorChunks { reader: self, tensor: t, base: self.chunk_base(t)? })
    }

    /// Whether [`Reader::read_tensor`] returns this tensor without copying.
    pub fn is_zero_copy(&self, t: &TensorEntry) -> bool {
        self.contiguous_raw(t).is_some()
    }

    /// Checks the whole file: every chunk's CRC and decoding, every tensor's digest, and that
    /// the bytes between payloads are zero. [`Reader::verify_tensor`] and
    /// [`Reader::verify_padding`] do the parts.
    pub fn verify(&self) -> Result<VerifyReport, ReadError> {
        self.verify_with(|_| {})
    }

    /// [`Reader::verify`], calling `on_tensor` after each tensor checks out (for progress).
    pub fn verify_with(&self, mut on_tensor: impl FnMut(&TensorEntry)) -> Result<VerifyReport, ReadError> {
        let mut report = VerifyReport::default();
        for t in self.tensors() {
            self.verify_tensor(t)?;
            on_tensor(t);
            report.tensors += 1;
            report.chunks += t.chunks.len() as u64;
            report.stored_bytes += t.stored_length();
            report.logical_bytes += t.byte_length;
        }
        self.verify_padding()?;
        Ok(report)
    }

    /// Decodes one tensor with CRCs checked and compares its digest, streaming it (a window
    /// of chunks at a time), so that the memory it takes does not grow with the tensor.
    pub fn verify_tensor(&self, t: &TensorEntry) -> Result<(), ReadError> {
        let mut digest = tpde_format::digest::StreamDigest::new();
        self.stream_with(t, ChecksumPolicy::Verify, |bytes| {
            digest.update(bytes);
            Ok::<(), ReadError>(())
        })?;
        check_computed_digest(t, digest.finalize())
    }

    /// Decodes tensor `t` a window of chunks at a time (each window's chunks in parallel) and
    /// hands its logical bytes to `sink` in order: a tensor of any size passes through a
    /// bounded buffer (`tpde cat`, verifying). A tensor over
    /// [`ReadOptions::max_tensor_bytes`] is refused before anything is decoded.
    pub fn stream_tensor<E: From<ReadError>>(
        &self,
        t: &TensorEntry,
        sink: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        self.stream_with(t, self.options.checksums, sink)
    }

    fn stream_with<E: From<ReadError>>(
        &self,
        t: &TensorEntry,
        policy: ChecksumPolicy,
        mut sink: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        self.check_size(t)?;
        if let Some(range) = self.contiguous_raw(t) {
            if policy == ChecksumPolicy::Verify {
                t.chunks.par_iter().enumerate().try_for_each(|(i, c)| self.stored(t, i, c, policy).map(|_| ()))?;
            }
            return sink(&bytes(&self.src, range, "chunk")?);
        }
        let base = self.chunk_base(t)?;
        let mut buf = Vec::new();
        let (mut start, mut at) = (0u64, 0u64);
        for c in &t.chunks {
            at += c.decoded_length;
            if at - start >= STREAM_WINDOW || at == t.byte_length {
                let out = zeroed(&mut buf, at - start, &t.name)?;
                self.decode_span(t, start..at, out, &base, policy)?;
                sink(out)?;
                start = at;
            }
        }
        Ok(())
    }

    /// Refuses a tensor over [`ReadOptions::max_tensor_bytes`].
    pub fn check_size(&self, t: &TensorEntry) -> Result<(), ReadError> {
        match t.byte_length > self.options.max_tensor_bytes {
            true => Err(ReadError::TooLarge {
                name: t.name.clone(),
                bytes: t.byte_length,
                limit: self.options.max_tensor_bytes,
            }),
            false => Ok(()),
        }
    }

    /// Checks that every byte of the payload area that no chunk covers is zero (spec §4).
    pub fn verify_padding(&self) -> Result<(), ReadError> {
        let mut ranges: Vec<(u64, u64)> =
            self.tensors().iter().flat_map(|t| &t.chunks).map(|c| (c.offset, c.offset + c.stored_length)).collect();
        ranges.sort_unstable();
        let mut gaps = Vec::new();
        let mut at = Header::LEN as u64;
        let end = self.trailer.directory_offset;
        for (s, e) in ranges.into_iter().chain([(end, end)]) {
            if s > at {
                gaps.push(at..s);
            }
            at = at.max(e);
        }
        self.src.prefetch(&gaps).map_err(|source| ReadError::source("padding", &gaps, source))?;
        for gap in gaps {
            let start = gap.start;
            if let Some(i) = bytes(&self.src, gap, "padding")?.iter().position(|&b| b != 0) {
                return Err(FormatError::Malformed {
                    what: "padding",
                    location: Position::at(start + i as u64),
                    detail: "a byte outside every chunk is not zero".into(),
                }
                .into());
            }
        }
        Ok(())
    }

    fn read_tensor_with(&self, t: &TensorEntry, policy: ChecksumPolicy) -> Result<Cow<'_, [u8]>, ReadError> {
        self.check_size(t)?;
        if let Some(range) = self.contiguous_raw(t) {
            if policy == ChecksumPolicy::Verify {
                t.chunks.par_iter().enumerate().try_for_each(|(i, c)| self.stored(t, i, c, policy).map(|_| ()))?;
            }
            return bytes(&self.src, range, "chunk");
        }
        // A delta's base tensor is checked (or fetched) before the output is allocated: the
        // base justifies the length.
        let base = self.chunk_base(t)?;
        let mut out = zeroed_vec(t.byte_length, &t.name)?;
        self.decode_chunks(t, &mut out, &base, policy)?;
        Ok(Cow::Owned(out))
    }

    /// The stored range of a tensor whose chunks are all `raw` and back to back, in a source
    /// that lends its bytes (a remote one copies them anyway, a window at a time).
    fn contiguous_raw(&self, t: &TensorEntry) -> Option<std::ops::Range<u64>> {
        if self.src.prefetch_window().is_some() {
            return None;
        }
        let first = t.chunks.first()?;
        let mut end = first.offset;
        for c in &t.chunks {
            if c.codec != CodecTag::Raw || c.offset != end || !c.params.is_empty() {
                return None;
            }
            end += c.stored_length;
        }
        Some(first.offset..end)
    }

    fn decode_into(&self, t: &TensorEntry, out: &mut [u8], policy: ChecksumPolicy) -> Result<(), ReadError> {
        let base = self.chunk_base(t)?;
        self.decode_chunks(t, out, &base, policy)
    }

    /// What `t`'s delta chunks decode against; a base that gives ranges is checked here to
    /// hold the tensor with its dtype and shape.
    fn chunk_base(&self, t: &TensorEntry) -> Result<ChunkBase<'_>, ReadError> {
        if !self.tensor_uses_base(t) {
            return Ok(ChunkBase::None);
        }
        match &self.base {
            Some(b) if b.reads_ranges() => {
                let info = b.tensor_info(&t.name)?.ok_or_else(|| ReadError::BaseTensor {
                    name: t.name.clone(),
                    detail: "the base has no tensor of that name".into(),
                })?;
                if info.0 != t.dtype || info.1 != t.shape {
                    return Err(ReadError::BaseTensor {
                        name: t.name.clone(),
                        detail: format!("the base's is {} {:?}, the file's {} {:?}", info.0, info.1, t.dtype, t.shape),
                    });
                }
                Ok(ChunkBase::Ranges)
            }
            _ => Ok(self.base_tensor(t)?.map_or(ChunkBase::None, ChunkBase::Whole)),
        }
    }

    /// Decodes bytes `range` of tensor `t`'s logical bytes into `out`, decoding only the chunks
    /// that cover them. For a delta, the base gives each such chunk's base bytes the same way
    /// when it is a TPDE file, so a slice read through a chain decodes only the chunks the slice
    /// covers in every file.
    pub fn read_range_into(
        &self,
        t: &TensorEntry,
        range: std::ops::Range<u64>,
        out: &mut [u8],
    ) -> Result<(), ReadError> {
        if range.start > range.end || range.end > t.byte_length || out.len() as u64 != range.end - range.start {
            return Err(ReadError::BufferLength {
                name: t.name.clone(),
                found: out.len() as u64,
                expected: range.end.saturating_sub(range.start),
            });
        }
        self.decode_range(t, range, out)
    }

    /// [`Reader::read_range_into`] without its checks: also what a delta's chunks ask of this
    /// file when it is their base ([`Base::read_range_into`]).
    pub(crate) fn decode_range(
        &self,
        t: &TensorEntry,
        range: std::ops::Range<u64>,
        out: &mut [u8],
    ) -> Result<(), ReadError> {
        let base = self.chunk_base(t)?;
        self.decode_span(t, range, out, &base, self.options.checksums)
    }

    /// Asks the source, and the chain of bases behind it, to fetch ahead the stored bytes that
    /// decoding bytes `range` of tensor `name` needs ([`Base::prefetch_range`]).
    pub(crate) fn prefetch_span(&self, name: &str, range: std::ops::Range<u64>) -> Result<(), ReadError> {
        let t = self.tensor(name)?;
        let stored: Vec<_> = covering(t, &range).map(|(_, c, _)| c.offset..c.offset + c.stored_length).collect();
        self.src.prefetch(&stored).map_err(|source| ReadError::source("chunks", &stored, source))?;
        match &self.base {
            Some(b) if self.tensor_uses_base(t) && b.reads_ranges() => b.prefetch_range(name, range),
            _ => Ok(()),
        }
    }

    /// Decodes bytes `range` of `t` into `out`, chunk by chunk in parallel. A remote source
    /// gets them a window at a time ([`Source::prefetch_window`]), announced before the window
    /// decodes, so that its requests are few and concurrent and what it holds stays bounded.
    fn decode_span(
        &self,
        t: &TensorEntry,
        range: std::ops::Range<u64>,
        out: &mut [u8],
        base: &ChunkBase<'_>,
        policy: ChecksumPolicy,
    ) -> Result<(), ReadError> {
        let jobs = span_jobs(t, &range, out);
        let Some(window) = self.src.prefetch_window() else {
            return self.decode_jobs(t, jobs, base, policy);
        };
        let mut group = Vec::new();
        let mut group_bytes = 0;
        for job in jobs {
            if !group.is_empty() && group_bytes + job.c.stored_length > window {
                self.fetch_and_decode(t, std::mem::take(&mut group), base, policy)?;
                group_bytes = 0;
            }
            group_bytes += job.c.stored_length;
            group.push(job);
        }
        self.fetch_and_decode(t, group, base, policy)
    }

    fn fetch_and_decode(
        &self,
        t: &TensorEntry,
        jobs: Vec<SpanJob<'_, '_>>,
        base: &ChunkBase<'_>,
        policy: ChecksumPolicy,
    ) -> Result<(), ReadError> {
        let (Some(first), Some(last)) = (jobs.first(), jobs.last()) else {
            return Ok(());
        };
        let span = first.lo..last.lo + last.c.decoded_length;
        let stored: Vec<_> = jobs.iter().map(|j| j.c.offset..j.c.offset + j.c.stored_length).collect();
        self.src.prefetch(&stored).map_err(|source| ReadError::source("chunks", &stored, source))?;
        if let (ChunkBase::Ranges, Some(b)) = (base, &self.base) {
            b.prefetch_range(&t.name, span)?;
        }
        self.decode_jobs(t, jobs, base, policy)
    }

    fn decode_jobs(
        &self,
        t: &TensorEntry,
        jobs: Vec<SpanJob<'_, '_>>,
        base: &ChunkBase<'_>,
        policy: ChecksumPolicy,
    ) -> Result<(), ReadError> {
        let results: Vec<Result<(), ReadError>> =
            jobs.into_par_iter().map(|job| self.decode_job(t, job, base, policy)).collect();
        // The first failing chunk in file order, so the error does not depend on scheduling.
        results.into_iter().collect()
    }

    /// Decodes one chunk's part of a span.
    fn decode_job(
        &self,
        t: &TensorEntry,
        SpanJob { i, c, lo, skip, part }: SpanJob<'_, '_>,
        base: &ChunkBase<'_>,
        policy: ChecksumPolicy,
    ) -> Result<(), ReadError> {
        if policy == self.options.checksums && self.predicted_inputs.contains(&t.name) {
            // A chunk predictions read: decoded once (under the reader's checksum
            // policy) and kept, for the predictions and the reads that need it again.
            let key = (t.name.clone(), lo, lo + c.decoded_length);
            let kept = match self.inputs.get(&key) {
                Some(kept) => kept,
                None => {
                    let whole: Arc<[u8]> = self.decode_whole(t, i, c, base, policy)?.into();
                    self.inputs.insert(key, whole.clone());
                    whole
                }
            };
            part.copy_from_slice(&kept[skip as usize..skip as usize + part.len()]);
            return Ok(());
        }
        if skip == 0 && part.len() as u64 == c.decoded_length {
            return self.decode_chunk(t, i, c, base, policy, part);
        }
        let whole = self.decode_whole(t, i, c, base, policy)?;
        part.copy_from_slice(&whole[skip as usize..skip as usize + part.len()]);
        Ok(())
    }

    /// Chunk `i` (entry `c`) of `t`, decoded into a buffer of its own.
    fn decode_whole(
        &self,
        t: &TensorEntry,
        i: usize,
        c: &ChunkEntry,
        base: &ChunkBase<'_>,
        policy: ChecksumPolicy,
    ) -> Result<Vec<u8>, ReadError> {
        let mut whole = vec![0u8; c.decoded_length as usize];
        self.decode_chunk(t, i, c, base, policy, &mut whole)?;
        Ok(whole)
    }

    /// The bytes of the base tensor `t` decodes against, if any of its chunks does: the attached
    /// base's tensor of the same name, dtype and shape.
    fn base_tensor(&self, t: &TensorEntry) -> Result<Option<Cow<'_, [u8]>>, ReadError> {
        if !self.tensor_uses_base(t) {
            return Ok(None);
        }
        let Some(base) = &self.base else {
            return Err(self.base_missing());
        };
        let bt = base.tensor(&t.name)?.ok_or_else(|| ReadError::BaseTensor {
            name: t.name.clone(),
            detail: "the base has no tensor of that name".into(),
        })?;
        if bt.dtype != t.dtype || bt.shape != t.shape || bt.data.len() as u64 != t.byte_length {
            return Err(ReadError::BaseTensor {
                name: t.name.clone(),
                detail: format!(
                    "the base's is {} {:?} ({} bytes), the file's {} {:?}",
                    bt.dtype,
                    bt.shape,
                    bt.data.len(),
                    t.dtype,
                    t.shape
                ),
            });
        }
        Ok(Some(bt.data))
    }

    fn decode_chunks(
        &self,
        t: &TensorEntry,
        out: &mut [u8],
        base: &ChunkBase<'_>,
        policy: ChecksumPolicy,
    ) -> Result<(), ReadError> {
        self.decode_span(t, 0..t.byte_length, out, base, policy)
    }

    /// Decodes chunk `i` of `t` into `out`, its decoded length, against `base` (from
    /// [`Reader::chunk_base`]).
    fn decode_chunk(
        &self,
        t: &TensorEntry,
        i: usize,
        c: &ChunkEntry,
        base: &ChunkBase<'_>,
        policy: ChecksumPolicy,
        out: &mut [u8],
    ) -> Result<(), ReadError> {
        let from = c.element_start * t.dtype.size();
        let mut own = Scratch::default();
        let base = match base {
            _ if !c.codec.needs_base() => None,
            ChunkBase::None => None,
            ChunkBase::Whole(whole) => Some(&whole[from as usize..from as usize + out.len()]),
            ChunkBase::Ranges => {
                let b = self.base.as_ref().expect("chunk_base checked the base");
                let own = own.of_len(out.len());
                b.read_range_into(&t.name, from..from + out.len() as u64, own)?;
                Some(&own[..])
            }
        };
        let prediction;
        let base = if c.codec == CodecTag::DeltaPredicted {
            let b = base.ok_or_else(|| self.base_missing())?;
            prediction = self.predict(c, from..from + out.len() as u64, b)?;
            Some(&prediction[..])
        } else {
            base
        };
        let ctx = ChunkContext { dtype: t.dtype, base };
        let stored = self.stored(t, i, c, policy)?;
        tpde_codec::decode(c.codec, ctx, &c.params, &stored, out)
            .map_err(|source| ReadError::Codec { location: chunk_location(t, i, c), source })
    }

    /// The prediction of a `delta-predicted` chunk `c` over bytes `range` of its tensor, whose
    /// base bytes there are `base` (spec §6.8). The tensors it reads in this file are decoded
    /// over the same range first; validation bounded how deep that goes (R30).
    fn predict(&self, c: &ChunkEntry, range: std::ops::Range<u64>, base: &[u8]) -> Result<Vec<u8>, ReadError> {
        let p = Prediction::parse(&c.params).expect("validated when the file was opened (R30)");
        let len = base.len();
        // Through decode_range, which keeps the chunks of the tensors predictions read.
        let this = |name: &str| -> Result<Vec<u8>, ReadError> {
            let mut out = vec![0u8; len];
            self.decode_range(self.tensor(name)?, range.clone(), &mut out)?;
            Ok(out)
        };
        let exp_avg = this(p.inputs()[0])?;
        let other = match &p {
            Prediction::AdamSecondMoment { exp_avg: name, .. } => {
                let b = self.base.as_ref().ok_or_else(|| self.base_missing())?;
                match b.tensor_info(name)? {
                    Some((DType::F32, shape)) if shape == self.tensor(name)?.shape => {}
                    found => {
                        return Err(ReadError::BaseTensor {
                            name: name.clone(),
                            detail: match found {
                                None => "a prediction reads it from the base, which has no tensor of that name".into(),
                                Some((dtype, shape)) => format!(
                                    "a prediction reads it from the base, whose is {dtype} {shape:?}, not the file's"
                                ),
                            },
                        })
                    }
                }
                let mut out = vec![0u8; len];
                b.read_range_into(name, range.clone(), &mut out)?;
                out
            }
            Prediction::AdamParameter { exp_avg_sq, .. } => this(exp_avg_sq)?,
        };
        let mut prediction = vec![0u8; len];
        tpde_codec::predicted::predict(&p, Inputs { base, exp_avg: &exp_avg, other: &other }, &mut prediction);
        Ok(prediction)
    }

    /// The error of a delta file's chunk decoded without its base: the recorded digest and hint.
    pub fn base_missing(&self) -> ReadError {
        let b = self.directory.base.as_ref().expect("validation ties base codecs to a base reference");
        ReadError::BaseMissing { digest: to_hex(&b.digest), hint: b.path_hint.clone() }
    }

    /// A chunk's stored bytes, CRC-checked under `policy`.
    fn stored(
        &self,
        t: &TensorEntry,
        i: usize,
        c: &ChunkEntry,
        policy: ChecksumPolicy,
    ) -> Result<Cow<'_, [u8]>, ReadError> {
        let bytes = bytes(&self.src, c.offset..c.offset + c.stored_length, "chunk")?;
        if policy == ChecksumPolicy::Verify {
            let crc = crc32fast::hash(&bytes);
            if crc != c.crc32 {
                return Err(FormatError::ChecksumMismatch {
                    what: "chunk",
                    location: chunk_location(t, i, c),
                    stored: format!("{:08x}", c.crc32),
                    computed: format!("{crc:08x}"),
                }
                .into());
            }
        }
        Ok(bytes)
    }
}

/// The chunks of `t` whose decoded bytes overlap bytes `range` of the tensor: each one's index,
/// entry, and the tensor byte its decoded bytes start at.
fn covering<'t>(
    t: &'t TensorEntry,
    range: &std::ops::Range<u64>,
) -> impl Iterator<Item = (usize, &'t ChunkEntry, u64)> + 't {
    let (start, end) = (range.start, range.end);
    let mut at = 0u64;
    t.chunks.iter().enumerate().filter_map(move |(i, c)| {
        let lo = at;
        at += c.decoded_length;
        (at > start && lo < end).then_some((i, c, lo))
    })
}

thread_local! {
    /// This thread's spare buffers for a delta chunk's base bytes (one per link of a chain being
    /// decoded): a buffer allocated per chunk and link was faulted in and zeroed by the kernel
    /// every time (a chain of 6 on one core spent 16% of its time there).
    static SPARE: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A buffer from this thread's spares, handed back when dropped.
#[derive(Default)]
struct Scratch(Vec<u8>);

impl Scratch {
    /// The buffer, `len` bytes long, its bytes left from an earlier use: for a decoder, which
    /// writes every byte.
    fn of_len(&mut self, len: usize) -> &mut [u8] {
        if self.0.capacity() == 0 {
            self.0 = SPARE.with_borrow_mut(Vec::pop).unwrap_or_default();
        }
        self.0.resize(len, 0);
        &mut self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // At most 16 per thread, of at most 16 MiB each (the default chunk is 4 MiB): 256 MiB.
        let spare = std::mem::take(&mut self.0);
        if spare.capacity() > 0 && spare.capacity() <= 16 << 20 {
            SPARE.with_borrow_mut(|s| {
                if s.len() < 16 {
                    s.push(spare);
                }
            });
        }
    }
}

/// The jobs that decode bytes `range` of `t` into `out` (exactly that long): one per chunk
/// covering it, each given its part of `out`.
fn span_jobs<'t, 'o>(t: &'t TensorEntry, range: &std::ops::Range<u64>, out: &'o mut [u8]) -> Vec<SpanJob<'t, 'o>> {
    let mut jobs = Vec::new();
    let mut rest = out;
    for (i, c, lo) in covering(t, range) {
        let (from, to) = (lo.max(range.start), (lo + c.decoded_length).min(range.end));
        let (part, tail) = std::mem::take(&mut rest).split_at_mut((to - from) as usize);
        rest = tail;
        jobs.push(SpanJob { i, c, lo, skip: from - lo, part });
    }
    jobs
}

/// One chunk's part of a [`Reader::decode_span`]: chunk `i` (entry `c`, whose decoded bytes
/// start at `lo` in the tensor) gives `part`, from its byte `skip` on.
struct SpanJob<'t, 'o> {
    i: usize,
    c: &'t ChunkEntry,
    lo: u64,
    skip: u64,
    part: &'o mut [u8],
}

/// What a tensor's delta chunks decode against (see [`Reader::chunk_base`]).
enum ChunkBase<'r> {
    /// The tensor has no chunk that uses a base.
    None,
    /// The base decodes each chunk's range on its own ([`Base::read_range_into`]).
    Ranges,
    /// The whole base tensor, for bases that give only whole tensors.
    Whole(Cow<'r, [u8]>),
}

/// A tensor being decoded chunk by chunk: see [`Reader::tensor_chunks`].
pub struct TensorChunks<'r, S: Source> {
    reader: &'r Reader<S>,
    tensor: &'r TensorEntry,
    base: ChunkBase<'r>,
}

impl<S: Source> TensorChunks<'_, S> {
    /// The tensor.
    pub fn tensor(&self) -> &TensorEntry {
        self.tensor
    }

    /// Decodes chunk `i` (CRC-checked under the reader's policy) into `out`, which must be
    /// exactly its decoded length.
    pub fn decode_into(&self, i: usize, out: &mut [u8]) -> Result<(), ReadError> {
        let t = self.tensor;
        let c = t.chunks.get(i).ok_or_else(|| ReadError::NotFound { name: format!("{}[chunk {i}]", t.name) })?;
        if out.len() as u64 != c.decoded_length {
            return Err(ReadError::BufferLength {
                name: format!("{}[chunk {i}]", t.name),
                found: out.len() as u64,
                expected: c.decoded_length,
            });
        }
        self.reader.decode_chunk(t, i, c, &self.base, self.reader.options.checksums, out)
    }
}

/// Bytes of the source; validation has already put every range the reader asks for inside the
/// file, so a range it does not have means a [`Source`] that shrank or misreports its length.
fn bytes<'a, S: Source>(
    src: &'a S,
    range: std::ops::Range<u64>,
    what: &'static str,
) -> Result<Cow<'a, [u8]>, ReadError> {
    let file_len = src.len();
    let want = range.end - range.start;
    let truncated = || ReadError::Format(FormatError::Truncated { what, start: range.start, end: range.end, file_len });
    match src.get(range.clone()) {
        Ok(b) if b.len() as u64 == want => Ok(b),
        Ok(_) => Err(truncated()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(truncated()),
        Err(source) => Err(ReadError::source(what, std::slice::from_ref(&range), source)),
    }
}

/// A new vector of `len` zero bytes, its allocation fallible: a length the system cannot give
/// is a `limit-exceeded` error naming the tensor, never an abort. The allocation is probed
/// first and then made by `vec!`, whose zeroed allocation (calloc) gets pages the kernel has
/// zeroed already; filling a reserved vector with zeros would write the tensor once more
/// before the decoder writes it.
fn zeroed_vec(len: u64, name: &str) -> Result<Vec<u8>, ReadError> {
    let too_large = || ReadError::OutOfMemory { name: name.to_owned(), bytes: len };
    let len = usize::try_from(len).map_err(|_| too_large())?;
    let mut probe = Vec::<u8>::new();
    probe.try_reserve_exact(len).map_err(|_| too_large())?;
    // Kept opaque, so that the compiler cannot drop the probe as an allocation never used.
    drop(std::hint::black_box(probe));
    Ok(vec![0u8; len])
}

/// `buf` made `len` zero bytes long, its allocation fallible: a length the system cannot give
/// is a `limit-exceeded` error naming the tensor, never an abort.
fn zeroed<'b>(buf: &'b mut Vec<u8>, len: u64, name: &str) -> Result<&'b mut [u8], ReadError> {
    let too_large = || ReadError::OutOfMemory { name: name.to_owned(), bytes: len };
    let len = usize::try_from(len).map_err(|_| too_large())?;
    buf.clear();
    buf.try_reserve_exact(len).map_err(|_| too_large())?;
    buf.resize(len, 0);
    Ok(&mut buf[..])
}

/// Checks decoded bytes against the tensor's digest (R26), for decoders outside this crate too.
pub fn check_digest(t: &TensorEntry, data: &[u8]) -> Result<(), ReadError> {
    check_computed_digest(t, tensor_digest(data))
}

/// Checks a tensor digest computed from its decoded bytes against the one recorded (R26).
fn check_computed_digest(t: &TensorEntry, digest: Digest) -> Result<(), ReadError> {
    if digest != t.digest {
        return Err(FormatError::ChecksumMismatch {
            what: "tensor digest",
            location: Position::tensor(&t.name),
            stored: to_hex(&t.digest),
            computed: to_hex(&digest),
        }
        .into());
    }
    Ok(())
}

/// Where chunk `i` of `t` is, for error messages: tensor, chunk index and file offset.
pub fn chunk_location(t: &TensorEntry, i: usize, c: &ChunkEntry) -> Position {
    Position::chunk(&t.name, i as u32).with_offset(c.offset)
}
