"""progress= of long saves, loads, packs and unpacks: a callable sees the bytes go by, a bar draws on a
terminal (and nothing for short work), and an exception from the callable stops the work,
leaving no file."""
import io
import os

import numpy as np
import pytest

import tpde
import tpde.numpy
import tpde.torch
from tpde._progress import Bar, resolve


def tensors(n=6, size=12_000_000):
    # Several batches of the writer (64 MiB each), so progress is reported along the way.
    rng = np.random.default_rng(0)
    return {f"w{i}": rng.standard_normal(size).astype(np.float32) for i in range(n)}


def test_a_callable_sees_the_bytes_go_by(tmp_path):
    x = tensors()
    total = sum(a.nbytes for a in x.values())
    seen = []
    tpde.numpy.save_file(x, tmp_path / "a.tpde", progress=lambda done, all: seen.append((done, all)))
    assert seen and seen[-1] == (total, total)
    assert all(b[0] >= a[0] for a, b in zip(seen, seen[1:])), seen
    seen.clear()
    tpde.unpack(tmp_path / "a.tpde", tmp_path / "a.safetensors", progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (total, total)
    seen.clear()
    tpde.pack(tmp_path / "a.safetensors", tmp_path / "b.tpde", progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (total, total)
    for load in (tpde.numpy.load_file, tpde.torch.load_file):
        seen.clear()
        back = load(tmp_path / "b.tpde", progress=lambda d, t: seen.append((d, t)))
        assert seen[-1] == (total, total) and sorted(back) == sorted(x)


def test_an_exception_from_the_callable_stops_the_save_and_leaves_nothing(tmp_path):
    calls = []

    def stop(done, total):
        calls.append(done)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tpde.numpy.save_file(tensors(n=12), tmp_path / "a.tpde", progress=stop)
    assert calls and os.listdir(tmp_path) == []


def test_the_bar_draws_only_for_long_work():
    out = io.StringIO()
    bar = Bar("saving x", out)
    bar(10, 100)
    bar(100, 100)  # done within half a second: nothing drawn
    assert out.getvalue() == ""
    bar = Bar("saving x", out)
    bar.start -= 1.0  # running for a second
    bar(50_000_000, 100_000_000)
    bar(100_000_000, 100_000_000)
    lines = out.getvalue().split("\r")
    assert "saving x" in lines[1] and " 50.0%" in lines[1] and "100.0% 100/100 MB" in lines[-1]
    assert out.getvalue().endswith("\n")


def test_progress_arguments():
    assert resolve(False, "x") is None
    assert isinstance(resolve(True, "x"), Bar)
    f = lambda d, t: None  # noqa: E731
    assert resolve(f, "x") is f
    assert resolve(None, "x") is None  # stderr is not a terminal under pytest
    with pytest.raises(tpde.TpdeError, match="progress"):
        resolve(3, "x")
