//! Hostile input: truncation at every offset, every single-byte flip, and directories that
//! each break one rule. Every case must be an error of the right category, never a panic.

mod common;

use tpde_codec::Encoder;
use tpde_format::{ErrorKind, RequiredFeatures};
use tpde_read::{ReadOptions, Reader};

fn open(bytes: &[u8]) -> Result<Reader<&[u8]>, tpde_read::ReadError> {
    Reader::from_source(bytes)
}

#[test]
fn truncation_at_every_offset_is_an_error() {
    for encoder in [Encoder::Raw, Encoder::Zstd { level: 3 }] {
        let file = common::small_file(encoder);
        assert!(open(&file).is_ok());
        for len in 0..file.len() {
            let err = open(&file[..len]).err().unwrap_or_else(|| panic!("truncated to {len} bytes opened"));
            let expected = if len == 0 { ErrorKind::NotTpde } else { ErrorKind::Truncated };
            assert_eq!(err.kind(), expected, "truncated to {len}: {err}");
        }
    }
}

#[test]
fn every_single_byte_flip_is_caught() {
    for encoder in [Encoder::Raw, Encoder::Zstd { level: 3 }] {
        let file = common::small_file(encoder);
        for at in 0..file.len() {
            for mask in [0x01u8, 0x80, 0xFF] {
                let mut bad = file.clone();
                bad[at] ^= mask;
                let caught = match open(&bad) {
                    Err(_) => true,
                    Ok(r) => r.verify().is_err(),
                };
                assert!(caught, "flipping byte {at} with {mask:#04x} went unnoticed");
            }
        }
    }
}

#[test]
fn flipped_chunk_bytes_are_checksum_mismatches() {
    let file = common::small_file(Encoder::Zstd { level: 3 });
    let r = open(&file).unwrap();
    let c = &r.tensor("ramp").unwrap().chunks[1];
    let mut bad = file.clone();
    bad[c.offset as usize + 3] ^= 0x10;
    let r = open(&bad).unwrap();
    let err = r.read("ramp").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ChecksumMismatch);
    let msg = err.to_string();
    assert!(msg.contains("\"ramp\"") && msg.contains("chunk 1"), "error says where: {msg}");
}

#[test]
fn directory_rules() {
    let file = common::small_file(Encoder::Raw);
    let case = |name: &str, kind: ErrorKind, edit: &dyn Fn(&mut tpde_format::Directory)| {
        let bad = common::with_directory(&file, edit);
        let err = open(&bad).err().unwrap_or_else(|| panic!("{name}: accepted"));
        assert_eq!(err.kind(), kind, "{name}: {err}");
    };
    case("overlapping chunks", ErrorKind::Malformed, &|d| {
        let off = d.tensors[0].chunks[0].offset;
        d.tensors[0].chunks[1].offset = off + 64;
    });
    case("chunk past the payload area", ErrorKind::Malformed, &|d| d.tensors[0].chunks[0].offset = 1 << 40);
    case("offset overflows", ErrorKind::Malformed, &|d| d.tensors[0].chunks[0].offset = u64::MAX - 63);
    case("unaligned chunk", ErrorKind::Malformed, &|d| d.tensors[0].chunks[0].offset += 1);
    case("byte_length disagrees with shape", ErrorKind::Malformed, &|d| d.tensors[0].byte_length += 4);
    case("shape overflows u64", ErrorKind::Malformed, &|d| d.tensors[0].shape = vec![u64::MAX, u64::MAX]);
    case("gap in element ranges", ErrorKind::Malformed, &|d| d.tensors[0].chunks[1].element_start += 1);
    case("decoded length disagrees", ErrorKind::Malformed, &|d| d.tensors[0].chunks[0].decoded_length -= 4);
    case("raw stored length disagrees", ErrorKind::Malformed, &|d| {
        d.tensors[0].chunks[0].stored_length -= 4;
    });
    case("duplicate tensor name", ErrorKind::Malformed, &|d| d.tensors[1].name = d.tensors[0].name.clone());
    case("rank over the limit", ErrorKind::LimitExceeded, &|d| {
        d.tensors[2].shape = vec![0; 33];
    });
    case("decoded chunk over the limit", ErrorKind::LimitExceeded, &|d| {
        let t = &mut d.tensors[0];
        t.shape = vec![1 << 29];
        t.byte_length = 4 << 29;
        t.chunks.truncate(1);
        t.chunks[0].element_count = 1 << 29;
        t.chunks[0].decoded_length = 4 << 29;
    });
    case("reserved key with the wrong type", ErrorKind::Malformed, &|d| {
        d.metadata[0].value = tpde_format::MetadataValue::I64(1);
    });
    case("base reference without the BASE flag", ErrorKind::Malformed, &|d| {
        d.base = Some(tpde_format::BaseRef { digest: [7; 32], path_hint: "b.tpde".into() });
    });
}

#[test]
fn header_rules() {
    let file = common::small_file(Encoder::Raw);
    let bad = common::with_header(&file, |h| h.required_features |= 1 << 5);
    assert_eq!(open(&bad).err().unwrap().kind(), ErrorKind::UnsupportedFeature);
    let bad = common::with_header(&file, |h| h.required_features |= RequiredFeatures::BASE);
    assert_eq!(open(&bad).err().unwrap().kind(), ErrorKind::Malformed, "BASE flag without a base reference");
    let bad = common::with_header(&file, |h| h.optional_features |= 1 << 9);
    assert!(open(&bad).is_ok(), "unknown may-ignore flags are ignored");
    let bad = common::with_header(&file, |h| h.major_version = 2);
    let err = open(&bad).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::UnsupportedVersion);
    assert!(err.to_string().contains("2.0"), "{err}");
    let bad = common::with_header(&file, |h| h.minor_version = 9);
    assert!(open(&bad).is_ok(), "a newer minor version is read");
    let mut bad = file.clone();
    bad[..4].copy_from_slice(b"PK\x03\x04");
    let err = open(&bad).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::NotTpde);
    assert!(err.to_string().contains("50, 4b, 03, 04"), "names the magic found: {err}");
}

#[test]
fn unknown_codec_and_dtype_codes_are_unsupported() {
    let file = common::small_file(Encoder::Raw);
    let r = open(&file).unwrap();
    let dir_at = r.trailer().directory_offset as usize;
    let dir = &file[dir_at..file.len() - 32];
    // "scalar" has one chunk; find its entry by name and patch the dtype and codec bytes.
    let name_at = dir.windows(6).position(|w| w == b"scalar").unwrap();
    let dtype_at = name_at + 6;
    // dtype, rank (0: a scalar has no dims), byte_length, digest, chunk_count, then the
    // chunk entry's five u64 and crc32 before its codec tag.
    let codec_at = dtype_at + 2 + 8 + 32 + 4 + 44;
    for (at, value, what) in [(dtype_at, vec![0x7e], "dtype"), (codec_at, vec![0x34, 0x12], "codec")] {
        let mut d = dir.to_vec();
        d[at..at + value.len()].copy_from_slice(&value);
        let mut bad = file[..dir_at].to_vec();
        bad.extend_from_slice(&d);
        bad.extend_from_slice(&tpde_format::Trailer::new(dir_at as u64, &d).to_bytes());
        let err = open(&bad).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::UnsupportedFeature, "{what}: {err}");
    }
}

#[test]
fn oversized_tensors_are_refused_before_allocating() {
    let file = common::small_file(Encoder::Zstd { level: 3 });
    let r =
        Reader::with_options(file.as_slice(), ReadOptions { max_tensor_bytes: 100, ..ReadOptions::default() }).unwrap();
    assert_eq!(r.read("ramp").unwrap_err().kind(), ErrorKind::LimitExceeded);
    assert!(r.read("scalar").is_ok());
}

#[test]
fn arbitrary_garbage_is_rejected() {
    let mut x = 0x1234_5678_9abc_def0u64;
    for len in [0usize, 1, 7, 8, 63, 64, 95, 96, 97, 200, 1000] {
        for _ in 0..50 {
            let mut bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            if len >= 8 {
                bytes[..8].copy_from_slice(&tpde_format::MAGIC);
            }
            assert!(open(&bytes).is_err());
        }
    }
}

#[test]
fn error_messages_say_where_and_what() {
    let file = common::small_file(Encoder::Raw);
    let bad = common::with_directory(&file, |d| d.tensors[0].byte_length += 4);
    let msg = open(&bad).err().unwrap().to_string();
    assert!(msg.contains("\"ramp\"") && msg.contains("1204") && msg.contains("1200"), "{msg}");
}

/// Rewrites the trailer of `file` with these fields, resealing its CRC.
fn with_trailer(file: &[u8], directory_offset: u64, directory_length: u64, directory_crc32: u32) -> Vec<u8> {
    let mut t = tpde_format::Trailer {
        directory_offset,
        directory_length,
        directory_crc32,
        trailer_crc32: 0,
        end_magic: *b"TPDE-END",
    };
    t.trailer_crc32 = crc32fast::hash(&t.to_bytes()[..20]);
    let mut out = file[..file.len() - 32].to_vec();
    out.extend_from_slice(&t.to_bytes());
    out
}

/// Replaces the directory bytes and reseals the trailer.
fn with_directory_bytes(file: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let r = open(file).unwrap();
    let at = r.trailer().directory_offset as usize;
    let mut dir = file[at..file.len() - 32].to_vec();
    edit(&mut dir);
    let mut out = file[..at].to_vec();
    out.extend_from_slice(&dir);
    out.extend_from_slice(&tpde_format::Trailer::new(at as u64, &dir).to_bytes());
    out
}

#[test]
fn trailer_and_directory_envelope_rules() {
    let file = common::small_file(Encoder::Raw);
    let r = open(&file).unwrap();
    let t = r.trailer().clone();
    let kind = |bytes: &[u8]| open(bytes).err().expect("rejected").kind();

    // R7: trailer CRC.
    let mut bad = file.clone();
    let n = bad.len();
    bad[n - 30] ^= 1;
    assert_eq!(kind(&bad), ErrorKind::ChecksumMismatch);
    // R9: directory over the limit.
    assert_eq!(kind(&with_trailer(&file, 64, 300 << 20, 0)), ErrorKind::LimitExceeded);
    // R10: directory overlapping the header, or not ending at the trailer.
    let end = file.len() as u64 - 32;
    assert_eq!(kind(&with_trailer(&file, 32, end - 32, t.directory_crc32)), ErrorKind::Malformed);
    assert_eq!(kind(&with_trailer(&file, t.directory_offset, t.directory_length - 1, 0)), ErrorKind::Malformed);
    // R11: directory CRC.
    let mut bad = file.clone();
    bad[t.directory_offset as usize + 2] ^= 1;
    assert_eq!(kind(&bad), ErrorKind::ChecksumMismatch);
    // R12: base_kind 2, trailing bytes, a count past the end, a string that is not UTF-8.
    assert_eq!(kind(&with_directory_bytes(&file, |d| d[8] = 2)), ErrorKind::Malformed);
    assert_eq!(kind(&with_directory_bytes(&file, |d| d.push(0))), ErrorKind::Malformed);
    assert_eq!(
        kind(&with_directory_bytes(&file, |d| d[4..8].copy_from_slice(&u32::MAX.to_le_bytes()))),
        ErrorKind::Malformed
    );
    let key_at = 9 + 2; // first metadata key "tpde.step"
    assert_eq!(kind(&with_directory_bytes(&file, |d| d[key_at] = 0xff)), ErrorKind::Malformed);
}

#[test]
fn codec_rules() {
    let file = common::small_file(Encoder::Zstd { level: 3 });
    let r = open(&file).unwrap();
    let ramp0 = r.tensor("ramp").unwrap().chunks[0].clone();
    // R23: a zstd chunk claiming more than 32768x expansion is rejected at open.
    let bad = one_chunk_claiming(&file, 1 << 20);
    let err = open(&bad).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Malformed, "{err}");
    // R25: stored bytes that do not decode, under a CRC that matches them.
    let mut bad = file.clone();
    let at = ramp0.offset as usize + ramp0.stored_length as usize / 2;
    bad[at] ^= 0x5a;
    let crc = crc32fast::hash(&bad[ramp0.offset as usize..(ramp0.offset + ramp0.stored_length) as usize]);
    let bad = common::with_directory(&bad, |d| d.tensors[0].chunks[0].crc32 = crc);
    let r = open(&bad).unwrap();
    let e = r.read("ramp").err();
    let verified = r.verify().err();
    assert!(e.is_some() || verified.is_some(), "a corrupted zstd chunk decodes and verifies");
    // R25: params where the codec takes none.
    let bad = common::with_directory(&file, |d| d.tensors[0].chunks[0].params = vec![1]);
    assert_eq!(open(&bad).unwrap().read("ramp").unwrap_err().kind(), ErrorKind::Malformed);
    // R28: a chunk that decodes against a base, in a file with no base reference.
    let bad = common::with_directory(&file, |d| d.tensors[0].chunks[0].codec = tpde_format::CodecTag::DeltaXor);
    let err = open(&bad).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Malformed, "{err}");
    assert!(err.to_string().contains("has none"), "{err}");
    // R23 for planes: a chunk claiming more than 32768x expansion.
    let planes = common::small_file(Encoder::Codec(tpde_format::CodecTag::Planes));
    assert_eq!(open(&one_chunk_claiming(&planes, 1 << 28)).err().unwrap().kind(), ErrorKind::Malformed);
}

/// The f32 tensor "ramp" of `file` as one chunk (its first) that claims to decode to `elements`.
fn one_chunk_claiming(file: &[u8], elements: u64) -> Vec<u8> {
    common::with_directory(file, |d| {
        let t = &mut d.tensors[0];
        t.shape = vec![elements];
        t.byte_length = elements * 4;
        t.chunks.truncate(1);
        t.chunks[0].element_count = elements;
        t.chunks[0].decoded_length = elements * 4;
    })
}

#[test]
fn verification_rules() {
    let file = common::small_file(Encoder::Raw);
    // R26: a tensor digest that does not match.
    let bad = common::with_directory(&file, |d| d.tensors[0].digest[0] ^= 1);
    let r = open(&bad).unwrap();
    assert!(r.read("ramp").is_ok(), "reads check CRCs, not digests");
    assert_eq!(r.verify().unwrap_err().kind(), ErrorKind::ChecksumMismatch);
    // R27: a non-zero byte in padding.
    let r = open(&file).unwrap();
    let c = &r.tensor("scalar").unwrap().chunks[0];
    let pad = (c.offset + c.stored_length) as usize;
    let mut bad = file.clone();
    bad[pad] = 1;
    let r = open(&bad).unwrap();
    let err = r.verify().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Malformed);
    assert!(err.to_string().contains(&format!("byte {pad}")), "{err}");
}
