"""Worker processes of test_dcp.py: each is one rank of a real torch.distributed (gloo) job.

A worker writes what it saw to ``OUT/rank-R.json``; test_dcp.py checks it. Full tensors are
made from seeds, the same on every rank, so that any rank can check any shard bit-exactly."""
from __future__ import annotations

import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

# (name, shape, dtype, placement): placements of the DTensors in the state.
TENSORS = [
    ("encoder.weight", (37, 24), torch.float32, "shard0"),  # 37 rows: uneven over 2 and 3 ranks
    ("encoder.bias", (37,), torch.float32, "shard0"),
    ("decoder.weight", (16, 29), torch.bfloat16, "shard1"),
    ("norm.weight", (24,), torch.float32, "replicate"),
]
PLAIN = [("buffers.counts", (5, 3), torch.int64)]  # a plain tensor, the same on every rank


def full(name: str, shape, dtype, version: int) -> torch.Tensor:
    """Version 0 is a 'keyframe' state; each later version changes it slightly, as a training
    step does, so that a delta against the previous version is small."""
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=g, dtype=torch.float32)
        for v in range(1, version + 1):
            t = t + 1e-3 * torch.randn(shape, generator=torch.Generator().manual_seed(v * 7919 + len(name)))
        return t.to(dtype)
    return torch.randint(0, 1000, shape, generator=g, dtype=dtype) + version


def placement(kind: str):
    return {"shard0": Shard(0), "shard1": Shard(1), "replicate": Replicate()}[kind]


def state(mesh, version: int, empty: bool = False):
    def value(t):
        return torch.zeros_like(t) if empty else t

    sd = {
        "model": {
            name: distribute_tensor(value(full(name, shape, dtype, version)), mesh, [placement(kind)])
            for name, shape, dtype, kind in TENSORS
        },
        "extra": {name: value(full(name, shape, dtype, version)) for name, shape, dtype in PLAIN},
        "progress": {"step": 0 if empty else 100 * (version + 1), "tag": "" if empty else f"v{version}"},
    }
    return sd


def check(sd, version: int):
    """Names of the tensors and values of ``sd`` that differ from version ``version``."""
    bad = []
    for name, shape, dtype, _ in TENSORS:
        got = sd["model"][name].full_tensor()
        if not torch.equal(_bits(got), _bits(full(name, shape, dtype, version))):
            bad.append(name)
    for name, shape, dtype in PLAIN:
        if not torch.equal(sd["extra"][name], full(name, shape, dtype, version)):
            bad.append(name)
    if sd["progress"] != {"step": 100 * (version + 1), "tag": f"v{version}"}:
        bad.append(f"progress={sd['progress']}")
    return bad


def _bits(t):
    """The bit patterns of float tensors (torch.equal on floats says -0.0 == 0.0)."""
    return {torch.float32: lambda: t.view(torch.int32), torch.bfloat16: lambda: t.view(torch.int16)}.get(t.dtype, lambda: t)()


def run(job: dict) -> dict:
    """One rank's part of ``job``; returns what the test checks."""
    from tpde.torch.dcp import TpdeStorageReader, TpdeStorageWriter

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    out: dict = {}
    action = job["action"]
    if action in ("save", "async_save", "crash_before_finish"):
        writer = TpdeStorageWriter(job["path"], base=job.get("base"), max_abs_error=job.get("max_abs_error"))
        if action == "crash_before_finish":
            def finish(*args, **kwargs):  # every rank file is written; the process dies now
                os._exit(17)

            writer.finish = finish
        sd = state(mesh, job["version"])
        if action == "async_save":
            # DCP's advice: asynchronous saves get a process group of their own.
            group = dist.new_group(backend="gloo")
            dcp.async_save(sd, storage_writer=writer, process_group=group).result()
        else:
            dcp.save(sd, storage_writer=writer, use_collectives=job.get("use_collectives", True))
    elif action == "checkpointer":
        from tpde.torch import Checkpointer

        ck = Checkpointer(job["path"], keyframe_every=3, keep_last=2, async_save=job.get("async_save", False),
                          layout=job.get("layout"))
        assert ck.distributed
        for version in range(job["versions"]):
            ck.save(100 * (version + 1), state(mesh, version))
        ck.wait()
        out["steps"] = ck.steps()
        last = ck.load(state=state(mesh, 0, empty=True))
        out["bad"] = check(last, job["versions"] - 1)
        ck.close()
    elif action == "killed_mid_upload":
        # step 100 saves; during step 200 the test's proxy kills rank 1 (SIGKILL) as its
        # multipart upload sends its first part: nobody aborts that upload
        from tpde.torch import Checkpointer

        ck = Checkpointer(job["path"], keyframe_every=3)
        big = lambda v: {**state(mesh, v), "big": distribute_tensor(  # noqa: E731
            torch.full((10 << 20,), float(v)), mesh, [Shard(0)])}  # 20 MiB a rank: a multipart upload
        ck.save(100, big(0))
        ck.save(200, big(1))
        out["unexpected"] = "step 200 saved"
    elif action == "checkpointer_outage":
        # step 100 saves; the store refuses rank 1's upload of step 200 (the test's proxy) and
        # then fails step 300's first requests for a while (a restart): 200 fails, 300 rides it out
        from tpde.torch import Checkpointer

        ck = Checkpointer(job["path"], keyframe_every=3)
        ck.save(100, state(mesh, 0))
        try:
            ck.save(200, state(mesh, 1))
        except BaseException as e:
            out["error"] = _describe(e)
        out["steps_after_failure"] = ck.steps()
        out["bad_after_failure"] = check(ck.load(state=state(mesh, 0, empty=True)), 0)
        ck.save(300, state(mesh, 2))
        out["steps"] = ck.steps()
        out["bad"] = check(ck.load(state=state(mesh, 0, empty=True)), 2)
        ck.close()
    elif action == "load":
        sd = state(mesh, 0, empty=True)
        try:
            dcp.load(sd, storage_reader=TpdeStorageReader(job["path"]))
        except BaseException as e:  # DCP gathers every rank's error into a CheckpointException
            out["error"] = _describe(e)
            return out
        out["bad"] = check(sd, job["version"])
    return out


def _describe(e: BaseException) -> dict:
    from tpde import TpdeError

    failures = getattr(e, "failures", None)
    if failures:
        e = next(iter(failures.values()))[0]
    return {"type": type(e).__name__, "kind": getattr(e, "kind", None) if isinstance(e, TpdeError) else None, "message": str(e)}


def main(rank: int, world: int, store: str, job_file: str, out_dir: str) -> None:
    with open(job_file) as f:
        job = json.load(f)
    with open(os.path.join(out_dir, f"pid-{rank}"), "w") as f:  # for a test that kills one rank
        f.write(str(os.getpid()))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = run(job)
    except BaseException as e:
        result = {"error": _describe(e), "traceback": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    # Every rank's report is written: exit at once. Tearing gloo down at exit aborted a rank once
    # in CI, after its load had been checked ("terminate called without an active exception",
    # from torch's C++ threads): the harness's exit, not what a test checks.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
