//! The rules that relate fields to each other (spec §9). A reader MUST apply them before it
//! trusts any offset or length in the directory; after [`validate`] succeeds every chunk's
//! stored range lies inside the payload area and every size product fits in `u64`.

use std::collections::HashSet;

use crate::directory::Directory;
use crate::error::{FormatError, Position};
use crate::header::{Header, RequiredFeatures};
use crate::limits::{MAX_CHUNK_DECODED_LEN, MAX_CHUNK_STORED_LEN, MAX_NAME_LEN, MAX_RANK};
use crate::metadata::reserved_type;

/// Checks a parsed directory against the header and the payload area `64..payload_end`
/// (`payload_end` is the directory's offset).
pub fn validate(header: &Header, dir: &Directory, payload_end: u64) -> Result<(), FormatError> {
    validate_metadata(dir)?;
    let has_base_flag = header.required_features & RequiredFeatures::BASE != 0;
    if has_base_flag != dir.base.is_some() {
        return Err(FormatError::malformed(
            "directory",
            Position::default(),
            format!(
                "the BASE feature flag is {} but the directory {}",
                if has_base_flag { "set" } else { "clear" },
                if dir.base.is_some() { "has a base reference" } else { "has no base reference" }
            ),
        ));
    }

    let alignment = u64::from(header.alignment);
    let mut names = HashSet::with_capacity(dir.tensors.len());
    let mut ranges = Vec::new();
    for (ti, t) in dir.tensors.iter().enumerate() {
        let here = || Position::tensor(&t.name);
        if t.name.is_empty() || t.name.len() as u64 > MAX_NAME_LEN {
            return Err(FormatError::malformed(
                "tensor entry",
                Position::default(),
                format!("tensor {ti} has an empty name"),
            ));
        }
        if !names.insert(t.name.as_str()) {
            return Err(FormatError::malformed("tensor entry", here(), "the name is used by an earlier tensor"));
        }
        if t.shape.len() as u64 > MAX_RANK {
            return Err(FormatError::LimitExceeded {
                what: "rank",
                found: t.shape.len() as u64,
                limit: MAX_RANK,
                location: here(),
            });
        }
        let size = t.dtype.size();
        let numel = t.element_count();
        let expected_len = numel.and_then(|n| n.checked_mul(size));
        if expected_len != Some(t.byte_length) {
            return Err(FormatError::malformed(
                "tensor entry",
                here(),
                match expected_len {
                    Some(e) => {
                        format!("byte_length is {} but shape {:?} x {} bytes is {e}", t.byte_length, t.shape, size)
                    }
                    None => format!("shape {:?} x {} bytes overflows u64", t.shape, size),
                },
            ));
        }
        let numel = t.byte_length / size;

        let mut next = 0u64;
        for (ci, c) in t.chunks.iter().enumerate() {
            let at = || Position::chunk(&t.name, ci as u32);
            if c.element_start != next {
                return Err(FormatError::malformed(
                    "chunk entry",
                    at(),
                    format!("element_start is {} but the previous chunk ended at element {next}", c.element_start),
                ));
            }
            let end = c.element_start.checked_add(c.element_count).filter(|&e| c.element_count > 0 && e <= numel);
            let Some(end) = end else {
                return Err(FormatError::malformed(
                    "chunk entry",
                    at(),
                    format!(
                        "elements {}+{} are empty or outside the tensor's {numel}",
                        c.element_start, c.element_count
                    ),
                ));
            };
            next = end;
            // P5: the limit (R15) before R20, which is a rule about the same value.
            if c.decoded_length > MAX_CHUNK_DECODED_LEN {
                return Err(FormatError::LimitExceeded {
                    what: "decoded chunk length",
                    found: c.decoded_length,
                    limit: MAX_CHUNK_DECODED_LEN,
                    location: at(),
                });
            }
            if c.decoded_length != c.element_count * size {
                return Err(FormatError::malformed(
                    "chunk entry",
                    at(),
                    format!(
                        "decoded_length is {} but {} elements of {} are {} bytes",
                        c.decoded_length,
                        c.element_count,
                        t.dtype,
                        c.element_count * size
                    ),
                ));
            }
            if c.stored_length > MAX_CHUNK_STORED_LEN {
                return Err(FormatError::LimitExceeded {
                    what: "stored chunk length",
                    found: c.stored_length,
                    limit: MAX_CHUNK_STORED_LEN,
                    location: at(),
                });
            }
            if c.codec.needs_base() && dir.base.is_none() {
                return Err(FormatError::malformed(
                    "chunk entry",
                    at(),
                    format!("codec {} decodes against a base, and the file has none", c.codec),
                ));
            }
            if c.offset % alignment != 0 {
                return Err(FormatError::malformed(
                    "chunk entry",
                    at(),
                    format!("offset {} is not a multiple of the alignment {alignment}", c.offset),
                ));
            }
            let in_bounds = c.stored_range().filter(|r| r.start >= Header::LEN as u64 && r.end <= payload_end);
            let Some(range) = in_bounds else {
                return Err(FormatError::malformed(
                    "chunk entry",
                    at(),
                    format!(
                        "stored bytes {}+{} are outside the payload area {}..{payload_end}",
                        c.offset,
                        c.stored_length,
                        Header::LEN
                    ),
                ));
            };
            if !range.is_empty() {
                ranges.push((range.start, range.end, ti, ci));
            }
        }
        if next != numel {
            return Err(FormatError::malformed(
                "tensor entry",
                here(),
                format!("chunks cover {next} of {numel} elements"),
            ));
        }
    }

    crate::prediction::validate_predictions(dir)?;

    // Two chunks may share a stored range exactly (a deduplicated payload); no other overlap.
    // An empty range overlaps nothing (its chunk fails R25 when read), so none was listed.
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        let ((s0, e0, t0, c0), (s1, e1, t1, c1)) = (w[0], w[1]);
        if s1 < e0 && (s0, e0) != (s1, e1) {
            return Err(FormatError::malformed(
                "chunk entry",
                Position::chunk(&dir.tensors[t1].name, c1 as u32).with_offset(s1),
                format!(
                    "stored bytes {s1}..{e1} overlap bytes {s0}..{e0} of tensor {:?} chunk {c0}",
                    dir.tensors[t0].name
                ),
            ));
        }
    }
    Ok(())
}

fn validate_metadata(dir: &Directory) -> Result<(), FormatError> {
    let mut keys = HashSet::with_capacity(dir.metadata.len());
    for m in &dir.metadata {
        let here = || Position::default();
        if m.key.is_empty() {
            return Err(FormatError::malformed("metadata entry", here(), "empty key"));
        }
        if !keys.insert(m.key.as_str()) {
            return Err(FormatError::malformed("metadata entry", here(), format!("key {:?} appears twice", m.key)));
        }
        if let Some(expected) = reserved_type(&m.key) {
            if m.value.type_name() != expected {
                return Err(FormatError::malformed(
                    "metadata entry",
                    here(),
                    format!("reserved key {:?} must hold a {expected}, found a {}", m.key, m.value.type_name()),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChunkEntry, CodecTag, DType, TensorEntry};

    /// A file of one u8 tensor of `n` elements in one zstd chunk at offset 64, stored in
    /// `stored` bytes, and the end of its payload area.
    fn one_chunk(n: u64, stored: u64) -> (Header, Directory, u64) {
        let chunk = ChunkEntry {
            element_start: 0,
            element_count: n,
            offset: Header::LEN as u64,
            stored_length: stored,
            decoded_length: n,
            crc32: 0,
            codec: CodecTag::Zstd,
            params: Vec::new(),
        };
        let t = TensorEntry {
            name: "t".into(),
            dtype: DType::U8,
            shape: vec![n],
            byte_length: n,
            digest: [0; 32],
            chunks: vec![chunk],
        };
        (Header::new(0, 64, 0), Directory { tensors: vec![t], ..Directory::default() }, 64 + 100)
    }

    #[test]
    fn chunk_lengths_at_their_limits_are_within_them() {
        // At a limit the value is allowed; one over it, the limit speaks (R15).
        let (h, dir, end) = one_chunk(MAX_CHUNK_DECODED_LEN, 100);
        validate(&h, &dir, end).expect("a chunk decoding to exactly 1 GiB");
        // A stored length at its limit cannot fit this payload area: R21 speaks, not the limit.
        let (h, dir, end) = one_chunk(100, MAX_CHUNK_STORED_LEN);
        let e = validate(&h, &dir, end).unwrap_err();
        assert!(
            matches!(e, FormatError::Malformed { .. }) && e.to_string().contains("outside the payload area"),
            "{e}"
        );
        for (n, stored) in [(MAX_CHUNK_DECODED_LEN + 1, 100), (100, MAX_CHUNK_STORED_LEN + 1)] {
            let (h, dir, end) = one_chunk(n, stored);
            let e = validate(&h, &dir, end).unwrap_err();
            assert!(matches!(e, FormatError::LimitExceeded { .. }), "{n} {stored}: {e}");
        }
        let (h, dir, end) = one_chunk(100, 100);
        validate(&h, &dir, end).expect("a chunk within every limit and the payload area");
    }
}
