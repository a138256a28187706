"""Loads onto a GPU (tpde/torch/_staging.py): a ring of pinned buffers, each stage decoded on
the CPU cores and copied to the device while the next decodes. CI has no GPU, so the pipeline's
logic (the ring, ordering, errors mid-way, Ctrl-C, bounded memory) and every front end's use of
it run here with the copy step replaced by a slow stand-in on a thread; the CUDA tests at the end
run where there is a GPU (tools/gpu-check.sh)."""
from __future__ import annotations

import queue
import signal
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tpde  # noqa: E402
import tpde.torch  # noqa: E402
from tpde.torch import _staging  # noqa: E402

CUDA = torch.cuda.is_available()


class SlowCopier:
    """A CUDA stream's stand-in: copies run later, in order, on a thread of their own, each after
    a pause, reading their source only then, so a ring that refilled a buffer before its copies
    ran would deliver the wrong bytes. ``interrupt_after`` sends SIGINT after that many copies."""

    made: list = []

    def __init__(self, pause: float = 0.002, interrupt_after: int = 0) -> None:
        self.pause, self.interrupt_after = pause, interrupt_after
        self.queue: queue.Queue = queue.Queue()
        self.buffers: list = []
        self.copies = 0
        self.finished = False
        SlowCopier.made.append(self)
        threading.Thread(target=self._run, daemon=True).start()

    def buffer(self, nbytes):
        self.buffers.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    def copy(self, dst, src):
        self.queue.put((dst, src))

    def mark(self):
        done = threading.Event()
        self.queue.put(done)
        return done

    def wait(self, mark):
        mark.wait()

    def finish(self):
        self.mark().wait()
        self.finished = True

    def _run(self):
        while True:
            item = self.queue.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            time.sleep(self.pause)
            item[0].copy_(item[1])
            self.copies += 1
            if self.copies == self.interrupt_after:
                signal.raise_signal(signal.SIGINT)


@pytest.fixture
def staged(monkeypatch):
    """Every torch load goes through the pipeline, onto the CPU, with SlowCopier as the copy step,
    a ring of 2 buffers of the smallest slot (the largest chunk a load touches)."""
    SlowCopier.made = []
    monkeypatch.setattr(_staging, "is_staged", lambda device: True)
    monkeypatch.setattr(_staging, "copier_for", lambda device: SlowCopier())
    monkeypatch.setattr(_staging, "SLOT_BYTES", 1)
    monkeypatch.setattr(_staging, "SLOTS", 2)
    yield SlowCopier.made
    for c in SlowCopier.made:
        assert c.finished and c.queue.empty(), "every copy ended before the load returned"
        assert len(c.buffers) <= 2, "host memory: the ring, nothing more"


def tensors():
    g = torch.Generator().manual_seed(3)
    out = {
        "w": torch.randn(300, 257, generator=g),  # about 300 KB, compressible planes
        "half": torch.randn(64, 999, generator=g).to(torch.bfloat16),
        "ids": torch.arange(50_000, dtype=torch.int64),
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "flags": torch.rand(1000, generator=g) > 0.5,
    }
    for k in range(8):
        out[f"layer{k}.bias"] = torch.randn(100 + 37 * k, generator=g)
    return out


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
    assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def test_load_file_and_safe_open_stream_bit_exact(tmp_path, staged):
    src = tensors()
    tpde.torch.save_file(src, tmp_path / "a.tpde")
    moved = {k: v + 1 if v.is_floating_point() else v for k, v in src.items()}
    tpde.torch.save_file(moved, tmp_path / "b.tpde", base=tmp_path / "a.tpde")
    for path, want in ((tmp_path / "a.tpde", src), (tmp_path / "b.tpde", moved)):
        seen = []
        got = tpde.torch.load_file(path, progress=lambda done, total: seen.append((done, total)))
        assert got.keys() == want.keys()
        for k in want:
            same(got[k], want[k])
        total = sum(t.numel() * t.element_size() for t in want.values())
        assert seen[-1] == (total, total) and len(seen) > 2, "progress stage by stage, to the end"
    assert len(staged[0].buffers) == 2 and len(set(staged[0].buffers)) == 1
    with tpde.safe_open(tmp_path / "b.tpde", "pt") as f:
        same(f.get_tensor("w"), moved["w"])
        same(f.get_slice("w")[17:250], moved["w"][17:250])  # a run of rows: streamed
        same(f.get_slice("w")[5:9, 3:7], moved["w"][5:9, 3:7].contiguous())  # not one run: gathered
        same(f.get_slice("scalar")[...], moved["scalar"])
        assert f.get_slice("w")[3:3].shape == (0, 257)


def test_load_into_streams_into_the_tensors_given(tmp_path, staged):
    src = tensors()
    tpde.torch.save_file(src, tmp_path / "a.tpde")
    into = {k: torch.empty_like(v) for k, v in src.items()}
    into["tied"] = into["w"]  # one storage under two names: decoded once
    tpde.torch.save_file({**src, "tied": src["w"]}, tmp_path / "t.tpde")
    ptr = into["w"].data_ptr()
    assert tpde.torch.load_into(tmp_path / "t.tpde", into) == ([], [])
    assert into["w"].data_ptr() == ptr, "in place"
    for k in src:
        same(into[k], src[k])


def test_checkpointer_load_on_a_device(tmp_path, staged):
    state = {"model": tensors(), "step": 7, "rng": torch.get_rng_state(), "np": np.arange(5)}
    with tpde.torch.Checkpointer(tmp_path / "ck") as ck:
        ck.save(7, state)
        for got in (ck.load(device="cpu"), ck.load(map_location=None)):
            assert got["step"] == 7 and np.array_equal(got["np"], np.arange(5))
            same(got["rng"], state["rng"])
            for k, v in state["model"].items():
                same(got["model"][k], v)
    assert staged, "the loads went through the pipeline"


def test_dcp_reads_boxes_into_device_targets(tmp_path, staged):
    import torch.distributed.checkpoint as dcp
    import warnings
    from torch.distributed.checkpoint.planner import LoadItemType

    from tpde.torch.dcp import TpdeStorageReader, TpdeStorageWriter, _read_to_device

    src = tensors()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one process, no process group: as meant
        dcp.save(dict(src), storage_writer=TpdeStorageWriter(tmp_path / "d"))
        got = {k: torch.empty_like(v) for k, v in src.items()}
        dcp.load(got, storage_reader=TpdeStorageReader(tmp_path / "d"))
    for k in src:
        same(got[k], src[k])

    # A box that is not whole rows lands in a device buffer first, then in its target.
    class Req:
        type = LoadItemType.TENSOR

        def __init__(self, offsets, lengths):
            self.storage_offsets, self.lengths = offsets, lengths

    class Planner:
        committed = []

        def commit_tensor(self, req, target):
            self.committed.append(req)

    tpde.torch.save_file({"t": src["w"]}, tmp_path / "w.tpde")
    f = tpde._file(tmp_path / "w.tpde", None)
    whole, rows, box = torch.empty(300, 257), torch.empty(20, 257), torch.empty(4, 5)
    items = [(Req((0, 0), (300, 257)), "t", whole), (Req((40, 0), (20, 257)), "t", rows), (Req((7, 9), (4, 5)), "t", box)]
    _read_to_device(f, "w.tpde", torch.device("cpu"), items, Planner())
    same(whole, src["w"])
    same(rows, src["w"][40:60])
    same(box, src["w"][7:11, 9:14].contiguous())
    assert len(Planner.committed) == 3


def test_a_damaged_chunk_mid_way_is_a_typed_error_after_the_copies_end(tmp_path, staged):
    src = tensors()
    path = tmp_path / "a.tpde"
    tpde.torch.save_file(src, path, codec="raw")
    data = bytearray(path.read_bytes())
    at = data.find(src["layer7.bias"].numpy().tobytes())  # the last tensor's bytes, stored raw
    assert at > 0
    data[at + 10] ^= 0x40
    path.write_bytes(bytes(data))
    into = {k: torch.zeros_like(v) for k, v in src.items()}
    with pytest.raises(tpde.TpdeError) as e:
        tpde.torch.load_into(path, into)
    assert e.value.kind == "checksum-mismatch" and "layer7.bias" in str(e.value)
    same(into["w"], src["w"])  # stages before the damage were copied and stay
    with pytest.raises(tpde.TpdeError):
        tpde.torch.load_file(path)


def test_ctrl_c_mid_way_stops_the_load_after_the_copies_in_flight(tmp_path, staged, monkeypatch):
    tpde.torch.save_file(tensors(), tmp_path / "a.tpde")
    monkeypatch.setattr(_staging, "copier_for", lambda device: SlowCopier(pause=0.02, interrupt_after=2))
    # Ctrl-C as in an interactive session, whatever an earlier test or library left installed.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            tpde.torch.load_file(tmp_path / "a.tpde")
    finally:
        signal.signal(signal.SIGINT, before)
    assert staged[0].copies < len(tensors()), "stopped before the end"


def test_a_tensor_over_the_size_limit_is_refused_before_its_destination_is_made(tmp_path, staged, monkeypatch):
    path = tmp_path / "a.tpde"
    tpde.torch.save_file({"w": torch.ones(4096)}, path)
    empty = torch.empty

    def only_staging_buffers(*args, **kwargs):
        t = empty(*args, **kwargs)
        assert t.dtype == torch.uint8, f"a destination was made first: {t.dtype} {tuple(t.shape)}"
        return t

    monkeypatch.setattr(torch, "empty", only_staging_buffers)
    for load in (
        lambda: tpde.torch.load_file(path, max_tensor_bytes=1000),
        lambda: tpde.safe_open(path, "pt", max_tensor_bytes=1000).get_slice("w")[0:100],
    ):
        with pytest.raises(tpde.TpdeError) as e:
            load()
        assert e.value.kind == "limit-exceeded", e.value


def test_memory_the_device_or_the_host_cannot_give_is_limit_exceeded(tmp_path, staged, monkeypatch):
    """Issue 67: a staged load turned torch's out-of-memory error (a 16 GiB declared tensor, a
    pinned ring the host cannot give) into torch's RuntimeError, where a load onto the CPU says
    ``limit-exceeded``. And a file of large chunks gets fewer slots, never a larger ring."""
    path = tmp_path / "a.tpde"
    tpde.torch.save_file({"w": torch.ones(4096), "b": torch.zeros(10)}, path)
    empty = torch.empty

    def no_destination(*args, **kwargs):
        if kwargs.get("dtype") != torch.uint8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB")
        return empty(*args, **kwargs)

    class NoPinnedMemory(SlowCopier):
        def buffer(self, nbytes):
            raise RuntimeError(f"CUDA error: out of memory (cudaHostAlloc of {nbytes} bytes)")

    def refused(why):
        with pytest.raises(tpde.TpdeError) as e:
            tpde.torch.load_file(path)
        assert e.value.kind == "limit-exceeded" and "cannot be had" in str(e.value), (why, e.value)

    monkeypatch.setattr(torch, "empty", no_destination)
    refused("the destination")
    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(_staging, "copier_for", lambda device: NoPinnedMemory())
    refused("the ring")
    monkeypatch.setattr(_staging, "copier_for", lambda device: SlowCopier())
    # A ring bounded below one slot's size: one slot, reused, and the bytes still right.
    monkeypatch.setattr(_staging, "RING_BYTES", 1)
    same(tpde.torch.load_file(path)["w"], torch.ones(4096))
    assert len(SlowCopier.made[-1].buffers) == 1


def test_a_device_torch_does_not_know_is_a_tpde_error(tmp_path):
    tpde.torch.save_file({"w": torch.ones(3)}, tmp_path / "a.tpde")
    for device in ("gpu", "cuda:x", 7.5):
        with pytest.raises(tpde.TpdeError) as e:
            tpde.torch.load_file(tmp_path / "a.tpde", device=device)
        assert e.value.kind == "invalid-argument" and repr(device) in str(e.value)
    if not CUDA:
        with pytest.raises(tpde.TpdeError) as e:
            tpde.safe_open(tmp_path / "a.tpde", "pt", device="cuda:0")
        assert "CUDA" in str(e.value)
        with tpde.torch.Checkpointer(tmp_path / "ck") as ck:
            ck.save(1, {"w": torch.ones(2)})
            with pytest.raises(tpde.TpdeError):
                ck.load(device="cuda")
    # Without CUDA, or onto the CPU, nothing changes.
    assert torch.equal(tpde.torch.load_file(tmp_path / "a.tpde", device="cpu")["w"], torch.ones(3))


# -- on a GPU (tools/gpu-check.sh) -----------------------------------------------------------


@pytest.mark.skipif(not CUDA, reason="no CUDA")
def test_cuda_loads_every_way_bit_exact(tmp_path):
    src = tensors()
    tpde.torch.save_file(src, tmp_path / "a.tpde")
    got = tpde.torch.load_file(tmp_path / "a.tpde", device="cuda")
    for k, v in src.items():
        same(got[k], v.cuda())
    with tpde.safe_open(tmp_path / "a.tpde", "pt", device="cuda:0") as f:
        same(f.get_tensor("half"), src["half"].cuda())
        same(f.get_slice("w")[100:200], src["w"][100:200].cuda())
        same(f.get_slice("w")[::2, 1], src["w"][::2, 1].contiguous().cuda())
    into = {k: torch.full_like(v, 7, device="cuda") if v.dtype != torch.bool else torch.zeros_like(v, device="cuda") for k, v in src.items()}
    tpde.torch.load_into(tmp_path / "a.tpde", into)
    for k, v in src.items():
        same(into[k], v.cuda())
    with tpde.torch.Checkpointer(tmp_path / "ck") as ck:
        ck.save(1, {"model": {k: v.cuda() for k, v in src.items()}, "step": 1})
        for state in (ck.load(device="cuda"), ck.load(map_location=None)):
            for k, v in src.items():
                same(state["model"][k], v.cuda())


@pytest.mark.skipif(not CUDA, reason="no CUDA")
def test_cuda_dcp_load_into_gpu_tensors(tmp_path):
    import torch.distributed.checkpoint as dcp
    import warnings

    from tpde.torch.dcp import TpdeStorageReader, TpdeStorageWriter

    src = tensors()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(dict(src), storage_writer=TpdeStorageWriter(tmp_path / "d"))
        got = {k: torch.empty_like(v, device="cuda") for k, v in src.items()}
        dcp.load(got, storage_reader=TpdeStorageReader(tmp_path / "d"))
    for k, v in src.items():
        same(got[k], v.cuda())
