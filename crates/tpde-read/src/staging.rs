//! Staged reads: what a load onto a device streams through a ring of host buffers. Requests (a
//! byte range of a tensor each) are laid out in stages of at most a slot's bytes, cut at chunk
//! boundaries; a stage decodes into one buffer in one parallel pass while the previous one is
//! copied out, so host memory stays bounded by the ring, never a copy of the checkpoint.

use std::ops::Range;

use super::*;

/// Bytes `range` of request `request`, written at byte `at` of its stage's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Index into the requests the stages were planned for.
    pub request: usize,
    /// Bytes of the tensor (not of the request): `range.start` is the tensor's byte offset.
    pub range: Range<u64>,
    /// Where the piece lies in the stage's buffer.
    pub at: u64,
}

/// Pieces that decode together into one buffer of [`Stage::len`] bytes, back to back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stage {
    /// In request order, then byte order.
    pub pieces: Vec<Piece>,
    /// Bytes of the buffer the pieces fill.
    pub len: u64,
}

/// The slot a ring needs for `requests` when asked for `slot_bytes`: at least the largest
/// chunk a request touches, so that every stage cuts at chunk boundaries and no chunk is
/// decoded twice (a chunk decodes whole; the spec bounds it at 1 GiB, files written by TPDE
/// at 4 MiB).
pub fn slot_len(requests: &[(&TensorEntry, Range<u64>)], slot_bytes: u64) -> u64 {
    let largest = requests
        .iter()
        .flat_map(|(t, range)| decode::covering(t, range).map(|(_, c, _)| c.decoded_length))
        .max()
        .unwrap_or(0);
    slot_bytes.max(largest).max(1)
}

/// `requests` in stages of at most `slot` bytes (from [`slot_len`]), in order: every requested
/// byte in exactly one piece, each piece ending at a chunk boundary or its request's end.
/// Empty requests get no piece.
pub fn plan(requests: &[(&TensorEntry, Range<u64>)], slot: u64) -> Vec<Stage> {
    let mut stages = Vec::new();
    let mut stage = Stage::default();
    for (request, (t, range)) in requests.iter().enumerate() {
        // The chunk boundaries inside the request, then its end.
        let mut cuts =
            decode::covering(t, range).map(|(_, c, lo)| lo + c.decoded_length).filter(|&b| b < range.end).peekable();
        let mut from = range.start;
        while from < range.end {
            let room = slot - stage.len;
            // The furthest cut that fits in the room left, else (a fresh stage) the next one.
            let mut to = None;
            while let Some(&b) = cuts.peek() {
                if b - from > room {
                    break;
                }
                to = Some(b);
                cuts.next();
            }
            let to = match to {
                _ if range.end - from <= room => range.end,
                Some(b) => b,
                None if stage.len > 0 => {
                    stages.push(std::mem::take(&mut stage));
                    continue;
                }
                // Only when a chunk is longer than the slot, which `slot_len` rules out.
                None => cuts.next().unwrap_or(range.end),
            };
            stage.pieces.push(Piece { request, range: from..to, at: stage.len });
            stage.len += to - from;
            from = to;
            if stage.len >= slot {
                stages.push(std::mem::take(&mut stage));
            }
        }
    }
    if stage.len > 0 {
        stages.push(stage);
    }
    stages
}

impl<S: Source> Reader<S> {
    /// Decodes `stage` of a [`plan`] for `requests` into `out` (at least the stage's length),
    /// its pieces side by side. The error returned is the first in piece order.
    pub fn read_stage(
        &self,
        requests: &[(&TensorEntry, Range<u64>)],
        stage: &Stage,
        out: &mut [u8],
    ) -> Result<(), ReadError> {
        let found = out.len() as u64;
        let mut rest = out.get_mut(..stage.len as usize).ok_or_else(|| ReadError::BufferLength {
            name: "a staging buffer".into(),
            found,
            expected: stage.len,
        })?;
        let mut jobs = Vec::with_capacity(stage.pieces.len());
        for p in &stage.pieces {
            let (t, _) = requests
                .get(p.request)
                .ok_or_else(|| ReadError::NotFound { name: format!("request {} of a staged read", p.request) })?;
            let (part, tail) = std::mem::take(&mut rest).split_at_mut((p.range.end - p.range.start) as usize);
            rest = tail;
            jobs.push((*t, p.range.clone(), part));
        }
        let results: Vec<Result<(), ReadError>> =
            jobs.into_par_iter().map(|(t, range, part)| self.read_range_into(t, range, part)).collect();
        results.into_iter().collect()
    }
}
