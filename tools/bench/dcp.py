#!/usr/bin/env python3
"""TPDE under torch.distributed.checkpoint (DCP) next to DCP's own FileSystemWriter, on a real
training state sharded as FSDP shards it, saved and loaded by several ranks at once.

    python3 tools/bench/dcp.py CKPT_DIR [--ranks 2] [--out DIR]

CKPT_DIR holds the safetensors checkpoints of tools/finetune_checkpoints.py (weights, both AdamW
moments and the step counter, every K steps of a real fine-tune). Every rank turns each into the
state an FSDP2 job hands dcp.save: every tensor a DTensor sharded on dim 0 over the ranks (as
fully_shard shards parameters and optimizer states), plus the step as a Python int. The series
is then saved in order by each contender, each step into its own folder:

- FileSystemWriter (torch's default DCP storage: torch.save'd shards, one file per rank);
- TpdeStorageWriter, keyframes only;
- TpdeStorageWriter, each step a delta against the one before (one chain from the first);
- tpde.torch.Checkpointer under torch.distributed, in its two layouts: "reverse" (the newest
  step a keyframe stored raw, the step before it compressed again as each rank's delta against
  it on a background thread) and "forward" (each step a delta against the one before, a
  keyframe every 10). Training runs between two saves for longer than a save takes, so the
  rewrite is awaited (``ck.wait()``) before each timed save and reported apart.

Reported: the folders' size over the whole series and for one (the last) step, the median wall
time of a save (all ranks, barrier to barrier; the first save of the delta chain is its
keyframe and is left out of its median), and the time to load the last step into a state of
the same sharding. The page cache is warm (the files were just written): this measures encoding
and decoding, not the disk. Gloo on the CPU, one process per rank.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from safetensors.torch import load_file as st_load

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "crates", "tpde-py", "python"))


def series(ckpt_dir):
    files = sorted(f for f in os.listdir(ckpt_dir) if f.endswith(".safetensors"))
    for f in files:
        t = st_load(os.path.join(ckpt_dir, f))
        step = int(t.pop("optimizer.step"))
        yield step, t


def sharded(tensors, mesh, step, empty=False):
    from torch.distributed.tensor import Shard, distribute_tensor

    model = {}
    optim = {}
    for name, t in tensors.items():
        dt = distribute_tensor(torch.zeros_like(t) if empty else t, mesh, [Shard(0)])
        if name.startswith("model."):
            model[name[len("model."):]] = dt
        else:
            optim[name[len("optimizer."):]] = dt
    return {"model": model, "optim": optim, "step": -1 if empty else step}


def folder_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def start_rank(rank, world, ckpt_dir, store):
    """Joins the gloo group as ``rank``, one core per rank (torch and TPDE's threads alike, for
    every contender); returns the device mesh and the series, sharded over it."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    os.environ["RAYON_NUM_THREADS"] = "1"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    return mesh, [(step, sharded(t, mesh, step)) for step, t in series(ckpt_dir)]


def worker(rank, world, args, store):
    from tpde.torch.dcp import TpdeStorageReader, TpdeStorageWriter

    mesh, states = start_rank(rank, world, args.ckpt_dir, store)
    contenders = {
        "DCP FileSystemWriter": (lambda path, prev: dcp.FileSystemWriter(path), dcp.FileSystemReader),
        "TpdeStorageWriter, keyframes": (lambda path, prev: TpdeStorageWriter(path), TpdeStorageReader),
        "TpdeStorageWriter, deltas": (lambda path, prev: TpdeStorageWriter(path, base=prev), TpdeStorageReader),
    }
    contenders["Checkpointer, reverse"] = ("reverse", None)
    contenders["Checkpointer, forward"] = ("forward", None)
    results = {}
    for name, (writer, reader) in contenders.items():
        if name.startswith("Checkpointer"):
            results[name] = checkpointer(rank, mesh, states, os.path.join(args.out, name.split()[-1]), writer)
            continue
        root = os.path.join(args.out, name.split(",")[0].split()[-1] + ("-delta" if "deltas" in name else ""))
        saves, prev = [], None
        for step, sd in states:
            path = os.path.join(root, f"step-{step:06d}")
            dist.barrier()
            t0 = time.perf_counter()
            dcp.save(sd, storage_writer=writer(path, prev))
            dist.barrier()
            saves.append(time.perf_counter() - t0)
            prev = path
        target = sharded({k: v.full_tensor() for k, v in _flat(states[-1][1]).items()}, mesh, 0, empty=True)
        dist.barrier()
        t0 = time.perf_counter()
        dcp.load(target, storage_reader=reader(prev))
        dist.barrier()
        load = time.perf_counter() - t0
        ok = all(torch.equal(a.to_local().view(torch.int32), b.to_local().view(torch.int32))
                 for a, b in zip(_flat(target).values(), _flat(states[-1][1]).values()))
        ok = ok and target["step"] == states[-1][0]
        timed = saves[1:] if "deltas" in name else saves
        if rank == 0:
            dirs = [os.path.join(root, d) for d in sorted(os.listdir(root))]
            results[name] = {
                "series_bytes": sum(folder_bytes(d) for d in dirs),
                "last_step_bytes": folder_bytes(dirs[-1]),
                "save_s": statistics.median(timed),
                "load_last_s": load,
                "bit_exact": ok,
            }
    if rank == 0:
        raw = sum(t.numel() * t.element_size() for t in _flat(states[-1][1]).values())
        report(results, raw, len(states), world)
    dist.destroy_process_group()


def checkpointer(rank, mesh, states, root, layout):
    """The distributed Checkpointer saving the series and loading its newest step."""
    from tpde.torch import Checkpointer

    ck = Checkpointer(root, layout=layout, keyframe_every=None if layout == "reverse" else 10)
    saves, settles = [], []
    for step, sd in states:
        t0 = time.perf_counter()
        ck.wait()  # the background rewrite of the step before, and pruning: during training
        settles.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        ck.save(step, sd)
        dist.barrier()
        saves.append(time.perf_counter() - t0)
    ck.wait()
    target = sharded({k: v.full_tensor() for k, v in _flat(states[-1][1]).items()}, mesh, 0, empty=True)
    dist.barrier()
    t0 = time.perf_counter()
    ck.load(state=target)
    dist.barrier()
    load = time.perf_counter() - t0
    ok = all(torch.equal(a.to_local().view(torch.int32), b.to_local().view(torch.int32))
             for a, b in zip(_flat(target).values(), _flat(states[-1][1]).values()))
    ck.close()
    if rank != 0:
        return None
    dirs = [os.path.join(root, d) for d in sorted(os.listdir(root)) if d.startswith("step-")]
    return {
        "series_bytes": sum(folder_bytes(d) for d in dirs),
        "last_step_bytes": folder_bytes(dirs[-1]),
        "save_s": statistics.median(saves[1:]),
        "rewrite_s": statistics.median(settles[2:]) if len(settles) > 2 else 0.0,
        "load_last_s": load,
        "bit_exact": ok and target["step"] == states[-1][0],
    }


def _flat(sd):
    d = {f"model.{k}": v for k, v in sd["model"].items()}
    d.update({f"optimizer.{k}": v for k, v in sd["optim"].items()})
    return d


def report(results, raw, steps, world):
    print(f"{steps} checkpoints of {raw / 1e6:.0f} MB (weights + AdamW moments, f32), {world} ranks, gloo, CPU")
    print(f"| storage | one step, share of raw | series of {steps} | save (median) | load last step | bit-exact |")
    print("|---|---:|---:|---:|---:|---|")
    for name, r in results.items():
        if r.get("rewrite_s"):
            name += f" (+{r['rewrite_s'] * 1e3:.0f} ms rewrite during training)"
        print(
            f"| {name} | {r['last_step_bytes'] / raw:.3f} ({r['last_step_bytes'] / 1e6:.0f} MB) | "
            f"{r['series_bytes'] / 1e6:.0f} MB | {r['save_s'] * 1e3:.0f} ms | {r['load_last_s'] * 1e3:.0f} ms | "
            f"{'yes' if r['bit_exact'] else 'NO'} |"
        )
    print(json.dumps({"raw_bytes": raw, "steps": steps, "ranks": world, "results": results}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt_dir")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--out", help="folder for the checkpoints (default: a temporary one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.out) as tmp:
        args.out = tmp
        mp.spawn(worker, args=(args.ranks, args, os.path.join(tmp, "store")), nprocs=args.ranks)


if __name__ == "__main__":
    main()
