//! Decoding: the parallel engine behind every read. A tensor (or a range of it) becomes chunk
//! jobs that decode side by side into one buffer, each against its base range or prediction; a
//! chain decodes a chunk at a time through all its files; `raw` runs are borrowed from the map.

use super::*;

/// How many times a chunk from a remote store whose CRC fails is fetched again before the
/// file is called damaged (`Source::refetch`).
const REFETCHES: usize = 3;

impl<S: Source> Reader<S> {
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
    /// idle, since most tensors are one chunk. A remote source still reads
    /// tensor by tensor, a window at a time. The error returned is the first in the order given.
    pub fn read_many_into(&self, tensors: Vec<(&TensorEntry, &mut [u8])>) -> Result<(), ReadError> {
        self.read_many_into_reporting(tensors, &|_| ())
    }

    /// [`Reader::read_many_into`], calling `decoded(bytes)` from the decoding threads as each
    /// piece of a tensor is done (a progress bar's feed).
    pub fn read_many_into_reporting(
        &self,
        tensors: Vec<(&TensorEntry, &mut [u8])>,
        decoded: &(dyn Fn(u64) + Sync),
    ) -> Result<(), ReadError> {
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
        if let Some(window) = self.src.prefetch_window() {
            // A remote source: tensors one after another, each a window at a time; runs of
            // small neighbours are announced together first, so that they share requests (a
            // request per small tensor would cost a round trip each).
            let mut rest = tensors;
            while !rest.is_empty() {
                // Counted by decoded length, which bounds what the bases behind it fetch too.
                let mut n = 0;
                let mut bytes = 0;
                while n < rest.len() && (n == 0 || bytes + rest[n].0.byte_length <= window) {
                    bytes += rest[n].0.byte_length;
                    n += 1;
                }
                let group: Vec<_> = rest.drain(..n).collect();
                if group.len() > 1 {
                    self.prefetch_whole(&group.iter().map(|(t, _)| *t).collect::<Vec<_>>())?;
                }
                for (t, out) in group {
                    self.decode_into(t, out, policy)?;
                    decoded(t.byte_length);
                }
            }
            return Ok(());
        }
        let bases = tensors.iter().map(|(t, _)| self.chunk_base(t)).collect::<Result<Vec<_>, _>>()?;
        let mut jobs = Vec::new();
        for ((t, out), base) in tensors.into_iter().zip(&bases) {
            jobs.extend(span_jobs(t, &(0..t.byte_length), out).into_iter().map(|job| (t, base, job)));
        }
        let results: Vec<Result<(), ReadError>> = jobs
            .into_par_iter()
            .map(|(t, base, job)| {
                let bytes = job.part.len() as u64;
                self.decode_job(t, job, base, policy)?;
                decoded(bytes);
                Ok(())
            })
            .collect();
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

    pub(crate) fn read_tensor_with(&self, t: &TensorEntry, policy: ChecksumPolicy) -> Result<Cow<'_, [u8]>, ReadError> {
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
        // Fresh pages, mapped in a few calls rather than a fault per page as the decoder
        // writes them.
        crate::pages::populate(&mut out);
        self.decode_chunks(t, &mut out, &base, policy)?;
        Ok(Cow::Owned(out))
    }

    /// The stored range of a tensor whose chunks are all `raw` and back to back, in a source
    /// that lends its bytes (a remote one copies them anyway, a window at a time).
    pub(crate) fn contiguous_raw(&self, t: &TensorEntry) -> Option<std::ops::Range<u64>> {
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

    pub(crate) fn decode_into(&self, t: &TensorEntry, out: &mut [u8], policy: ChecksumPolicy) -> Result<(), ReadError> {
        let base = self.chunk_base(t)?;
        self.decode_chunks(t, out, &base, policy)
    }

    /// What `t`'s delta chunks decode against; a base that gives ranges is checked here to
    /// hold the tensor with its dtype and shape.
    pub(crate) fn chunk_base(&self, t: &TensorEntry) -> Result<ChunkBase<'_>, ReadError> {
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

    /// Asks the source, and the chain of bases behind it, to fetch ahead all the stored bytes of
    /// `tensors` in one announcement ([`Base::prefetch_tensors`]).
    pub(crate) fn prefetch_whole(&self, tensors: &[&TensorEntry]) -> Result<(), ReadError> {
        let stored: Vec<_> =
            tensors.iter().flat_map(|t| t.chunks.iter().map(|c| c.offset..c.offset + c.stored_length)).collect();
        self.src.prefetch(&stored).map_err(|source| ReadError::source("chunks", &stored, source))?;
        match &self.base {
            Some(b) if b.reads_ranges() => {
                let names: Vec<&str> =
                    tensors.iter().filter(|t| self.tensor_uses_base(t)).map(|t| t.name.as_str()).collect();
                b.prefetch_tensors(&names)
            }
            _ => Ok(()),
        }
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
    pub(crate) fn decode_span(
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

    pub(crate) fn fetch_and_decode(
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

    pub(crate) fn decode_jobs(
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
    pub(crate) fn decode_job(
        &self,
        t: &TensorEntry,
        SpanJob { i, c, lo, skip, part }: SpanJob<'_, '_>,
        base: &ChunkBase<'_>,
        policy: ChecksumPolicy,
    ) -> Result<(), ReadError> {
        if policy == self.options.checksums && self.predicted_inputs.read().expect("not poisoned").contains(&t.name) {
            // A chunk predictions read: decoded once (under the reader's checksum
            // policy) and kept, for the predictions and the reads that need it again.
            let key = (t.name.clone(), lo, lo + c.decoded_length);
            let kept = match self.inputs.get(&key) {
                Some(kept) => kept,
                // The whole chunk asked for: decoded in place and kept as one copy (through a
                // buffer of its own it was a zeroed allocation and two copies, 3% of a predicted
                // reverse hop's load).
                None if skip == 0 && part.len() as u64 == c.decoded_length => {
                    self.decode_chunk(t, i, c, base, policy, part)?;
                    self.inputs.insert(key, Arc::from(&*part));
                    return Ok(());
                }
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
    pub(crate) fn decode_whole(
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
    pub(crate) fn base_tensor(&self, t: &TensorEntry) -> Result<Option<Cow<'_, [u8]>>, ReadError> {
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

    pub(crate) fn decode_chunks(
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
    pub(crate) fn decode_chunk(
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
        let mut prediction = Scratch::default();
        let base = if c.codec == CodecTag::DeltaPredicted {
            let b = base.ok_or_else(|| self.base_missing())?;
            let p = prediction.of_len(out.len());
            self.predict(t, c, from..from + out.len() as u64, b, p)?;
            Some(&p[..])
        } else {
            base
        };
        let ctx = ChunkContext { dtype: t.dtype, base };
        let stored = self.stored(t, i, c, policy)?;
        tpde_codec::decode(c.codec, ctx, &c.params, &stored, out).map_err(|source| {
            ReadError::Codec { location: chunk_location(t, i, c), source }.in_file_of_minor(self.header().minor_version)
        })
    }

    /// Writes into `prediction` the prediction of a `delta-predicted` chunk `c` of `t` over bytes
    /// `range` of `t`, whose base bytes there are `base` (spec §6.8). The tensors it reads in
    /// this file are decoded over the same range first; validation bounded how deep that goes
    /// (R30). Its inputs go to reused buffers: fresh ones cost page faults on every chunk.
    pub(crate) fn predict(
        &self,
        t: &TensorEntry,
        c: &ChunkEntry,
        range: std::ops::Range<u64>,
        base: &[u8],
        prediction: &mut [u8],
    ) -> Result<(), ReadError> {
        let p = Prediction::parse(&c.params).expect("validated when the file was opened (R30)");
        // Through decode_range, which keeps the chunks of the tensors predictions read.
        let this = |name: &str, out: &mut [u8]| self.decode_range(self.tensor(name)?, range.clone(), out);
        // A tensor of the base, which must be f32 of the predicted tensor's shape (R29).
        let from_base = |name: &str, out: &mut [u8]| -> Result<(), ReadError> {
            let b = self.base.as_ref().ok_or_else(|| self.base_missing())?;
            match b.tensor_info(name)? {
                Some((DType::F32, shape)) if shape == t.shape => {}
                found => {
                    return Err(ReadError::BaseTensor {
                        name: name.to_owned(),
                        detail: match found {
                            None => "a prediction reads it from the base, which has no tensor of that name".into(),
                            Some((dtype, shape)) => format!(
                                "a prediction reads it from the base, whose is {dtype} {shape:?}, not the file's"
                            ),
                        },
                    })
                }
            }
            b.read_range_into(name, range.clone(), out)
        };
        let (mut first, mut second) = (Scratch::default(), Scratch::default());
        let (exp_avg, other) = (first.of_len(base.len()), second.of_len(base.len()));
        for ((name, at), out) in p.operands().into_iter().zip([&mut *exp_avg, &mut *other]) {
            match at {
                Operand::File => this(name, out)?,
                Operand::Base => from_base(name, out)?,
            }
        }
        tpde_codec::predicted::predict(&p, Inputs { base, exp_avg, other }, prediction);
        Ok(())
    }

    /// A chunk's stored bytes, CRC-checked under `policy`.
    pub(crate) fn stored(
        &self,
        t: &TensorEntry,
        i: usize,
        c: &ChunkEntry,
        policy: ChecksumPolicy,
    ) -> Result<Cow<'_, [u8]>, ReadError> {
        let range = c.offset..c.offset + c.stored_length;
        let bytes = bytes(&self.src, range.clone(), "chunk")?;
        if policy == ChecksumPolicy::Verify {
            let mut crc = crc32fast::hash(&bytes);
            // From a remote store, a failed CRC may be a response damaged on its way: fetched
            // again, a bounded number of times, before the file is called damaged.
            for _ in 0..REFETCHES {
                if crc == c.crc32 {
                    break;
                }
                let Some(again) = self.src.refetch(range.clone()) else { break };
                let again = again.map_err(|source| ReadError::source("chunk", std::slice::from_ref(&range), source))?;
                crc = crc32fast::hash(&again);
                if crc == c.crc32 {
                    return Ok(Cow::Owned(again));
                }
            }
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
pub(crate) fn covering<'t>(
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
    /// every time, a large share of a chain's decode.
    static SPARE: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A buffer from this thread's spares, handed back when dropped.
#[derive(Default)]
pub(crate) struct Scratch(Vec<u8>);

impl Scratch {
    /// The buffer, `len` bytes long, its bytes left from an earlier use: for a decoder, which
    /// writes every byte.
    pub(crate) fn of_len(&mut self, len: usize) -> &mut [u8] {
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
pub(crate) fn span_jobs<'t, 'o>(
    t: &'t TensorEntry,
    range: &std::ops::Range<u64>,
    out: &'o mut [u8],
) -> Vec<SpanJob<'t, 'o>> {
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
pub(crate) struct SpanJob<'t, 'o> {
    i: usize,
    c: &'t ChunkEntry,
    lo: u64,
    skip: u64,
    part: &'o mut [u8],
}

/// What a tensor's delta chunks decode against (see [`Reader::chunk_base`]).
pub(crate) enum ChunkBase<'r> {
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
pub(crate) fn bytes<'a, S: Source>(
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
pub(crate) fn zeroed_vec(len: u64, name: &str) -> Result<Vec<u8>, ReadError> {
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
pub(crate) fn zeroed<'b>(buf: &'b mut Vec<u8>, len: u64, name: &str) -> Result<&'b mut [u8], ReadError> {
    let too_large = || ReadError::OutOfMemory { name: name.to_owned(), bytes: len };
    let len = usize::try_from(len).map_err(|_| too_large())?;
    buf.clear();
    buf.try_reserve_exact(len).map_err(|_| too_large())?;
    buf.resize(len, 0);
    Ok(&mut buf[..])
}
