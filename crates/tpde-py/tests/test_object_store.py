"""tpde on object storage: save_file, load_file, safe_open, pack/unpack and the Checkpointer on
s3:// URLs, against a real S3 server process (s3s-fs, which tools/test.sh installs) on
127.0.0.1."""
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import tpde
import tpde.numpy
import tpde.torch
from tpde import _tpde
from tpde.torch import Checkpointer

BUCKET = "tpde-py"


def _s3s_fs() -> str:
    exe = os.environ.get("S3S_FS") or shutil.which("s3s-fs") or str(Path.home() / ".cargo/bin/s3s-fs")
    if not os.path.isfile(exe):
        pytest.fail("s3s-fs is not installed (cargo install s3s-fs --features binary); tools/test.sh installs it")
    return exe


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    root = tmp_path_factory.mktemp("s3")
    (root / BUCKET).mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [_s3s_fs(), "--host", "127.0.0.1", "--port", str(port), "--access-key", "AK", "--secret-key", "SK", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert server.poll() is None and time.time() < deadline, "s3s-fs did not start"
            time.sleep(0.05)
    # The extension reads these once, when it first talks to the bucket.
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="AK",
        AWS_SECRET_ACCESS_KEY="SK",
        AWS_REGION="us-east-1",
        AWS_ALLOW_HTTP="true",
    )
    yield root / BUCKET
    server.terminate()
    server.wait()


def url(key: str) -> str:
    return f"s3://{BUCKET}/{key}"


def state(step: int):
    g = torch.Generator().manual_seed(step)
    return {
        "w": torch.randn(300, 200, generator=g),
        "h": torch.randn(64, 64, generator=g).to(torch.bfloat16),
        "n": torch.arange(10, dtype=torch.int64) + step,
    }


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k


def test_save_load_and_slice_through_a_delta_in_a_bucket(s3):
    s0, s1 = state(0), state(1)
    s1["w"] = s0["w"] + 1e-3 * torch.randn(300, 200)
    tpde.torch.save_file(s0, url("files/s0.tpde"))
    report = tpde.torch.save_file(s1, url("files/s1.tpde"), base=url("files/s0.tpde"))
    assert report["delta_tensors"] == 3
    assert (s3 / "files" / "s1.tpde").stat().st_size == report["file_bytes"]
    same(tpde.torch.load_file(url("files/s1.tpde")), s1)
    with tpde.safe_open(url("files/s1.tpde"), framework="pt") as f:
        assert f.get_slice("w")[10:12].equal(s1["w"][10:12])
        # Under 256 KiB: the first GET brought the whole object.
        requests, received = f._f().object_stats()
        assert requests == 1 and received == report["file_bytes"], (requests, received)


def test_local_files_report_no_object_stats(tmp_path):
    tpde.numpy.save_file({"a": np.arange(4, dtype=np.float32)}, tmp_path / "a.tpde")
    assert _tpde.File(str(tmp_path / "a.tpde"), None).object_stats() is None


def test_pack_and_unpack_with_urls(s3, tmp_path):
    from safetensors.torch import load_file as st_load
    from safetensors.torch import save_file as st_save

    s0 = state(3)
    st_save(s0, tmp_path / "s0.safetensors")
    tpde.pack(tmp_path / "s0.safetensors", url("pack/s0.tpde"))
    tpde.unpack(url("pack/s0.tpde"), tmp_path / "back.safetensors")
    same(st_load(tmp_path / "back.safetensors"), s0)
    assert tpde.copy(url("pack/s0.tpde"), tmp_path / "s0.tpde") == (s3 / "pack" / "s0.tpde").stat().st_size
    assert (tmp_path / "s0.tpde").read_bytes() == (s3 / "pack" / "s0.tpde").read_bytes()


def test_checkpointer_in_a_bucket_saves_prunes_and_resumes(s3):
    prefix = url("run-1")
    states = [state(s) for s in range(5)]
    with Checkpointer(prefix, keyframe_every=2, keep_last=2, async_save=True) as ck:
        for step, s in enumerate(states):
            ck.save(step * 10, {"model": s, "step": step})
        ck.wait()
        # 40 is a keyframe (every second file), 30 a delta on 20, which is kept for it.
        assert ck.steps() == [20, 30, 40]
        # The writer's lease lies beside them while it writes, and goes when it closes.
        assert sorted(_tpde.list_files(prefix)) == [
            ".tpde-writer.lock", "step-0000000020.tpde", "step-0000000030.tpde", "step-0000000040.tpde"]
        same(ck.load()["model"], states[4])
        same(ck.load(30)["model"], states[3])
        # A second writer on the prefix is refused, naming the holder; a reader is not.
        other = Checkpointer(prefix, keyframe_every=2)
        with pytest.raises(tpde.TpdeError, match="another Checkpointer is writing") as e:
            other.save(50, {"model": states[0], "step": 5})
        assert f"pid {os.getpid()}" in str(e.value)
        same(other.load()["model"], states[4])
    assert ".tpde-writer.lock" not in _tpde.list_files(prefix)
    # A new Checkpointer on the same prefix (a restarted job) finds them.
    again = Checkpointer(prefix, keyframe_every=2)
    assert again.latest() == 40
    with pytest.raises(tpde.TpdeError) as e:
        again.load(50)
    assert e.value.kind == "not-found"


def test_bad_urls_and_missing_objects_are_typed_errors(s3):
    with pytest.raises(tpde.TpdeError) as e:
        tpde.safe_open(url("nothing/here.tpde"))
    assert e.value.kind == "not-found" and url("nothing/here.tpde") in str(e.value)
    with pytest.raises(tpde.TpdeError) as e:
        tpde.safe_open("gs://bucket/x.tpde")
    assert e.value.kind == "unsupported-feature"
    with pytest.raises(tpde.TpdeError) as e:
        tpde.torch.save_file(state(0), "s3://b/../x.tpde")
    assert e.value.kind == "invalid-argument"
