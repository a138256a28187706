//! The spec's test vector (spec/vectors/minimal.tpde, dumped in spec/tpde-v1.md §12): the file
//! is the spec's hex dump byte for byte, the writer still produces exactly these bytes, and the
//! reader reads them. Nothing here rewrites the file: a change to the writer's bytes is a spec
//! change, made by editing §12's dump (the failing test prints the new one) and the file.

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

/// `xxd`'s layout, as §12 prints it: offset, eight groups of two bytes, then a comment.
fn hex_dump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (i, line) in bytes.chunks(16).enumerate() {
        let groups: Vec<String> = line.chunks(2).map(|g| g.iter().map(|b| format!("{b:02x}")).collect()).collect();
        out.push_str(&format!("{:08x}: {}\n", i * 16, groups.join(" ")));
    }
    out
}

/// The bytes of spec §12's dump: every line `OFFSET: HEX HEX ...` of its text block, the hex
/// groups up to the two spaces before the line's comment.
fn spec_dump() -> Vec<u8> {
    let spec =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/tpde-v1.md")).unwrap();
    let section = spec.split("## 12. Test vector").nth(1).expect("spec §12");
    let block = section.split("```text").nth(1).unwrap().split("```").next().unwrap();
    let mut bytes = Vec::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let (offset, rest) = line.split_once(": ").expect("OFFSET: HEX");
        assert_eq!(usize::from_str_radix(offset, 16).unwrap(), bytes.len(), "dump line {line:?}");
        let hex = rest.split("  ").next().unwrap();
        for group in hex.split_whitespace() {
            for pair in group.as_bytes().chunks(2) {
                bytes.push(u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap());
            }
        }
    }
    bytes
}

#[test]
fn the_vector_file_is_the_spec_dump() {
    let committed = std::fs::read(vector_path()).expect("spec/vectors/minimal.tpde");
    assert_eq!(committed.len(), 242, "§12 says 242 bytes");
    assert_eq!(spec_dump(), committed, "spec §12's dump and spec/vectors/minimal.tpde differ");
}

#[test]
fn writer_output_matches_the_spec_vector() {
    let committed = std::fs::read(vector_path()).expect("spec/vectors/minimal.tpde");
    let bytes = minimal();
    assert!(
        bytes == committed,
        "the writer's bytes changed. That is a spec change: update §12 (its new dump is below), the \
         file and the version notes.\n{}",
        hex_dump(&bytes)
    );
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
