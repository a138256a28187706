#!/usr/bin/env python3
"""Loading onto a GPU: every way TPDE offers next to safetensors and torch.load, in one run.

    python3 tools/bench/cuda_loads.py [--mb 1024] [--runs 5] [--dir DIR] [--device cuda]

Two checkpoints of at least --mb MB each are made in --dir (default: a temporary folder):

- a bf16 model: 16 tensors of N(0, 0.02), as safetensors, as a TPDE keyframe (the default
  codec) and as torch.save's file;
- an fp32 training state: the weights of a stack of linear layers and their Adam moments after
  three real Adam steps, the same three ways, and as a Checkpointer step (its newest is stored
  raw, as a resume reads it).

Each path loads each checkpoint onto --device, the paths interleaved round by round, from the
page cache (every file is read once first), the device synchronized before the clock stops.
Reported: the median seconds and GB/s of logical bytes, the ratio to safetensors' own
`load_file(device=...)`, and the resident host memory the load added at its peak (sampled; the
staging ring's pinned buffers stay cached by torch after the first round, so its size is
printed once above the tables; the file's memory map counts once its pages are read). Every TPDE load is checked bit for bit. Run with
--device cpu to try the script without a GPU: the loads then stay on the CPU, and two more rows
stream through the ring, with a CPU copy in place of the DMA, and with no copy at all (the
decode into the ring alone: what the pipeline reaches when the DMA costs nothing).
"""
import argparse
import gc
import os
import platform
import statistics
import tempfile
import threading
import time

import torch
from safetensors.torch import load_file as st_load
from safetensors.torch import save_file as st_save

import tpde
import tpde.torch
from tpde.torch import _staging


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} threads)"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    return 0


class Peak:
    """The most resident memory above where it started, sampled every 2 ms on a thread (VmHWM
    cannot be reset everywhere: gVisor, on the GPU machine, has no clear_refs)."""

    def __enter__(self):
        self.base = self.top = rss()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self):
        while not self.done.wait(0.002):
            self.top = max(self.top, rss())

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self.top = max(self.top, rss())
        self.added = self.top - self.base


def bf16_model(mb):
    g = torch.Generator().manual_seed(0)
    cols = 8192
    rows = max(1, mb * (1 << 20) // 16 // (cols * 2))
    return {f"layers.{k}.weight": (torch.randn(rows, cols, generator=g) * 0.02).to(torch.bfloat16) for k in range(16)}


def adam_state(mb):
    torch.manual_seed(1)
    width = 2048
    layers = max(1, mb * (1 << 20) // (3 * 4 * width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        x = torch.randn(8, width)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    flat = {}
    for name, p in model.named_parameters():
        s = opt.state[p]
        flat[f"model.{name}"] = p.detach().clone()
        flat[f"optim.{name}.exp_avg"] = s["exp_avg"].clone()
        flat[f"optim.{name}.exp_avg_sq"] = s["exp_avg_sq"].clone()
    return flat


class CpuCopier:
    """The pipeline's copy step done on the CPU, at once: what the ring costs without a GPU. Its
    buffers are kept from load to load, as torch's caching host allocator keeps pinned ones."""

    cache: dict = {}

    def __init__(self):
        self.taken = 0

    def buffer(self, nbytes):
        kept = CpuCopier.cache.setdefault(nbytes, [])
        while len(kept) <= self.taken:
            kept.append(torch.empty(nbytes, dtype=torch.uint8))
        self.taken += 1
        return kept[self.taken - 1]

    def copy(self, dst, src):
        dst.copy_(src)

    def mark(self):
        return None

    def wait(self, mark):
        pass

    def finish(self):
        pass


class NoCopier(CpuCopier):
    """No copy at all: the pipeline's decode into the ring alone, what a free DMA would leave."""

    def copy(self, dst, src):
        pass


def ring_on_cpu(path, copier):
    staged, copier_for = _staging.is_staged, _staging.copier_for
    _staging.is_staged, _staging.copier_for = (lambda d: True), (lambda d: copier())
    try:
        return tpde.torch.load_file(path, progress=False)
    finally:
        _staging.is_staged, _staging.copier_for = staged, copier_for


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    device = torch.device(a.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    work = a.dir or tempfile.mkdtemp(prefix="tpde-cuda-loads-")
    os.makedirs(work, exist_ok=True)
    print(f"cpu: {cpu_name()}")
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        print(f"gpu: {p.name}, {p.total_memory / 2**30:.0f} GiB; torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"staging ring: {_staging.SLOTS} pinned buffers of {_staging.SLOT_BYTES >> 20} MiB (or the largest chunk)")
    print(f"files in {work}; medians of {a.runs} interleaved rounds, page cache warm\n")

    for kind, make in (("bf16 model", bf16_model), ("fp32 state with Adam moments", adam_state)):
        tensors = make(a.mb)
        logical = sum(t.numel() * t.element_size() for t in tensors.values())
        st, tp, pt = (os.path.join(work, f"{kind.split()[0]}.{ext}") for ext in ("safetensors", "tpde", "pt"))
        st_save(tensors, st)
        tpde.torch.save_file(tensors, tp, progress=False)
        torch.save(tensors, pt)
        ck_dir = os.path.join(work, f"{kind.split()[0]}-ck")
        with tpde.torch.Checkpointer(ck_dir) as ck:
            ck.save(1, tensors)
        for path in (st, tp, pt):
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass
        on_device = {k: torch.empty_like(v, device=device) for k, v in tensors.items()}
        paths = {
            "safetensors load_file(device=)": lambda: st_load(st, device=str(device)),
            "safetensors load_file, then .to(device)": lambda: {k: v.to(device) for k, v in st_load(st).items()},
            "torch.load(map_location=device)": lambda: torch.load(pt, map_location=device, weights_only=True),
            "tpde load_file(device=)": lambda: tpde.torch.load_file(tp, device=device, progress=False),
            "tpde load_into(tensors on the device)": lambda: tpde.torch.load_into(tp, on_device),
            "tpde load_file, then .to(device) (before)": lambda: {
                k: v.to(device) for k, v in tpde.torch.load_file(tp, progress=False).items()
            },
            "tpde Checkpointer.load(device=)": lambda: tpde.torch.Checkpointer(ck_dir).load(device=device),
        }
        if device.type == "cpu":
            paths["tpde load_file through the ring (a CPU copy for the DMA)"] = lambda: ring_on_cpu(tp, CpuCopier)
            paths["tpde decode into the ring alone (no copy: the DMA's bound)"] = lambda: ring_on_cpu(tp, NoCopier)
        times = {name: [] for name in paths}
        peaks = {name: [] for name in paths}
        for r in range(a.runs + 1):  # the first round warms up (CUDA context, pinned pool)
            for name, load in paths.items():
                gc.collect()
                with Peak() as peak:
                    t0 = time.perf_counter()
                    out = load()
                    sync()
                    dt = time.perf_counter() - t0
                if r == 0 and name.startswith("tpde") and "no copy" not in name:
                    got = on_device if name.startswith("tpde load_into") else out
                    for k, v in tensors.items():
                        assert torch.equal(got[k].cpu().view(-1).view(torch.uint8), v.view(-1).view(torch.uint8)), (name, k)
                del out
                if r:
                    times[name].append(dt)
                    peaks[name].append(peak.added)
        ratio = os.path.getsize(tp) / os.path.getsize(st)
        print(f"## {kind}: {logical / 1e9:.2f} GB, {len(tensors)} tensors; TPDE keyframe {ratio:.3f} of safetensors' file")
        print(f"| path | s | GB/s | vs safetensors device= | host peak added, MB |")
        print("|---|---:|---:|---:|---:|")
        ref = statistics.median(times["safetensors load_file(device=)"])
        for name in paths:
            t = statistics.median(times[name])
            print(
                f"| {name} | {t:.3f} | {logical / t / 1e9:.2f} | {ref / t:.2f}x | "
                f"{statistics.median(peaks[name]) / 1e6:,.0f} |"
            )
        print()
        del tensors, on_device
        for path in (st, tp, pt):
            os.remove(path)


if __name__ == "__main__":
    main()
