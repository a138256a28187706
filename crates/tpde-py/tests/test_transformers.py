"""tpde.transformers: a real Hugging Face Trainer whose checkpoint folders are stored as TPDE,
killed mid-run, resumes bit for bit as the uninterrupted run; the newest folder opens the
Trainer's way, and nothing pickled stays in the others."""
import datetime
import os

import pytest
import torch
from safetensors.torch import load_file

import tpde
from tpde.torch import Series, _folder

pytest.importorskip("accelerate")  # the Trainer needs it
import tpde.transformers  # noqa: E402

import frameworks  # noqa: E402


def run(*args, check=True):
    return frameworks.run("hf_run.py", *args, check=check)


STATES = ["config.json", "model.safetensors", "optimizer.pt", "rng_state.pth", "scheduler.pt", "trainer_state.json",
          "training_args.bin"]
STORED = ["TPDE-README.txt", "checkpoint.tpde", "config.json", "trainer_state.json", "training_args.json"]


def test_the_newest_folder_opens_the_trainer_s_way_and_a_killed_run_resumes_bit_for_bit(tmp_path):
    """The default (newest="native"): the newest checkpoint-N is the Trainer's own folder, so
    train(resume_from_checkpoint=True) and from_pretrained open it without TPDE (issue 58); the
    ones before it are stored, and a resumed run continues their chain."""
    from transformers import BertForSequenceClassification

    run(tmp_path / "plain", 12, "--weights", tmp_path / "plain.safetensors")
    out = tmp_path / "tpde"
    p = run(out, 12, "--tpde", "--kill-after", 8, check=False)
    assert p.returncode == -9, p.stderr[-3000:]
    # save_total_limit=3 kept the last three: two stored (a .tpde file and JSON, no pickle), the newest as written
    assert sorted(os.listdir(out)) == ["checkpoint-4", "checkpoint-6", "checkpoint-8"]
    assert sorted(os.listdir(out / "checkpoint-4")) == sorted(os.listdir(out / "checkpoint-6")) == STORED
    assert sorted(os.listdir(out / "checkpoint-8")) == STATES
    assert tpde._tpde.File(str(out / "checkpoint-4" / "checkpoint.tpde"), None).is_delta()  # against checkpoint-6
    assert not tpde._tpde.File(str(out / "checkpoint-6" / "checkpoint.tpde"), None).is_delta()
    # the Trainer's own resume, and a script without TPDE
    run(out, 12, "--tpde", "--resume", "true", "--weights", tmp_path / "resumed.safetensors")
    plain, resumed = load_file(tmp_path / "plain.safetensors"), load_file(tmp_path / "resumed.safetensors")
    assert plain.keys() == resumed.keys()
    for k in plain:
        assert torch.equal(plain[k], resumed[k]), k
    assert sorted(os.listdir(out)) == ["checkpoint-10", "checkpoint-12", "checkpoint-8"]
    assert sorted(os.listdir(out / "checkpoint-12")) == STATES
    model = BertForSequenceClassification.from_pretrained(out / "checkpoint-12")
    assert torch.equal(model.state_dict()["classifier.weight"], resumed["classifier.weight"])
    # the resumed run went on with the chain: checkpoint-8 (stored by it) is a delta against checkpoint-10
    assert tpde._tpde.File(str(out / "checkpoint-8" / "checkpoint.tpde"), None).is_delta()
    # a stored checkpoint comes back as the Trainer wrote it, for its own reader: one resume's copy at a time
    tpde.transformers.resume(out / "checkpoint-8")
    back = tpde.transformers.resume(out / "checkpoint-10")
    assert os.listdir(out / ".tpde-resume") == ["checkpoint-10"]
    assert tpde.transformers.resume(out) == str(out / "checkpoint-12")  # the newest, as it is
    assert set(os.listdir(back)) >= {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"}
    rng = torch.load(os.path.join(back, "rng_state.pth"), weights_only=False)
    assert rng["numpy"][1].dtype.name == "uint32" and isinstance(rng["python"], tuple)
    # export: for good, anywhere; from_pretrained opens it
    exported = tpde.transformers.export(out / "checkpoint-8", tmp_path / "eight")
    assert BertForSequenceClassification.from_pretrained(exported).config.num_labels == 3
    with pytest.raises(tpde.TpdeError, match="exists"):
        tpde.transformers.export(out / "checkpoint-8", tmp_path / "eight")
    # and so does the command: `tpde unpack checkpoint-N -o DEST`
    frameworks.tpde_command("unpack", out / "checkpoint-10", "-o", tmp_path / "ten")
    assert set(os.listdir(tmp_path / "ten")) >= {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"}
    ten = BertForSequenceClassification.from_pretrained(tmp_path / "ten")
    assert torch.equal(ten.state_dict()["classifier.weight"], load_file(os.path.join(back, "model.safetensors"))["classifier.weight"])


def test_load_best_model_at_end_loads_a_stored_best_folder(tmp_path):
    """load_best_model_at_end reads the best folder's weight files, and a folder without them is
    only a warning to the Trainer: a stored best folder gets them back for the load, and is
    stored again after it (issue 58)."""
    import json

    run(tmp_path / "plain", 12, "--best", "--weights", tmp_path / "plain.safetensors")
    out = tmp_path / "tpde"
    run(out, 12, "--tpde", "--best", "--weights", tmp_path / "tpde.safetensors")
    plain, loaded = load_file(tmp_path / "plain.safetensors"), load_file(tmp_path / "tpde.safetensors")
    for k in plain:
        assert torch.equal(plain[k], loaded[k]), k
    best = os.path.basename(json.loads((out / "checkpoint-12" / "trainer_state.json").read_text())["best_model_checkpoint"])
    assert best != "checkpoint-12" and sorted(os.listdir(out / best)) == STORED
    last = load_file(out / "checkpoint-12" / "model.safetensors")
    assert not torch.equal(last["classifier.weight"], loaded["classifier.weight"])  # the best was loaded, not the last


def test_newest_tpde_stores_every_folder_and_resumes_bit_for_bit(tmp_path):
    """newest="tpde": every folder stored at once (the newest a keyframe); resume() gives the
    Trainer its files back."""
    run(tmp_path / "plain", 8, "--weights", tmp_path / "plain.safetensors")
    out = tmp_path / "tpde"
    p = run(out, 8, "--tpde", "--newest", "tpde", "--kill-after", 6, check=False)
    assert p.returncode == -9, p.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    for c in os.listdir(out):
        assert sorted(os.listdir(out / c)) == STORED
    assert not tpde._tpde.File(str(out / "checkpoint-6" / "checkpoint.tpde"), None).is_delta()
    run(out, 8, "--tpde", "--newest", "tpde", "--resume", out / "checkpoint-6", "--weights", tmp_path / "resumed.safetensors")
    plain, resumed = load_file(tmp_path / "plain.safetensors"), load_file(tmp_path / "resumed.safetensors")
    for k in plain:
        assert torch.equal(plain[k], resumed[k]), k
    assert sorted(os.listdir(out)) == ["checkpoint-4", "checkpoint-6", "checkpoint-8"]  # .tpde-resume is gone
    with pytest.raises(tpde.TpdeError, match="newest is 'native' or 'tpde'"):
        tpde.transformers.TpdeCallback(newest="pickle")


def test_a_file_that_only_a_pickle_carries_is_an_error_naming_it(tmp_path):
    torch.save({"w": torch.ones(3)}, tmp_path / "optimizer.pt")
    torch.save({"when": datetime.date(2026, 1, 1)}, tmp_path / "extra.pt")
    with pytest.raises(tpde.TpdeError, match=r"extra\.pt: holds an object that only a pickle can carry"):
        _folder.pack(str(tmp_path), Series(), {})
    assert sorted(os.listdir(tmp_path)) == ["extra.pt", "optimizer.pt"]  # left as it was


def test_expand_writes_only_plain_file_names(tmp_path):
    (tmp_path / "c").mkdir()
    Series().save(tmp_path / "c" / _folder.STORED, {"files": {"../escape.pt": {"torch": {"w": torch.ones(2)}}}})
    with pytest.raises(tpde.TpdeError, match="is not a file name"):
        _folder.expand(str(tmp_path / "c"), str(tmp_path / "out"), Series())
    assert not (tmp_path / "escape.pt").exists()


def test_a_kill_mid_rewrite_never_lets_the_rotation_delete_a_kept_base(tmp_path):
    """A kill between a checkpoint's rewrite (as a delta against the next) and the restore of its
    folder's time left that folder newer than its base's; the Trainer rotates oldest-first by
    time, so the resumed run deleted the base and kept a checkpoint that no longer loaded
    (issue 53, 3 of 3 runs). Here every point of that window is the same state: the delta's
    folder touched after its base's. The resumed run's rotation keeps only loadable checkpoints."""
    out = tmp_path / "tpde"
    p = run(out, 12, "--tpde", "--kill-after", 8, check=False)
    assert p.returncode == -9, p.stderr[-3000:]
    delta = out / "checkpoint-4"
    assert tpde._tpde.File(str(delta / "checkpoint.tpde"), None).is_delta()  # against checkpoint-6
    t0 = int(datetime.datetime.now().timestamp()) - 1000
    os.utime(out / "checkpoint-6", (t0, t0))
    os.utime(out / "checkpoint-8", (t0 + 1, t0 + 1))
    os.utime(delta, (t0 + 2, t0 + 2))  # the kill's state: newer than its base
    run(out, 12, "--tpde", "--resume", out / "checkpoint-8")
    kept = sorted(os.listdir(out))
    assert kept == ["checkpoint-10", "checkpoint-12", "checkpoint-8"], kept
    for c in kept:
        tpde.transformers.resume(out / c)  # each loads: its base is kept


def test_a_stored_folder_left_newer_than_the_next_is_never_the_one_kept_without_its_base(tmp_path):
    """Issue 67: a kill after a folder was stored (a keyframe) and before its time was put back
    left it newer than the native folder after it. The resumed run wrote it again as a delta
    against that folder, keeping its later time, and the Trainer's rotation (oldest time first)
    then deleted the base. Every folder made a delta is now made older than its base before the
    Trainer can rotate: each folder kept loads."""
    out = tmp_path / "tpde"
    p = run(out, 12, "--tpde", "--kill-after", 6, check=False)
    assert p.returncode == -9, p.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert not tpde._tpde.File(str(out / "checkpoint-4" / "checkpoint.tpde"), None).is_delta()
    t0 = int(datetime.datetime.now().timestamp()) - 1000
    os.utime(out / "checkpoint-2", (t0 - 1, t0 - 1))
    os.utime(out / "checkpoint-6", (t0, t0))
    os.utime(out / "checkpoint-4", (t0 + 2, t0 + 2))  # the kill's state: stored, touched after checkpoint-6
    # Resumed: checkpoint-4 is written again against checkpoint-6 when that is stored (at step 8),
    # and the rotation at step 10 deletes the oldest by time.
    run(out, 10, "--tpde", "--resume", out / "checkpoint-6")
    kept = sorted(os.listdir(out))
    assert kept == ["checkpoint-10", "checkpoint-6", "checkpoint-8"], kept
    for c in kept:
        tpde.transformers.resume(out / c)  # each loads: its base is kept


def test_a_failed_rewrite_keeps_its_folder_s_time(tmp_path):
    from tpde.torch.series import _times_kept

    f = tmp_path / "checkpoint-2" / "checkpoint.tpde"
    f.parent.mkdir()
    f.write_bytes(b"x")
    os.utime(f.parent, (1_000_000_000, 1_000_000_000))
    with pytest.raises(RuntimeError):
        with _times_kept(str(f)):
            (f.parent / "new").write_bytes(b"y")  # what a rewrite does to its folder
            raise RuntimeError("the rewrite failed")
    assert os.stat(f.parent).st_mtime == 1_000_000_000


def test_a_series_continues_from_a_file_another_process_wrote(tmp_path):
    """What a resumed run's callback does with the newest stored folder before the one it stores."""
    a, b = tmp_path / "a.tpde", tmp_path / "b.tpde"
    w = torch.randn(4096)
    first = Series()
    first.save(a, {"w": w})
    first.close()
    s = Series()
    s.continue_from(a)
    s.save(b, {"w": w + 1})
    s.wait()
    f = tpde._tpde.File(str(a), None)
    assert f.is_delta() and f.metadata()["checkpoint.base"] == "b.tpde"
    assert torch.equal(Series().load(a)["w"], w)


def test_best_files_that_cannot_be_given_back_are_a_warning_not_a_failed_run(tmp_path, monkeypatch):
    """Issue 67: a full disk while the callback gives a stored best folder its files back (just
    before the Trainer loads the best model) failed ``train()`` at its very end; the Trainer itself
    only warns of a best folder without weights. It is a warning now, and nothing is left."""
    from types import SimpleNamespace

    best = tmp_path / "checkpoint-2"
    best.mkdir()
    torch.save({"w": torch.ones(2)}, best / "optimizer.pt")
    callback = tpde.transformers.TpdeCallback(background=False)
    _folder.pack(str(best), callback.series, {})

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_folder, "expand", full_disk)
    args = SimpleNamespace(load_best_model_at_end=True, output_dir=str(tmp_path))
    state = SimpleNamespace(best_model_checkpoint=str(best))
    with pytest.warns(UserWarning, match="No space left on device"):
        callback.on_log(args, state, None, logs={"train_runtime": 1.0})
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2"]
