"""Optimizer-aware deltas (format 1.6, `delta-predicted`) on a real fine-tune (issue 27).

    python tools/bench/predicted.py [--checkpoints 6] [--every 1 2 10] [--warmup 20]

All-MiniLM-L6-v2, masked-language modelling on the standard library's source, AdamW (lr 5e-5,
weight decay 0.01), fp32, on the CPU (`tools/bench/lossy.py`'s model and data). For each spacing
k, trains `--warmup` steps, then saves `--checkpoints` checkpoints k optimizer steps apart with
`tpde.torch.Checkpointer` (the first a keyframe, the others deltas), once with predictions
(`predict=True`, the default) and once without, from the same training states. Prints each
group's stored share of its raw bytes over the deltas, the whole state's, `zstd -3` of each raw
tensor for comparison, and the save and load times (this machine, wall clock).
"""
import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

import subprocess

import torch

import tpde.torch
from tpde import _tpde

HERE = Path(__file__).resolve().parent


def lossy_module():
    spec = importlib.util.spec_from_file_location("lossy_bench", HERE / "lossy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def group(name):
    if name.endswith("/exp_avg_sq"):
        return "exp_avg_sq"
    if name.endswith("/exp_avg"):
        return "exp_avg"
    return "weights" if name.startswith("model/") else "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoints", type=int, default=6)
    ap.add_argument("--every", type=int, nargs="+", default=[1, 2, 10])
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--eval-batches", type=int, default=1)
    args = ap.parse_args()
    lossy = lossy_module()
    run = lossy.Run(lossy.load_finetune(), lossy.model_dir(), args)
    print("| spacing | predicted | weights | exp_avg | exp_avg_sq | whole state | zstd -3 | save s | load s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for k in args.every:
        model, opt = run.fresh()
        gen = torch.Generator().manual_seed(7)
        run.train(model, opt, gen, args.warmup)
        states = []
        for _ in range(args.checkpoints):
            run.train(model, opt, gen, k)
            states.append({"model": {n: t.clone() for n, t in model.state_dict().items()},
                           "optim": __import__("copy").deepcopy(opt.state_dict())})
        zstd_raw = zstd_out = 0
        for st in states[1:]:
            for t in [*st["model"].values(), *(x for s in st["optim"]["state"].values() for x in s.values())]:
                b = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                zstd_raw += len(b)
                zstd_out += len(subprocess.run(["zstd", "-3", "-c"], input=b, capture_output=True, check=True).stdout)
        for predict in (True, False):
            with tempfile.TemporaryDirectory(prefix="tpde-predicted-") as d:
                ck = tpde.torch.Checkpointer(d, keyframe_every=args.checkpoints + 1, predict=predict, layout="forward")
                save = 0.0
                for i, st in enumerate(states):
                    t0 = time.perf_counter()
                    ck.save(args.warmup + (i + 1) * k, st)
                    save += time.perf_counter() - t0 if i else 0.0
                raw, stored = {}, {}
                for i in range(1, len(states)):
                    f = _tpde.File(ck.path(args.warmup + (i + 1) * k), None)
                    for n in f.keys():
                        dtype, shape = f.info(n)
                        g = group(n)
                        raw[g] = raw.get(g, 0) + f.read(n).nbytes
                        stored[g] = stored.get(g, 0) + f.stored_bytes(n)
                t0 = time.perf_counter()
                back = ck.load()
                load = time.perf_counter() - t0
                last = states[-1]
                assert all(torch.equal(back["model"][n].view(torch.int32), t.view(torch.int32))
                           for n, t in last["model"].items() if t.dtype == torch.float32)
            share = {g: stored[g] / raw[g] for g in raw}
            whole = sum(stored.values()) / sum(raw.values())
            print(f"| {k} | {'yes' if predict else 'no'} | {share['weights']:.3f} | {share['exp_avg']:.3f} | "
                  f"{share['exp_avg_sq']:.3f} | {whole:.3f} | {zstd_out / zstd_raw:.3f} | "
                  f"{save / (len(states) - 1):.2f} | {load:.2f} |", flush=True)


if __name__ == "__main__":
    main()
