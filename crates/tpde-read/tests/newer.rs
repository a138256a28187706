//! A file that declares a newer minor version than this reader's, and breaks a rule as this
//! reader knows it, may use what the newer version adds (spec §11): the error says so, and
//! keeps its category.

use std::path::Path;

use tpde_format::{surgery, ErrorKind, FORMAT_MINOR};
use tpde_read::Reader;

fn corpus(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/invalid").join(name)).unwrap()
}

fn first_error(bytes: Vec<u8>) -> tpde_read::ReadError {
    let r = match Reader::from_source(bytes) {
        Ok(r) => r,
        Err(e) => return e,
    };
    for t in r.tensors() {
        if let Err(e) = r.read_tensor(t) {
            return e;
        }
    }
    panic!("the file read");
}

#[test]
fn errors_of_a_newer_file_say_that_it_is_newer() {
    // An unknown plane mode (read time) and an unknown codec tag (open time).
    for (name, kind) in
        [("r25-plane-mode.tpde", ErrorKind::Malformed), ("r14-unknown-codec.tpde", ErrorKind::UnsupportedFeature)]
    {
        let file = corpus(name);
        let newer = surgery::with_header(&file, |h| h.minor_version = FORMAT_MINOR + 1).unwrap();
        let e = first_error(newer);
        assert_eq!(e.kind(), kind, "{name}");
        let said = e.to_string();
        assert!(
            said.contains(&format!(
                "declares format 1.{}, newer than this reader's 1.{FORMAT_MINOR}",
                FORMAT_MINOR + 1
            )),
            "{said}"
        );
        // Not for a file of this reader's version or older: it broke a rule this reader knows.
        let e = first_error(surgery::with_header(&file, |h| h.minor_version = FORMAT_MINOR).unwrap());
        assert_eq!(e.kind(), kind);
        assert!(!e.to_string().contains("newer"), "{e}");
    }
    // A checksum error is not explained by a newer version.
    let crc = corpus("r24-chunk-crc.tpde");
    let e = first_error(surgery::with_header(&crc, |h| h.minor_version = FORMAT_MINOR + 1).unwrap());
    assert_eq!(e.kind(), ErrorKind::ChecksumMismatch);
    assert!(!e.to_string().contains("newer"), "{e}");
}
