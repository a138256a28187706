//! Files that claim more than they hold, and hints that lead where they should not: the
//! chunk-reuse bomb (many chunk entries naming one small stored range, R22, so a few KB declare
//! gigabytes), the decoded-size cap, streamed verification, and the path-hint policy.

use std::path::Path;

use tpde_codec::Encoder;
use tpde_format::digest::StreamDigest;
use tpde_format::{surgery, BaseRef, DType, ErrorKind};
use tpde_read::{open_chain_with, PathHints, ReadOptions, Reader};
use tpde_write::{WriteOptions, Writer};

/// Elements of the one stored chunk: 64 MiB of f32 zeros, a few KB in zstd.
const CHUNK_ELEMENTS: u64 = 16 << 20;

/// A valid file of one f32 tensor `w` of `copies` x 64 MiB of zeros, whose chunk entries all
/// name the same stored range. With `digest`, the tensor digest is the true one (a file that
/// verifies); without, a placeholder (what a hostile file would carry, found only by decoding).
fn chunk_reuse_bomb(copies: u64, digest: bool) -> Vec<u8> {
    let opts = WriteOptions {
        encoder: Encoder::Zstd { level: 19 },
        chunk_bytes: CHUNK_ELEMENTS * 4,
        ..WriteOptions::default()
    };
    let mut w = Writer::new(Vec::new(), opts).unwrap();
    w.add_tensor("w", DType::F32, &[CHUNK_ELEMENTS], &vec![0u8; (CHUNK_ELEMENTS * 4) as usize]).unwrap();
    let file = w.finish().unwrap();
    let digest = digest.then(|| {
        let zeros = vec![0u8; (CHUNK_ELEMENTS * 4) as usize];
        let mut d = StreamDigest::new();
        (0..copies).for_each(|_| d.update(&zeros));
        d.finalize()
    });
    surgery::with_directory(&file, |dir| {
        let t = &mut dir.tensors[0];
        let one = t.chunks[0].clone();
        t.shape = vec![CHUNK_ELEMENTS * copies];
        t.byte_length = CHUNK_ELEMENTS * 4 * copies;
        t.digest = digest.unwrap_or([7; 32]);
        t.chunks = (0..copies)
            .map(|k| {
                let mut c = one.clone();
                c.element_start = k * CHUNK_ELEMENTS;
                c
            })
            .collect();
    })
    .unwrap()
}

#[test]
fn a_64_gib_tensor_in_a_few_kb_is_refused_not_allocated() {
    let file = chunk_reuse_bomb(1024, false);
    assert!(file.len() < 100_000, "{} bytes", file.len());
    let r = Reader::from_source(file).unwrap();
    let t = r.tensor("w").unwrap();
    assert_eq!(t.byte_length, 64 << 30);
    for e in [r.read("w").err().unwrap(), r.verify().err().unwrap(), r.stream_tensor(t, |_| Ok(())).err().unwrap()] {
        assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
        assert!(e.to_string().contains("\"w\""), "names the tensor: {e}");
    }
}

#[test]
fn a_tensor_over_memory_is_an_error_not_an_abort() {
    // Under a raised cap, 64 GiB can still not be had on a machine like CI's: the allocation
    // fails cleanly instead of aborting the process. (Where the kernel promises any amount of
    // memory, overcommit mode 1, the allocation would succeed and the test says nothing.)
    if std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|m| m.trim() == "1") {
        return;
    }
    let file = chunk_reuse_bomb(1024, false);
    let r = Reader::with_options(file, ReadOptions { max_tensor_bytes: u64::MAX, ..ReadOptions::default() }).unwrap();
    let e = r.read("w").err().unwrap();
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
}

#[test]
fn the_cap_is_the_readers_to_set() {
    let r = Reader::with_options(
        chunk_reuse_bomb(2, false),
        ReadOptions { max_tensor_bytes: 64 << 20, ..ReadOptions::default() },
    )
    .unwrap();
    assert_eq!(r.read("w").err().unwrap().kind(), ErrorKind::LimitExceeded);
}

#[test]
fn a_large_tensor_streams_through_a_bounded_buffer() {
    // 512 MiB from a few KB: verified and streamed a window at a time, never held whole.
    let r = Reader::from_source(chunk_reuse_bomb(8, true)).unwrap();
    let t = r.tensor("w").unwrap().clone();
    let (mut total, mut largest) = (0u64, 0usize);
    r.stream_tensor(&t, |bytes| {
        assert!(bytes.iter().all(|&b| b == 0));
        total += bytes.len() as u64;
        largest = largest.max(bytes.len());
        Ok::<(), tpde_read::ReadError>(())
    })
    .unwrap();
    assert_eq!(total, 512 << 20);
    assert!(largest <= 128 << 20, "a window of {largest} bytes");
    r.verify().unwrap();
    // A wrong digest is still found when streaming.
    let bad = Reader::from_source(chunk_reuse_bomb(2, false)).unwrap();
    assert_eq!(bad.verify().err().unwrap().kind(), ErrorKind::ChecksumMismatch);
}

/// Writes the bombs the Python tests load (`crates/tpde-py/tests/data/`): `TPDE_WRITE_FIXTURES=1
/// cargo test -p tpde-read --test hostile` rewrites them; otherwise the committed ones must be
/// what this code makes.
#[test]
fn python_fixtures_are_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tpde-py/tests/data");
    for (name, copies) in [("bomb-64gib.tpde", 1024), ("bomb-2gib.tpde", 32)] {
        let made = chunk_reuse_bomb(copies, false);
        let path = dir.join(name);
        if std::env::var_os("TPDE_WRITE_FIXTURES").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &made).unwrap();
        }
        assert!(
            std::fs::read(&path).unwrap() == made,
            "{} is stale: TPDE_WRITE_FIXTURES=1 rewrites it",
            path.display()
        );
    }
}

/// A keyframe `base.tpde` and a delta on it whose path hint is `hint`, in `dir`.
fn delta_with_hint(dir: &Path, hint: &str) -> std::path::PathBuf {
    let data: Vec<u8> = (0..256u32).flat_map(|x| (x as f32).to_le_bytes()).collect();
    let mut w = Writer::new(Vec::new(), WriteOptions::default()).unwrap();
    w.add_tensor("w", DType::F32, &[256], &data).unwrap();
    let base = w.finish().unwrap();
    std::fs::write(dir.join("base.tpde"), &base).unwrap();
    let base_reader = Reader::from_source(base).unwrap();
    let next: Vec<u8> = (0..256u32).flat_map(|x| (x as f32 + 0.5).to_le_bytes()).collect();
    let opts = WriteOptions {
        encoder: Encoder::Auto,
        base: Some(BaseRef { digest: base_reader.content_digest(), path_hint: hint.into() }),
        ..WriteOptions::default()
    };
    let mut w = Writer::new(Vec::new(), opts).unwrap();
    w.add_tensor_delta("w", DType::F32, &[256], &next, &base_reader.read("w").unwrap()).unwrap();
    let path = dir.join("delta.tpde");
    std::fs::write(&path, w.finish().unwrap()).unwrap();
    path
}

#[test]
fn path_hints_follow_the_policy() {
    let root = tempfile::tempdir().unwrap();
    let (inside, outside) = (root.path().join("run"), root.path().join("elsewhere"));
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    // A hint that leaves the folder (to a base that is there), and one that stays in it.
    let escaping = delta_with_hint(&outside, "../elsewhere/base.tpde");
    let within = PathHints::within_folder_of(&escaping);
    open_chain_with(&escaping, &PathHints::Follow).unwrap();
    open_chain_with(&escaping, &PathHints::Within(vec![root.path().into()])).unwrap();
    let e = open_chain_with(&escaping, &PathHints::Within(vec![inside.clone()])).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::BaseMissing);
    assert!(e.to_string().contains("../elsewhere/base.tpde") && e.to_string().contains("not followed"), "{e}");
    open_chain_with(&escaping, &within).unwrap();
    let e = open_chain_with(&escaping, &PathHints::Ignore).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::BaseMissing, "{e}");

    // An absolute hint to a file that exists and is no checkpoint: refused without being read,
    // so the error tells nothing of it.
    let probe = delta_with_hint(&inside, "/etc/hostname");
    let e = open_chain_with(&probe, &PathHints::within_folder_of(&probe)).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::BaseMissing, "{e}");
    // A link inside the folder that points out of it leads out of it.
    std::os::unix::fs::symlink(outside.join("base.tpde"), inside.join("link.tpde")).unwrap();
    let linked = delta_with_hint(&inside, "link.tpde");
    assert_eq!(
        open_chain_with(&linked, &PathHints::within_folder_of(&linked)).err().unwrap().kind(),
        ErrorKind::BaseMissing
    );
    open_chain_with(&linked, &PathHints::Follow).unwrap();
}
