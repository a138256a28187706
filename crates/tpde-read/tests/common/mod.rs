//! Helpers shared by the reader's integration tests.
#![allow(dead_code)]

use tpde_codec::Encoder;
use tpde_format::{DType, Directory, Header, MetadataValue, Trailer};
use tpde_write::{WriteOptions, Writer};

/// A small file with several tensors, several chunks per tensor, both codecs' worth of data.
pub fn small_file(encoder: Encoder) -> Vec<u8> {
    let opts = WriteOptions { encoder, chunk_bytes: 128, ..WriteOptions::default() };
    let mut w = Writer::new(Vec::new(), opts).unwrap();
    w.add_metadata("tpde.step", MetadataValue::U64(42)).unwrap();
    w.add_metadata("note", MetadataValue::String("hello".into())).unwrap();
    let ramp: Vec<u8> = (0..300u32).flat_map(|i| ((i as f32) * 0.25).to_le_bytes()).collect();
    w.add_tensor("ramp", DType::F32, &[3, 100], &ramp).unwrap();
    w.add_tensor("scalar", DType::I64, &[], &7i64.to_le_bytes()).unwrap();
    w.add_tensor("empty", DType::BF16, &[0, 5], &[]).unwrap();
    let bytes: Vec<u8> = (0..200u32).map(|i| (i * 7 % 256) as u8).collect();
    w.add_tensor("ünïcode/名前", DType::U8, &[200], &bytes).unwrap();
    w.finish().unwrap()
}

/// Replaces the directory of a valid file with `dir` and reseals the trailer, so a test can
/// build a file that breaks exactly one directory rule.
pub fn with_directory(file: &[u8], edit: impl FnOnce(&mut Directory)) -> Vec<u8> {
    let t = Trailer::parse(file[file.len() - 32..].try_into().unwrap(), file.len() as u64).unwrap();
    let mut dir = Directory::parse(&file[t.directory_offset as usize..file.len() - 32]).unwrap();
    edit(&mut dir);
    let mut out = file[..t.directory_offset as usize].to_vec();
    let bytes = dir.to_bytes();
    out.extend_from_slice(&bytes);
    out.extend_from_slice(&Trailer::new(t.directory_offset, &bytes).to_bytes());
    out
}

/// Rewrites header fields and reseals its CRC.
pub fn with_header(file: &[u8], edit: impl FnOnce(&mut Header)) -> Vec<u8> {
    let mut h = Header::parse(&file[..64], file.len() as u64).unwrap();
    edit(&mut h);
    h.header_crc32 = crc32fast::hash(&h.to_bytes()[..60]);
    let mut out = file.to_vec();
    out[..64].copy_from_slice(&h.to_bytes());
    out
}

pub fn all_dtypes() -> Vec<DType> {
    DType::ALL.to_vec()
}
