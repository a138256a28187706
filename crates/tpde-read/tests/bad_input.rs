//! Hostile input: truncation at every offset, every single-byte flip, random garbage, and what
//! the errors say. Every case must be an error of the right category, never a panic. The files
//! that break one rule each are the conformance corpus (`conformance/`, run by
//! `tools/tpde/tests/conformance.rs`).

mod common;

use tpde_codec::Encoder;
use tpde_format::{surgery, ErrorKind};
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
