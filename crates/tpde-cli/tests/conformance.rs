//! The conformance corpus through the reference reader, and `tpde conformance` as a user runs it.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;
use tpde_cli::conformance;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../conformance")
}

#[test]
fn the_reader_passes_the_corpus() {
    let outcomes = conformance::run(&corpus()).unwrap();
    assert!(outcomes.len() >= 60, "{} files", outcomes.len());
    let failures: Vec<String> =
        outcomes.iter().filter_map(|o| o.failure.as_ref().map(|f| format!("{}: {f}", o.file))).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn the_command_fails_on_a_reader_that_would_not_conform() {
    Command::cargo_bin("tpde")
        .unwrap()
        .args(["conformance", "--quiet"])
        .arg(corpus())
        .assert()
        .success()
        .stdout(contains("0 failed"));

    // A corpus where a valid file turned into an invalid one, an invalid file is accepted,
    // and an unlisted file sits in valid/: each is a failure, and the exit code is 1.
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&corpus(), dir.path());
    std::fs::copy(dir.path().join("invalid/r24-chunk-crc.tpde"), dir.path().join("valid/small-raw.tpde")).unwrap();
    std::fs::copy(dir.path().join("valid/small-zstd.tpde"), dir.path().join("invalid/r03-header-crc.tpde")).unwrap();
    std::fs::write(dir.path().join("valid/stray.tpde"), b"").unwrap();
    Command::cargo_bin("tpde")
        .unwrap()
        .args(["conformance", "--quiet"])
        .arg(dir.path())
        .assert()
        .code(1)
        .stdout(contains("FAIL R24").not())
        .stdout(contains("valid/small-raw.tpde: rejected (checksum-mismatch)"))
        .stdout(contains(
            "invalid/r03-header-crc.tpde: the file breaks R3 (spec §9): accepted; expected checksum-mismatch",
        ))
        .stdout(contains("valid/stray.tpde: not listed in the manifest"))
        .stdout(contains("3 failed"));
}

/// The GPU decoder (on lavapipe in CI) reaches the CPU reader's outcome for every corpus file:
/// the same bytes for valid files, the same category for invalid ones.
#[test]
#[cfg_attr(feature = "skip-gpu-tests", ignore = "built with --features skip-gpu-tests: no GPU adapter")]
fn the_gpu_decoder_passes_the_corpus() {
    let gpu = tpde_gpu::Gpu::new().unwrap_or_else(|e| {
        panic!("{e}: install a Vulkan driver (Debian: mesa-vulkan-drivers), or test with --features skip-gpu-tests")
    });
    let outcomes = conformance::run_on(&corpus(), conformance::Backend::Gpu(&gpu)).unwrap();
    assert!(outcomes.len() >= 160, "{} files", outcomes.len());
    let failures: Vec<String> =
        outcomes.iter().filter_map(|o| o.failure.as_ref().map(|f| format!("{}: {f}", o.file))).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A base given to the reference reader that is not a file, a folder or nothing at all, is a
/// base not found, `base-missing` (spec §7.3); it answered `io` and `not-found`, neither a §9
/// category (issue 59, item 7).
#[test]
fn a_given_base_that_is_not_a_file_is_base_missing() {
    let dir = tempfile::tempdir().unwrap();
    let delta = std::fs::read_dir(corpus().join("valid"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| tpde::read::Reader::open(p).is_ok_and(|r| r.directory().base.is_some()))
        .expect("a valid delta in the corpus");
    for base in [dir.path().to_path_buf(), dir.path().join("nothing.tpde")] {
        let out = Command::cargo_bin("tpde")
            .unwrap()
            .arg("conformance-read")
            .arg(&delta)
            .arg("--base")
            .arg(&base)
            .output()
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["error"], "base-missing", "{base:?}: {json}");
    }
}
