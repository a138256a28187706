//! What the issue and spec §9.1 ask the corpus to cover, checked on the generated files.

use std::collections::{BTreeSet, HashSet};

use tpde_conformance::Expect;
use tpde_format::{CodecTag, DType, RequiredFeatures};
use tpde_read::Reader;

#[test]
fn the_corpus_covers_every_tag_dtype_flag_and_rule() {
    let corpus = tpde_corpus::generate();
    assert!(corpus.files.len() >= 60, "{} files", corpus.files.len());
    let (mut codecs, mut dtypes, mut flags, mut minors) = (HashSet::new(), BTreeSet::new(), 0u64, BTreeSet::new());
    let (mut scalars, mut empties, mut max_rank, mut longest_name, mut non_ascii) = (0, 0, 0, 0, 0);
    for (case, (path, bytes)) in corpus.manifest.files.iter().zip(&corpus.files) {
        assert_eq!(&case.file, path);
        if !matches!(case.expect, Expect::Valid { .. }) {
            continue;
        }
        let r = Reader::from_source(bytes.as_slice()).unwrap_or_else(|e| panic!("{path}: {e}"));
        flags |= r.header().required_features | r.header().optional_features;
        minors.insert(r.header().minor_version);
        for t in r.tensors() {
            dtypes.insert(t.dtype.code());
            codecs.extend(t.chunks.iter().map(|c| c.codec));
            scalars += usize::from(t.shape.is_empty());
            empties += usize::from(t.byte_length == 0);
            max_rank = max_rank.max(t.shape.len());
            longest_name = longest_name.max(t.name.len());
            non_ascii += usize::from(!t.name.is_ascii());
        }
    }
    for tag in CodecTag::ALL {
        assert!(codecs.contains(&tag), "no valid file uses codec {tag}");
    }
    for dtype in DType::ALL {
        assert!(dtypes.contains(&dtype.code()), "no valid file holds {dtype}");
    }
    assert_ne!(flags & RequiredFeatures::BASE, 0, "no delta file");
    assert_ne!(flags >> 1, 0, "no file with a flag a reader must ignore");
    assert!(minors.len() >= 3, "minor versions 1.0, 1.1 and a newer one: {minors:?}");
    assert!(scalars > 0 && empties > 0 && non_ascii > 0);
    assert_eq!(max_rank as u64, tpde_format::limits::MAX_RANK);
    assert_eq!(longest_name as u64, tpde_format::limits::MAX_NAME_LEN);
}
