#!/usr/bin/env python3
"""tpde.torch.Checkpointer's two layouts next to torch.save and safetensors, on a real training run.

    python3 tools/bench/checkpointer.py CKPT_DIR [--out DIR] [--keyframe-every 10] [--runs 3] [--cold]

CKPT_DIR holds the safetensors checkpoints of tools/finetune_checkpoints.py (weights, both AdamW
moments, the step counter, every K steps of a real fine-tune). Each becomes the state a training
loop would hand its checkpoint code ({"model": ..., "optim": {"exp_avg": ..., "exp_avg_sq": ...,
"step": ...}}), and the series is saved, in order, by each contender into its own folder under
--out (default: a temporary folder on the same disk as /tmp):

- tpde reverse: the Checkpointer's default layout (the newest checkpoint a keyframe stored raw,
  the one before it compressed again as a reverse delta on a background thread), synchronous:
  the loop is stalled for the newest's write;
- tpde reverse async: the same with async_save=True: the stall is the snapshot copy; the write
  overlaps the training that follows (taken to be longer than a save: the previous save is
  awaited outside the timed call, and the time that took is reported as the drain);
- tpde reverse compressed: the same with raw_newest=False (the newest a compressed keyframe);
- tpde forward: layout='forward' (each checkpoint a delta against the one before), synchronous;
- torch.save of the nested state, one file per step;
- safetensors.torch.save_file of the flat tensors, one file per step.

Reported: the folder's size (all steps), the median stall per save, and the time a fresh
process takes to load the newest step (timed inside that process, after its imports; the
resume after a crash), each the median of --runs runs; then, for the Checkpointer's layouts,
the time to restore each retained step relative to the newest (in this process). The page cache
is warm for loads (the files were just written): this measures decoding, not disk; with --cold
(root only) the page cache is dropped before each fresh-process load, so the newest step is read
from the disk, where reading fewer bytes pays. Every tpde restore is checked bit for bit.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file as st_load
from safetensors.torch import save_file as st_save

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "tpde-py", "python")
sys.path.insert(0, PYTHON_DIR)
from tpde.torch import Checkpointer  # noqa: E402

# A fresh process loading the newest step, as a resume does; prints the seconds the load took.
FRESH_LOAD = """
import os, sys, time
kind, folder, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, sys.argv[4])
import torch
from safetensors.torch import load_file
from tpde.torch import Checkpointer
t0 = time.perf_counter()
if kind == "tpde":
    Checkpointer(folder).load(step)
elif kind == "torch.save":
    torch.load(os.path.join(folder, f"step{step}.pt"), weights_only=True)
else:
    load_file(os.path.join(folder, f"step{step}.safetensors"))
print(time.perf_counter() - t0)
"""


def drop_page_cache():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def fresh_load(kind, folder, step, cold=False):
    if cold:
        drop_page_cache()
    out = subprocess.run([sys.executable, "-c", FRESH_LOAD, kind, folder, str(step), PYTHON_DIR],
                         check=True, capture_output=True, text=True)
    return float(out.stdout.split()[-1])


def states(ckpt_dir):
    files = sorted(f for f in os.listdir(ckpt_dir) if f.endswith(".safetensors"))
    out = []
    for f in files:
        t = st_load(os.path.join(ckpt_dir, f))
        model = {k[len("model."):]: v for k, v in t.items() if k.startswith("model.")}
        m = {k[len("optimizer.exp_avg."):]: v for k, v in t.items() if k.startswith("optimizer.exp_avg.")}
        v = {k[len("optimizer.exp_avg_sq."):]: v for k, v in t.items() if k.startswith("optimizer.exp_avg_sq.")}
        step = int(t["optimizer.step"])
        out.append((step, {"model": model, "optim": {"exp_avg": m, "exp_avg_sq": v, "step": t["optimizer.step"]}}))
    return out


def flat(state):
    d = {f"model.{k}": t for k, t in state["model"].items()}
    d.update({f"exp_avg.{k}": t for k, t in state["optim"]["exp_avg"].items()})
    d.update({f"exp_avg_sq.{k}": t for k, t in state["optim"]["exp_avg_sq"].items()})
    d["step"] = state["optim"]["step"]
    return d


def folder_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def run_series(name, series, folder, keyframe_every):
    """Saves the series; returns (stalls in s, extra time to drain async saves in s)."""
    os.makedirs(folder)
    stalls = []
    drain = 0.0
    if name.startswith("tpde"):
        layout = "forward" if "forward" in name else "reverse"
        ck = Checkpointer(folder, keyframe_every=keyframe_every, async_save=name.endswith("async"), layout=layout,
                          raw_newest="compressed" not in name)
        for step, st in series:
            # Training runs between two saves for minutes, longer than a save takes: the
            # previous async save is done by the next, so it is not part of the stall.
            ck.wait()
            t0 = time.perf_counter()
            ck.save(step, st)
            stalls.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ck.close()
        drain = time.perf_counter() - t0  # the last save's encode and write
        return stalls, drain
    for step, st in series:
        t0 = time.perf_counter()
        if name == "torch.save":
            torch.save(st, os.path.join(folder, f"step{step}.pt"))
        else:
            st_save(flat(st), os.path.join(folder, f"step{step}.safetensors"))
        stalls.append(time.perf_counter() - t0)
    return stalls, drain


def restore_every_step(folder, series):
    """Seconds to restore each step, in this process, each checked bit for bit."""
    ck = Checkpointer(folder)
    out = {}
    for step, want in series:
        t0 = time.perf_counter()
        got = ck.load(step)
        out[step] = time.perf_counter() - t0
        for part in ("model", "exp_avg", "exp_avg_sq"):
            w = want["model"] if part == "model" else want["optim"][part]
            g = got["model"] if part == "model" else got["optim"][part]
            for k, t in w.items():
                assert torch.equal(g[k].view(torch.uint8), t.view(torch.uint8)), (step, part, k)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpt_dir")
    ap.add_argument("--out")
    ap.add_argument("--keyframe-every", type=int, help="default: the Checkpointer's (4 reverse, 10 forward)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="drop the page cache before each fresh-process load (root)")
    a = ap.parse_args()
    series = states(a.ckpt_dir)
    if len(series) < 2:
        sys.exit(f"{a.ckpt_dir}: need at least two checkpoints")
    raw = sum(t.numel() * t.element_size() for t in flat(series[0][1]).values())
    print(f"{len(series)} checkpoints, steps {series[0][0]}..{series[-1][0]}, {raw / 1e6:.1f} MB of tensors each, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    root = a.out or tempfile.mkdtemp(prefix="tpde-bench-", dir="/tmp")
    names = ["tpde reverse", "tpde reverse async", "tpde reverse compressed", "tpde forward", "torch.save", "safetensors"]
    results = {n: {"stall": [], "drain": [], "load": [], "size": 0, "steps": []} for n in names}
    for run in range(a.runs):
        for n in names:  # interleaved, so drift in the machine hits every contender alike
            folder = os.path.join(root, f"{n.replace(' ', '-').replace('.', '-')}-{run}")
            stalls, drain = run_series(n, series, folder, a.keyframe_every)
            kind = "tpde" if n.startswith("tpde") else n
            results[n]["load"].append(fresh_load(kind, folder, series[-1][0], a.cold))
            if n.startswith("tpde"):
                results[n]["steps"].append(restore_every_step(folder, series))
            results[n]["stall"].extend(stalls)
            results[n]["drain"].append(drain)
            results[n]["size"] = folder_bytes(folder)
            shutil.rmtree(folder)
    total_raw = raw * len(series)
    torch_load = statistics.median(results["torch.save"]["load"])
    print(f"\n| {len(series)} checkpoints | folder size | share of raw | median stall per save | "
          f"first save (keyframe) | load newest, fresh process{' (cold)' if a.cold else ''} | / torch.load |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for n in names:
        r = results[n]
        per_run = len(series)
        firsts = r["stall"][::per_run]
        load = statistics.median(r["load"])
        print(f"| {n} | {r['size'] / 1e6:.1f} MB | {r['size'] / total_raw:.3f} | "
              f"{statistics.median(r['stall']) * 1e3:.0f} ms | {statistics.median(firsts) * 1e3:.0f} ms | "
              f"{load * 1e3:.0f} ms | {load / torch_load:.2f} |")
    print(f"\nasync: waiting for the last save at the end took a median "
          f"{statistics.median(results['tpde reverse async']['drain']) * 1e3:.0f} ms")
    print("\nRestoring each step, in one process (median ms; in brackets: / the newest step's):\n")
    print("| layout | " + " | ".join(f"step {s}" for s, _ in series) + " |")
    print("|---|" + "---:|" * len(series))
    for n in ("tpde reverse", "tpde reverse compressed", "tpde forward"):
        per_step = {s: statistics.median(r[s] for r in results[n]["steps"]) for s, _ in series}
        newest = per_step[series[-1][0]]
        print(f"| {n[5:]} | " + " | ".join(f"{per_step[s] * 1e3:.0f} ({per_step[s] / newest:.1f})"
                                                   for s, _ in series) + " |")
    if not a.out:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
