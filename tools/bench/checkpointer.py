#!/usr/bin/env python3
"""tpde.torch.Checkpointer next to torch.save and safetensors, on a real training run.

    python3 tools/bench/checkpointer.py CKPT_DIR [--out DIR] [--keyframe-every 10] [--runs 3]

CKPT_DIR holds the safetensors checkpoints of tools/finetune_checkpoints.py (weights, both AdamW
moments, the step counter, every K steps of a real fine-tune). Each becomes the state a training
loop would hand its checkpoint code ({"model": ..., "optim": {"exp_avg": ..., "exp_avg_sq": ...,
"step": ...}}), and the series is saved, in order, by each contender into its own folder under
--out (default: a temporary folder on the same disk as /tmp):

- tpde Checkpointer, synchronous: the loop is stalled for the whole encode and write;
- tpde Checkpointer, async_save=True: the stall is the snapshot copy; the write overlaps the
  training that follows (taken to be longer than a save: the previous save is awaited outside
  the timed call, and the time that took is reported as the drain);
- torch.save of the nested state, one file per step;
- safetensors.torch.save_file of the flat tensors, one file per step.

Reported: the folder's size (all steps), the median stall per save, and the time to load the
last step (the Checkpointer decodes its chain of deltas), each the median of --runs runs. The
page cache is warm for loads (the files were just written): this measures decoding, not disk.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file as st_load
from safetensors.torch import save_file as st_save

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "crates", "tpde-py", "python"))
from tpde.torch import Checkpointer  # noqa: E402


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
    """Saves the series; returns (stalls in s, extra time to drain async saves in s, loader)."""
    os.makedirs(folder)
    stalls = []
    drain = 0.0
    if name.startswith("tpde"):
        ck = Checkpointer(folder, keyframe_every=keyframe_every, async_save=name.endswith("async"))
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
        last = series[-1][0]
        return stalls, drain, lambda: Checkpointer(folder).load(last)
    for step, st in series:
        t0 = time.perf_counter()
        if name == "torch.save":
            torch.save(st, os.path.join(folder, f"step{step}.pt"))
        else:
            st_save(flat(st), os.path.join(folder, f"step{step}.safetensors"))
        stalls.append(time.perf_counter() - t0)
    last = series[-1][0]
    if name == "torch.save":
        return stalls, drain, lambda: torch.load(os.path.join(folder, f"step{last}.pt"), weights_only=True)
    return stalls, drain, lambda: st_load(os.path.join(folder, f"step{last}.safetensors"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpt_dir")
    ap.add_argument("--out")
    ap.add_argument("--keyframe-every", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    series = states(a.ckpt_dir)
    if len(series) < 2:
        sys.exit(f"{a.ckpt_dir}: need at least two checkpoints")
    raw = sum(t.numel() * t.element_size() for t in flat(series[0][1]).values())
    print(f"{len(series)} checkpoints, steps {series[0][0]}..{series[-1][0]}, {raw / 1e6:.1f} MB of tensors each, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    root = a.out or tempfile.mkdtemp(prefix="tpde-bench-", dir="/tmp")
    names = ["tpde", "tpde async", "torch.save", "safetensors"]
    results = {n: {"stall": [], "drain": [], "load": [], "size": 0} for n in names}
    for run in range(a.runs):
        for n in names:  # interleaved, so drift in the machine hits every contender alike
            folder = os.path.join(root, f"{n.replace(' ', '-').replace('.', '-')}-{run}")
            stalls, drain, load = run_series(n, series, folder, a.keyframe_every)
            t0 = time.perf_counter()
            loaded = load()
            results[n]["load"].append(time.perf_counter() - t0)
            if n.startswith("tpde"):  # the restore is bit-exact
                want = series[-1][1]
                for k, t in want["model"].items():
                    assert torch.equal(loaded["model"][k].view(torch.uint8), t.view(torch.uint8)), k
            results[n]["stall"].extend(stalls)
            results[n]["drain"].append(drain)
            results[n]["size"] = folder_bytes(folder)
            shutil.rmtree(folder)
    total_raw = raw * len(series)
    print(f"\n| {len(series)} checkpoints | folder size | share of raw | median stall per save | "
          f"first save (keyframe) | load last step |")
    print("|---|---:|---:|---:|---:|---:|")
    for n in names:
        r = results[n]
        per_run = len(series)
        firsts = r["stall"][::per_run]
        print(f"| {n} | {r['size'] / 1e6:.1f} MB | {r['size'] / total_raw:.3f} | "
              f"{statistics.median(r['stall']) * 1e3:.0f} ms | {statistics.median(firsts) * 1e3:.0f} ms | "
              f"{statistics.median(r['load']) * 1e3:.0f} ms |")
    print(f"\nasync: waiting for the last save at the end took a median "
          f"{statistics.median(results['tpde async']['drain']) * 1e3:.0f} ms")
    if not a.out:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
