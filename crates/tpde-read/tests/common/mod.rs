//! Helpers shared by the reader's integration tests.
#![allow(dead_code)]

use tpde_codec::Encoder;
use tpde_format::{DType, MetadataValue};
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

pub fn all_dtypes() -> Vec<DType> {
    DType::ALL.to_vec()
}
