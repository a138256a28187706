//! Hostile input: truncation at every offset, every single-byte flip, random garbage, and what
//! the errors say. Every case must be an error of the right category, never a panic. The files
//! that break one rule each are the conformance corpus (`conformance/`, run by
//! `crates/tpde-cli/tests/conformance.rs`).

mod common;

use tpde_codec::Encoder;
use tpde_format::CodecTag;
use tpde_format::{surgery, ErrorKind};
use tpde_read::{ChecksumPolicy, ReadOptions, Reader};

/// Files of every keyframe form: raw, zstd, and the entropy-coded ones whose records carry
/// lanes and contexts.
fn files() -> Vec<(Encoder, Vec<u8>)> {
    [
        Encoder::Raw,
        Encoder::Zstd { level: 3 },
        Encoder::AutoSerial,
        Encoder::Auto,
        Encoder::Codec(CodecTag::PlanesLanes),
        Encoder::Codec(CodecTag::PlanesContext),
    ]
    .into_iter()
    .map(|e| (e, common::small_file(e)))
    .collect()
}

fn open(bytes: &[u8]) -> Result<Reader<&[u8]>, tpde_read::ReadError> {
    Reader::from_source(bytes)
}

#[test]
fn truncation_at_every_offset_is_an_error() {
    for (encoder, file) in files() {
        assert!(open(&file).is_ok(), "{encoder:?}");
        for len in 0..file.len() {
            let err =
                open(&file[..len]).err().unwrap_or_else(|| panic!("{encoder:?}: truncated to {len} bytes opened"));
            let expected = if len == 0 { ErrorKind::NotTpde } else { ErrorKind::Truncated };
            assert_eq!(err.kind(), expected, "{encoder:?}: truncated to {len}: {err}");
        }
    }
}

#[test]
fn every_single_byte_flip_is_caught() {
    for (encoder, file) in files() {
        for at in 0..file.len() {
            for mask in [0x01u8, 0x80, 0xFF] {
                let mut bad = file.clone();
                bad[at] ^= mask;
                let caught = match open(&bad) {
                    Err(_) => true,
                    Ok(r) => r.verify().is_err(),
                };
                assert!(caught, "{encoder:?}: flipping byte {at} with {mask:#04x} went unnoticed");
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
fn reading_many_tensors_at_once_reports_the_first_bad_one_in_the_order_given() {
    let file = common::small_file(Encoder::Zstd { level: 3 });
    let r = open(&file).unwrap();
    let mut bad = file.clone();
    for (name, chunk) in [("ramp", 1), ("ünïcode/名前", 0)] {
        let c = &r.tensor(name).unwrap().chunks[chunk];
        bad[c.offset as usize + 3] ^= 0x10;
    }
    let r = open(&bad).unwrap();
    let names = ["scalar", "ramp", "ünïcode/名前"];
    let mut bufs: Vec<Vec<u8>> = names.iter().map(|n| vec![0; r.tensor(n).unwrap().byte_length as usize]).collect();
    let mut read = |order: &[usize]| {
        let mut by_index: Vec<Option<&mut [u8]>> = bufs.iter_mut().map(|b| Some(&mut b[..])).collect();
        let jobs = order.iter().map(|&i| (r.tensor(names[i]).unwrap(), by_index[i].take().unwrap())).collect();
        r.read_many_into(jobs).unwrap_err()
    };
    for (order, named) in [(&[0, 1, 2], "chunk 1"), (&[2, 1, 0], "chunk 0")] {
        let e = read(order);
        assert_eq!(e.kind(), ErrorKind::ChecksumMismatch, "{e}");
        assert!(e.to_string().contains(named), "{order:?}: {e}");
    }
    let ramp = r.tensor("ramp").unwrap();
    let e = r.read_many_into(vec![(ramp, &mut [0u8; 4][..])]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
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
            // The category spec §9's precedences give: the magic (P1), the major version from
            // 10 bytes on (P2), the length (R5), then the header CRC (P3), which random bytes
            // break (2^-32 aside).
            let major = bytes.get(8..10).map(|m| u16::from_le_bytes([m[0], m[1]]));
            let expected = match len {
                0..=7 if !bytes.is_empty() && tpde_format::MAGIC.starts_with(&bytes) => ErrorKind::Truncated,
                0..=7 => ErrorKind::NotTpde,
                8 | 9 => ErrorKind::Truncated,
                _ if major != Some(1) => ErrorKind::UnsupportedVersion,
                10..=63 => ErrorKind::Truncated,
                _ => ErrorKind::ChecksumMismatch,
            };
            let err = open(&bytes).err().unwrap_or_else(|| panic!("{len} random bytes opened"));
            assert_eq!(err.kind(), expected, "{len} bytes: {err}");
        }
    }
}

#[test]
fn error_messages_say_where_and_what() {
    let file = common::small_file(Encoder::Raw);
    let bad = surgery::with_directory(&file, |d| d.tensors[0].byte_length += 4).unwrap();
    let msg = open(&bad).err().unwrap().to_string();
    assert!(msg.contains("\"ramp\"") && msg.contains("1204") && msg.contains("1200"), "{msg}");
    // The version found, the bytes found where the magic belongs.
    let bad = surgery::with_header(&file, |h| h.major_version = 2).unwrap();
    assert!(open(&bad).err().unwrap().to_string().contains("2.0"));
    let mut bad = file.clone();
    bad[..4].copy_from_slice(b"PK\x03\x04");
    let msg = open(&bad).err().unwrap().to_string();
    assert!(msg.contains("50, 4b, 03, 04"), "names the magic found: {msg}");
    // The byte of padding that is not zero.
    let r = open(&file).unwrap();
    let c = &r.tensor("scalar").unwrap().chunks[0];
    let pad = (c.offset + c.stored_length) as usize;
    let mut bad = file.clone();
    bad[pad] = 1;
    let msg = open(&bad).unwrap().verify().unwrap_err().to_string();
    assert!(msg.contains(&format!("byte {pad}")), "{msg}");
    // A delta codec in a file without a base says so.
    let bad =
        surgery::with_directory(&file, |d| d.tensors[0].chunks[0].codec = tpde_format::CodecTag::DeltaXor).unwrap();
    assert!(open(&bad).err().unwrap().to_string().contains("has none"));
}

/// `ChecksumPolicy::Trust` skips chunk CRCs (R24) and nothing else: a flipped payload byte is
/// read without a CRC error (and caught by verify, which always checks), while the directory,
/// the decoders and the digests still guard everything they guard.
#[test]
fn trusted_input_skips_chunk_crcs_and_nothing_else() {
    let trust = ReadOptions { checksums: ChecksumPolicy::Trust, ..ReadOptions::default() };
    // A raw chunk with a flipped byte: Verify stops at the CRC, Trust returns the bytes.
    let file = common::small_file(Encoder::Raw);
    let c = open(&file).unwrap().tensor("ramp").unwrap().chunks[1].clone();
    let mut bad = file.clone();
    bad[c.offset as usize + 3] ^= 0x10;
    assert_eq!(open(&bad).unwrap().read("ramp").unwrap_err().kind(), ErrorKind::ChecksumMismatch);
    let trusted = Reader::with_options(bad.as_slice(), trust).unwrap();
    let read = trusted.read("ramp").unwrap();
    let good = open(&file).unwrap().read("ramp").unwrap().into_owned();
    let diff: Vec<usize> = (0..good.len()).filter(|&i| read[i] != good[i]).collect();
    assert_eq!(diff, vec![(c.element_start * 4) as usize + 3], "exactly the flipped byte differs");
    assert_eq!(trusted.verify().unwrap_err().kind(), ErrorKind::ChecksumMismatch, "verify always checks");
    // An entropy-coded chunk with a flipped byte: no CRC check, but the decoder still rejects
    // what does not decode, or the digest check of verify catches what decodes wrongly.
    let file = common::small_file(Encoder::Codec(CodecTag::PlanesContext));
    let c = open(&file).unwrap().tensor("ramp").unwrap().chunks[0].clone();
    for at in 0..c.stored_length as usize {
        let mut bad = file.clone();
        bad[c.offset as usize + at] ^= 0x04;
        let trusted = Reader::with_options(bad.as_slice(), trust).unwrap();
        let caught = match trusted.read("ramp") {
            Err(e) => e.kind() == ErrorKind::Malformed,
            Ok(_) => trusted.verify().is_err(),
        };
        assert!(caught, "byte {at} of the chunk flipped, read as trusted, went unnoticed");
    }
    // Structure is checked as ever.
    let broken = surgery::with_directory(&file, |d| d.tensors[0].byte_length += 4).unwrap();
    assert_eq!(Reader::with_options(broken.as_slice(), trust).err().unwrap().kind(), ErrorKind::Malformed);
}
