//! Verifying a file: every CRC, every tensor digest (streamed through a bounded window for a
//! large tensor), the padding between chunks.

use super::*;

/// Logical bytes [`Reader::stream_tensor`] decodes at once (whole chunks, so a window may
/// hold one chunk more: at most 1 GiB by §8, 4 MiB as the writer chunks by default).
pub(crate) const STREAM_WINDOW: u64 = 64 << 20;

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

impl<S: Source> Reader<S> {
    /// Checks the whole file: every chunk's CRC and decoding, every tensor's digest, that
    /// the bytes between payloads are zero, and the file table (`tpde.files`) if there is one. [`Reader::verify_tensor`] and
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
        self.files()?; // the file table (R31), when the file carries one
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

    pub(crate) fn stream_with<E: From<ReadError>>(
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
}

/// Checks decoded bytes against the tensor's digest (R26), for decoders outside this crate too.
pub fn check_digest(t: &TensorEntry, data: &[u8]) -> Result<(), ReadError> {
    check_computed_digest(t, tensor_digest(data))
}

/// Checks a tensor digest computed from its decoded bytes against the one recorded (R26).
pub(crate) fn check_computed_digest(t: &TensorEntry, digest: Digest) -> Result<(), ReadError> {
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
