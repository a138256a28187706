//! `tpde-make-corpus [DIR]`: writes the conformance corpus into DIR (default `conformance`).
//!
//! The corpus is frozen: a committed file may change only with a reason in the spec's version
//! notes. So a file that already exists with other bytes (or one to delete) is written only if
//! `spec/CHANGES.md` names it; otherwise this refuses and says so. `--check` only reports.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tpde_corpus::{generate, Drift};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let check = args.iter().any(|a| a == "--check");
    let dir = args.iter().find(|a| !a.starts_with("--")).map_or_else(|| PathBuf::from("conformance"), PathBuf::from);
    let corpus = generate();
    if args.iter().any(|a| a == "--spec-table") {
        print!("{}", tpde_corpus::spec_table(&corpus.manifest));
        return ExitCode::SUCCESS;
    }
    let drift = corpus.drift(&dir);
    if drift.is_empty() {
        println!("{}: {} files, up to date", dir.display(), corpus.files.len());
        return ExitCode::SUCCESS;
    }
    for d in &drift {
        println!("{d}");
    }
    if check {
        return ExitCode::FAILURE;
    }
    let notes = std::fs::read_to_string(dir.join("../spec/CHANGES.md")).unwrap_or_default();
    let unexplained: Vec<&Drift> = drift
        .iter()
        .filter(|d| !matches!(d, Drift::Missing(_)) && d.path() != tpde_conformance::MANIFEST)
        .filter(|d| !notes.contains(file_name(d.path())))
        .collect();
    if !unexplained.is_empty() {
        eprintln!(
            "refusing: {} committed file(s) would change or go, and spec/CHANGES.md does not name them. \
             Say why in the version notes (name each file), or fix the writer.",
            unexplained.len()
        );
        return ExitCode::FAILURE;
    }
    for d in &drift {
        let path = dir.join(d.path());
        let result = match d {
            Drift::Extra(_) => std::fs::remove_file(&path),
            _ => write(&path, corpus.entries().find(|(p, _)| *p == d.path()).expect("a generated path").1.as_ref()),
        };
        if let Err(e) = result {
            eprintln!("{}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    println!("{}: wrote {} change(s)", dir.display(), drift.len());
    ExitCode::SUCCESS
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, bytes)
}
