"""tpde.accelerate: Accelerate's save_state/load_state through TPDE; a loop killed mid-run
resumes bit for bit (weights, optimizer, scheduler and RNG states) as the uninterrupted run."""
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("accelerate")
import tpde  # noqa: E402
import tpde.accelerate  # noqa: E402

import frameworks  # noqa: E402


def run(*args, check=True):
    return frameworks.run("accelerate_run.py", *args, check=check)


def test_a_killed_loop_resumes_bit_for_bit_and_the_newest_opens_accelerate_s_way(tmp_path):
    run(tmp_path / "plain", 12, "--weights", tmp_path / "plain.safetensors")
    project = tmp_path / "tpde"
    p = run(project, 12, "--tpde", "--kill-after", 8, check=False)
    assert p.returncode == -9, p.stderr[-3000:]
    checkpoints = project / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == ["checkpoint_1", "checkpoint_2", "checkpoint_3"]  # total_limit=3
    for c in ("checkpoint_1", "checkpoint_2"):
        # no pickle beside it, and a note saying what it is and how to export it (issue 70)
        assert sorted(os.listdir(checkpoints / c)) == ["TPDE-README.txt", "checkpoint.tpde"]
        assert f"tpde unpack {c} -o {c}-exported" in (checkpoints / c / "TPDE-README.txt").read_text()
    # the newest as Accelerate wrote it (issue 58)
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl"} <= set(os.listdir(checkpoints / "checkpoint_3"))
    assert tpde._tpde.File(str(checkpoints / "checkpoint_1" / "checkpoint.tpde"), None).is_delta()  # against _2
    files = tpde.safe_open(checkpoints / "checkpoint_2" / "checkpoint.tpde", "pt", hints="follow").keys()
    assert any(k.startswith("files/random_states_0.pkl/") for k in files)  # the RNG states are stored
    assert any(k.startswith("files/optimizer.bin/") for k in files)
    # accelerator.load_state() without TPDE resumes from the newest
    shutil.copytree(project, tmp_path / "own")
    run(tmp_path / "own", 12, "--resume", "--weights", tmp_path / "own.safetensors")
    run(project, 12, "--tpde", "--resume", "--weights", tmp_path / "resumed.safetensors")
    plain = load_file(tmp_path / "plain.safetensors")
    for name in ("own", "resumed"):
        resumed = load_file(tmp_path / f"{name}.safetensors")
        assert plain.keys() == resumed.keys()
        for k in plain:
            assert torch.equal(plain[k], resumed[k]), (name, k)
    # the resumed run stored checkpoint_3 (an earlier process's newest) at its first save
    assert sorted(os.listdir(checkpoints)) == ["checkpoint_3", "checkpoint_4", "checkpoint_5"]
    assert sorted(os.listdir(checkpoints / "checkpoint_3")) == ["TPDE-README.txt", "checkpoint.tpde"]
    with pytest.raises(tpde.TpdeError, match="newest is 'native' or 'tpde'"):
        tpde.accelerate.save_state(object(), str(tmp_path), newest="pickle")


def test_two_processes_resume_bit_for_bit(tmp_path):
    """Two processes (DDP over gloo, Accelerate's MULTI_CPU) under torchrun, both killed right
    after the save of step 8 (the folder before it stored, half stored or not yet: each loads); the resumed
    run ends with the uninterrupted run's weights, which depend on both processes' RNG states."""

    def launch(*args, check=True):
        torchrun = ("-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(29500 + os.getpid() % 1000))
        return frameworks.run("accelerate_run.py", *args, check=check, launcher=torchrun)

    launch(tmp_path / "plain", 12, "--weights", tmp_path / "plain.safetensors")
    project = tmp_path / "tpde"
    assert launch(project, 12, "--tpde", "--kill-after", 8, check=False).returncode != 0
    files = tpde.safe_open(project / "checkpoints" / "checkpoint_1" / "checkpoint.tpde", "pt", hints="follow").keys()
    assert any(k.startswith("files/random_states_1.pkl/") for k in files)  # the second process's RNG states
    launch(project, 12, "--tpde", "--resume", "--weights", tmp_path / "resumed.safetensors")
    plain, resumed = load_file(tmp_path / "plain.safetensors"), load_file(tmp_path / "resumed.safetensors")
    for k in plain:
        assert torch.equal(plain[k], resumed[k]), k


def test_sharded_accelerate_states_are_refused_with_the_way_that_works(tmp_path):
    import types

    import tpde.accelerate
    from accelerate.utils import DistributedType

    fsdp = types.SimpleNamespace(distributed_type=DistributedType.FSDP)
    with pytest.raises(tpde.TpdeError, match=r"under FSDP .*tpde\.torch\.dcp") as e:
        tpde.accelerate.save_state(fsdp, str(tmp_path))
    assert e.value.kind == "unsupported-feature" and os.listdir(tmp_path) == []
