//! The committed corpus is frozen: the generator must still write exactly its bytes. A writer
//! change that alters a corpus file fails here; to accept it, say why in spec/CHANGES.md
//! (naming the files) and run `cargo run -p tpde-corpus -- conformance`, which refuses
//! otherwise.

use std::path::PathBuf;

#[test]
fn the_committed_corpus_is_what_the_generator_writes() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../conformance");
    let drift = tpde_corpus::generate().drift(&dir);
    let listing: Vec<String> = drift.iter().map(ToString::to_string).collect();
    assert!(
        drift.is_empty(),
        "the corpus differs from the generator's output:\n  {}\nIf the change is meant, name the files and say why in \
         spec/CHANGES.md, then run `cargo run -p tpde-corpus -- conformance`.",
        listing.join("\n  ")
    );
}

#[test]
fn the_spec_names_the_files_of_every_rule() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let spec = std::fs::read_to_string(root.join("spec/tpde-v1.md")).unwrap();
    let table = tpde_corpus::spec_table(&tpde_corpus::generate().manifest);
    assert!(
        spec.contains(&table),
        "spec §9.1 must list the corpus files of every rule; replace its table with the output of \
         `cargo run -p tpde-corpus -- --spec-table`"
    );
    // Every rule of §9 has a file, and every file's rule is in §9.
    let rules: Vec<&str> = spec
        .lines()
        .filter(|l| l.starts_with("| R") && l.matches('|').count() == 4)
        .map(|l| l[2..].split_whitespace().next().unwrap())
        .collect();
    assert_eq!(rules.len(), 31, "rules parsed from §9: {rules:?}");
    for rule in &rules {
        assert!(table.contains(&format!("| {rule} |")), "no corpus file breaks {rule}");
    }
    for case in &tpde_corpus::generate().manifest.files {
        assert!(case.rule.starts_with('§') || rules.contains(&case.rule.as_str()), "{}: rule {}", case.file, case.rule);
    }
}

#[test]
fn the_corpus_readme_cannot_go_stale() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("conformance/README.md")).unwrap();
    let version = format!("\"spec_version\": \"{}\"", tpde_corpus::SPEC_VERSION);
    assert!(readme.contains(&version), "conformance/README.md's manifest example must say {version}");
    // Counts belong to the manifest: a number of files in the README would go stale.
    let words: Vec<&str> = readme.split_whitespace().collect();
    for w in words.windows(3) {
        let counted = w[0].trim_matches(|c: char| !c.is_ascii_digit()).parse::<u32>().is_ok()
            && ((w[1].starts_with("valid") || w[1].starts_with("invalid")) && w[2].starts_with("file")
                || w[1].starts_with("files"));
        assert!(!counted, "conformance/README.md counts files ({}); point to the manifest instead", w.join(" "));
    }
}
