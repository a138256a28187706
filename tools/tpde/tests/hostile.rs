//! The command line on hostile files: a tensor declared far larger than the file (the
//! chunk-reuse bombs of `crates/tpde-py/tests/data/`), streamed in bounded memory or refused,
//! never an abort; and a base hint that is a URL, not followed unless the user opted in.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::PredicateBooleanExt;
use tpde_tools::demo;

fn tpde() -> Command {
    Command::cargo_bin("tpde").unwrap()
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates/tpde-py/tests/data").join(name)
}

/// `tpde ARGS` with its address space limited to `kib` KiB: a command that tried to hold a
/// 2 GiB tensor whole could not.
fn tpde_within(kib: u64, args: &[&str]) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c").arg(format!("ulimit -v {kib} && exec \"$0\" \"$@\"")).arg(assert_cmd::cargo::cargo_bin("tpde"));
    c.args(args);
    c
}

#[test]
fn a_64_gib_tensor_is_refused_with_an_error() {
    let bomb = fixture("bomb-64gib.tpde");
    for cmd in [vec!["cat", bomb.to_str().unwrap(), "w"], vec!["verify", bomb.to_str().unwrap()]] {
        tpde().args(&cmd).assert().code(1).stderr(predicates::str::contains("over the reader's limit of 17179869184"));
    }
    // A lower cap is the caller's.
    let small = fixture("bomb-2gib.tpde");
    tpde()
        .args(["cat", small.to_str().unwrap(), "w", "--max-bytes", "1000000"])
        .assert()
        .code(1)
        .stderr(predicates::str::contains("over the reader's limit of 1000000"));
}

#[test]
fn a_2_gib_tensor_streams_in_bounded_memory() {
    let bomb = fixture("bomb-2gib.tpde");
    let bomb = bomb.to_str().unwrap();
    let out = tpde_within(1_500_000, &["cat", bomb, "w"]).assert().success().get_output().stdout.clone();
    assert_eq!(out.len(), 2 << 30);
    assert!(out.iter().all(|&b| b == 0));
    drop(out);
    // Its recorded digest is not the zeros': verify decodes it all, in bounded memory, and finds that.
    tpde_within(1_500_000, &["verify", bomb])
        .assert()
        .code(1)
        .stderr(predicates::str::contains("checksum-mismatch").or(predicates::str::contains("tensor digest")));
}

#[test]
fn a_url_hint_is_not_followed_without_object_storage_configured() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.safetensors"), dir.path().join("b.safetensors"));
    let model = demo::DemoModel { vocab: 64, d_model: 16, d_ff: 48, layers: 1 };
    demo::write_checkpoint(model, 5, 1, &a).unwrap();
    demo::write_checkpoint(model, 6, 1, &b).unwrap();
    let (ka, kb) = (dir.path().join("a.tpde"), dir.path().join("b.tpde"));
    tpde().arg("pack").arg(&a).arg("-o").arg(&ka).assert().success();
    tpde().arg("pack").arg(&b).arg("--base").arg(&ka).arg("-o").arg(&kb).assert().success();
    // The delta's hint rewritten to a URL, as a hostile file would have it.
    let file = std::fs::read(&kb).unwrap();
    let file = tpde_format::surgery::with_directory(&file, |d| {
        d.base.as_mut().unwrap().path_hint = "s3://some-bucket/a.tpde".into();
    })
    .unwrap();
    std::fs::write(&kb, file).unwrap();
    let mut cmd = tpde();
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            cmd.env_remove(k);
        }
    }
    cmd.arg("verify")
        .arg(&kb)
        .assert()
        .code(1)
        .stderr(predicates::str::contains("\"s3://some-bucket/a.tpde\" not followed"))
        .stderr(predicates::str::contains("object storage is not configured"));
    // The base given explicitly still works.
    tpde().arg("verify").arg(&kb).arg("--base").arg(&ka).assert().success();
}
