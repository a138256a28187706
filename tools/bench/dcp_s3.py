#!/usr/bin/env python3
"""Sharded saves straight to object storage: TPDE's DCP storage on an S3 bucket next to DCP's
FileSystemWriter writing to local disk and then uploading, several ranks, in one run.

    python3 tools/bench/dcp_s3.py CKPT_DIR [--ranks 2] [--out DIR]

CKPT_DIR holds the safetensors checkpoints of tools/finetune_checkpoints.py (a real fine-tune's
weights and AdamW moments). The bench starts an S3-compatible server (s3s-fs, which
tools/test.sh installs) on 127.0.0.1 over a folder under --out, and every rank turns each
checkpoint into the state an FSDP2 job hands dcp.save (every tensor a DTensor sharded on dim 0)
and saves the series in order, each step to its own prefix:

- FileSystemWriter + upload: dcp.save to a local folder, then every rank uploads its own file
  (``tpde.copy``, a streamed multipart upload) and rank 0 the ``.metadata``, last; a load
  downloads each rank's file (and the metadata) and then runs dcp.load on the local copy;
- TpdeStorageWriter to the bucket, keyframes: each rank's file is a multipart upload, then
  ``.metadata`` one PUT;
- TpdeStorageWriter to the bucket, each step a delta against the step before (in the bucket).

Reported: bytes in the bucket for the series and for the last step, the median save time (all
ranks, barrier to barrier, upload included; the delta chain's first save, its keyframe, left
out), the time to load the last step (download included), and each rank's GET requests and
bytes for that load (TpdeStorageReader's ``object_requests`` / ``object_bytes``). Loopback
network, the server's disk is the machine's; gloo on the CPU, one process per rank, one core
each.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "tpde-py", "python"))
from dcp import _flat, sharded, start_rank  # noqa: E402  (tools/bench/dcp.py: the same states)
from object_store import start_server  # noqa: E402  (tools/bench/object_store.py: the same server)

BUCKET = "bench"


def bucket_bytes(root, prefix):
    d = os.path.join(root, BUCKET, prefix)
    return sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(d) for f in fs)


def worker(rank, world, args, store):
    import tpde
    from tpde.torch.dcp import METADATA_FILE, TpdeStorageReader, TpdeStorageWriter

    mesh, states = start_rank(rank, world, args.ckpt_dir, store)
    local = os.path.join(args.out, "local")
    results = {}

    def timed(fn):
        dist.barrier()
        t0 = time.perf_counter()
        out = fn()
        dist.barrier()
        return time.perf_counter() - t0, out

    # FileSystemWriter to local disk, then upload.
    def fs_save(step, sd):
        path = os.path.join(local, f"step-{step:06d}")
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(path))
        for name in sorted(os.listdir(path)):
            if name.startswith(f"__{rank}_"):
                tpde.copy(os.path.join(path, name), f"s3://{BUCKET}/fs/step-{step:06d}/{name}")
        dist.barrier()
        if rank == 0:
            tpde.copy(os.path.join(path, METADATA_FILE), f"s3://{BUCKET}/fs/step-{step:06d}/{METADATA_FILE}")

    def fs_load(step, target):
        path = os.path.join(args.out, "download", f"step-{step:06d}")
        os.makedirs(path, exist_ok=True)
        names = tpde._tpde.list_files(f"s3://{BUCKET}/fs/step-{step:06d}")
        for name in names:
            if name.startswith(f"__{rank}_") or (rank == 0 and name == METADATA_FILE):
                tpde.copy(f"s3://{BUCKET}/fs/step-{step:06d}/{name}", os.path.join(path, name))
        dist.barrier()
        dcp.load(target, storage_reader=dcp.FileSystemReader(path))

    contenders = {
        "FileSystemWriter to local disk + upload": ("fs", None),
        "TpdeStorageWriter to the bucket, keyframes": ("key", False),
        "TpdeStorageWriter to the bucket, deltas": ("delta", True),
    }
    for name, (prefix, deltas) in contenders.items():
        saves, prev = [], None
        for step, sd in states:
            url = f"s3://{BUCKET}/{prefix}/step-{step:06d}"
            if prefix == "fs":
                s, _ = timed(lambda: fs_save(step, sd))
            else:
                s, _ = timed(lambda: dcp.save(sd, storage_writer=TpdeStorageWriter(url, base=prev if deltas else None)))
            saves.append(s)
            prev = url
        last = states[-1]
        target = sharded({k: v.full_tensor() for k, v in _flat(last[1]).items()}, mesh, 0, empty=True)
        if prefix == "fs":
            load, _ = timed(lambda: fs_load(last[0], target))
            stats = None
        else:
            reader = TpdeStorageReader(prev)
            load, _ = timed(lambda: dcp.load(target, storage_reader=reader))
            stats = [reader.object_requests, reader.object_bytes]
        gathered = [None] * world
        dist.all_gather_object(gathered, stats)
        ok = all(torch.equal(a.to_local().view(torch.int32), b.to_local().view(torch.int32))
                 for a, b in zip(_flat(target).values(), _flat(last[1]).values())) and target["step"] == last[0]
        if rank == 0:
            results[name] = {
                "series_bytes": bucket_bytes(os.path.join(args.out, "s3"), prefix),
                "last_step_bytes": bucket_bytes(os.path.join(args.out, "s3"), os.path.join(prefix, f"step-{last[0]:06d}")),
                "save_s": statistics.median(saves[1:] if deltas else saves),
                "load_last_s": load,
                "per_rank_gets": gathered,
                "bit_exact": ok,
            }
    if rank == 0:
        raw = sum(t.numel() * t.element_size() for t in _flat(states[-1][1]).values())
        print(f"{len(states)} checkpoints of {raw / 1e6:.0f} MB (weights + AdamW moments, f32), {world} ranks, gloo, CPU;"
              " S3: s3s-fs on 127.0.0.1")
        print("| storage | last step in the bucket | series | save (median) | load last step | GETs per rank (requests, MB) | bit-exact |")
        print("|---|---:|---:|---:|---:|---|---|")
        for name, r in results.items():
            gets = "; ".join(f"{g[0]}, {g[1] / 1e6:.0f}" for g in r["per_rank_gets"]) if r["per_rank_gets"][0] else "download"
            print(f"| {name} | {r['last_step_bytes'] / raw:.3f} ({r['last_step_bytes'] / 1e6:.0f} MB) | "
                  f"{r['series_bytes'] / 1e6:.0f} MB | {r['save_s'] * 1e3:.0f} ms | {r['load_last_s'] * 1e3:.0f} ms | {gets} | "
                  f"{'yes' if r['bit_exact'] else 'NO'} |")
        print(json.dumps({"raw_bytes": raw, "results": results}))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt_dir")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--out", help="folder for the server's data and the local copies (default: a temporary one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.out) as tmp:
        args.out = tmp
        server, _ = start_server(Path(tmp) / "s3")
        try:
            mp.spawn(worker, args=(args.ranks, args, os.path.join(tmp, "store")), nprocs=args.ranks)
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
