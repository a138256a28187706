//! Plain `cargo test` replays what fuzzing found (`fuzz/regressions/<target>/`, minimized
//! crash inputs, committed with their fix) and the seeds made from the conformance corpus,
//! through the same bodies libFuzzer runs.

use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn committed_crash_inputs_no_longer_crash() {
    let mut replayed = 0;
    for (target, run) in tpde_fuzzing::TARGETS {
        let dir = root().join("fuzz/regressions").join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries {
            let path = e.unwrap().path();
            run(&std::fs::read(&path).unwrap());
            replayed += 1;
        }
    }
    println!("replayed {replayed} crash inputs");
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
