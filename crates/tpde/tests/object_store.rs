//! `.tpde` files in object storage, against a real S3 server process (`s3s-fs`) behind a proxy
//! that counts requests and injects faults (`tpde_testkit::s3`). One server serves the whole test
//! binary (the client is configured once per process, from the environment); each test keeps
//! to its own key prefix.

use std::collections::HashMap;
use std::sync::OnceLock;

use tpde::location::Stored;
use tpde::open::{open_base, open_reader, open_tpde, open_tpde_with, HintPolicy, OpenOptions};
use tpde::pack::TensorRef;
use tpde::read::PathHints;
use tpde::{DType, ErrorKind, Location, WriteOptions};
use tpde::{PackJob, PackReport, PackSource};
use tpde_testkit::s3::{Fault, S3};

fn s3() -> &'static S3 {
    static SERVER: OnceLock<S3> = OnceLock::new();
    SERVER.get_or_init(|| {
        let s = S3::start();
        for (k, v) in s.env() {
            std::env::set_var(k, v);
        }
        s
    })
}

fn at(key: &str) -> Location {
    Location::parse(&s3().url(key)).unwrap()
}

type Tensors = Vec<(String, DType, Vec<u64>, Vec<u8>)>;

/// A small checkpoint: f32 weights that drift with `step`, a bf16 tensor, a step counter.
fn checkpoint(step: u32, elements: usize) -> Tensors {
    let w: Vec<u8> = (0..elements)
        .flat_map(|i| ((i as f32 * 0.001).sin() + step as f32 * 1e-4 * (i % 7) as f32).to_le_bytes())
        .collect();
    let h: Vec<u8> = (0..4096u32).flat_map(|i| ((i.wrapping_mul(2654435761) >> 20) as u16).to_le_bytes()).collect();
    vec![
        ("layer.weight".into(), DType::F32, vec![elements as u64], w),
        ("layer.bias".into(), DType::BF16, vec![4096], h),
        ("step".into(), DType::I64, vec![], i64::from(step).to_le_bytes().to_vec()),
    ]
}

fn write(out: &Location, tensors: &Tensors, base: Option<&Location>) -> Result<PackReport, tpde::Error> {
    let base_ck = base.map(open_base).transpose()?;
    let job = PackJob {
        base: base_ck.as_deref().zip(base).map(|(b, at)| (b, out.hint_to(at))),
        ..PackJob::keyframe(WriteOptions { encoder: tpde::Encoder::Auto, ..WriteOptions::default() })
    };
    let refs: Vec<TensorRef<'_>> =
        tensors.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice())).collect();
    let source = PackSource::Tensors { tensors: &refs, metadata: &[], format: "test" };
    tpde::pack(source, out, job, &()).map(|p| p.report)
}

fn read_all(file: &Location) -> HashMap<String, Vec<u8>> {
    let r = open_tpde(file, None).unwrap();
    r.tensors().iter().map(|t| (t.name.clone(), r.read_tensor(t).unwrap().into_owned())).collect()
}

fn assert_same(file: &Location, tensors: &Tensors) {
    let got = read_all(file);
    assert_eq!(got.len(), tensors.len());
    for (name, _, _, bytes) in tensors {
        assert!(got[name] == *bytes, "{file}: tensor {name} differs");
    }
}

fn gets(key: &str) -> usize {
    s3().requests(key).iter().filter(|r| r.method == "GET").count()
}

#[test]
fn keyframes_and_deltas_round_trip_and_find_their_base_by_key() {
    let (k0, k1, k2) = (at("chain/step-0/ck.tpde"), at("chain/step-1/ck.tpde"), at("chain/step-2/ck.tpde"));
    let steps: Vec<Tensors> = (0..3).map(|s| checkpoint(s, 50_000)).collect();
    write(&k0, &steps[0], None).unwrap();
    let r1 = write(&k1, &steps[1], Some(&k0)).unwrap();
    write(&k2, &steps[2], Some(&k1)).unwrap();
    assert_eq!(r1.delta_tensors, 3);
    // The hint is relative to the delta's own key, so the chain moves with its prefix.
    let r = open_reader(&k2).unwrap();
    assert_eq!(r.directory().base.as_ref().unwrap().path_hint, "../step-1/ck.tpde");
    for (k, t) in [(&k0, &steps[0]), (&k1, &steps[1]), (&k2, &steps[2])] {
        assert_same(k, t);
        open_tpde(k, None).unwrap().verify().unwrap();
    }
    // A slice through the chain.
    let r = open_tpde(&k2, None).unwrap();
    let t = r.tensor("layer.weight").unwrap().clone();
    let mut out = vec![0u8; 400];
    tpde::open::read_range(&r, &t, 4000, &mut out).unwrap();
    assert_eq!(out, steps[2][0].3[4000..4400]);
}

#[test]
fn a_base_may_be_local_while_the_delta_is_remote_and_the_other_way_round() {
    let dir = tempfile::tempdir().unwrap();
    let local_base = Location::from(dir.path().join("base.tpde"));
    let remote_base = at("mixed/base.tpde");
    let (a, b) = (checkpoint(10, 20_000), checkpoint(11, 20_000));
    write(&local_base, &a, None).unwrap();
    write(&remote_base, &a, None).unwrap();

    let remote_delta = at("mixed/delta-on-local.tpde");
    write(&remote_delta, &b, Some(&local_base)).unwrap();
    let hint = open_reader(&remote_delta).unwrap().directory().base.as_ref().unwrap().path_hint.clone();
    assert!(std::path::Path::new(&hint).is_absolute(), "{hint}");
    assert_same(&remote_delta, &b);

    let local_delta = Location::from(dir.path().join("delta-on-remote.tpde"));
    write(&local_delta, &b, Some(&remote_base)).unwrap();
    let hint = open_reader(&local_delta).unwrap().directory().base.as_ref().unwrap().path_hint.clone();
    assert_eq!(hint, s3().url("mixed/base.tpde"));
    assert_same(&local_delta, &b);

    // Confined to the delta's folder, with S3 configured: the URL hint is refused
    // (`base-missing`, naming it) and the store is not asked (issue 53: it was followed).
    let confined = |folder: &std::path::Path| OpenOptions {
        hints: HintPolicy { paths: PathHints::Within(vec![folder.into()]), ..HintPolicy::default() },
        ..OpenOptions::default()
    };
    let asked = s3().requests("mixed/base.tpde").len();
    let e = open_tpde_with(&local_delta, None, &confined(dir.path())).err().expect("refused");
    assert_eq!(e.kind(), ErrorKind::BaseMissing, "{e}");
    assert!(e.to_string().contains("confined"), "{e}");
    assert_eq!(s3().requests("mixed/base.tpde").len(), asked, "the store was asked for the base");
    // A chain opened in the bucket follows hints within it.
    let remote_delta = at("mixed/delta-on-remote.tpde");
    write(&remote_delta, &b, Some(&remote_base)).unwrap();
    let r = open_tpde_with(&remote_delta, None, &confined(dir.path())).unwrap();
    assert_eq!(&*r.read("layer.weight").unwrap(), &b[0].3[..]);
}

#[test]
fn opening_takes_the_tail_and_the_header_and_a_small_tensor_one_more_get() {
    // 24 MiB of weights: well past the 256 KiB tail fetched on open.
    let key = "count/big.tpde";
    let t = checkpoint(3, 6 << 20);
    write(&at(key), &t, None).unwrap();
    let before = gets(key);
    let r = open_reader(&at(key)).unwrap();
    assert_eq!(gets(key) - before, 2, "open: one GET of the tail, one of the header");
    assert_eq!(&*r.read("step").unwrap(), &t[2].3[..]);
    assert_eq!(gets(key) - before, 2, "the step counter's chunk is inside the tail already");
    let bias = r.read("layer.bias").unwrap();
    assert_eq!(&*bias, &t[1].3[..]);
    assert!(gets(key) - before <= 3, "one small tensor: at most one more GET");
    let Stored::Object(src) = r.source() else { panic!("an object") };
    assert!(src.stats().bytes < 1 << 20, "{:?}: only the tail, the header and one chunk", src.stats());

    // The whole of the big tensor: its 6 chunks, coalesced and cut into 8 MiB pieces.
    let before = s3().requests(key).len();
    assert_eq!(&*r.read("layer.weight").unwrap(), &t[0].3[..]);
    let reads: Vec<_> = s3().requests(key).into_iter().skip(before).collect();
    assert!(reads.iter().all(|l| l.method == "GET" && l.range.is_some()), "{reads:?}");
    assert!((3..=4).contains(&reads.len()), "24 MiB in pieces of 8 MiB: {reads:?}");
}

#[test]
fn large_files_upload_in_parts_and_a_failed_or_dropped_upload_leaves_nothing() {
    let key = "multipart/big.tpde";
    let big = checkpoint(4, 12 << 20); // 48 MiB: three parts of 16 MiB and a last one
    write(&at(key), &big, None).unwrap();
    let log = s3().requests(key);
    assert!(log.iter().any(|l| l.method == "POST" && l.target.contains("uploads")), "a multipart upload: {log:?}");
    assert!(log.iter().filter(|l| l.method == "PUT" && l.target.contains("partNumber")).count() >= 3);
    assert_same(&at(key), &big);

    // A part refused for good: the upload is aborted, the object that was there stays.
    s3().inject("PUT", key, Fault::Status(400), 1);
    let err = write(&at(key), &checkpoint(5, 12 << 20), None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert!(err.message().contains(&s3().url(key)), "{err}");
    assert!(s3().requests(key).iter().any(|l| l.method == "DELETE" && l.target.contains("uploadId")), "aborted");
    assert_same(&at(key), &big);

    // A file abandoned half way (its sink dropped): aborted, no object.
    let key = "multipart/abandoned.tpde";
    {
        use std::io::Write;
        let mut sink = at(key).create().unwrap();
        sink.write_all(&vec![7u8; 40 << 20]).unwrap();
    }
    let log = s3().requests(key);
    assert!(log.iter().any(|l| l.method == "DELETE" && l.target.contains("uploadId")), "aborted: {log:?}");
    assert!(!at(key).is_file().unwrap());
}

#[test]
fn passing_faults_are_retried_and_reads_stay_bit_exact() {
    let key = "faults/transient.tpde";
    let t = checkpoint(6, 3 << 20);
    s3().inject("PUT", key, Fault::Status(503), 1);
    write(&at(key), &t, None).unwrap();
    s3().inject("GET", key, Fault::Status(503), 2);
    s3().inject("GET", key, Fault::Drop, 1);
    s3().inject("GET", key, Fault::CutBody(1000), 2);
    let before = gets(key);
    assert_same(&at(key), &t);
    let log: Vec<_> = s3().requests(key).into_iter().filter(|l| l.method == "GET").skip(before).collect();
    assert!(log.iter().any(|l| l.status == 503) && log.iter().any(|l| l.status == 0), "{log:?}");
}

#[test]
fn missing_objects_and_persistent_failures_are_typed_errors_that_name_the_url() {
    let missing = at("errors/none.tpde");
    let err = open_tpde(&missing, None).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.message().contains(&missing.to_string()), "{err}");

    let key = "errors/down.tpde";
    write(&at(key), &checkpoint(7, 1000), None).unwrap();
    s3().inject("GET", key, Fault::Status(503), 1000);
    let err = open_tpde(&at(key), None).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert!(err.message().contains(&s3().url(key)), "{err}");

    // A delta whose base object was deleted: base-missing, naming where the base should be.
    let (base, delta) = (at("errors/b.tpde"), at("errors/d.tpde"));
    write(&base, &checkpoint(1, 50_000), None).unwrap();
    write(&delta, &checkpoint(2, 50_000), Some(&base)).unwrap();
    base.remove().unwrap();
    let r = open_tpde(&delta, None).unwrap();
    let t = r.tensors().iter().find(|t| r.tensor_uses_base(t)).expect("a tensor coded against the base");
    let err = tpde::Error::from(r.read_tensor(t).unwrap_err());
    assert_eq!(err.kind(), ErrorKind::BaseMissing, "{err}");
    let err = tpde::open::open_chain(&delta).err().unwrap();
    assert!(err.message().contains(&base.to_string()), "{err}");
}

#[test]
fn a_modified_or_truncated_object_is_caught_as_a_file_would_be() {
    let key = "errors/tampered.tpde";
    let t = checkpoint(8, 100_000);
    write(&at(key), &t, None).unwrap();
    let path = s3().object_path(key);
    let mut bytes = std::fs::read(&path).unwrap();
    let chunk = open_reader(&at(key)).unwrap().tensor("layer.weight").unwrap().chunks[0].offset as usize;
    bytes[chunk + 10] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let err = tpde::Error::from(open_reader(&at(key)).unwrap().verify().unwrap_err());
    assert_eq!(err.kind(), ErrorKind::ChecksumMismatch, "{err}");

    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    let err = open_reader(&at(key)).err().unwrap();
    assert!(matches!(err.kind(), ErrorKind::Truncated | ErrorKind::Malformed | ErrorKind::NotTpde), "{err}");
}

/// A response body damaged on its way (the store's object is whole) fails its chunk's CRC: the
/// chunk is fetched again, up to three times, and reads bit-exact (issue 53: `unpack` and `cat`
/// failed at once). Damaged every time, it is still a checksum error.
#[test]
fn a_chunk_damaged_in_transit_is_fetched_again() {
    let key = "transit/damaged.tpde";
    let t = checkpoint(9, 3 << 20); // 12 MiB of weights: past the tail fetched on open
    write(&at(key), &t, None).unwrap();
    let r = open_reader(&at(key)).unwrap();
    let before = s3().requests(key).len();
    s3().inject("GET", key, Fault::CorruptResponse, 2);
    assert_eq!(&*r.read("layer.weight").unwrap(), &t[0].3[..]);
    assert!(s3().requests(key).len() >= before + 3, "fetched again: {:?}", s3().requests(key));
    let r = open_reader(&at(key)).unwrap();
    s3().inject("GET", key, Fault::CorruptResponse, 100);
    let err = tpde::Error::from(r.read("layer.weight").unwrap_err());
    assert_eq!(err.kind(), ErrorKind::ChecksumMismatch, "{err}");
}

#[test]
fn folders_of_objects_list_and_remove() {
    for s in 0..3 {
        write(&at(&format!("listing/step-{s}.tpde")), &checkpoint(s, 100), None).unwrap();
    }
    let folder = at("listing");
    assert_eq!(folder.list().unwrap(), ["step-0.tpde", "step-1.tpde", "step-2.tpde"]);
    at("listing/step-1.tpde").remove().unwrap();
    at("listing/step-1.tpde").remove().unwrap(); // a missing object is no error
    assert_eq!(folder.list().unwrap(), ["step-0.tpde", "step-2.tpde"]);
    assert!(at("listing/nothing-here").list().unwrap().is_empty());
}

/// Issue 67: a writer stopped past its lease in the middle of an upload finishes that upload when
/// it runs again. Its write expects the object it saw before it checked its lease: when another
/// writer replaced (or created) the object in between, the commit writes nothing, whether the
/// file is one PUT or a multipart upload, and what the other writer wrote stays.
#[test]
fn a_write_expecting_a_version_never_replaces_what_another_writer_wrote_since() {
    use std::io::Write;
    use tpde::object::{version, Expect, ObjectUrl};
    for (key, len) in [("fence/small.tpde", 1 << 20), ("fence/parts.tpde", 40 << 20)] {
        let url = ObjectUrl::parse(&s3().url(key)).unwrap();
        let saw = version(&url).unwrap();
        assert_eq!(saw, Expect::Absent, "{key}");
        // The stale writer starts (all but its last part uploaded), then another writer saves.
        let mut stale = at(key).create_expecting(&saw).unwrap();
        stale.write_all(&vec![1u8; len]).unwrap();
        let live = checkpoint(7, 1 << 10);
        write(&at(key), &live, None).unwrap();
        let e = stale.commit().unwrap_err();
        assert!(e.message().contains("another writer replaced this object"), "{key}: {e}");
        assert_same(&at(key), &live);

        // Expecting the version it saw, a writer replaces it; the version that then lies there
        // refuses a writer still expecting the old one.
        let saw = version(&url).unwrap();
        assert!(matches!(saw, Expect::ETag(_)), "{key}: {saw:?}");
        let mut first = at(key).create_expecting(&saw).unwrap();
        let mut second = at(key).create_expecting(&saw).unwrap();
        first.write_all(&vec![2u8; len]).unwrap();
        second.write_all(&vec![3u8; len]).unwrap();
        assert_eq!(first.commit().unwrap(), len as u64, "{key}");
        let e = second.commit().unwrap_err();
        assert!(e.message().contains("another writer replaced this object"), "{key}: {e}");
        assert_eq!(tpde::object::get_all(&url).unwrap().as_ref(), vec![2u8; len].as_slice(), "{key}");
    }
    // No upload is left behind by the refused ones.
    let log = s3().requests("fence/parts.tpde");
    let aborted = log.iter().filter(|l| l.method == "DELETE" && l.target.contains("uploadId")).count();
    assert_eq!(aborted, 2, "{log:?}");
}
