//! The spec's test vector (spec/vectors/minimal.tpde, dumped in spec/tpde-v1.md §12): the
//! writer must still produce exactly these bytes, and the reader must read them. Regenerate with
//! `TPDE_BLESS=1 cargo test -p tpde-read --test golden` only together with a spec change.

use std::path::PathBuf;
use tpde_format::{digest::to_hex, DType, MetadataValue};
use tpde_read::Reader;
use tpde_write::{WriteOptions, Writer};

fn vector_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/vectors/minimal.tpde")
}

fn minimal() -> Vec<u8> {
    let mut w = Writer::new(Vec::new(), WriteOptions::default()).unwrap();
    w.add_metadata("tpde.step", MetadataValue::U64(1)).unwrap();
    let data: Vec<u8> = [1.0f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    w.add_tensor("w", DType::F32, &[2], &data).unwrap();
    w.finish().unwrap()
}

#[test]
fn writer_output_matches_the_spec_vector() {
    let bytes = minimal();
    if std::env::var_os("TPDE_BLESS").is_some() {
        std::fs::write(vector_path(), &bytes).unwrap();
    }
    let committed = std::fs::read(vector_path()).expect("spec/vectors/minimal.tpde");
    assert_eq!(bytes, committed, "the writer's bytes changed: update the spec and its version notes, then bless");
}

#[test]
fn reader_reads_the_spec_vector() {
    let r = Reader::open(vector_path()).unwrap();
    assert_eq!(&*r.read("w").unwrap(), &[0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0]);
    assert_eq!(r.metadata("tpde.step"), Some(&MetadataValue::U64(1)));
    // Both values are quoted in spec §12 and were checked against Python's `blake3` package.
    assert_eq!(
        to_hex(&r.tensor("w").unwrap().digest),
        "54847fa2028a3457068a78ba8e6a086cccf672def025d7e4cb2761b538edbf3f"
    );
    assert_eq!(to_hex(&r.content_digest()), "f6f0ebd9d030af91b114ef726de62360b5c92f02256b1b5011af5f8de132389f");
}
