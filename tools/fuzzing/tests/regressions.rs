//! Plain `cargo test` replays what fuzzing found (`fuzz/regressions/<target>/`: inputs of a
//! minimized fuzzing corpus, and any crash input, committed with its fix) and the seeds made
//! from the conformance corpus, through the same bodies libFuzzer runs.

use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn committed_inputs_replay_without_a_crash() {
    let dir = root().join("fuzz/regressions");
    // Every folder is a target's: a misnamed one would be skipped without a word.
    let targets: Vec<&str> = tpde_fuzzing::TARGETS.iter().map(|(t, _)| *t).collect();
    for e in std::fs::read_dir(&dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(
                targets.contains(&name.as_str()),
                "fuzz/regressions/{name}/ is not a fuzz target's name ({targets:?})"
            );
        }
    }
    for (target, run) in tpde_fuzzing::TARGETS {
        let mut replayed = 0;
        for e in std::fs::read_dir(dir.join(target)).unwrap_or_else(|e| panic!("fuzz/regressions/{target}: {e}")) {
            let path = e.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let result = std::panic::catch_unwind(|| run(&bytes));
            assert!(result.is_ok(), "{target} panicked on {}", path.display());
            replayed += 1;
        }
        assert!(replayed > 0, "fuzz/regressions/{target}/ holds no input");
    }
}

#[test]
fn corpus_seeds_pass_every_target_they_seed() {
    let seeds = tpde_fuzzing::seeds(&root().join("conformance")).unwrap();
    assert!(seeds.iter().filter(|(t, _, _)| *t == "codec_decode").count() > 100);
    for (target, name, bytes) in &seeds {
        let run = tpde_fuzzing::TARGETS.iter().find(|(t, _)| t == target).unwrap().1;
        let result = std::panic::catch_unwind(|| run(bytes));
        assert!(result.is_ok(), "{target} panicked on seed {name}");
    }
}

#[test]
fn structured_targets_round_trip_simple_inputs() {
    // Inputs of every length up to a few hundred bytes, as libFuzzer's first ones are.
    for len in 0..400usize {
        let data: Vec<u8> = (0..len).map(|i| (i * 31 + len) as u8).collect();
        tpde_fuzzing::roundtrip::run(&data);
        tpde_fuzzing::delta_roundtrip::run(&data);
    }
}
