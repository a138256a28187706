//! The container writer: header first, each tensor's chunks as they are encoded, then the
//! directory and trailer; and [`FileWriter`], atomic on disk.

use super::*;

/// The Zstandard level of a file table (`tpde.files`): the table is small (configs,
/// tokenizers) and written once, and it decodes as fast at any level.
const FILES_ZSTD_LEVEL: i32 = 19;

/// The value of a `tpde.files` entry (spec §5.5): the table of `files` in one Zstandard frame
/// that records its content size. Paths and sizes are checked as a reader checks them.
pub fn files_frame(files: &[tpde_format::files::FileEntry]) -> Result<Vec<u8>, WriteError> {
    use tpde_format::files::{encode_table, KEY_FILES};
    let invalid = |e: &dyn std::fmt::Display| WriteError::invalid(KEY_FILES, e.to_string());
    let table = encode_table(files).map_err(|e| invalid(&e))?;
    let mut cctx = zstd::bulk::Compressor::new(FILES_ZSTD_LEVEL).map_err(|e| invalid(&e))?;
    cctx.include_contentsize(true).map_err(|e| invalid(&e))?;
    cctx.compress(&table).map_err(|e| invalid(&e))
}

/// A streaming TPDE writer.
pub struct Writer<W: Write> {
    pub(crate) out: W,
    pub(crate) pos: u64,
    pub(crate) header: Header,
    pub(crate) encoder: Encoder,
    pub(crate) chunk_bytes: u64,
    pub(crate) directory: Directory,
    pub(crate) names: HashSet<String>,
    /// Tensors already written, by what makes their chunks reusable: identical bytes, dtype and
    /// base bytes. A tied or duplicated tensor points at the first one's chunks (spec §4).
    pub(crate) written: HashMap<DedupKey, usize>,
    /// Set when a tensor failed after some of its bytes were written: those bytes belong to no
    /// chunk, so the file could only be finished in breach of spec rule R27.
    pub(crate) failed: bool,
}

impl<W: Write> Writer<W> {
    /// Starts a file: checks the options and writes the header.
    pub fn new(mut out: W, options: WriteOptions) -> Result<Self, WriteError> {
        let a = u64::from(options.alignment);
        if !a.is_power_of_two() || !(MIN_ALIGNMENT..=tpde_format::limits::MAX_ALIGNMENT).contains(&a) {
            return Err(WriteError::invalid("header", format!("alignment {a} is not a power of two in 64..=1 MiB")));
        }
        if let Some(base) = &options.base {
            if base.path_hint.len() as u64 > MAX_PATH_HINT_LEN {
                return Err(WriteError::invalid("base reference", "path hint is over 4096 bytes"));
            }
        }
        let chunk_bytes = (options.chunk_bytes.min(MAX_CHUNK_DECODED_LEN) / a * a).max(a);
        let flags = if options.base.is_some() { RequiredFeatures::BASE } else { 0 };
        let minor = options.encoder.since_minor(options.base.is_some()).max(options.min_minor_version);
        let header = Header::new(minor, options.alignment, flags);
        out.write_all(&header.to_bytes())?;
        Ok(Writer {
            out,
            pos: Header::LEN as u64,
            header,
            encoder: options.encoder,
            chunk_bytes,
            directory: Directory { base: options.base, ..Directory::default() },
            names: HashSet::new(),
            written: HashMap::new(),
            failed: false,
        })
    }

    /// Adds a metadata entry. Keys are unique; reserved `tpde.` keys must have their spec type.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: MetadataValue) -> Result<(), WriteError> {
        let key = key.into();
        if key.is_empty() || key.len() as u64 > MAX_KEY_LEN {
            return Err(WriteError::invalid(format!("metadata key {key:?}"), "keys are 1..=1024 bytes"));
        }
        if self.directory.metadata.iter().any(|m| m.key == key) {
            return Err(WriteError::invalid(format!("metadata key {key:?}"), "the key is already set"));
        }
        if let Some(expected) = reserved_type(&key).filter(|e| *e != value.type_name()) {
            return Err(WriteError::invalid(
                format!("metadata key {key:?}"),
                format!("the spec gives it type {expected}"),
            ));
        }
        if value.payload().len() as u64 > u64::from(u32::MAX) {
            return Err(WriteError::invalid(format!("metadata key {key:?}"), "the value is over 4 GiB"));
        }
        // Spec §11: the header, written first, declares every minor version the file uses.
        let since = tpde_format::metadata::since_minor(&key);
        if since > self.header.minor_version {
            return Err(WriteError::invalid(
                format!("metadata key {key:?}"),
                format!(
                    "it needs format 1.{since}; the file was started as 1.{} (set WriteOptions::min_minor_version)",
                    self.header.minor_version
                ),
            ));
        }
        self.directory.metadata.push(MetadataEntry::new(key, value));
        Ok(())
    }

    /// Adds the files of a model folder that are not tensors (spec §5.5): the reserved entry
    /// `tpde.files`, their table in one Zstandard frame ([`files_frame`]). The file must have
    /// been started as 1.7 or later (`WriteOptions::min_minor_version`).
    pub fn add_files(&mut self, files: &[tpde_format::files::FileEntry]) -> Result<(), WriteError> {
        self.add_metadata(tpde_format::files::KEY_FILES, MetadataValue::Bytes(files_frame(files)?))
    }

    /// Sets the encoder for the tensors added from now on (a file may mix codecs, chunk by
    /// chunk: the tag is recorded in each chunk entry). The header, already written, declares
    /// the minor version of the encoder the file was started with, so a codec of a later minor
    /// version is refused: start the file with it instead.
    pub fn set_encoder(&mut self, encoder: Encoder) -> Result<(), WriteError> {
        let with_base = self.header.required_features & RequiredFeatures::BASE != 0;
        if encoder.since_minor(with_base) > self.header.minor_version {
            return Err(WriteError::invalid(
                "encoder",
                format!(
                    "it needs format 1.{}, the file was started as 1.{}",
                    encoder.since_minor(with_base),
                    self.header.minor_version
                ),
            ));
        }
        self.encoder = encoder;
        Ok(())
    }

    /// Adds a tensor whose logical bytes (little-endian, row-major) are in `data`, as a keyframe:
    /// its chunks decode without a base.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[u64],
        data: &[u8],
    ) -> Result<&TensorEntry, WriteError> {
        self.add_one(TensorInput { name, dtype, shape, data, base: None, predict: None })
    }

    /// Adds a tensor as a delta against the base tensor of the same name, whose logical bytes
    /// are `base` (same dtype and shape). The file must have been started with a base
    /// reference. The encoder decides per chunk whether to use the base (spec §6.3).
    pub fn add_tensor_delta(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[u64],
        data: &[u8],
        base: &[u8],
    ) -> Result<&TensorEntry, WriteError> {
        self.add_tensor_delta_with_digest(name, dtype, shape, data, base, tensor_digest(base))
    }

    /// [`Writer::add_tensor_delta`] for a base tensor whose digest (spec §7.1) the caller
    /// already has, from the base file's directory or an earlier pass, sparing a hash of the
    /// base bytes. It must be the digest of `base`: tied tensors share chunks only when their
    /// bytes and their bases' digests are equal (checked in debug builds).
    pub fn add_tensor_delta_with_digest(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[u64],
        data: &[u8],
        base: &[u8],
        base_digest: Digest,
    ) -> Result<&TensorEntry, WriteError> {
        self.add_one(TensorInput { name, dtype, shape, data, base: Some((base, base_digest)), predict: None })
    }

    /// Adds several tensors, in order, encoding the chunks of all of them in parallel: a
    /// checkpoint of many tensors of one chunk each keeps every core busy, where adding them one
    /// at a time encodes each on one core. The result is the file that adding them one by one
    /// writes. Every tensor is checked before any is written, so a batch that is refused
    /// (a bad shape, a repeated name) writes nothing; the caller bounds the batch's memory, since
    /// the encoded chunks of up to four chunks per thread are held at a time (two being
    /// written while the next two encode).
    pub fn add_tensors(&mut self, tensors: &[TensorInput<'_>]) -> Result<(), WriteError> {
        let mut batch_names = HashSet::new();
        for t in tensors {
            self.check_input(t)?;
            if !batch_names.insert(t.name) {
                return Err(WriteError::invalid(format!("tensor {:?}", t.name), "the batch names it twice"));
            }
        }
        let digests: Vec<Digest> = tensors.par_iter().map(|t| tensor_digest(t.data)).collect();
        // A tensor whose chunks an earlier one's already are (tied or duplicated, in an earlier
        // call or this batch) points at them; the others are encoded.
        let keys: Vec<DedupKey> = tensors
            .iter()
            .zip(&digests)
            .map(|(t, &digest)| DedupKey { digest, dtype: t.dtype, base: t.base.map(|(_, d)| d) })
            .collect();
        let mut in_batch = HashMap::new();
        let reuse: Vec<Option<Reuse>> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| {
                // A predicted tensor's chunks read other tensors: never shared.
                if tensors[i].predict.is_some() {
                    return None;
                }
                let found = self.written.get(key).map(|&e| Reuse::Written(e));
                let found = found.or_else(|| in_batch.get(key).map(|&j| Reuse::Batch(j)));
                in_batch.entry(*key).or_insert(i);
                found
            })
            .collect();
        let chunk = self.chunk_bytes as usize;
        let jobs: Vec<Job> = (0..tensors.len())
            .filter(|&i| reuse[i].is_none())
            .flat_map(|i| (0..tensors[i].data.len()).step_by(chunk).map(move |at| (i, at)))
            .collect();
        let mut entries: Vec<Option<TensorEntry>> = tensors
            .iter()
            .zip(&digests)
            .map(|(t, &digest)| {
                let mut e = self.begin_entry(t.name, t.dtype, t.shape, t.data.len() as u64);
                e.digest = digest;
                Some(e)
            })
            .collect();
        // Where each tensor of the batch went in the directory, once pushed.
        let mut pushed = vec![0usize; tensors.len()];
        let mut next = 0;
        let mut push_before = |w: &mut Self, end: usize, entries: &mut [Option<TensorEntry>]| {
            for i in next..end {
                let mut entry = entries[i].take().expect("pushed once");
                match reuse[i] {
                    Some(Reuse::Written(e)) => entry.chunks = w.directory.tensors[e].chunks.clone(),
                    Some(Reuse::Batch(j)) => entry.chunks = w.directory.tensors[pushed[j]].chunks.clone(),
                    None if tensors[i].predict.is_none() => {
                        w.written.insert(keys[i], w.directory.tensors.len());
                    }
                    None => {}
                }
                pushed[i] = w.directory.tensors.len();
                w.push_entry(entry);
            }
            next = next.max(end);
        };
        // The bytes of tensor i's chunk at `at`.
        let chunk_of = |i: usize, at: usize| at..(at + chunk).min(tensors[i].data.len());
        // Where the tensor being written began, with its padding.
        let mut open_from = self.pos;
        let mut write_job = |w: &mut Self, (i, at): Job, encoded: Encoded| {
            push_before(w, i, &mut entries);
            let entry = entries[i].as_mut().expect("not pushed before its chunks");
            if entry.chunks.is_empty() {
                open_from = w.pos;
            }
            let data = &tensors[i].data[chunk_of(i, at)];
            let written = encoded
                .map_err(|source| WriteError::Codec { tensor: entry.name.clone(), source })
                .and_then(|encoded| Ok(w.write_chunk(entry, data, encoded)?));
            if let Err(e) = written {
                // Bytes of a tensor that will have no entry belong to no chunk.
                w.failed |= w.pos != open_from;
                return Err(e);
            }
            Ok(())
        };
        // Chunks encode on the pool, at most `in_flight` encoding or waiting to be written, and
        // are written in order as they come: no thread waits for another's slowest chunk, and
        // the output is written while the next chunks encode.
        let in_flight = self.chunks_in_flight();
        let (encoder, minor) = (self.encoder, self.header.minor_version);
        let (done, finished) = mpsc::channel();
        let mut ready = HashMap::new();
        rayon::in_place_scope(|s| {
            let spawn = |k: usize| {
                let (i, at) = jobs[k];
                let (t, range) = (&tensors[i], chunk_of(i, at));
                let part = Part {
                    dtype: t.dtype,
                    data: &t.data[range.clone()],
                    base: t.base.map(|(b, _)| &b[range.clone()]),
                    predict: t.predict.map(|p| (p.prediction, &p.exp_avg[range.clone()], &p.other[range])),
                };
                let done = done.clone();
                s.spawn(move |_| {
                    // A panic is sent on, to be raised here, where the writer waits.
                    let encoded = panic::catch_unwind(AssertUnwindSafe(|| encode_part(encoder, minor, &part)));
                    let _ = done.send((k, encoded));
                });
            };
            let mut spawned = jobs.len().min(in_flight);
            (0..spawned).for_each(spawn);
            for (k, &job) in jobs.iter().enumerate() {
                let encoded = loop {
                    if let Some(encoded) = ready.remove(&k) {
                        break encoded;
                    }
                    let (j, encoded) = receive(&finished);
                    ready.insert(j, encoded.unwrap_or_else(|p| panic::resume_unwind(p)));
                };
                if spawned < jobs.len() {
                    spawn(spawned);
                    spawned += 1;
                }
                write_job(self, job, encoded)?;
            }
            Ok::<(), WriteError>(())
        })?;
        push_before(self, tensors.len(), &mut entries);
        Ok(())
    }

    fn add_one(&mut self, tensor: TensorInput<'_>) -> Result<&TensorEntry, WriteError> {
        self.add_tensors(&[tensor])?;
        Ok(self.directory.tensors.last().expect("just pushed"))
    }

    /// Checks a tensor before anything of it is written.
    fn check_input(&mut self, t: &TensorInput<'_>) -> Result<(), WriteError> {
        let expected = self.check_tensor(t.name, t.dtype, t.shape)?;
        let what = || format!("tensor {:?}", t.name);
        if t.data.len() as u64 != expected {
            return Err(WriteError::invalid(
                what(),
                format!("{} bytes given, shape {:?} of {} needs {expected}", t.data.len(), t.shape, t.dtype),
            ));
        }
        if let Some((base, digest)) = t.base {
            if self.directory.base.is_none() {
                return Err(WriteError::invalid(what(), "a delta needs a file started with a base"));
            }
            if base.len() != t.data.len() {
                return Err(WriteError::invalid(
                    what(),
                    format!("{} base bytes for {} tensor bytes", base.len(), t.data.len()),
                ));
            }
            debug_assert_eq!(tensor_digest(base), digest, "the digest of tensor {:?}'s base", t.name);
        }
        if let Some(p) = t.predict {
            let minor = p.prediction.since_minor();
            if self.header.minor_version < minor {
                return Err(WriteError::invalid(
                    what(),
                    format!(
                        "predictions need format 1.{minor}; the file was started as 1.{}",
                        self.header.minor_version
                    ),
                ));
            }
            if t.dtype != DType::F32 || t.base.is_none() {
                return Err(WriteError::invalid(what(), "predictions are of f32 deltas (spec §6.8)"));
            }
            if p.exp_avg.len() != t.data.len() || p.other.len() != t.data.len() {
                return Err(WriteError::invalid(what(), "a prediction's inputs are not the tensor's length"));
            }
        }
        Ok(())
    }

    /// Adds a tensor whose logical bytes are read from `src`, one batch of chunks at a time, so
    /// the tensor need never be in memory whole. `src` must yield exactly the tensor's bytes.
    pub fn add_tensor_from(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[u64],
        src: impl Read,
    ) -> Result<&TensorEntry, WriteError> {
        let expected = self.check_tensor(name, dtype, shape)?;
        let before = self.pos;
        let result = self.stream_tensor(name, dtype, shape, expected, src);
        self.settle(before, result)
    }

    fn stream_tensor(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[u64],
        expected: u64,
        mut src: impl Read,
    ) -> Result<(), WriteError> {
        // The digest is computed batch by batch as the chunks are encoded: one pass.
        let mut hasher = tpde_format::digest::StreamDigest::new();
        let mut entry = self.begin_entry(name, dtype, shape, expected);
        let batch = self.batch_bytes();
        let mut buf = vec![0u8; batch.min(expected) as usize];
        let mut done = 0u64;
        while done < expected {
            let n = (expected - done).min(batch) as usize;
            src.read_exact(&mut buf[..n]).map_err(|e| {
                WriteError::invalid(
                    format!("tensor {name:?}"),
                    format!("source ended after {done} of {expected} bytes ({e})"),
                )
            })?;
            hasher.update(&buf[..n]);
            let parts: Vec<Part<'_>> = buf[..n]
                .chunks(self.chunk_bytes as usize)
                .map(|data| Part { dtype, data, base: None, predict: None })
                .collect();
            for (part, encoded) in parts.iter().zip(encode_parts(self.encoder, self.header.minor_version, &parts)) {
                let encoded = encoded.map_err(|source| WriteError::Codec { tensor: name.to_owned(), source })?;
                self.write_chunk(&mut entry, part.data, encoded)?;
            }
            done += n as u64;
        }
        let mut probe = [0u8; 1];
        if src.read(&mut probe)? != 0 {
            return Err(WriteError::invalid(
                format!("tensor {name:?}"),
                format!("source has more than {expected} bytes"),
            ));
        }
        entry.digest = hasher.finalize();
        self.push_entry(entry);
        Ok(())
    }

    /// Writes the directory and trailer and returns the output.
    pub fn finish(mut self) -> Result<W, WriteError> {
        self.check_not_failed()?;
        // A prediction's names must be tensors of the file (R30): the reader predicts from them.
        tpde_format::prediction::validate_predictions(&self.directory)
            .map_err(|e| WriteError::invalid("predictions", e.to_string()))?;
        let dir = self.directory.to_bytes();
        let trailer = Trailer::new(self.pos, &dir);
        self.out.write_all(&dir)?;
        self.out.write_all(&trailer.to_bytes())?;
        self.out.flush()?;
        Ok(self.out)
    }

    /// The tensors written so far.
    pub fn tensors(&self) -> &[TensorEntry] {
        &self.directory.tensors
    }

    /// The header this writer wrote.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Ends a step that may have written payload bytes. If it failed after writing some, those
    /// bytes belong to no chunk, and the writer refuses all further work.
    fn settle(&mut self, before: u64, result: Result<(), WriteError>) -> Result<&TensorEntry, WriteError> {
        match result {
            Ok(()) => Ok(self.directory.tensors.last().expect("the step pushed its entry")),
            Err(e) => {
                self.failed |= self.pos != before;
                Err(e)
            }
        }
    }

    fn check_not_failed(&self) -> Result<(), WriteError> {
        if self.failed {
            Err(WriteError::invalid(
                "file",
                "an earlier tensor failed part-way; its bytes cannot be taken back, so the file cannot be finished",
            ))
        } else {
            Ok(())
        }
    }

    fn check_tensor(&mut self, name: &str, dtype: DType, shape: &[u64]) -> Result<u64, WriteError> {
        self.check_not_failed()?;
        let what = || format!("tensor {name:?}");
        if name.is_empty() || name.len() as u64 > MAX_NAME_LEN {
            return Err(WriteError::invalid(what(), "names are 1..=4096 bytes of UTF-8"));
        }
        if self.names.contains(name) {
            return Err(WriteError::invalid(what(), "a tensor of that name was already written"));
        }
        if shape.len() as u64 > MAX_RANK {
            return Err(WriteError::invalid(what(), format!("rank {} is over the limit of {MAX_RANK}", shape.len())));
        }
        shape
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| WriteError::invalid(what(), format!("shape {shape:?} overflows u64 bytes")))
    }

    fn batch_bytes(&self) -> u64 {
        // Two chunks per thread keeps every core busy while bounding memory.
        self.chunk_bytes * 2 * rayon::current_num_threads().max(1) as u64
    }

    /// How many chunks [`Writer::add_tensors`] keeps encoding or encoded and unwritten: four
    /// per thread, so a slow chunk holds up its thread only.
    fn chunks_in_flight(&self) -> usize {
        4 * rayon::current_num_threads().max(1)
    }

    fn begin_entry(&self, name: &str, dtype: DType, shape: &[u64], byte_length: u64) -> TensorEntry {
        let chunk_count = byte_length.div_ceil(self.chunk_bytes.max(1)) as usize;
        TensorEntry {
            name: name.to_owned(),
            dtype,
            shape: shape.to_vec(),
            byte_length,
            digest: [0; 32],
            chunks: Vec::with_capacity(chunk_count),
        }
    }

    fn push_entry(&mut self, entry: TensorEntry) {
        self.names.insert(entry.name.clone());
        self.directory.tensors.push(entry);
    }

    /// Writes the next chunk of `entry`, whose logical bytes are `data`, aligned.
    fn write_chunk(&mut self, entry: &mut TensorEntry, data: &[u8], encoded: EncodedChunk) -> io::Result<()> {
        let EncodedChunk { stored, tag, params, crc32 } = encoded;
        let stored = stored.as_deref().unwrap_or(data);
        self.pad_to_alignment()?;
        let element_count = data.len() as u64 / entry.dtype.size();
        entry.chunks.push(ChunkEntry {
            element_start: entry.chunks.last().map_or(0, |c| c.element_start + c.element_count),
            element_count,
            offset: self.pos,
            stored_length: stored.len() as u64,
            decoded_length: data.len() as u64,
            crc32,
            codec: tag,
            params,
        });
        self.out.write_all(stored)?;
        self.pos += stored.len() as u64;
        Ok(())
    }

    fn pad_to_alignment(&mut self) -> io::Result<()> {
        const ZEROS: [u8; 4096] = [0; 4096];
        let a = u64::from(self.header.alignment);
        let mut pad = (a - self.pos % a) % a;
        while pad > 0 {
            let n = pad.min(ZEROS.len() as u64);
            self.out.write_all(&ZEROS[..n as usize])?;
            pad -= n;
            self.pos += n;
        }
        Ok(())
    }
}

/// A [`Writer`] to a file that appears under its final name only when complete (see
/// [`atomic`]: a crash leaves neither a partial file under the final name nor one beside it).
pub struct FileWriter {
    writer: Writer<BufWriter<AtomicFile>>,
}

impl FileWriter {
    /// Starts a file that will appear at `path`.
    pub fn create(path: impl AsRef<Path>, options: WriteOptions) -> Result<Self, WriteError> {
        let file = AtomicFile::create(path)?;
        let writer = Writer::new(BufWriter::with_capacity(1 << 20, file), options)?;
        Ok(FileWriter { writer })
    }

    /// Writes the directory and trailer, syncs, and puts the file into place. On error
    /// nothing appears under the final name and nothing is left beside it.
    pub fn finish(self) -> Result<File, WriteError> {
        let file = self.writer.finish()?.into_inner().map_err(|e| e.into_error())?;
        Ok(file.commit()?)
    }
}

impl std::ops::Deref for FileWriter {
    type Target = Writer<BufWriter<AtomicFile>>;
    fn deref(&self) -> &Self::Target {
        &self.writer
    }
}

impl std::ops::DerefMut for FileWriter {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.writer
    }
}
