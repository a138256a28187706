"""tpde.torch.dcp: TPDE under torch.distributed.checkpoint, in real multi-process gloo jobs
(dcp_workers.py is one rank), saved with one world size and loaded with another."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402

import tpde  # noqa: E402
from tpde.torch.dcp import TpdeStorageReader, TpdeStorageWriter  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "dcp_workers.py")


def run_job(tmp_path, world, expect_exit=0, **job):
    """Runs ``job`` on ``world`` ranks, each a separate process; returns each rank's report."""
    d = tmp_path / f"job-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    (d / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, str(r), str(world), str(d / "store"), str(d / "job.json"), str(d)], env=env
        )
        for r in range(world)
    ]
    try:
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    reports = []
    for r in range(world):
        f = d / f"rank-{r}.json"
        reports.append(json.loads(f.read_text()) if f.exists() else None)
    if expect_exit == 0:
        assert codes == [0] * world, (codes, reports)
        for rep in reports:
            assert "traceback" not in rep, rep["traceback"]
    return codes, reports


def loads(tmp_path, world, path, version):
    _, reports = run_job(tmp_path, world, action="load", path=str(path), version=version)
    for rep in reports:
        assert "error" not in rep, rep["error"]
        assert rep["bad"] == [], rep["bad"]


def load_error(tmp_path, world, path):
    _, reports = run_job(tmp_path, world, action="load", path=str(path), version=0)
    errors = [rep["error"] for rep in reports if "error" in rep]
    assert errors, "the load should have failed"
    return errors[0]


def test_saved_by_two_ranks_loads_bit_exact_on_three_and_one(tmp_path):
    ck = tmp_path / "ck"
    run_job(tmp_path, 2, action="save", path=str(ck), version=0)
    files = sorted(os.listdir(ck))
    assert files == [".metadata", "rank-00000.tpde", "rank-00001.tpde"]
    # Each rank wrote its own shards: the 37 rows of encoder.weight split 19 + 18.
    with tpde.safe_open(ck / "rank-00000.tpde", "np") as f0, tpde.safe_open(ck / "rank-00001.tpde", "np") as f1:
        assert "model.encoder.weight@0,0" in f0.keys() and "model.encoder.weight@0,0" not in f1.keys()
        assert f1.get_slice("model.encoder.weight@19,0").get_shape() == [18, 24]
        assert "model.decoder.weight@0,15" in f1.keys()  # Shard(1): columns 15..29
        # A replicated tensor, and a plain tensor every rank holds, are stored once.
        both = f0.keys() + f1.keys()
        assert sum(k.startswith("model.norm.weight@") for k in both) == 1
        assert sum(k.startswith("extra.buffers.counts@") for k in both) == 1
    loads(tmp_path, 3, ck, 0)
    loads(tmp_path, 1, ck, 0)


def test_deltas_across_world_sizes(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    run_job(tmp_path, 2, action="save", path=str(a), version=0)
    run_job(tmp_path, 2, action="save", path=str(b), base=str(a), version=1)
    for r in range(2):
        with tpde.safe_open(b / f"rank-{r:05d}.tpde", "np", hints="follow") as f:
            assert f._f().is_delta()
        # Same world size: each rank's delta is smaller than its keyframe.
        assert os.path.getsize(b / f"rank-{r:05d}.tpde") < 0.8 * os.path.getsize(a / f"rank-{r:05d}.tpde")
    loads(tmp_path, 3, b, 1)
    loads(tmp_path, 2, b, 1)
    # A base of another world size: shards that moved are keyframe chunks, never wrong.
    run_job(tmp_path, 3, action="save", path=str(c), base=str(b), version=2)
    loads(tmp_path, 2, c, 2)
    # The chain survives moving the whole folder: hints are relative.
    moved = tmp_path / "moved"
    moved.mkdir()
    for x in (a, b, c):
        shutil.move(str(x), str(moved / x.name))
    loads(tmp_path, 1, moved / "c", 2)


def test_async_save(tmp_path):
    ck = tmp_path / "ck"
    run_job(tmp_path, 2, action="async_save", path=str(ck), version=3)
    loads(tmp_path, 2, ck, 3)


def test_a_save_killed_before_finish_leaves_no_checkpoint(tmp_path):
    ck = tmp_path / "ck"
    codes, _ = run_job(tmp_path, 2, expect_exit=None, action="crash_before_finish", path=str(ck), version=0)
    assert codes[0] == 17
    assert "rank-00000.tpde" in os.listdir(ck)  # the ranks wrote; the metadata never came
    assert load_error(tmp_path, 2, ck)["kind"] == "not-found"
    # Saving again into a used folder: once the new save has begun, the old checkpoint is no
    # longer accepted, and a crash leaves no mix of the two.
    run_job(tmp_path, 2, action="save", path=str(ck), version=0)
    loads(tmp_path, 2, ck, 0)
    run_job(tmp_path, 2, expect_exit=None, action="crash_before_finish", path=str(ck), version=1)
    assert load_error(tmp_path, 2, ck)["kind"] == "not-found"


def _single_state(scale=1.0):
    g = torch.Generator().manual_seed(5)
    return {"w": torch.randn(64, 33, generator=g) * scale, "b": torch.arange(10), "meta": {"epoch": 2}}


def _dcp_single(fn, *args, **kwargs):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is not initialized": one process, as meant
        return fn(*args, **kwargs)


def _unwrap(e):
    failures = getattr(e, "failures", None)
    return next(iter(failures.values()))[0] if failures else e


def test_wrong_or_missing_base_is_a_typed_error(tmp_path):
    with pytest.raises(tpde.TpdeError) as e:
        TpdeStorageWriter(tmp_path / "new", base=tmp_path / "nowhere")
    assert e.value.kind == "base-missing"
    # A folder written by FileSystemWriter is not a TPDE base.
    fs = tmp_path / "fs"
    _dcp_single(dcp.save, _single_state(), storage_writer=dcp.FileSystemWriter(str(fs)))
    with pytest.raises(tpde.TpdeError) as e:
        TpdeStorageWriter(tmp_path / "new", base=fs)
    assert e.value.kind == "base-mismatch"
    with pytest.raises(tpde.TpdeError) as e:
        TpdeStorageReader(fs)
    assert e.value.kind == "malformed"
    # A delta whose base folder is gone fails with base-missing, naming the base.
    a, b = tmp_path / "a", tmp_path / "b"
    _dcp_single(dcp.save, _single_state(), storage_writer=TpdeStorageWriter(a))
    _dcp_single(dcp.save, _single_state(1.001), storage_writer=TpdeStorageWriter(b, base=a))
    target = _single_state(0)
    _dcp_single(dcp.load, target, storage_reader=TpdeStorageReader(b))
    assert torch.equal(target["w"], _single_state(1.001)["w"]) and target["meta"] == {"epoch": 2}
    shutil.rmtree(a)
    # DCP gathers a storage reader's errors into a CheckpointException; ours is inside, typed.
    with pytest.raises(BaseException) as e:
        _dcp_single(dcp.load, _single_state(0), storage_reader=TpdeStorageReader(b))
    err = _unwrap(e.value)
    assert isinstance(err, tpde.TpdeError) and err.kind == "base-missing", err
    # A base whose file was replaced is refused when writing the next delta.
    _dcp_single(dcp.save, _single_state(), storage_writer=TpdeStorageWriter(a))
    c = tmp_path / "c"
    _dcp_single(dcp.save, _single_state(1.01), storage_writer=TpdeStorageWriter(c))
    shutil.copy(c / "rank-00000.tpde", a / "rank-00000.tpde")
    with pytest.raises(BaseException) as e:
        _dcp_single(dcp.save, _single_state(1.02), storage_writer=TpdeStorageWriter(tmp_path / "d", base=a))
    err = _unwrap(e.value)
    assert isinstance(err, tpde.TpdeError) and err.kind == "base-mismatch", err


def test_a_box_read_decodes_the_right_elements(tmp_path):
    from tpde.torch.dcp import _read_box

    g = torch.Generator().manual_seed(1)
    t = torch.randn(300, 7, 11, generator=g)
    tpde.torch.save_file({"t": t}, tmp_path / "t.tpde")
    f = tpde._file(tmp_path / "t.tpde", None)
    for offsets, lengths in [((0, 0, 0), (300, 7, 11)), ((17, 2, 3), (100, 4, 5)), ((299, 6, 10), (1, 1, 1))]:
        box = _read_box(f, "t", offsets, lengths)
        want = t[tuple(slice(o, o + n) for o, n in zip(offsets, lengths))]
        assert torch.equal(box.view(torch.int32), want.contiguous().view(torch.int32))
    with pytest.raises(tpde.TpdeError) as e:
        _read_box(f, "t", (290, 0, 0), (20, 7, 11))
    assert e.value.kind == "malformed"


@pytest.mark.parametrize("layout", ["reverse", "forward"])
@pytest.mark.parametrize("async_save", [False, True])
def test_checkpointer_under_torch_distributed(tmp_path, async_save, layout):
    ck = tmp_path / "ck"
    _, reports = run_job(tmp_path, 2, action="checkpointer", path=str(ck), versions=5, async_save=async_save,
                         layout=layout)
    for rep in reports:
        assert rep["bad"] == [] and rep["steps"] == [400, 500], rep
    # keyframe_every=3, keep_last=2 keeps 400 and 500. Forward: 100 K, 200 D, 300 D, 400 K,
    # 500 D on 400. Reverse: the newest is a keyframe, 400 each rank's delta against it.
    assert sorted(os.listdir(ck)) == [".tpde-writer.lock", "step-0000000400", "step-0000000500"]
    delta, key, base = ("400", "500", "500") if layout == "reverse" else ("500", "400", "400")
    for r in (0, 1):
        with tpde.safe_open(ck / f"step-0000000{delta}" / f"rank-0000{r}.tpde", "np", hints="follow") as f:
            assert f._f().is_delta() and f.metadata()["checkpoint.base_step"] == base
        with tpde.safe_open(ck / f"step-0000000{key}" / f"rank-0000{r}.tpde", "np") as f:
            assert not f._f().is_delta()
    # Loaded by another world size, through DCP directly: the newest, and the rewritten 400
    # (whose .metadata names each file's content digest, unchanged by the rewrite).
    loads(tmp_path, 3, ck / "step-0000000500", 4)
    loads(tmp_path, 3, ck / "step-0000000400", 3)


def test_a_rank_file_of_another_save_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _dcp_single(dcp.save, _single_state(), storage_writer=TpdeStorageWriter(a))
    _dcp_single(dcp.save, _single_state(2.0), storage_writer=TpdeStorageWriter(b))
    shutil.copy(b / "rank-00000.tpde", a / "rank-00000.tpde")
    with pytest.raises(BaseException) as e:
        _dcp_single(dcp.load, _single_state(0), storage_reader=TpdeStorageReader(a))
    err = _unwrap(e.value)
    assert isinstance(err, tpde.TpdeError) and err.kind == "checksum-mismatch", err


def test_lossy_deltas_keep_their_bound_and_exact_items(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    base = {**_single_state(), "optim": {"step": torch.tensor(10.0)}}
    _dcp_single(dcp.save, base, storage_writer=TpdeStorageWriter(a))
    new = {**_single_state(1.0001), "optim": {"step": torch.tensor(11.0)}}
    tau = 1e-3
    _dcp_single(dcp.save, new, storage_writer=TpdeStorageWriter(b, base=a, max_abs_error=tau))
    with tpde.safe_open(b / "rank-00000.tpde", "np", hints="follow") as f:
        assert float(f._f().all_metadata()["tpde.max_abs_error"]) == tau
    got = {**_single_state(0), "optim": {"step": torch.tensor(0.0)}}
    _dcp_single(dcp.load, got, storage_reader=TpdeStorageReader(b))
    err = (got["w"] - new["w"]).abs().max().item()
    assert 0 < err <= tau  # some changes were dropped, none by more than tau
    assert got["optim"]["step"].item() == 11.0 and torch.equal(got["b"], new["b"])  # exact
    with pytest.raises(tpde.TpdeError) as e:
        TpdeStorageWriter(tmp_path / "c", max_abs_error=tau)
    assert e.value.kind == "invalid-argument"


def test_a_base_kept_in_memory_writes_the_same_rank_files(tmp_path):
    from tpde.torch import dcp as tdcp

    for in_memory in (True, False):
        root = tmp_path / f"mem-{in_memory}"
        prev = None
        for k, scale in enumerate([1.0, 1.001, 1.002]):
            path = root / f"step-{k}"
            writer = TpdeStorageWriter(path, base=prev, base_in_memory=in_memory)
            _dcp_single(dcp.save, _single_state(scale), storage_writer=writer)
            prev = path
        # The process holds the last rank file it wrote only when asked to.
        assert (tdcp._LAST is not None) == in_memory
    for k in range(3):
        a = (tmp_path / "mem-True" / f"step-{k}" / "rank-00000.tpde").read_bytes()
        b = (tmp_path / "mem-False" / f"step-{k}" / "rank-00000.tpde").read_bytes()
        assert a == b, k
