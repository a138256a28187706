//! The command line on hostile files: a tensor declared far larger than the file (the
//! chunk-reuse bombs of `crates/tpde-py/tests/data/`), streamed in bounded memory or refused,
//! never an abort; and a base hint that is a URL, not followed unless the user opted in.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::PredicateBooleanExt;
use tpde_cli::demo;

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

/// `tpde` in a network namespace of its own (`unshare -rn`: no interface but a loopback that is
/// down), where any connection fails, where the kernel allows unprivileged namespaces; plain
/// `tpde`, saying so, where it does not.
fn tpde_offline() -> Command {
    if std::process::Command::new("unshare").args(["-rn", "true"]).status().is_ok_and(|s| s.success()) {
        let mut c = Command::new("unshare");
        c.arg("-rn").arg(assert_cmd::cargo::cargo_bin("tpde"));
        c
    } else {
        eprintln!("no unprivileged network namespaces here: the URL-hint test runs with the network up");
        tpde()
    }
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
    let offline = || {
        let mut cmd = tpde_offline();
        for (k, _) in std::env::vars() {
            if k.starts_with("AWS_") {
                cmd.env_remove(k);
            }
        }
        cmd
    };
    // Confined to the file's folder by default; opened up, still not without object storage.
    for (flag, why) in [(None, "confined to"), (Some("--follow-hints"), "object storage is not configured")] {
        offline()
            .arg("verify")
            .arg(&kb)
            .args(flag)
            .assert()
            .code(1)
            .stderr(predicates::str::contains("\"s3://some-bucket/a.tpde\" not followed"))
            .stderr(predicates::str::contains(why));
    }
    // The base given explicitly still works.
    tpde().arg("verify").arg(&kb).arg("--base").arg(&ka).assert().success();
}

/// A full disk, as a 64 KiB tmpfs in a mount namespace of the test's own (`unshare -rm`): a
/// failed `pack` or `unpack` names the file it was writing, and leaves nothing there.
#[test]
fn a_full_disk_names_the_output_and_leaves_nothing() {
    if !std::process::Command::new("unshare").args(["-rm", "true"]).status().is_ok_and(|s| s.success()) {
        eprintln!("no unprivileged mount namespaces here: the full-disk test does not run");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("a.safetensors");
    let model = demo::DemoModel { vocab: 64, d_model: 32, d_ff: 96, layers: 2 };
    demo::write_checkpoint(model, 5, 1, &st).unwrap();
    let packed = dir.path().join("a.tpde");
    tpde().arg("pack").arg(&st).arg("-o").arg(&packed).assert().success();
    let full = dir.path().join("full");
    std::fs::create_dir(&full).unwrap();
    for (args, out) in [
        (vec!["pack".into(), st.display().to_string()], "x.tpde"),
        (vec!["unpack".into(), packed.display().to_string()], "y.safetensors"),
    ] {
        let out = full.join(out).display().to_string();
        let script = "mount -t tmpfs -o size=64k tmpfs \"$1\" && shift && \"$@\"; rc=$?; ls -A \"$0\"; exit $rc";
        let assert = Command::new("unshare")
            .args(["-rm", "sh", "-c", script])
            .arg(&full)
            .arg(&full)
            .arg(assert_cmd::cargo::cargo_bin("tpde"))
            .args(&args)
            .args(["-o", &out])
            .assert()
            .code(1)
            .stderr(predicates::str::contains(format!("{out}: ")))
            .stderr(predicates::str::contains("No space left on device"));
        // `ls -A` of the full folder after the failure: empty, no temporary file left.
        assert.stdout("");
    }
}

/// A hint naming what is not a TPDE file (a device, a file that cannot be read) is refused with
/// an error that names the hint, and never says a base was "given" when none was.
#[test]
fn a_hint_that_cannot_be_read_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.safetensors"), dir.path().join("b.safetensors"));
    let model = demo::DemoModel { vocab: 64, d_model: 16, d_ff: 48, layers: 1 };
    demo::write_checkpoint(model, 5, 1, &a).unwrap();
    demo::write_checkpoint(model, 6, 1, &b).unwrap();
    let (ka, kb, kc) = (dir.path().join("a.tpde"), dir.path().join("b.tpde"), dir.path().join("c.tpde"));
    tpde().arg("pack").arg(&a).arg("-o").arg(&ka).assert().success();
    tpde().arg("pack").arg(&b).arg("--base").arg(&ka).arg("-o").arg(&kb).assert().success();
    // c.tpde: a valid TPDE file, but another checkpoint than the base.
    tpde().arg("pack").arg(&b).arg("-o").arg(&kc).assert().success();
    for hint in ["/proc/self/mem", "c.tpde"] {
        let file = std::fs::read(&kb).unwrap();
        let file = tpde_format::surgery::with_directory(&file, |d| {
            d.base.as_mut().unwrap().path_hint = hint.into();
        })
        .unwrap();
        std::fs::write(&kb, file).unwrap();
        let out = tpde().arg("verify").arg(&kb).assert().code(1);
        let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
        assert!(stderr.contains(hint), "{stderr}");
        assert!(!stderr.contains("given"), "{stderr}");
    }
}

/// A model folder's file table that names a path outside the output folder (spec §5.5, R31):
/// `tpde unpack` and `tpde verify` refuse it, and nothing is written, inside or outside.
#[test]
fn a_file_table_that_leaves_the_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let folder = small_model_folder(&d.join("model"));
    tpde().arg("pack").arg(&folder).arg("-o").arg(d.join("ok.tpde")).assert().success();
    let ok = std::fs::read(d.join("ok.tpde")).unwrap();
    let evil = with_table(&ok, &[(b"../evil.txt", b"pwned")]);
    std::fs::write(d.join("evil.tpde"), evil).unwrap();
    let out = d.join("out");
    tpde()
        .arg("unpack")
        .arg(d.join("evil.tpde"))
        .arg("-o")
        .arg(&out)
        .assert()
        .code(1)
        .stderr(predicates::str::contains("../evil.txt"));
    assert!(!d.join("evil.txt").exists());
    assert!(!out.exists(), "no folder, and no weights written either");
    tpde()
        .arg("verify")
        .arg(d.join("evil.tpde"))
        .assert()
        .code(1)
        .stderr(predicates::str::contains("malformed file table"));
    // The tensors still read: a reader of tensors ignores the table, as a 1.6 reader does.
    tpde().arg("unpack").arg(d.join("evil.tpde")).arg("-o").arg(d.join("one.safetensors")).assert().success();
}

/// A model folder at `folder`: a small `model.safetensors` and a `config.json`.
fn small_model_folder(folder: &Path) -> PathBuf {
    std::fs::create_dir_all(folder).unwrap();
    let model = demo::DemoModel { vocab: 64, d_model: 16, d_ff: 48, layers: 1 };
    demo::write_checkpoint(model, 1, 1, &folder.join("model.safetensors")).unwrap();
    std::fs::write(folder.join("config.json"), b"{}").unwrap();
    folder.to_path_buf()
}

/// `file` (a `.tpde` with a file table) with its table replaced by `files`, written by hand in a
/// Zstandard frame of one raw block, as no TPDE writer would write it.
fn with_table(file: &[u8], files: &[(&[u8], &[u8])]) -> Vec<u8> {
    use tpde_format::files::KEY_FILES;
    use tpde_format::MetadataValue;
    let mut table = (files.len() as u32).to_le_bytes().to_vec();
    for (path, data) in files {
        table.extend((path.len() as u16).to_le_bytes());
        table.extend_from_slice(path);
        table.extend((data.len() as u64).to_le_bytes());
        table.extend_from_slice(data);
    }
    let mut frame = vec![0x28, 0xB5, 0x2F, 0xFD, 0xA0];
    frame.extend((table.len() as u32).to_le_bytes());
    frame.extend_from_slice(&((table.len() as u32) << 3 | 1).to_le_bytes()[..3]);
    frame.extend_from_slice(&table);
    tpde_format::surgery::with_directory(file, |dir| {
        dir.metadata.iter_mut().find(|m| m.key == KEY_FILES).unwrap().value = MetadataValue::Bytes(frame);
    })
    .unwrap()
}

/// A sharded folder's `.tpde` whose file table carries its own index and the weights that index
/// names (issue 53): before 1.8's revision `tpde verify` passed it, with the content digest
/// unchanged, and an unpacked folder loaded the table's weights. Now the table breaks R31:
/// verify and a folder unpack refuse it and leave no folder; the tensors still read.
#[test]
fn a_file_table_that_carries_weights_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let folder = tpde_testkit::folder::sharded(d, 1.0);
    std::fs::write(folder.join("config.json"), b"{}").unwrap();
    tpde().arg("pack").arg(&folder).arg("-o").arg(d.join("ok.tpde")).assert().success();
    let index = br#"{"metadata": {}, "weight_map": {"a.weight": "evil.safetensors"}}"#;
    let weights = std::fs::read(folder.join("model-00001-of-00002.safetensors")).unwrap();
    let ok = std::fs::read(d.join("ok.tpde")).unwrap();
    for table in [
        vec![
            (&b"config.json"[..], &b"{}"[..]),
            (b"evil.safetensors", &weights),
            (b"model.safetensors.index.json", index),
        ],
        vec![(&b"model.safetensors.index.json"[..], &index[..])],
        vec![(&b"sub/EVIL.SafeTensors"[..], &weights[..])],
    ] {
        std::fs::write(d.join("evil.tpde"), with_table(&ok, &table)).unwrap();
        tpde()
            .arg("verify")
            .arg(d.join("evil.tpde"))
            .assert()
            .code(1)
            .stderr(predicates::str::contains("names weights"));
        let out = d.join("out");
        tpde().arg("unpack").arg(d.join("evil.tpde")).arg("-o").arg(&out).assert().code(1);
        assert!(!out.exists(), "a refused unpack leaves no folder");
        assert_eq!(
            std::fs::read_dir(d)
                .unwrap()
                .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".partial"))
                .count(),
            0
        );
        tpde().arg("unpack").arg(d.join("evil.tpde")).arg("-o").arg(d.join("one.safetensors")).assert().success();
    }
    // The honest file unpacks to the folder, its index written from the layout.
    tpde().arg("unpack").arg(d.join("ok.tpde")).arg("-o").arg(d.join("again")).assert().success();
    let json = |p: &Path| serde_json::from_slice::<serde_json::Value>(&std::fs::read(p).unwrap()).unwrap();
    let index = "model.safetensors.index.json";
    assert_eq!(json(&d.join("again").join(index)), json(&folder.join(index)));
}

/// Packing a folder reads through links only inside it or into a Hugging Face cache's blobs,
/// and refuses what is not a file: a link to `/etc/passwd` or `/proc/self/environ` (which would
/// carry the packer's secrets), a FIFO, and a link to `/proc/self/pagemap` (its size says 0; it
/// read on to 2 GiB), each a usage error that names it, with no output left.
#[test]
fn packing_a_folder_follows_links_only_inside_and_refuses_special_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fresh = |name: &str| small_model_folder(&d.join(name));
    for (name, target) in
        [("passwd", "/etc/passwd"), ("environ", "/proc/self/environ"), ("pagemap", "/proc/self/pagemap")]
    {
        let folder = fresh(name);
        std::os::unix::fs::symlink(target, folder.join("notes.txt")).unwrap();
        let out = d.join(format!("{name}.tpde"));
        // 1 GiB of address space: the pagemap read needed more, and failed by running out.
        tpde_within(1 << 20, &["pack", folder.to_str().unwrap(), "-o", out.to_str().unwrap()])
            .assert()
            .code(2)
            .stderr(predicates::str::contains("outside the folder").and(predicates::str::contains("notes.txt")));
        assert!(!out.exists(), "{name}");
    }
    let folder = fresh("fifo");
    assert!(std::process::Command::new("mkfifo").arg(folder.join("pipe")).status().unwrap().success());
    tpde()
        .arg("pack")
        .arg(&folder)
        .arg("-o")
        .arg(d.join("fifo.tpde"))
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .code(2)
        .stderr(predicates::str::contains("not a file or a folder").and(predicates::str::contains("pipe")));
    assert!(!d.join("fifo.tpde").exists());
    // Inside the folder, and into a cache's blobs: read through, and said.
    let folder = fresh("fine");
    std::os::unix::fs::symlink("config.json", folder.join("same.json")).unwrap();
    let blobs = d.join("hub/models--org--m/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join("abc123"), b"# README").unwrap();
    std::os::unix::fs::symlink(blobs.join("abc123"), folder.join("README.md")).unwrap();
    tpde()
        .arg("pack")
        .arg(&folder)
        .arg("-o")
        .arg(d.join("fine.tpde"))
        .assert()
        .success()
        .stderr(predicates::str::contains("same.json: a link").and(predicates::str::contains("README.md: a link")));
}

/// A delta from elsewhere whose hint leads out of its folder (issue 53: every local hint was
/// followed by default, `/etc/shadow` or `/proc/self/environ` included): `unpack`, `verify`
/// and `cat` refuse it by default as `base-missing`, naming the hint and saying why, and open
/// nothing there; `--follow-hints` or a `--hint-root` above it opens it up.
#[test]
fn hints_are_confined_to_the_file_s_folder_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (bases, inbox) = (d.join("bases"), d.join("inbox"));
    std::fs::create_dir_all(&bases).unwrap();
    std::fs::create_dir_all(&inbox).unwrap();
    let model = demo::DemoModel { vocab: 64, d_model: 16, d_ff: 48, layers: 1 };
    demo::write_checkpoint(model, 5, 1, &d.join("a.safetensors")).unwrap();
    demo::write_checkpoint(model, 6, 1, &d.join("b.safetensors")).unwrap();
    tpde().arg("pack").arg(d.join("a.safetensors")).arg("-o").arg(bases.join("a.tpde")).assert().success();
    let delta = |base: &Path, out: &Path| {
        tpde().arg("pack").arg(d.join("b.safetensors")).arg("--base").arg(base).arg("-o").arg(out).assert().success();
    };
    let b = inbox.join("b.tpde");
    delta(&bases.join("a.tpde"), &b);
    let runs: [&[&str]; 3] = [&["verify"], &["cat", "lm_head.weight"], &["unpack", "-o", "out.safetensors"]];
    for args in runs {
        let (cmd, rest) = args.split_first().unwrap();
        let run = |extra: &[&str]| {
            let mut c = tpde();
            c.current_dir(d).arg(cmd).arg(&b).args(rest).args(extra);
            c
        };
        run(&[])
            .assert()
            .code(1)
            .stderr(predicates::str::contains("not followed").and(predicates::str::contains("allowed folders")));
        run(&["--follow-hints"]).assert().success();
        run(&["--hint-root", d.to_str().unwrap()]).assert().success();
    }
    // A hint into the file's own folder is followed as before.
    std::fs::copy(bases.join("a.tpde"), inbox.join("a.tpde")).unwrap();
    let moved = inbox.join("b2.tpde");
    delta(&inbox.join("a.tpde"), &moved);
    tpde().arg("verify").arg(&moved).assert().success();
}

/// Issue 58's message nits: a folder given where a file is wanted says so (it said "No such
/// device (os error 19)"), and a file cut short says where its trailer was looked for (it said
/// it needed bytes 2968..3000 of a file 3000 bytes long).
#[test]
fn a_folder_or_a_cut_file_is_named_for_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    tpde().arg("cat").arg(d).arg("w").assert().code(1).stderr(predicates::str::contains("a folder, not a file"));
    // inspect takes a folder of checkpoints too (its chains): one with none is named as such
    tpde().arg("inspect").arg(d).assert().code(1).stderr(predicates::str::contains("a folder with no TPDE file"));
    let model = demo::DemoModel { vocab: 64, d_model: 16, d_ff: 48, layers: 1 };
    demo::write_checkpoint(model, 1, 1, &d.join("a.safetensors")).unwrap();
    tpde().arg("pack").arg(d.join("a.safetensors")).arg("-o").arg(d.join("a.tpde")).assert().success();
    let bytes = std::fs::read(d.join("a.tpde")).unwrap();
    std::fs::write(d.join("cut.tpde"), &bytes[..3000]).unwrap();
    tpde().arg("verify").arg(d.join("cut.tpde")).assert().code(1).stderr(
        predicates::str::contains("no trailer where the file ends").and(predicates::str::contains("needs").not()),
    );
}

/// Issue 67: `tpde unpack -o DIR` over a folder holding version 1 of a model moved version 2's
/// files in one by one, so a kill (or an entry in the way) left a mix that `from_pretrained`
/// loads. Now a folder with files is refused unless `--replace`, and then replaced whole in one
/// step: after a kill at any moment DIR holds version 1 or version 2 exactly, never a stale file
/// beside the other's, and nothing else is left beside it once the next unpack has run.
#[test]
fn an_unpack_over_a_folder_leaves_the_old_version_or_the_new_never_a_mix() {
    use tpde_testkit::folder::{files, sharded};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (v1, v2) = (sharded(d, 1.0), sharded(d, 2.0));
    std::fs::write(v1.join("config.json"), b"{\"v\": 1}").unwrap();
    std::fs::write(v2.join("config.json"), b"{\"v\": 2}").unwrap();
    std::fs::write(v2.join("tokenizer.json"), b"{}").unwrap();
    for (v, name) in [(&v1, "v1.tpde"), (&v2, "v2.tpde")] {
        tpde().arg("pack").arg(v).arg("-o").arg(d.join(name)).assert().success();
    }
    let out = d.join("out");
    tpde().arg("unpack").arg(d.join("v1.tpde")).arg("-o").arg(&out).assert().success();
    // The single-file weights of an older layout, which transformers would prefer.
    std::fs::write(out.join("model.safetensors"), b"stale").unwrap();
    let mut old = files(&out);
    tpde().arg("unpack").arg(d.join("v2.tpde")).arg("-o").arg(d.join("fresh")).assert().success();
    let new = files(&d.join("fresh"));
    assert_eq!(new["config.json"], b"{\"v\": 2}");

    // Refused without --replace, naming it; the folder as it was, with a folder in the way too.
    std::fs::create_dir(out.join("tokenizer.json")).unwrap();
    tpde()
        .arg("unpack")
        .arg(d.join("v2.tpde"))
        .arg("-o")
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicates::str::contains("--replace"));
    assert_eq!(files(&out), old);
    std::fs::remove_dir(out.join("tokenizer.json")).unwrap();

    // Killed at moments spread over a whole unpack, each time from version 1 (or 2) again.
    let started = std::time::Instant::now();
    tpde().arg("unpack").arg(d.join("v1.tpde")).arg("-o").arg(&out).arg("--replace").assert().success();
    std::fs::write(out.join("model.safetensors"), b"stale").unwrap();
    let took = started.elapsed();
    let (mut saw_old, mut saw_new) = (0, 0);
    for k in 0..40u32 {
        let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("tpde"))
            .arg("unpack")
            .arg(d.join("v2.tpde"))
            .arg("-o")
            .arg(&out)
            .arg("--replace")
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(took * k / 30);
        let _ = child.kill();
        child.wait().unwrap();
        let now = files(&out);
        assert!(now == old || now == new, "kill {k}: a mix: {:?}", now.keys().collect::<Vec<_>>());
        if now == new {
            saw_new += 1;
            tpde().arg("unpack").arg(d.join("v1.tpde")).arg("-o").arg(&out).arg("--replace").assert().success();
            std::fs::write(out.join("model.safetensors"), b"stale").unwrap();
            old = files(&out);
        } else {
            saw_old += 1;
        }
    }
    eprintln!("{saw_old} kills left version 1, {saw_new} version 2");
    tpde().arg("unpack").arg(d.join("v2.tpde")).arg("-o").arg(&out).arg("--replace").assert().success();
    assert_eq!(files(&out), new, "replaced whole: no stale model.safetensors");
    let left: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 6, "v1, v2, their files, fresh and out; no partial folder: {left:?}");
}

/// Issue 67: `tpde unpack --gpu` of a 3.7 KB file declaring three f32 tensors of 1 GiB (the
/// chunks of `bomb-2gib.tpde` reused), under a 4 GiB address-space cap: the device cannot hold
/// them, and the decoder panicked in wgpu ("Out of Memory", exit 101). Memory the device cannot
/// give is `limit-exceeded`, as host memory is.
#[test]
#[cfg(feature = "gpu")]
#[cfg_attr(feature = "skip-gpu-tests", ignore = "built with --features skip-gpu-tests: no GPU adapter")]
fn device_memory_that_cannot_be_had_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = std::fs::read(fixture("bomb-2gib.tpde")).unwrap();
    let bomb = tpde_format::surgery::with_directory(&bomb, |d| {
        let mut w = d.tensors.remove(0);
        w.shape = vec![w.shape[0] / 2];
        w.byte_length /= 2;
        w.chunks.truncate(w.chunks.len() / 2);
        for name in ["a", "b", "c"] {
            d.tensors.push(tpde_format::TensorEntry { name: name.into(), ..w.clone() });
        }
    })
    .unwrap();
    let (file, out) = (dir.path().join("three-gib.tpde"), dir.path().join("out.safetensors"));
    std::fs::write(&file, bomb).unwrap();
    let (file, out) = (file.to_str().unwrap(), out.to_str().unwrap());
    tpde_within(4 << 20, &["unpack", "--gpu", file, "-o", out])
        .assert()
        .code(1)
        .stderr(predicates::str::contains("could not allocate").or(predicates::str::contains("out of memory")));
    assert!(!Path::new(out).exists());
}

/// Issue 70: `tpde pack ft/ --base ../base/ -o x.tpde` recorded a hint that a default unpack, which
/// follows hints only inside the file's folder, refuses; pack said nothing and unpack did not say
/// what to do. Pack now says what unpack will need, the refusal names the fix, and the fix works.
#[test]
fn pack_says_what_unpack_will_need_for_a_base_outside_the_file_s_folder() {
    use tpde_testkit::folder::{files, sharded};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (base, tuned) = (sharded(d, 1.0), sharded(d, 1.5));
    std::fs::write(tuned.join("config.json"), b"{}").unwrap();
    let work = d.join("work");
    std::fs::create_dir(&work).unwrap();
    let rel = |p: &Path| format!("../{}", p.file_name().unwrap().to_str().unwrap());
    tpde()
        .args(["pack", &rel(&tuned), "--base", &rel(&base), "-o", "x.tpde"])
        .current_dir(&work)
        .assert()
        .success()
        .stderr(predicates::str::contains("note:").and(predicates::str::contains(format!("--base {}", rel(&base)))));
    tpde()
        .args(["unpack", "x.tpde", "-o", "ft"])
        .current_dir(&work)
        .assert()
        .code(1)
        .stderr(predicates::str::contains("not followed").and(predicates::str::contains("--base")));
    tpde().args(["unpack", "x.tpde", "-o", "ft", "--base", &rel(&base)]).current_dir(&work).assert().success();
    tpde().args(["unpack", "x.tpde", "-o", "ft2", "--hint-root", ".."]).current_dir(&work).assert().success();
    assert_eq!(files(&work.join("ft"))["config.json"], b"{}");
    assert_eq!(files(&work.join("ft")), files(&work.join("ft2")));
    // A base in the file's own folder needs nothing: no note.
    tpde().args(["pack", &rel(&base), "-o", "base.tpde"]).current_dir(&work).assert().success();
    let out = tpde()
        .args(["pack", &rel(&tuned), "--base", "base.tpde", "-o", "y.tpde"])
        .current_dir(&work)
        .assert()
        .success()
        .get_output()
        .stderr
        .clone();
    assert!(!String::from_utf8(out).unwrap().contains("note:"));
}
