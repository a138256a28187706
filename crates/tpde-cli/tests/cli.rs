//! The command line end to end: round trips through safetensors, exit codes, JSON schema,
//! error messages, and that a failed write leaves nothing under the final name.

use assert_cmd::Command;
use std::path::Path;
use tpde_cli::{demo, verify};

fn tpde() -> Command {
    Command::cargo_bin("tpde").unwrap()
}

fn inspect() -> Command {
    Command::cargo_bin("tpde-inspect").unwrap()
}

fn small_model(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("m.safetensors");
    demo::write_checkpoint(demo::DemoModel { vocab: 64, d_model: 16, d_ff: 48, layers: 2 }, 5, 1, &p).unwrap();
    p
}

#[test]
fn pack_unpack_round_trip_with_both_codecs() {
    let dir = tempfile::tempdir().unwrap();
    let src = small_model(dir.path());
    for codec in ["raw", "zstd"] {
        let packed = dir.path().join(format!("m.{codec}.tpde"));
        let back = dir.path().join(format!("m.{codec}.safetensors"));
        tpde()
            .args(["pack", "--codec", codec, "--chunk-size", "1024"])
            .arg(&src)
            .arg("-o")
            .arg(&packed)
            .assert()
            .success();
        tpde().arg("verify").arg(&packed).assert().success().stdout(predicates::str::contains("ok: "));
        tpde().arg("unpack").arg(&packed).arg("-o").arg(&back).assert().success();
        assert_eq!(verify::compare_safetensors(&src, &back).unwrap(), None, "{codec} round trip");
    }
    // The same bytes whether the tensors were borrowed from the file (raw) or decoded (zstd),
    // metadata included: the unpacked header does not depend on a hash map's order.
    let (raw, zstd) = (dir.path().join("m.raw.safetensors"), dir.path().join("m.zstd.safetensors"));
    assert_eq!(std::fs::read(raw).unwrap(), std::fs::read(zstd).unwrap());
}

#[test]
fn cat_prints_one_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let src = small_model(dir.path());
    let packed = dir.path().join("m.tpde");
    tpde().arg("pack").arg(&src).arg("-o").arg(&packed).assert().success();
    let out = tpde().arg("cat").arg(&packed).arg("optimizer.step").assert().success().get_output().stdout.clone();
    assert_eq!(out, 5i64.to_le_bytes());
    tpde()
        .arg("cat")
        .arg(&packed)
        .arg("nope")
        .assert()
        .code(1)
        .stderr(predicates::str::contains("no tensor named \"nope\""));
}

#[test]
fn inspect_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let src = small_model(dir.path());
    let packed = dir.path().join("m.tpde");
    tpde().arg("pack").arg(&src).arg("-o").arg(&packed).assert().success();
    let text = inspect().arg(&packed).assert().success().get_output().stdout.clone();
    let text = String::from_utf8(text).unwrap();
    for needle in [
        "TPDE 1.11",
        "model.embed_tokens.weight",
        "bf16",
        "[64, 16]",
        "planes-context",
        "tpde.source_format",
        "none (keyframe)",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
    let json = inspect().arg(&packed).args(["--json", "--chunks"]).assert().success().get_output().stdout.clone();
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(v["schema"], "tpde-inspect/1");
    assert_eq!(v["format_version"]["major"], 1);
    assert_eq!(v["base"], serde_json::Value::Null);
    let tensors = v["tensors"].as_array().unwrap();
    assert_eq!(tensors.len() as u64, v["tensor_count"].as_u64().unwrap());
    let t = tensors.iter().find(|t| t["name"] == "model.embed_tokens.weight").unwrap();
    assert_eq!(t["dtype"], "bf16");
    assert_eq!(t["shape"], serde_json::json!([64, 16]));
    assert_eq!(t["chunks"].as_array().unwrap().len() as u64, t["chunk_count"].as_u64().unwrap());
    let meta = v["metadata"].as_array().unwrap();
    assert!(meta.iter().any(|m| m["key"] == "step" && m["value"] == "5" && m["type"] == "string"));
}

#[test]
fn exit_codes_and_messages() {
    let dir = tempfile::tempdir().unwrap();
    let src = small_model(dir.path());
    let packed = dir.path().join("m.tpde");
    tpde().arg("pack").arg(&src).arg("-o").arg(&packed).assert().success();

    // Usage errors exit 2.
    inspect().assert().code(2);
    tpde().args(["pack", "--codec", "lz77"]).arg(&src).arg("-o").arg(&packed).assert().code(2);
    tpde().args(["frobnicate"]).assert().code(2);
    // A torch.save output, or a framework's checkpoint folder, is the Python package's to write.
    let said = "the `tpde` command of the Python package";
    let ckpt = dir.path().join("last.ckpt");
    tpde().arg("unpack").arg(&packed).arg("-o").arg(&ckpt).assert().code(2).stderr(predicates::str::contains(said));
    let folder = dir.path().join("checkpoint-3");
    std::fs::create_dir(&folder).unwrap();
    std::fs::copy(&packed, folder.join("checkpoint.tpde")).unwrap();
    let out = dir.path().join("out");
    tpde().arg("unpack").arg(&folder).arg("-o").arg(&out).assert().code(2).stderr(predicates::str::contains(said));
    assert!(!out.exists() && !ckpt.exists());

    // Not a TPDE file: exit 1, and the message names the magic found.
    inspect().arg(&src).assert().code(1).stderr(predicates::str::contains("not a TPDE file"));
    let json = inspect().arg(&src).arg("--json").assert().code(1).get_output().stdout.clone();
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(v["error"]["kind"], "not-tpde");

    // Unsupported version: the message names the version found.
    let mut bytes = std::fs::read(&packed).unwrap();
    bytes[8] = 3;
    let crc = crc32fast_hash(&bytes[..60]);
    bytes[60..64].copy_from_slice(&crc.to_le_bytes());
    let v3 = dir.path().join("v3.tpde");
    std::fs::write(&v3, &bytes).unwrap();
    let said = inspect()
        .arg(&v3)
        .assert()
        .code(1)
        .stderr(predicates::str::contains("version 3.11"))
        .get_output()
        .stderr
        .clone();
    let said = String::from_utf8(said).unwrap();
    assert_eq!(said.matches("v3.tpde").count(), 1, "the file named once: {said}");

    // A corrupted chunk: open succeeds, verify fails with exit 1 and says where.
    let mut bytes = std::fs::read(&packed).unwrap();
    let at = tpde::read::Reader::open(&packed).unwrap().tensor("lm_head.weight").unwrap().chunks[0].offset as usize;
    bytes[at + 10] ^= 0x40;
    let bad = dir.path().join("bad.tpde");
    std::fs::write(&bad, &bytes).unwrap();
    inspect().arg(&bad).assert().success();
    tpde().arg("verify").arg(&bad).assert().code(1).stderr(predicates::str::contains("checksum mismatch"));

    // Truncated: exit 1.
    let bytes = std::fs::read(&packed).unwrap();
    let cut = dir.path().join("cut.tpde");
    std::fs::write(&cut, &bytes[..bytes.len() - 10]).unwrap();
    tpde().arg("verify").arg(&cut).assert().code(1).stderr(predicates::str::contains("truncated"));
}

#[test]
fn a_failed_pack_leaves_nothing_under_the_final_name() {
    let dir = tempfile::tempdir().unwrap();
    let bad_input = dir.path().join("broken.safetensors");
    std::fs::write(&bad_input, b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":{\"dtype\":\"F32\",").unwrap();
    let out = dir.path().join("out.tpde");
    tpde().arg("pack").arg(&bad_input).arg("-o").arg(&out).assert().code(1);
    assert!(!out.exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 1, "only the input remains: {leftovers:?}");
}

#[test]
fn file_writer_is_atomic() {
    use tpde::write::{FileWriter, WriteOptions};
    use tpde_format::DType;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.tpde");
    {
        let mut w = FileWriter::create(&path, WriteOptions::default()).unwrap();
        w.add_tensor("t", DType::U8, &[3], &[1, 2, 3]).unwrap();
        // Dropped without finish(): as if the process had failed mid-write.
    }
    assert!(!path.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the temporary file is removed");
    let mut w = FileWriter::create(&path, WriteOptions::default()).unwrap();
    w.add_tensor("t", DType::U8, &[3], &[1, 2, 3]).unwrap();
    w.finish().unwrap();
    assert_eq!(&*tpde::read::Reader::open(&path).unwrap().read("t").unwrap(), &[1, 2, 3]);
}

#[test]
fn demo_runs_and_round_trips() {
    tpde().arg("demo").assert().success().stdout(predicates::str::contains("bit-exact"));
}

fn crc32fast_hash(b: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(b);
    h.finalize()
}

fn model(dir: &Path, name: &str, step: u64, seed: u64) -> std::path::PathBuf {
    let p = dir.join(name);
    demo::write_checkpoint(demo::DemoModel { vocab: 64, d_model: 16, d_ff: 48, layers: 2 }, step, seed, &p).unwrap();
    p
}

#[test]
fn deltas_through_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = model(d, "a.safetensors", 5, 1);
    let b = model(d, "b.safetensors", 6, 1);
    let other = model(d, "other.safetensors", 6, 2);
    tpde().arg("pack").arg(&a).arg("-o").arg(d.join("a.tpde")).assert().success();
    tpde()
        .arg("pack")
        .arg(&b)
        .args(["--base", "a.tpde", "-o", "b.tpde"])
        .current_dir(d)
        .assert()
        .success()
        .stderr(predicates::str::contains("as deltas"));
    tpde().arg("inspect").arg(d.join("b.tpde")).assert().success().stdout(predicates::str::contains("a.tpde"));
    // The base is found through the hint, or given as the .tpde or as the .safetensors.
    for base in [None, Some("a.tpde"), Some("a.safetensors")] {
        let mut cmd = tpde();
        cmd.args(["unpack", "b.tpde", "-o", "b.back.safetensors"]).current_dir(d);
        if let Some(base) = base {
            cmd.args(["--base", base]);
        }
        cmd.assert().success();
        assert_eq!(verify::compare_safetensors(&b, &d.join("b.back.safetensors")).unwrap(), None, "{base:?}");
    }
    tpde().args(["verify", "b.tpde", "--against", "b.safetensors"]).current_dir(d).assert().success();
    // A wrong base: exit 1, both digests named.
    tpde()
        .args(["unpack", "b.tpde", "--base", "other.safetensors", "-o", "x.safetensors"])
        .current_dir(d)
        .assert()
        .code(1)
        .stderr(predicates::str::is_match("wrong base: .*digest [0-9a-f]{64}, this base has [0-9a-f]{64}").unwrap());
    assert!(!d.join("x.safetensors").exists());
    // Without the base file the error names the digest and the hint.
    std::fs::rename(d.join("a.tpde"), d.join("moved.tpde")).unwrap();
    tpde()
        .args(["unpack", "b.tpde", "-o", "x.safetensors"])
        .current_dir(d)
        .assert()
        .code(1)
        .stderr(predicates::str::contains("needs its base"));
    // Lossless verification against a different checkpoint fails.
    tpde()
        .args(["verify", "b.tpde", "--base", "moved.tpde", "--against", "other.safetensors"])
        .current_dir(d)
        .assert()
        .code(1);
    let _ = other;
}

#[test]
fn lossy_deltas_are_bounded_recorded_and_checked() {
    // Real training checkpoints (the demo's TinyModel, AdamW), 10 steps apart: small changes.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("train")).unwrap();
    let ckpts = demo::train_checkpoints(&d.join("train"), 64, 40, 10, 3).unwrap();
    let (a, b) = (&ckpts[0].2, &ckpts[1].2);
    let tau = "0.0001";
    tpde().arg("pack").arg(b).args(["--max-abs-error", tau, "-o"]).arg(d.join("x.tpde")).assert().code(2);
    tpde()
        .arg("pack")
        .arg(b)
        .arg("--base")
        .arg(a)
        .args(["--max-abs-error", tau, "-o"])
        .arg(d.join("b.tpde"))
        .assert()
        .success();
    tpde()
        .arg("inspect")
        .arg(d.join("b.tpde"))
        .assert()
        .success()
        .stdout(predicates::str::contains("tpde.max_abs_error"));
    // Within the bound of its own original, and something was dropped (the error is not 0).
    let out = tpde()
        .arg("verify")
        .arg(d.join("b.tpde"))
        .arg("--against")
        .arg(b)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let out = String::from_utf8(out).unwrap();
    assert!(out.contains("within the recorded bound 1e-4"), "{out}");
    let max: f64 = out.rsplit("max abs error ").next().unwrap().trim().parse().unwrap();
    assert!(max > 0.0 && max <= 1e-4, "{out}");
    // Against the base, the integers (the step counter) differ: reported as such.
    tpde()
        .arg("verify")
        .arg(d.join("b.tpde"))
        .arg("--against")
        .arg(a)
        .assert()
        .code(1)
        .stderr(predicates::str::contains("a lossy file keeps every integer exactly"));
    // Against a checkpoint with the same integers and floats moved past the bound: the float
    // check fails, naming the bound.
    let moved = d.join("moved.safetensors");
    first_f32_moved(b, &moved, |x| x + 1e-3);
    tpde()
        .arg("verify")
        .arg(d.join("b.tpde"))
        .arg("--against")
        .arg(&moved)
        .assert()
        .code(1)
        .stderr(predicates::str::contains("over the bound 0.0001"));
    // A lossy chain: every delta snapped against its base as it decodes (closed loop), so each
    // file is within the bound of its own original, however long the chain.
    tpde()
        .arg("pack-series")
        .arg(d.join("train"))
        .args(["--keyframe-every", "10", "--max-abs-error", tau, "-o"])
        .arg(d.join("chain"))
        .assert()
        .success();
    assert!(ckpts.len() >= 4);
    for (k, (_, _, original, _)) in ckpts.iter().enumerate() {
        let packed = d.join("chain").join(original.file_name().unwrap()).with_extension("tpde");
        let out = tpde()
            .arg("verify")
            .arg(&packed)
            .arg("--against")
            .arg(original)
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let out = String::from_utf8(out).unwrap();
        match k {
            0 => assert!(out.contains("bit-exact against"), "the keyframe is lossless: {out}"),
            _ => assert!(out.contains("within the recorded bound 1e-4"), "step {k}: {out}"),
        }
    }
}

#[test]
fn pack_series_chains_with_keyframes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ckpts = d.join("ckpts");
    std::fs::create_dir(&ckpts).unwrap();
    for step in 0..5 {
        model(&ckpts, &format!("step{step}.safetensors"), step, 1);
    }
    let out = tpde()
        .args(["pack-series", "ckpts", "-o", "packed", "--keyframe-every", "3"])
        .current_dir(d)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let out = String::from_utf8(out).unwrap();
    assert_eq!(out.matches("(keyframe)").count(), 2, "{out}");
    assert_eq!(out.matches("(delta)").count(), 3, "{out}");
    for step in 0..5 {
        let back = d.join(format!("back{step}.safetensors"));
        tpde().arg("unpack").arg(d.join(format!("packed/step{step}.tpde"))).arg("-o").arg(&back).assert().success();
        let orig = ckpts.join(format!("step{step}.safetensors"));
        assert_eq!(verify::compare_safetensors(&orig, &back).unwrap(), None, "step {step}");
    }
    // A folder's chains at once (issue 58): whole, then with a base deleted by hand.
    let verify = |code: i32| {
        let out = tpde().args(["verify", "packed"]).current_dir(d).assert().code(code).get_output().clone();
        (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
    };
    let (out, _) = verify(0);
    assert!(out.contains("ok      step1.tpde  (needs step0.tpde;") && out.contains("ok: 5 files"), "{out}");
    // Which file needs which, from the directories alone: what deleting one costs.
    let inspect = || {
        let out = tpde().args(["inspect", "packed"]).current_dir(d).assert().success().get_output().stdout.clone();
        String::from_utf8(out).unwrap()
    };
    let out = inspect();
    assert!(out.contains("step0.tpde  keyframe; needed by 2: step1.tpde, step2.tpde\n"), "{out}");
    assert!(out.contains("step2.tpde  needs step1.tpde; needed by none\n"), "{out}");
    assert!(
        out.contains("step4.tpde  needs step3.tpde; needed by none") && out.contains("5 files, 2 keyframes"),
        "{out}"
    );
    std::fs::remove_file(d.join("packed/step3.tpde")).unwrap();
    assert!(inspect().contains("step4.tpde  needs \"step3.tpde\", which is not a TPDE file of this folder"));
    let (out, err) = verify(1);
    assert!(out.contains("FAILED  step4.tpde  (needs step3.tpde): base-missing"), "{out}");
    assert!(out.contains("ok      step2.tpde"), "{out}");
    assert!(err.contains("packed: 1 of 4 files do not load"), "{err}");
    // A damaged delta in the middle of a chain: it and the file after it fail (each file is
    // checked once, against its base held decoded, which a damaged file never is).
    let step1 = d.join("packed/step1.tpde");
    let mut bytes = std::fs::read(&step1).unwrap();
    let middle = bytes.len() / 2; // inside a chunk's stored bytes
    bytes[middle] ^= 0x40;
    std::fs::write(&step1, bytes).unwrap();
    let (out, err) = verify(1);
    assert!(out.contains("ok      step0.tpde") && out.contains("FAILED  step1.tpde"), "{out}");
    assert!(out.contains("FAILED  step2.tpde  (needs step1.tpde)"), "{out}");
    assert!(err.contains("packed: 3 of 4 files do not load"), "{err}");
    // A subfolder that cannot be read is a failed check of its own, not the end of the command
    // (as root, which reads it anyway, there is nothing to see).
    let locked = d.join("packed/locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    if std::fs::read_dir(&locked).is_err() {
        let (out, _) = verify(1);
        assert!(out.contains("FAILED  locked") && out.contains("ok      step0.tpde"), "{out}");
        assert!(inspect().contains("locked  unreadable"));
    }
    std::fs::set_permissions(&locked, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

#[test]
#[cfg_attr(feature = "skip-gpu-tests", ignore = "built with --features skip-gpu-tests: no GPU adapter")]
fn gpu_profile_and_gpu_unpack() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = model(d, "a.safetensors", 5, 1);
    let b = model(d, "b.safetensors", 6, 1);
    model(d, "other.safetensors", 6, 2);
    tpde()
        .args(["pack", "--profile", "gpu", "--chunk-size", "4096"])
        .arg(&a)
        .arg("-o")
        .arg(d.join("a.tpde"))
        .assert()
        .success();
    tpde()
        .args(["pack", "--profile", "gpu", "--chunk-size", "4096", "--base", "a.tpde", "-o", "b.tpde"])
        .arg(&b)
        .current_dir(d)
        .assert()
        .success();
    // Only codecs a GPU decodes in parallel.
    for f in ["a.tpde", "b.tpde"] {
        let out = inspect().args(["--json", "--chunks"]).arg(d.join(f)).assert().success().get_output().stdout.clone();
        let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let text = json.to_string();
        for tag in tpde_format::CodecTag::ALL.into_iter().filter(|t| !t.gpu_parallel()) {
            assert!(!text.contains(&format!("\"{}\"", tag.name())), "{f} uses {tag}");
        }
        assert!(text.contains("-lanes\"") || text.contains("\"planes-context\""), "{f}: {text}");
    }
    // Decoded on the GPU: the base through the hint, as a .tpde, or as the .safetensors.
    for base in [None, Some("a.tpde"), Some("a.safetensors")] {
        let mut cmd = tpde();
        cmd.args(["unpack", "--gpu", "b.tpde", "-o", "b.gpu.safetensors"]).current_dir(d);
        if let Some(base) = base {
            cmd.args(["--base", base]);
        }
        cmd.assert().success();
        assert_eq!(verify::compare_safetensors(&b, &d.join("b.gpu.safetensors")).unwrap(), None, "{base:?}");
    }
    // A CPU-profile file decodes on the GPU too (zstd and serial rANS on the CPU, finished there).
    tpde().args(["pack", "--codec", "zstd"]).arg(&a).arg("-o").arg(d.join("a.zstd.tpde")).assert().success();
    tpde().args(["unpack", "--gpu", "a.zstd.tpde", "-o", "a.gpu.safetensors"]).current_dir(d).assert().success();
    assert_eq!(verify::compare_safetensors(&a, &d.join("a.gpu.safetensors")).unwrap(), None);
    tpde()
        .args(["unpack", "--gpu", "b.tpde", "--base", "other.safetensors", "-o", "x.safetensors"])
        .current_dir(d)
        .assert()
        .code(1)
        .stderr(predicates::str::contains("wrong base"));
    assert!(!d.join("x.safetensors").exists());
    tpde()
        .args(["pack", "--profile", "gpu", "--codec", "zstd"])
        .arg(&a)
        .arg("-o")
        .arg(d.join("z.tpde"))
        .assert()
        .code(2)
        .stderr(predicates::str::contains("--profile gpu writes only"));
}

#[test]
fn auto_writes_lane_forms_and_auto_serial_the_1_1_codecs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = model(d, "a.safetensors", 5, 1);
    let b = model(d, "b.safetensors", 6, 1);
    let codecs = |f: &str| {
        let out = inspect().args(["--json", "--chunks"]).arg(d.join(f)).assert().success().get_output().stdout.clone();
        serde_json::from_slice::<serde_json::Value>(&out).unwrap().to_string()
    };
    for (codec, lanes) in [(None, true), (Some("auto-serial"), false)] {
        let suffix = codec.unwrap_or("auto");
        let (key, delta) = (format!("a.{suffix}.tpde"), format!("b.{suffix}.tpde"));
        let pack = |input: &Path, output: &str, base: Option<&str>| {
            let mut cmd = tpde();
            cmd.args(["pack", "--chunk-size", "4096"]).arg(input).args(["-o", output]).current_dir(d);
            if let Some(codec) = codec {
                cmd.args(["--codec", codec]);
            }
            if let Some(base) = base {
                cmd.args(["--base", base]);
            }
            cmd.assert().success();
        };
        pack(&a, &key, None);
        pack(&b, &delta, Some(&key));
        for f in [&key, &delta] {
            let text = codecs(f);
            // `auto` writes only lane tags; `auto-serial` only the 1.1 codecs.
            for tag in tpde_format::CodecTag::ALL.into_iter().filter(|t| t.name() != "raw") {
                if text.contains(&format!("\"{}\"", tag.name())) {
                    assert_eq!(tag.lanes(), lanes, "{f} uses {tag}");
                }
            }
            let lane_tags = text.contains("-lanes\"") || text.contains("\"planes-context\"");
            assert_eq!(lane_tags, lanes, "{f}: {text}");
        }
        tpde().args(["unpack", &delta, "--base", &key, "-o", "b.out.safetensors"]).current_dir(d).assert().success();
        assert_eq!(verify::compare_safetensors(&b, &d.join("b.out.safetensors")).unwrap(), None, "{suffix}");
    }
}

#[test]
fn sharded_folders_pack_to_one_file_and_unpack_to_the_same_folder() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (a, b) = (tpde_testkit::folder::sharded(d, 1.0), tpde_testkit::folder::sharded(d, 1.001));
    tpde().arg("pack").arg(&a).arg("-o").arg(d.join("a.tpde")).assert().success();
    tpde().arg("pack").arg(&b).arg("--base").arg(d.join("a.tpde")).arg("-o").arg(d.join("b.tpde")).assert().success();
    tpde().arg("unpack").arg(d.join("b.tpde")).arg("-o").arg(d.join("out")).assert().success();
    for shard in ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"] {
        assert_eq!(verify::compare_safetensors(&b.join(shard), &d.join("out").join(shard)).unwrap(), None, "{shard}");
    }
    let index = |p: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p.join("model.safetensors.index.json")).unwrap()).unwrap()
    };
    assert_eq!(index(&b), index(&d.join("out")));
    // Every tensor in one file, when the output is a .safetensors.
    tpde().arg("unpack").arg(d.join("b.tpde")).arg("-o").arg(d.join("all.safetensors")).assert().success();
    // The GPU path writes one file only: a folder output is a usage error (exit 2).
    tpde().args(["unpack", "--gpu"]).arg(d.join("b.tpde")).arg("-o").arg(d.join("gpu-out")).assert().code(2);
    // A folder without an index is not a sharded checkpoint.
    std::fs::remove_file(a.join("model.safetensors.index.json")).unwrap();
    tpde()
        .arg("pack")
        .arg(&a)
        .arg("-o")
        .arg(d.join("x.tpde"))
        .assert()
        .code(2)
        .stderr(predicates::str::contains("index.json"));
}

/// `pack --help` names every codec of the registry, and says what `auto` writes for a keyframe
/// and for a delta: the codecs a real pack with `auto` chose.
#[test]
fn the_codec_help_matches_the_registry_and_what_auto_writes() {
    let help = tpde().args(["pack", "--help"]).assert().success().get_output().stdout.clone();
    let help = String::from_utf8(help).unwrap().split_whitespace().collect::<Vec<_>>().join(" ");
    // delta-predicted needs an optimizer's prediction, which only the Python Checkpointer gives.
    for tag in tpde_format::CodecTag::ALL.into_iter().filter(|&t| t != tpde_format::CodecTag::DeltaPredicted) {
        assert!(help.contains(tag.name()), "pack --help does not name codec {}", tag.name());
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    model(d, "a.safetensors", 5, 1);
    model(d, "b.safetensors", 6, 1);
    tpde().args(["pack", "a.safetensors", "-o", "a.tpde"]).current_dir(d).assert().success();
    tpde().args(["pack", "b.safetensors", "--base", "a.tpde", "-o", "b.tpde"]).current_dir(d).assert().success();
    // The codec of most stored bytes in each file.
    let main_codec = |file: &str| {
        let r = tpde::read::Reader::open(d.join(file)).unwrap();
        let mut bytes = std::collections::HashMap::<tpde_format::CodecTag, u64>::new();
        for c in r.tensors().iter().flat_map(|t| &t.chunks) {
            *bytes.entry(c.codec).or_default() += c.stored_length;
        }
        bytes.into_iter().max_by_key(|&(_, b)| b).unwrap().0
    };
    let keyframe = main_codec("a.tpde");
    assert!(help.contains(&format!("{} for a keyframe", keyframe.name())), "auto writes {keyframe} keyframes: {help}");
    let delta = main_codec("b.tpde");
    let against = help.split("against a base").nth(1).unwrap();
    assert!(against.split("auto-serial").next().unwrap().contains(delta.name()), "auto writes {delta} deltas: {help}");
}

/// `tpde bench` runs end to end on a small checkpoint and two later steps of it: every row is
/// there with a positive speed (no timing is asserted), like compared with like, deltas are
/// smaller than their keyframe, and it leaves nothing behind.
#[test]
fn bench_smoke() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let steps: Vec<_> = (5..8)
        .map(|step| {
            let p = d.join(format!("m{step}.safetensors"));
            demo::write_checkpoint(demo::DemoModel { vocab: 64, d_model: 16, d_ff: 48, layers: 2 }, step, 1, &p)
                .unwrap();
            p
        })
        .collect();
    // No ZipNN here, whatever the machine has: its rows are optional.
    let out = bench(d, &steps, d.join("no-python").as_os_str());
    let row = |row: &str| -> (f64, f64) {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("| {row}")))
            .unwrap_or_else(|| panic!("no row {row:?}:\n{out}"));
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let mb_s: f64 = cells[3].parse().unwrap();
        assert!(mb_s > 0.0, "{line}");
        (cells[2].parse().unwrap_or(f64::NAN), mb_s)
    };
    for r in [
        "tpde pack --codec auto",
        "tpde unpack (auto file)",
        "tpde read all tensors (auto file, CRC on, in memory)",
        "tpde read all tensors (auto file, CRC on, into existing buffers",
        "restore keyframe (read all",
        "restore keyframe + 1 delta (",
        "restore keyframe + 2 deltas (",
        "zstd decode (library, whole file, in memory: compare with tpde read all)",
        "safetensors load",
    ] {
        row(r);
    }
    let (keyframe, _) = row("tpde pack --codec auto");
    let (delta, _) = row("tpde pack delta (auto");
    assert!(delta < keyframe, "a delta of a step later is smaller than a keyframe: {delta} vs {keyframe}\n{out}");
    // One-thread and all-core rows of the TPDE operations.
    assert!(out.contains("| tpde read all tensors (auto file, CRC on, in memory) | 1 |"), "{out}");
    assert!(out.contains("| restore keyframe + 2 deltas ("), "{out}");
    // Each link's own speed, or "-" where noise put it at or below zero.
    let link = out.lines().find(|l| l.starts_with("| restore keyframe + 1 delta (")).expect("the row");
    let adds = link.split("the last delta adds ").nth(1).expect("the delta's own speed");
    assert!(adds.starts_with('-') || adds.split(' ').next().unwrap().parse::<f64>().unwrap() > 0.0, "{link}");
    assert!(!out.contains("ZipNN"), "{out}");
    // The header names the rANS loop the CPU runs, which changes decode speed about twofold.
    let header = out.lines().next().unwrap();
    assert!(
        ["AVX-512)", "AVX2)", "scalar)"].iter().any(|l| header.ends_with(&format!("rANS lanes decoded with {l}"))),
        "{header}"
    );
}

/// Runs `tpde bench --runs 1` on `inputs` in a fresh folder under `d`, with `python` as
/// `TPDE_BENCH_PYTHON` and `d` on its PYTHONPATH; returns what it printed, once it has checked
/// that the bench left nothing in its folder.
fn bench(d: &Path, inputs: &[std::path::PathBuf], python: &std::ffi::OsStr) -> String {
    let work = d.join("work");
    std::fs::create_dir(&work).unwrap();
    let out = tpde()
        .arg("bench")
        .args(inputs)
        .args(["--runs", "1", "--dir"])
        .arg(&work)
        .env("TPDE_BENCH_PYTHON", python)
        .env("PYTHONPATH", d)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0, "bench left files in its folder");
    String::from_utf8(out).unwrap()
}

/// `tpde bench`'s ZipNN rows read the checkpoint's tensors from the file's layout themselves, so
/// a bf16 checkpoint (which numpy cannot hold without ml_dtypes) is compared too. Here against
/// a stand-in `zipnn` module on PYTHONPATH that stores the bytes as they are and checks how it is
/// called: ratio 1, round trip exact.
#[test]
fn bench_runs_zipnn_on_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("zipnn.py"),
        "class ZipNN:\n\
         \x20   def __init__(self, input_format, bytearray_dtype, threads):\n\
         \x20       assert input_format == 'byte' and bytearray_dtype == 'bfloat16', bytearray_dtype\n\
         \x20   def compress(self, b):\n\
         \x20       return bytes(b)\n\
         \x20   def decompress(self, c):\n\
         \x20       return bytes(c)\n",
    )
    .unwrap();
    let bf16: Vec<u8> =
        (0..64 * 64).map(|i| ((i as f32 * 0.01).sin().to_bits() >> 16) as u16).flat_map(u16::to_le_bytes).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![64, 64], &bf16).unwrap();
    let input = d.join("m.safetensors");
    safetensors::tensor::serialize_to_file([("w", view)], None, &input).unwrap();
    let out = bench(d, &[input], "python3".as_ref());
    assert!(out.contains("| ZipNN compress (per tensor, in memory) | 1 | 1.000 |"), "{out}");
    assert!(out.contains("| ZipNN decompress (per tensor, in memory) | 1 | - |"), "{out}");
}

/// `--max-rel-error` (format 1.5): a change of at most ρ·|x| is dropped, whatever the tensor's
/// scale; the file records ρ and says 1.5; `verify --against` checks every element against
/// ρ·|x| of its original, and fails on one moved past it.
#[test]
fn relative_bounds_are_recorded_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("train")).unwrap();
    let ckpts = demo::train_checkpoints(&d.join("train"), 64, 40, 10, 3).unwrap();
    let (a, b) = (&ckpts[0].2, &ckpts[1].2);
    let packed = d.join("b.tpde");
    tpde()
        .arg("pack")
        .arg(b)
        .arg("--base")
        .arg(a)
        .args(["--max-rel-error", "0.01", "-o"])
        .arg(&packed)
        .assert()
        .success();
    let r = tpde::read::Reader::open(&packed).unwrap();
    // 1.5 for the relative bound; `auto` writes 1.10's block records and, with a base, may
    // write 1.11's base-context block records (and 1.8's sparse plane records).
    assert_eq!(r.header().minor_version, 11);
    assert_eq!(r.metadata("tpde.max_rel_error"), Some(&tpde_format::MetadataValue::F64(0.01)));
    assert_eq!(r.metadata("tpde.max_abs_error"), None);
    let out = tpde().arg("verify").arg(&packed).arg("--against").arg(b).assert().success().get_output().stdout.clone();
    let out = String::from_utf8(out).unwrap();
    assert!(out.contains("within the recorded bound 1e-2·|x|"), "{out}");
    let max: f64 = out.rsplit("max abs error ").next().unwrap().trim().parse().unwrap();
    assert!(max > 0.0, "something was dropped: {out}");
    // Smaller than the lossless delta.
    let lossless = d.join("b-lossless.tpde");
    tpde().arg("pack").arg(b).arg("--base").arg(a).arg("-o").arg(&lossless).assert().success();
    assert!(std::fs::metadata(&packed).unwrap().len() < std::fs::metadata(&lossless).unwrap().len());
    // A negative bound is a usage error.
    tpde()
        .arg("pack")
        .arg(b)
        .arg("--base")
        .arg(a)
        .args(["--max-rel-error", "-1", "-o"])
        .arg(d.join("x.tpde"))
        .assert()
        .code(2);
    // One element moved by 2% of itself in a copy of the original: over the bound.
    let moved = d.join("moved.safetensors");
    first_f32_moved(b, &moved, |x| x * 1.02 + 1e-30);
    tpde()
        .arg("verify")
        .arg(&packed)
        .arg("--against")
        .arg(&moved)
        .assert()
        .code(1)
        .stderr(predicates::str::contains("over the bound 0 + 0.01·|x|"));
}

/// Copies the safetensors file `from` to `to` with the first element of its first f32 tensor
/// replaced by `f` of it.
fn first_f32_moved(from: &Path, to: &Path, f: impl Fn(f32) -> f32) {
    let st = std::fs::read(from).unwrap();
    let parsed = safetensors::SafeTensors::deserialize(&st).unwrap();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> =
        parsed.tensors().into_iter().map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec())).collect();
    let f32s = owned.iter_mut().find(|t| t.1 == safetensors::Dtype::F32).unwrap();
    let x = f(f32::from_le_bytes(f32s.3[..4].try_into().unwrap()));
    f32s.3[..4].copy_from_slice(&x.to_le_bytes());
    let views: Vec<(String, safetensors::tensor::TensorView)> = owned
        .iter()
        .map(|(n, dt, sh, data)| (n.clone(), safetensors::tensor::TensorView::new(*dt, sh.clone(), data).unwrap()))
        .collect();
    safetensors::tensor::serialize_to_file(views, None, to).unwrap();
}

/// `tpde inspect ... | head`: a reader that closes the pipe early ends the command quietly
/// with status 0 (no "Broken pipe" panic, no backtrace), for each command that prints much.
#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let (st, packed) = (dir.path().join("many.safetensors"), dir.path().join("many.tpde"));
    // 300 layers of 9 tensors, 3 files each: thousands of rows, far more than a pipe holds.
    let model = demo::DemoModel { vocab: 8, d_model: 4, d_ff: 4, layers: 300 };
    demo::write_checkpoint(model, 1, 1, &st).unwrap();
    tpde().arg("pack").arg(&st).arg("-o").arg(&packed).assert().success();
    let bin = |name: &str| assert_cmd::cargo::cargo_bin(name);
    let p = packed.to_str().unwrap();
    for (exe, args) in [
        (bin("tpde"), vec!["inspect", p, "--chunks"]),
        (bin("tpde-inspect"), vec!["--json", p]),
        (bin("tpde-inspect"), vec![p]),
    ] {
        let mut child = std::process::Command::new(&exe)
            .args(&args)
            .env("RUST_BACKTRACE", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 16];
        child.stdout.take().unwrap().read_exact(&mut first).unwrap(); // then closed
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && stderr.is_empty(), "{exe:?} {args:?}: {:?} {stderr}", out.status);
    }
}

/// `inspect`: a chunk two tensors share (a tied weight) counts once in the stored total, and a
/// long metadata value is cut to a line in the table, whole with `--full` and in `--json`.
#[test]
fn inspect_counts_shared_chunks_once_and_cuts_long_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let (st, packed) = (dir.path().join("tied.safetensors"), dir.path().join("tied.tpde"));
    let data: Vec<u8> = (0..10_000u32).flat_map(|i| (i as f32).sin().to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![10_000], &data).unwrap();
    let long = "x".repeat(5000);
    let meta = std::collections::HashMap::from([("long".to_string(), long.clone())]);
    safetensors::serialize_to_file([("a", view.clone()), ("b", view)], Some(meta), &st).unwrap();
    tpde().arg("pack").arg(&st).arg("-o").arg(&packed).assert().success();

    let json = tpde().arg("inspect").arg(&packed).arg("--json").assert().success().get_output().stdout.clone();
    let rep: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let tensors = rep["tensors"].as_array().unwrap();
    assert_eq!(tensors[0]["stored_bytes"], tensors[1]["stored_bytes"]);
    assert_eq!(rep["stored_bytes"], tensors[0]["stored_bytes"], "the shared chunks count once");
    assert!(rep["metadata"].as_array().unwrap().iter().any(|m| m["value"] == long.as_str()));

    let text = tpde().arg("inspect").arg(&packed).assert().success().get_output().stdout.clone();
    let text = String::from_utf8(text).unwrap();
    assert!(!text.contains(&long) && text.contains("(5000 characters in all)"), "{text}");
    let full = tpde().arg("inspect").arg(&packed).arg("--full").assert().success().get_output().stdout.clone();
    assert!(String::from_utf8(full).unwrap().contains(&long));
}

/// A model folder as the Hub has one: sharded weights, their index and the files beside them
/// (nested, hidden, a link to a file as a Hugging Face cache snapshot has), with what a pack
/// leaves out (weights in another format, a hidden folder, a link to a folder).
fn model_folder(dir: &Path, scale: f32) -> std::path::PathBuf {
    let folder = tpde_testkit::folder::sharded(dir, scale);
    let write = |rel: &str, data: &[u8]| {
        let p = folder.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    };
    write("config.json", format!("{{\"architectures\": [\"BertModel\"], \"scale\": {scale}}}\n").as_bytes());
    write("tokenizer.json", "{\"model\": {\"vocab\": {\"[PAD]\": 0, \"h\u{e9}llo\": 1}}}".as_bytes());
    write("1_Pooling/config.json", b"{\"pooling_mode_mean_tokens\": true}");
    write(".gitattributes", b"*.safetensors filter=lfs\n");
    write("empty.txt", b"");
    let blobs = dir.join("hub/models--org--model/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(format!("readme-{scale}")), b"the README, a blob in the cache").unwrap();
    std::os::unix::fs::symlink(blobs.join(format!("readme-{scale}")), folder.join("README.md")).unwrap();
    std::os::unix::fs::symlink("config.json", folder.join("config-link.json")).unwrap();
    // Left out:
    write("pytorch_model.bin", b"pickled weights");
    write(".cache/huggingface/download/model.lock", b"");
    std::os::unix::fs::symlink(dir, folder.join("linked-folder")).unwrap();
    std::os::unix::fs::symlink(dir.join("nowhere"), folder.join("dangling.json")).unwrap();
    folder
}

#[test]
fn model_folders_carry_their_files_and_are_bases_of_their_fine_tunes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (base, tuned) = (model_folder(d, 1.0), model_folder(d, 1.001));
    let packed =
        tpde().arg("pack").arg(&tuned).arg("--base").arg(&base).arg("-o").arg(d.join("ft.tpde")).assert().success();
    let said = String::from_utf8_lossy(&packed.get_output().stderr).into_owned();
    // The index is not carried (spec §5.5): unpack writes it from the layout.
    assert!(said.contains("4 as deltas) and 7 files (5 left out"), "{said}");
    assert!(said.contains("README.md: a link, read from") && said.contains("config-link.json: a link"), "{said}");
    // The delta names the base folder by the content digest its .tpde has: they are one base.
    tpde().arg("pack").arg(&base).arg("-o").arg(d.join("base.tpde")).assert().success();
    let ft = tpde::read::Reader::open(d.join("ft.tpde")).unwrap();
    let base_tpde = tpde::read::Reader::open(d.join("base.tpde")).unwrap();
    assert_eq!(ft.header().minor_version, 11); // 1.7's file table, 1.11's delta block records (`auto`)
    assert_eq!(ft.directory().base.as_ref().unwrap().digest, base_tpde.content_digest());
    assert_eq!(ft.directory().base.as_ref().unwrap().path_hint, "model-1");

    // Unpacked through the hint (a folder), or against the base's .tpde: the folder again, byte
    // for byte, but for what was left out.
    let mut want = tpde_testkit::folder::files(&tuned);
    want.retain(|p, _| !p.starts_with(".cache") && p != "pytorch_model.bin");
    for (out, base_arg) in [("out-hint", None), ("out-tpde", Some(d.join("base.tpde")))] {
        let mut cmd = tpde();
        cmd.arg("unpack").arg(d.join("ft.tpde")).arg("-o").arg(d.join(out));
        if let Some(b) = base_arg {
            cmd.arg("--base").arg(b);
        }
        cmd.assert().success();
        let got = tpde_testkit::folder::files(&d.join(out));
        assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{out}");
        for (p, bytes) in &want {
            if p.ends_with(".index.json") {
                let json = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).unwrap();
                assert_eq!(json(&got[p]), json(bytes), "{out}/{p}");
            } else if !p.ends_with(".safetensors") {
                assert_eq!(&got[p], bytes, "{out}/{p}");
            }
        }
        for shard in ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"] {
            assert_eq!(verify::compare_safetensors(&tuned.join(shard), &d.join(out).join(shard)).unwrap(), None);
        }
    }
    inspect().arg(d.join("ft.tpde")).assert().success().stdout(predicates::str::contains("1_Pooling/config.json"));

    // Unpacking over a folder with files is refused without --replace (issue 67); with it the
    // folder is replaced whole, never written through a link it holds, and what a link leads to
    // is neither written nor removed.
    let (out, elsewhere) = (d.join("out-link"), d.join("elsewhere"));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("keep.txt"), b"keep me").unwrap();
    std::os::unix::fs::symlink(&elsewhere, out.join("1_Pooling")).unwrap();
    tpde()
        .arg("unpack")
        .arg(d.join("ft.tpde"))
        .arg("-o")
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicates::str::contains("--replace"));
    tpde().arg("unpack").arg(d.join("ft.tpde")).arg("-o").arg(&out).arg("--replace").assert().success();
    assert_eq!(tpde_testkit::folder::files(&elsewhere).len(), 1, "nothing written through the link, nothing removed");
    assert!(std::fs::symlink_metadata(out.join("1_Pooling")).unwrap().is_dir());
    // A file that links out is replaced with its folder, not written through.
    let victim = d.join("victim.txt");
    std::fs::write(&victim, b"keep me").unwrap();
    let out = d.join("out-file-link");
    std::fs::create_dir_all(&out).unwrap();
    std::os::unix::fs::symlink(&victim, out.join("config.json")).unwrap();
    tpde().arg("unpack").arg(d.join("ft.tpde")).arg("-o").arg(&out).arg("--replace").assert().success();
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
    assert!(!std::fs::symlink_metadata(out.join("config.json")).unwrap().file_type().is_symlink());
}

#[test]
fn a_one_file_model_folder_unpacks_to_the_same_folder() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let folder = d.join("model");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy(small_model(d), folder.join("model.safetensors")).unwrap();
    std::fs::write(folder.join("config.json"), b"{\"model_type\": \"bert\"}").unwrap();
    std::fs::write(folder.join("vocab.txt"), b"[PAD]\n[UNK]\n").unwrap();
    tpde().arg("pack").arg(&folder).arg("-o").arg(d.join("m.tpde")).assert().success();
    tpde().arg("unpack").arg(d.join("m.tpde")).arg("-o").arg(d.join("out")).assert().success();
    let (got, want) = (tpde_testkit::folder::files(&d.join("out")), tpde_testkit::folder::files(&folder));
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    assert_eq!(got["config.json"], want["config.json"]);
    assert_eq!(got["vocab.txt"], want["vocab.txt"]);
    assert_eq!(
        verify::compare_safetensors(&folder.join("model.safetensors"), &d.join("out/model.safetensors")).unwrap(),
        None
    );
    // One file when asked for one.
    tpde().arg("unpack").arg(d.join("m.tpde")).arg("-o").arg(d.join("one.safetensors")).assert().success();
    assert_eq!(
        verify::compare_safetensors(&folder.join("model.safetensors"), &d.join("one.safetensors")).unwrap(),
        None
    );
    // A delta of a file against the folder.
    tpde()
        .arg("pack")
        .arg(folder.join("model.safetensors"))
        .arg("--base")
        .arg(&folder)
        .arg("-o")
        .arg(d.join("same.tpde"))
        .assert()
        .success();
    tpde().arg("verify").arg(d.join("same.tpde")).assert().success();
}

/// One tensor with a 190-character name padded every row of `inspect`'s table to its width
/// (issue 58): the NAME column stops at 60 characters, and that row alone is wider.
#[test]
fn inspect_keeps_its_table_narrow_beside_a_long_name() {
    use safetensors::tensor::{serialize_to_file, Dtype, TensorView};
    let dir = tempfile::tempdir().unwrap();
    let long = format!("optimizer.state.{}.exp_avg", "x".repeat(170));
    let data = vec![0u8; 64];
    let views = vec![
        (long.as_str(), TensorView::new(Dtype::F32, vec![16], &data).unwrap()),
        ("short.weight", TensorView::new(Dtype::F32, vec![16], &data).unwrap()),
    ];
    let src = dir.path().join("long.safetensors");
    serialize_to_file(views, None, &src).unwrap();
    let packed = dir.path().join("long.tpde");
    tpde().arg("pack").arg(&src).arg("-o").arg(&packed).assert().success();
    let text = String::from_utf8(inspect().arg(&packed).assert().success().get_output().stdout.clone()).unwrap();
    let row = |name: &str| text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name}: {text}"));
    assert!(row("short.weight").len() < 120, "{}", row("short.weight"));
    assert!(row(&long).contains("f32"), "{text}");
}

/// Every error of `inspect` and `unpack` names the file it is about (issue 58): a truncated
/// file and a file that is not TPDE to `inspect`, a delta with no base to `unpack --no-hints`.
#[test]
fn inspect_and_unpack_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let src = small_model(dir.path());
    let (key, delta) = (dir.path().join("k.tpde"), dir.path().join("d.tpde"));
    tpde().arg("pack").arg(&src).arg("-o").arg(&key).assert().success();
    tpde().arg("pack").arg(&src).arg("--base").arg(&key).arg("-o").arg(&delta).assert().success();
    let cut = dir.path().join("cut.tpde");
    let bytes = std::fs::read(&key).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "hello").unwrap();
    for file in [&cut, &text] {
        let named = predicates::str::contains(format!("{}: ", file.display()));
        tpde().arg("inspect").arg(file).assert().failure().stderr(named);
    }
    let out = dir.path().join("out.safetensors");
    let named = predicates::str::contains(format!("{}: ", delta.display()));
    tpde().arg("unpack").arg(&delta).arg("--no-hints").arg("-o").arg(&out).assert().failure().stderr(named);
}
