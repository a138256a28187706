#!/usr/bin/env python3
"""What each Checkpointer layout costs on a run trained from scratch (issue 54).

    python tools/bench/every_step.py [--saves 12] [--every 1 10] [--optim adamw adam amsgrad]
                                     [--keyframe-every N ...]

A 1.6M-parameter transformer (4 layers, width 192) trained from scratch on random token
sequences (next-token loss), fp32, on the CPU; torch's AdamW at lr 1e-3, weight decay 0.01
(or Adam, or AdamW with amsgrad). The states a training loop would save every k optimizer steps
({"model": ..., "optim": ...}) are captured once, then saved, in order, by each contender into
its own folder:

- reverse: ``tpde.torch.Checkpointer`` with its defaults (layout="reverse", predict=True);
- reverse, no predictions: predict=False (the reverse layout before format 1.9);
- forward: layout="forward";
- torch.save, one file per step.

Printed per contender: the stored share of the raw training-state bytes of every step but the
newest (which the reverse layout stores raw by design), of the deltas among them alone, and of
the newest; the median stall of a save; the time to load the newest and the slowest retained
step (medians of 5, in this process, page cache warm) over torch.load's of one step; a keyframe
step's load (median over the keyframes but the newest) over torch.load's, and a reverse delta
hop (a delta step's load less that of the newer step it is against, median) over a keyframe
step's load (issue 68). Every load is checked bit for bit.
"""
import argparse
import os
import platform
import statistics
import tempfile
import time

import torch

from tpde import _tpde
from tpde.torch import Checkpointer


def states(optim: str, saves: int, every: int):
    torch.manual_seed(0)
    vocab, width, seq = 512, 192, 64
    layer = torch.nn.TransformerEncoderLayer(width, 4, 2 * width, batch_first=True, dropout=0.0)
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, width), torch.nn.TransformerEncoder(layer, 4),
                                torch.nn.Linear(width, vocab))
    kind = {"adamw": dict(weight_decay=0.01), "adam": dict(), "amsgrad": dict(weight_decay=0.01, amsgrad=True)}[optim]
    opt = (torch.optim.Adam if optim == "adam" else torch.optim.AdamW)(model.parameters(), lr=1e-3, **kind)
    gen = torch.Generator().manual_seed(1)

    def train(n):
        for _ in range(n):
            x = torch.randint(0, vocab, (8, seq + 1), generator=gen)
            loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()

    train(5)
    out = []
    for _ in range(saves):
        train(every)
        out.append({"model": {k: v.clone() for k, v in model.state_dict().items()},
                    "optim": __import__("copy").deepcopy(opt.state_dict())})
    return out


def raw_bytes(state) -> int:
    ts = [*state["model"].values(), *(x for s in state["optim"]["state"].values() for x in s.values())]
    return sum(t.numel() * t.element_size() for t in ts)


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8))
    return a == b


def timed(f, runs=3):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--saves", type=int, default=12)
    ap.add_argument("--every", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--optim", nargs="+", default=["adamw"])
    ap.add_argument("--keyframe-every", type=int, nargs="*", default=[], help="extra reverse rows with these")
    args = ap.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}")
    print("| optimizer | every | contender | older steps / raw | their deltas / raw | newest / raw | stall ms "
          "| newest load / torch.load | slowest load / torch.load | a keyframe step's load / torch.load "
          "| a reverse hop / a keyframe step's load |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for optim in args.optim:
        for every in args.every:
            run = states(optim, args.saves, every)
            raw = raw_bytes(run[0])
            steps = [(i + 1) * every for i in range(len(run))]
            contenders = [("reverse", {}), ("reverse, no predictions", {"predict": False}),
                          ("forward", {"layout": "forward"})]
            contenders += [(f"reverse, keyframe_every={k}", {"keyframe_every": k}) for k in args.keyframe_every]
            with tempfile.TemporaryDirectory(prefix="tpde-every-step-") as root:
                pt = os.path.join(root, "pt")
                os.makedirs(pt)
                for s, st in zip(steps, run):
                    torch.save(st, os.path.join(pt, f"{s}.pt"))
                torch_load = timed(lambda: torch.load(os.path.join(pt, f"{steps[-1]}.pt"), weights_only=True), 5)[0]
                for name, kw in contenders:
                    ck = Checkpointer(os.path.join(root, name.replace(" ", "_").replace(",", "")), keep_last=len(run), **kw)
                    stalls = []
                    for s, st in zip(steps, run):
                        t0 = time.perf_counter()
                        ck.save(s, st)
                        stalls.append(time.perf_counter() - t0)
                    ck.wait()
                    size = {s: os.path.getsize(ck.path(s)) for s in ck.steps()}
                    older = sum(size[s] for s in steps[:-1]) / (raw * (len(steps) - 1))
                    deltas = [s for s in steps[:-1] if _tpde.File(ck.path(s), None).is_delta()]
                    delta_share = sum(size[s] for s in deltas) / (raw * len(deltas)) if deltas else float("nan")
                    newest = size[steps[-1]] / raw
                    loads = {}
                    for s, want in zip(steps, run):
                        loads[s], back = timed(lambda s=s: ck.load(s), 5)
                        assert same(back, want), f"{name}: step {s} does not load bit-exact"
                    # Issue 68's hop: what a delta step costs over the newer step its delta is against
                    # (the reverse layout's base is the next step), over a keyframe step's load.
                    keyframes = [loads[s] for s in steps[:-1] if s not in deltas]
                    keyframe = statistics.median(keyframes) if keyframes else float("nan")
                    hops = [loads[s] - loads[steps[i + 1]] for i, s in enumerate(steps[:-1]) if s in deltas]
                    hop = statistics.median(hops) / keyframe if hops and kw.get("layout") != "forward" else float("nan")
                    print(f"| {optim} | {every} | {name} | {older:.3f} | {delta_share:.3f} | {newest:.3f} | "
                          f"{statistics.median(stalls[1:]) * 1e3:.0f} | {loads[steps[-1]] / torch_load:.2f} | "
                          f"{max(loads.values()) / torch_load:.2f} | {keyframe / torch_load:.2f} | {hop:.2f} |", flush=True)


if __name__ == "__main__":
    main()
