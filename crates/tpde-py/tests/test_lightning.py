"""tpde.lightning.TpdeCheckpointIO with a real Lightning Trainer: a run killed mid-training
resumes from its TPDE checkpoint bit for bit, as the uninterrupted run; nothing is pickled."""
import os
import re

import pytest
import torch

pytest.importorskip("lightning")
from safetensors.torch import load_file  # noqa: E402

import tpde  # noqa: E402
from tpde.torch import Series  # noqa: E402

import frameworks  # noqa: E402


def run(*args, check=True):
    return frameworks.run("lightning_run.py", *args, check=check)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The weights after 14 steps, with Lightning's own TorchCheckpointIO, never interrupted."""
    d = tmp_path_factory.mktemp("uninterrupted")
    run(d / "ckpt", 14, "--io", "torch", "--weights", d / "w.safetensors")
    return load_file(d / "w.safetensors")


@pytest.mark.parametrize("io", ["tpde", "async"])
def test_a_killed_run_resumes_bit_for_bit(tmp_path, io, uninterrupted):
    ckpt = tmp_path / "ckpt"
    p = run(ckpt, 14, "--io", io, "--kill-after", 12, "--top-k", 4, check=False)
    assert p.returncode == -9, p.stderr[-3000:]
    names = sorted(os.listdir(ckpt))
    # save_top_k=4 on "step" keeps steps 8..11 (step 12's save never ran), and a link last.ckpt
    assert names == ["TPDE-README.txt", "epoch=1-step=10.ckpt", "epoch=1-step=8.ckpt", "epoch=1-step=9.ckpt",
                     "epoch=2-step=11.ckpt"] + (["last.ckpt"] if io == "tpde" else []), names
    deltas = 0
    for name in names[1:]:
        assert (ckpt / name).read_bytes()[:5] == b"\x89TPDE"  # a TPDE file, not torch.save's zip of a pickle
        f = tpde.safe_open(ckpt / name, "pt")
        deltas += f._f().is_delta()
        state = f.metadata()["checkpoint.state"]
        assert "pytorch-lightning_version" in state and "hyper_parameters" in state
    assert deltas >= 2
    run(tmp_path / "resumed", 14, "--io", "tpde", "--resume", ckpt / "epoch=1-step=10.ckpt", "--weights",
        tmp_path / "w.safetensors")
    resumed = load_file(tmp_path / "w.safetensors")
    assert resumed.keys() == uninterrupted.keys()
    for k in resumed:
        assert torch.equal(resumed[k], uninterrupted[k]), k


def test_the_newest_opens_lightning_s_way_by_default_and_export_gives_any_back(tmp_path, uninterrupted):
    """The default (newest="native", issue 70): the newest file is torch.save's, so torch.load,
    load_from_checkpoint and fit(ckpt_path=...) without the plug-in open it; the ones before it
    are TPDE, and export() writes any of them back as Lightning writes it."""
    from frameworks.lightning_run import Regressor

    import tpde.lightning

    ckpt = tmp_path / "ckpt"
    p = run(ckpt, 14, "--io", "native", "--kill-after", 11, "--top-k", 4, check=False)
    assert p.returncode == -9, p.stderr[-3000:]
    names = sorted(os.listdir(ckpt))
    assert names == ["TPDE-README.txt"] + [f"epoch=1-step={s}.ckpt" for s in (10, 7, 8, 9)] + ["last.ckpt"], names
    # an older one reaches torch.load or load_from_checkpoint in torch's words (the magic's first
    # bytes read as opcodes); the folder's note says what the files are and how to export one
    with pytest.raises(Exception, match="Unsupported operand 84"):
        torch.load(ckpt / "epoch=1-step=9.ckpt", weights_only=True)
    with pytest.raises(Exception, match="Unsupported operand 84"):
        Regressor.load_from_checkpoint(ckpt / "epoch=1-step=9.ckpt")
    note = (ckpt / "TPDE-README.txt").read_text()
    assert "stored by TPDE" in note and "tpde.lightning.export(" in note
    assert re.search(r"tpde unpack epoch=\d+-step=\d+\.ckpt -o eval\.ckpt", note), note
    newest = ckpt / "epoch=1-step=10.ckpt"
    assert os.readlink(ckpt / "last.ckpt").endswith("epoch=1-step=10.ckpt")
    assert newest.read_bytes()[:2] == b"PK"  # torch.save's zip
    assert all((ckpt / f"epoch=1-step={s}.ckpt").read_bytes()[:5] == b"\x89TPDE" for s in (7, 8, 9))
    assert tpde._tpde.File(str(ckpt / "epoch=1-step=8.ckpt"), None).is_delta()
    assert torch.load(newest, weights_only=True)["global_step"] == 10
    model = Regressor.load_from_checkpoint(newest)
    run(tmp_path / "resumed", 14, "--io", "torch", "--resume", newest, "--weights", tmp_path / "w.safetensors")
    resumed = load_file(tmp_path / "w.safetensors")
    for k in resumed:
        assert torch.equal(resumed[k], uninterrupted[k]), k
    assert torch.equal(model.state_dict()["net.0.weight"], torch.load(newest)["state_dict"]["net.0.weight"])
    # any TPDE checkpoint back as Lightning writes it
    nine = tpde.lightning.export(ckpt / "epoch=1-step=9.ckpt", tmp_path / "nine.ckpt")
    back, stored = torch.load(nine, weights_only=True), Series().load(ckpt / "epoch=1-step=9.ckpt")
    assert back["global_step"] == 9 and back.keys() == stored.keys()
    for k, v in stored["state_dict"].items():
        assert torch.equal(back["state_dict"][k], v), k
    with pytest.raises(tpde.TpdeError, match="exists"):
        tpde.lightning.export(ckpt / "epoch=1-step=9.ckpt", nine)
    # and so does the command: `tpde unpack` of a .ckpt to a .ckpt writes torch.save's file
    frameworks.tpde_command("unpack", ckpt / "epoch=1-step=8.ckpt", "-o", tmp_path / "eight.ckpt")
    eight = torch.load(tmp_path / "eight.ckpt", weights_only=True)
    assert eight["global_step"] == 8
    assert torch.equal(eight["state_dict"]["net.0.weight"], Series().load(ckpt / "epoch=1-step=8.ckpt")["state_dict"]["net.0.weight"])
    # a torch.save file is taken over: the plug-in resumes from it
    run(tmp_path / "taken", 14, "--io", "tpde", "--resume", newest, "--weights", tmp_path / "t.safetensors")
    assert torch.equal(load_file(tmp_path / "t.safetensors")["net.0.weight"], uninterrupted["net.0.weight"])


def test_deleting_a_checkpoint_keeps_the_others_loadable(tmp_path):
    s = Series(keyframe_every=10)
    states = {}
    for i in range(5):
        states[i] = {"w": torch.arange(1000, dtype=torch.float32) * (1 + i / 100), "i": i}
        s.save(tmp_path / f"c{i}.ckpt", states[i])
    s.wait()
    assert [tpde._tpde.File(str(tmp_path / f"c{i}.ckpt"), None).is_delta() for i in range(5)] == [True] * 4 + [False]
    s.remove(tmp_path / "c2.ckpt")  # c1 was a delta against it
    s.remove(tmp_path / "c4.ckpt")  # the newest keyframe: c3 was a delta against it
    for i in (0, 1, 3):
        got = Series().load(tmp_path / f"c{i}.ckpt")
        assert torch.equal(got["w"], states[i]["w"]) and got["i"] == i
    assert sorted(os.listdir(tmp_path)) == ["c0.ckpt", "c1.ckpt", "c3.ckpt"]
    # writing over a file that others are deltas against keeps them loadable too
    s.save(tmp_path / "c3.ckpt", {"w": torch.zeros(1000), "i": -1})
    for i in (0, 1):
        assert torch.equal(Series().load(tmp_path / f"c{i}.ckpt")["w"], states[i]["w"])


def test_state_that_json_cannot_carry_is_an_error_naming_it(tmp_path):
    from tpde.lightning import TpdeCheckpointIO

    io = TpdeCheckpointIO()
    with pytest.raises(tpde.TpdeError, match=r"hyper_parameters/schedule: a set cannot be saved"):
        io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "hyper_parameters": {"schedule": {1, 2}}},
                           tmp_path / "x.ckpt")
    assert os.listdir(tmp_path) == []
