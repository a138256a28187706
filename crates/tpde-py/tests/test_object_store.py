"""tpde on object storage: save_file, load_file, safe_open, pack/unpack and the Checkpointer on
s3:// URLs, against a real S3 server process (s3s-fs, which tools/test.sh installs) on
127.0.0.1."""
import os
import shutil
import signal
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


@pytest.mark.parametrize("layout", ["reverse", "forward"])
def test_checkpointer_in_a_bucket_saves_prunes_and_resumes(s3, layout):
    prefix = url(f"run-1-{layout}")
    states = [state(s) for s in range(5)]
    with Checkpointer(prefix, keyframe_every=2, keep_last=2, async_save=True, layout=layout) as ck:
        for step, s in enumerate(states):
            ck.save(step * 10, {"model": s, "step": step})
        ck.wait()
        # Forward: 40 is a keyframe (every second file), 30 a delta on 20, which is kept for it.
        # Reverse: 40 the newest keyframe, 30 written again as a keyframe (the end of a run).
        kept = [20, 30, 40] if layout == "forward" else [30, 40]
        assert ck.steps() == kept
        if layout == "reverse":  # rewritten in the bucket: compressed, no longer raw
            assert "checkpoint.raw" not in tpde.safe_open(ck.path(30), "np").metadata()
        # The writer's lease lies beside them while it writes, and goes when it closes.
        assert sorted(_tpde.list_files(prefix)) == [".tpde-writer.lock"] + [f"step-00000000{s}.tpde" for s in kept]
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


STALLED_WRITER = """
import sys, torch
from tpde.torch import Checkpointer, _writer_lock
_writer_lock.LEASE_SECONDS = float(sys.argv[2])
ck = Checkpointer(sys.argv[1], keyframe_every=3, async_save=sys.argv[3] == "async")
ck.save(0, {"w": torch.zeros(1000)})
ck.wait()
print("saved", flush=True)
sys.stdin.readline()
for step in (10, 11):  # after every step of the replacement: the step order lets them through
    try:
        ck.save(step, {"w": torch.full((1000,), -1.0)})
        ck.wait()
        print("saved", step, flush=True)
    except Exception as e:
        lost = "lost" if "no longer holds" in str(e) else "other"
        print("refused", step, getattr(e, "kind", type(e).__name__), lost, flush=True)
"""


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_writer_that_lost_its_lease_saves_no_more(s3, mode):
    """A writer stopped (SIGSTOP) past its lease, while a replacement takes the prefix over,
    resumes: each save it then asks for fails with a TpdeError and writes nothing (issue 53: it
    warned and went on, both writers' saves returned, and steps became unloadable)."""
    import sys, warnings

    prefix = url(f"lease-race-{mode}/")
    lease = 1.5
    p = subprocess.Popen(
        [sys.executable, "-c", STALLED_WRITER, prefix, str(lease), mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ.copy(),
    )
    try:
        assert p.stdout.readline().strip() == "saved"
        p.send_signal(signal.SIGSTOP)
        time.sleep(lease + 0.5)
        replacement = Checkpointer(prefix, keyframe_every=3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "replacing the expired lease"
            replacement.save(1, {"w": torch.full((1000,), 1.0)})
        replacement.save(2, {"w": torch.full((1000,), 2.0)})
        p.send_signal(signal.SIGCONT)
        p.stdin.write("go\n")
        p.stdin.flush()
        said = [p.stdout.readline().split() for _ in range(2)]
        assert said == [["refused", str(s), "invalid-argument", "lost"] for s in (10, 11)], said
        assert p.wait(timeout=60) == 0
        # The stalled writer wrote nothing; the replacement's steps are whole and its own.
        replacement.save(3, {"w": torch.full((1000,), 3.0)})
        assert replacement.steps()[-3:] == [1, 2, 3], replacement.steps()
        for step in (1, 2, 3):
            assert torch.equal(replacement.load(step)["w"], torch.full((1000,), float(step))), step
        replacement.close()
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()


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


# --- A flaky object store: the S3 server behind a proxy that fails a share of the requests ---

from s3_fault_proxy import FaultProxy  # noqa: E402


def pending_uploads(s3_bucket: Path, proxy: FaultProxy):
    """The multipart uploads the server holds open that this test's proxy saw start (s3s-fs
    keeps one note per upload, and its parts, in the folder it serves)."""
    now = {p.name for p in s3_bucket.parent.iterdir() if p.name.startswith(".upload")}
    return sorted(now - proxy.uploads_before)


def no_upload_left(s3_bucket: Path, proxy: FaultProxy):
    """Every upload a client started was completed or aborted, but for those whose start it never
    heard of (a 500 or a broken answer after the server started one, then a retry that started
    another): S3 has no idempotent start, and only a lifecycle rule finds those (docs/guarantees.md).
    They hold no parts."""
    left = pending_uploads(s3_bucket, proxy)
    assert len(left) <= proxy.lost_creates and all(n.endswith(".json") for n in left), (left, proxy.lost_creates)


@pytest.fixture
def flaky(s3, request, monkeypatch):
    """``(proxy, bucket)``: a bucket of its own reached through a FaultProxy. The extension builds
    a bucket's client from the environment when it first uses that bucket, so the endpoint is the
    proxy's for this test's bucket and stays the server's for the others."""
    upstream = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    rate, seed = request.param
    proxy = FaultProxy(upstream, rate, seed)
    proxy.uploads_before = {p.name for p in s3.parent.iterdir() if p.name.startswith(".upload")}
    name = f"flaky-{int(rate * 100)}-{seed}"
    (s3.parent / name).mkdir()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")
    yield proxy, name
    proxy.close()


def test_https_endpoints_work(s3, tmp_path, monkeypatch):
    """Every store in the cloud speaks HTTPS, which the local server does not: a TLS proxy in front
    of it (a self-signed certificate, accepted with AWS_ALLOW_INVALID_CERTIFICATES) carries a save
    in one PUT, one in parts, and their loads: rustls with the ring provider (issue 70's smaller
    build) does the handshake."""
    from s3_fault_proxy import FaultProxy

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    upstream = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    proxy = FaultProxy(upstream, 0.0, tls=(str(cert), str(key)))
    (s3.parent / "tls").mkdir()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"https://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("AWS_ALLOW_INVALID_CERTIFICATES", "true")
    try:
        for name, st in (("small", state(1)), ("parts", big_state(2))):
            tpde.torch.save_file(st, f"s3://tls/{name}.tpde")
            same(tpde.torch.load_file(f"s3://tls/{name}.tpde"), st)
        assert proxy.counts["requests"] > 4
    finally:
        proxy.close()


def big_state(step: int):
    """A state with a 20 MiB tensor, so that a keyframe is uploaded in parts (16 MiB each)."""
    g = torch.Generator().manual_seed(1000)
    big = torch.randn(5 << 20, generator=g)
    big[: 1 << 16] += step  # deltas are small but not empty
    return {"big": big, **state(step)}


STOPPED_MID_UPLOAD = """
import sys, torch
from tpde.torch import Checkpointer, _writer_lock
_writer_lock.LEASE_SECONDS = float(sys.argv[2])
ck = Checkpointer(sys.argv[1])
big = torch.zeros(5 << 20)  # 20 MiB: uploaded in parts
for step in range(4):
    ck.save(step, {"big": big + step})
print("saved", flush=True)
sys.stdin.readline()
try:
    ck.save(4, {"big": big - 1})
    print("saved 4", flush=True)
except Exception as e:
    print("refused 4", getattr(e, "kind", type(e).__name__), "replaced" in str(e), flush=True)
"""


def test_a_writer_stopped_mid_upload_past_its_lease_never_replaces_the_next_writers_step(s3):
    """Issue 67: writer A saves steps 0-3, starts step 4, and is stopped (SIGSTOP) with its parts
    in flight (held by a proxy) until its lease expires; B takes the prefix over and saves 4-7
    (rewriting 3 against its 4). A then runs again: its upload of step 4 completes no object
    (it expected none there), its save raises, and every step B saved loads as B saved it (it
    replaced B's step 4, and step 3 no longer loaded)."""
    import sys, warnings
    from s3_fault_proxy import FaultProxy

    upstream = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    proxy = FaultProxy(upstream, 0.0)
    prefix, lease = url("stopped-mid-upload/"), 2.0
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}
    a = subprocess.Popen([sys.executable, "-c", STOPPED_MID_UPLOAD, prefix, str(lease)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert a.stdout.readline().strip() == "saved"
        proxy.hold_when = lambda method, path: method == "PUT" and "partNumber" in path
        a.stdin.write("go\n")
        a.stdin.flush()
        deadline = time.time() + 60
        while proxy.held == 0:
            assert time.time() < deadline and a.poll() is None, "A's upload never started"
            time.sleep(0.02)
        a.send_signal(signal.SIGSTOP)
        time.sleep(lease + 0.5)
        b = Checkpointer(prefix)
        states = {s: {"big": torch.full((5 << 20,), float(10 + s))} for s in range(4, 8)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "replacing the expired lease"
            for s, st in states.items():
                b.save(s, st)
            b.wait()
        proxy.release()
        a.send_signal(signal.SIGCONT)
        assert a.stdout.readline().split() == ["refused", "4", "io", "True"]
        assert a.wait(timeout=60) == 0
        assert b.steps()[-5:] == [3, 4, 5, 6, 7]
        assert torch.equal(b.load(3)["big"], torch.full((5 << 20,), 3.0))
        for s, st in states.items():
            same(b.load(s), st)
        b.close()
    finally:
        if a.poll() is None:
            a.send_signal(signal.SIGCONT)
            a.kill()
            a.wait()
        proxy.close()


@pytest.mark.parametrize("flaky", [(0.25, 1)], indirect=True)
def test_no_save_is_lost_when_a_quarter_of_requests_fail(flaky, s3):
    proxy, bucket = flaky
    prefix = f"s3://{bucket}/run"
    states = [big_state(s) for s in range(8)]
    with Checkpointer(prefix, keyframe_every=4, keep_last=8) as ck:
        for step, s in enumerate(states):
            ck.save(step, {"model": s, "step": step})  # each one returns: none raises
        assert ck.steps() == list(range(8))
        for step in (0, 5, 7):
            same(ck.load(step)["model"], states[step])
    assert proxy.counts["requests"] > 100 and sum(proxy.counts[k] for k in FaultProxy.KINDS) > 20, proxy.counts
    no_upload_left(s3, proxy)


@pytest.mark.parametrize("flaky", [(0.30, 2)], indirect=True)
def test_pack_and_async_saves_ride_out_30_percent_faults(flaky, s3, tmp_path):
    from safetensors.torch import save_file as st_save

    proxy, bucket = flaky
    s0 = big_state(0)
    st_save(s0, tmp_path / "s0.safetensors")
    for i in range(4):
        tpde.pack(tmp_path / "s0.safetensors", f"s3://{bucket}/pack/{i}.tpde")
        same(tpde.torch.load_file(f"s3://{bucket}/pack/{i}.tpde"), s0)
    states = [big_state(s) for s in range(4)]
    with Checkpointer(f"s3://{bucket}/async", keyframe_every=2, keep_last=4, async_save=True) as ck:
        for step, s in enumerate(states):
            ck.save(step, {"model": s})
        ck.wait()
        same(ck.load()["model"], states[-1])
    assert sum(proxy.counts[k] for k in FaultProxy.KINDS) > 10, proxy.counts
    no_upload_left(s3, proxy)


@pytest.mark.parametrize("flaky", [(0.0, 3)], indirect=True)
def test_a_failed_upload_is_aborted_and_says_so(flaky, s3, tmp_path):
    from safetensors.torch import save_file as st_save

    proxy, bucket = flaky
    s0 = big_state(0)
    with Checkpointer(f"s3://{bucket}/run", keyframe_every=1) as ck:
        ck.save(0, {"model": s0})
        # Every second part of a multipart upload fails, however often it is tried.
        proxy.fail_when = lambda method, path: method == "PUT" and "partNumber=2" in path
        with pytest.raises(tpde.TpdeError) as e:
            ck.save(1, {"model": big_state(1)})
        assert e.value.kind == "io" and f"s3://{bucket}/run/" in str(e.value), e.value
        assert "nothing was written, its multipart upload was aborted" in str(e.value)
        assert pending_uploads(s3, proxy) == [], "the failed upload was not aborted"
        assert ck.steps() == [0]
        proxy.fail_when = None
        ck.save(2, {"model": big_state(2)})  # the failure blocks nothing
        assert ck.steps() == [0, 2]
        same(ck.load(0)["model"], s0)
    st_save(s0, tmp_path / "s0.safetensors")
    proxy.fail_when = lambda method, path: method == "PUT" and "partNumber=2" in path
    with pytest.raises(tpde.TpdeError) as e:
        tpde.pack(tmp_path / "s0.safetensors", f"s3://{bucket}/pack.tpde")
    assert f"s3://{bucket}/pack.tpde" in str(e.value)
    assert pending_uploads(s3, proxy) == [] and not (s3.parent / bucket / "pack.tpde").exists()


# --- DCP straight to the bucket: every rank its own object, .metadata last ---

from test_dcp import load_error, loads, run_job  # noqa: E402


def test_dcp_saves_to_a_bucket_and_loads_at_any_world_size(s3, tmp_path):
    s1, s2 = url("dcp/s1"), url("dcp/s2")
    run_job(tmp_path, 2, action="save", path=s1, version=0)
    run_job(tmp_path, 2, action="save", path=s2, base=s1, version=1)
    names = sorted(p.name for p in (s3 / "dcp" / "s2").iterdir())
    assert names == [".metadata", "rank-00000.tpde", "rank-00001.tpde"], names
    for r in ("rank-00000.tpde", "rank-00001.tpde"):  # deltas against the base's objects
        assert (s3 / "dcp" / "s2" / r).stat().st_size < (s3 / "dcp" / "s1" / r).stat().st_size
        assert tpde._tpde.File(url(f"dcp/s2/{r}"), None).is_delta()
    loads(tmp_path, 3, s2, 1)
    loads(tmp_path, 1, s2, 1)


def test_dcp_async_and_without_collectives_in_a_bucket(s3, tmp_path):
    run_job(tmp_path, 2, action="async_save", path=url("dcp/async"), version=2)
    loads(tmp_path, 2, url("dcp/async"), 2)
    run_job(tmp_path, 2, action="save", path=url("dcp/solo1"), version=0, use_collectives=False)
    run_job(tmp_path, 2, action="save", path=url("dcp/solo2"), base=url("dcp/solo1"), version=1, use_collectives=False)
    names = sorted(p.name for p in (s3 / "dcp" / "solo2").iterdir())
    assert names == ["__0.metadata", "__1.metadata", "rank-00000.tpde", "rank-00001.tpde"], names
    assert tpde._tpde.File(url("dcp/solo2/rank-00001.tpde"), None).is_delta()
    loads(tmp_path, 2, url("dcp/solo2"), 1)  # each rank its own metadata: the same world size


def test_a_dcp_save_to_a_bucket_killed_before_its_metadata_is_no_checkpoint(s3, tmp_path):
    good, bad = url("dcp/k1"), url("dcp/k2")
    run_job(tmp_path, 2, action="save", path=good, version=0)
    codes, _ = run_job(tmp_path, 2, expect_exit=None, action="crash_before_finish", path=bad, base=good, version=1)
    assert codes[0] == 17
    assert not (s3 / "dcp" / "k2" / ".metadata").exists()
    assert load_error(tmp_path, 2, bad)["kind"] == "not-found"
    loads(tmp_path, 2, good, 0)  # the previous checkpoint is untouched


@pytest.mark.parametrize("layout,async_save,world", [("reverse", False, 2), ("forward", False, 2), ("reverse", True, 3)])
def test_the_distributed_checkpointer_in_a_bucket_saves_prunes_and_resumes(s3, tmp_path, layout, async_save, world):
    prefix = f"ck-dist-{layout}-{async_save}-{world}"
    _, reports = run_job(tmp_path, world, action="checkpointer", path=url(prefix), versions=5, layout=layout,
                         async_save=async_save)
    for rep in reports:
        assert rep["steps"] == [400, 500] and rep["bad"] == [], rep
    # keep_last=2 kept steps 400 and 500 (keyframe_every=3: 400 is a keyframe in the forward
    # layout, a delta against 500 in the reverse); the server keeps emptied folders
    kept = sorted(p.name for p in (s3 / prefix).iterdir() if p.name.startswith("step-") and any(p.iterdir()))
    assert kept == ["step-0000000400", "step-0000000500"], kept
    for step in kept:
        assert sorted(p.name for p in (s3 / prefix / step).iterdir()) == [".metadata"] + [f"rank-0000{r}.tpde" for r in range(world)]
    delta = "400" if layout == "reverse" else "500"
    assert tpde._tpde.File(url(f"{prefix}/step-0000000{delta}/rank-00001.tpde"), None).is_delta()
    loads(tmp_path, 3, url(f"{prefix}/step-0000000500"), 4)  # the newest, resharded to 3 ranks
    loads(tmp_path, 1, url(f"{prefix}/step-0000000400"), 3)


@pytest.mark.parametrize("flaky", [(0.0, 0)], indirect=True)
def test_distributed_saves_to_a_failing_store_leave_no_half_checkpoint(flaky, s3, tmp_path, monkeypatch):
    """Rank 1 cannot upload step 200 (every request for its object fails): the save fails on
    both ranks and leaves nothing of step 200, step 100 still loads. Then the store fails the
    first requests of step 300 (a server restarting): the save rides it out."""
    proxy, bucket = flaky
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    restarts = {"left": 4}

    def fail_when(method, path):
        if "step-0000000200/rank-00001" in path:
            return True
        if "step-0000000300/" in path and restarts["left"] > 0:
            restarts["left"] -= 1
            return True
        return False

    proxy.fail_when = fail_when
    _, reports = run_job(tmp_path, 2, action="checkpointer_outage", path=f"s3://{bucket}/run")
    for rep in reports:
        assert rep["error"]["type"] in ("CheckpointException", "TpdeError"), rep["error"]
        assert rep["steps_after_failure"] == [100] and rep["bad_after_failure"] == [], rep
        assert rep["steps"] == [100, 300] and rep["bad"] == [], rep
    assert restarts["left"] == 0
    step200 = s3.parent / bucket / "run" / "step-0000000200"
    assert not step200.exists() or not any(step200.iterdir()), list(step200.iterdir())  # no object of it
    no_upload_left(s3, proxy)


def test_many_small_tensors_are_read_with_few_requests(s3):
    """read_many of a file's small tensors (LayerNorms, biases) announces them together, so
    neighbours share ranged GETs instead of costing a round trip each; the same through a delta
    and its base."""
    g = torch.Generator().manual_seed(3)
    small = {f"layer.{i}.bias": torch.randn(2049, generator=g) for i in range(200)}  # 1.6 MB: more than an open fetches
    tpde.torch.save_file(small, url("small/k.tpde"))
    tpde.torch.save_file({k: v + 1e-3 for k, v in small.items()}, url("small/d.tpde"), base=url("small/k.tpde"))
    for key in ("small/k.tpde", "small/d.tpde"):
        f = tpde._tpde.File(url(key), None)
        names = f.keys()
        flats = f.read_many(names)
        assert len(flats) == 200
        requests, _ = f.object_stats()
        assert requests <= 4, (key, requests)  # open (1-2) and one coalesced GET; 200 before
    got = tpde.torch.load_file(url("small/d.tpde"))
    for k, v in small.items():
        assert torch.equal(got[k], v + 1e-3)


@pytest.mark.parametrize("flaky", [(0.0, 1)], indirect=True)  # a bucket of its own: (rate, seed) names it
def test_a_rank_killed_mid_upload_leaves_the_previous_step_loadable(flaky, s3, tmp_path):
    """Rank 1 is killed (SIGKILL) as its multipart upload of step 200 sends its first part
    (the proxy in front of the server does it): step 200 never gets a .metadata nor a rank-1
    object, so no reader takes it for a checkpoint, and step 100 loads as before at another
    world size."""
    proxy, bucket = flaky
    killed = []

    def kill_rank_1(method, path):
        if method == "PUT" and "step-0000000200/rank-00001.tpde" in path and "partNumber" in path and not killed:
            pid = int(next(tmp_path.glob("job-*/pid-1")).read_text())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        return False

    proxy.fail_when = kill_rank_1
    prefix = f"s3://{bucket}/ck-killed"
    codes, _ = run_job(tmp_path, 2, expect_exit=None, action="killed_mid_upload", path=prefix)
    assert killed and codes[1] == -9, codes
    step200 = s3.parent / bucket / "ck-killed" / "step-0000000200"
    assert not (step200 / ".metadata").exists() and not (step200 / "rank-00001.tpde").exists()
    loads(tmp_path, 3, f"{prefix}/step-0000000100", 0)
    assert load_error(tmp_path, 2, f"{prefix}/step-0000000200")["kind"] == "not-found"
