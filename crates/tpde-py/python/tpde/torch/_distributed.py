"""A ``Checkpointer`` under torch.distributed: one DCP checkpoint per step (``tpde.torch.dcp``),
rank 0 choosing the chain and holding the writer lock, every rank told through one broadcast.
In the reverse layout each rank then writes its own file of the step before again, as a delta
against its file of the new step (``_rewrite``); the step's ``.metadata`` still holds, since the
file's content digest is unchanged.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, List, Optional, Tuple

import torch

from .. import _tpde
from ._state import SCHEMA_DCP


def _dcp():
    from . import dcp

    return dcp



def rank(ck: Any) -> int:
    return torch.distributed.get_rank(ck._group)

def save(ck: Any, step: int, state: Any) -> None:
    import torch.distributed.checkpoint as dcp

    settle(ck)
    # Rank 0 decides the chain; every rank must use the same base.
    plan: List[Any] = [None]
    if rank(ck) == 0:
        latest = ck.latest()
        try:
            ck._take_lock()
        except _tpde.TpdeError as e:
            plan[0] = ("error", str(e))
        else:
            newest = ck._newest_usable(ck.steps())
            if latest is not None and step <= latest:
                plan[0] = ("error", f"step {step} is not after the latest checkpoint, step {latest}")
            elif ck.layout == "reverse":
                plan[0] = ("ok", None, 0) + ck._reverse_plan(newest)
            else:
                plan[0] = ("ok",) + ck._base_of_next(newest) + (None, None, 0)
    src = torch.distributed.get_global_rank(ck._group, 0) if ck._group is not None else 0
    torch.distributed.broadcast_object_list(plan, src=src, group=ck._group)
    if plan[0][0] == "error":
        raise _tpde.TpdeError(plan[0][1])
    _, base, depth, previous, mode, run = plan[0]
    metadata = {"checkpoint.format": SCHEMA_DCP, "checkpoint.step": str(step), "checkpoint.depth": str(depth)}
    if base is not None:
        metadata["checkpoint.base_step"] = str(base)
    if ck.layout == "reverse":
        metadata.update(ck._newest_metadata(run))
    last = _dcp().last_written()  # this rank's file of the step before, as it decodes, if held
    writer = _dcp().TpdeStorageWriter(
        ck.path(step),
        base=None if base is None else ck.path(base),
        codec=ck._newest_codec() if ck.layout == "reverse" else ck.codec,
        max_abs_error=ck.max_abs_error if base is not None else None,
        max_rel_error=ck.max_rel_error if base is not None else None,
        metadata=metadata,
        base_in_memory=ck.base_in_memory,
    )
    job = (previous, step, mode, last)
    if ck.async_save:
        ck._pending.append(dcp.async_save(state, storage_writer=writer, process_group=ck._group))
        ck._distributed_pending = job
    else:
        try:
            dcp.save(state, storage_writer=writer, process_group=ck._group)
        except BaseException:
            withdraw(ck, step)
            raise
        rewrite_in_background(ck, job)


def withdraw(ck: Any, step: int) -> None:
    """After a failed save (DCP raises on every rank when one fails): this rank's file of it,
    if its write completed, is deleted, so that the step leaves nothing (it has no .metadata;
    in a bucket, an upload that failed was aborted)."""
    dcp = _dcp()
    try:
        _tpde.remove(dcp.join(ck.path(step), dcp.rank_file(rank(ck))))
    except Exception:  # the save's own error is the one to see
        pass


def rewrite_in_background(ck: Any, job: Tuple[Optional[int], int, Optional[str], Any]) -> None:
    """After a save: this rank writes its file of the step before again (reverse layout) on a
    thread of its own, while training goes on; ``settle`` waits for it on every rank."""
    previous, step, mode, last = job
    ck._distributed_unsettled = True
    if mode is None:
        return
    dcp = _dcp()
    name = dcp.rank_file(rank(ck))  # the same name in both steps' folders
    path, newest = dcp.join(ck.path(previous), name), dcp.join(ck.path(step), name)
    if not (dcp.is_file(path) and dcp.is_file(newest)):  # a world size that changed
        return
    content = last[1] if last is not None and last[0] == dcp.identity(path) else None
    new = dcp.last_written()
    snapshot = new[1] if new is not None and new[0] == dcp.identity(newest) else None
    if ck._rewriter is None:
        ck._rewriter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpde-rewrite")
    ck._rewriting = ck._rewriter.submit(ck._rewrite, path, newest, step, mode, content, snapshot)


def settle(ck: Any) -> None:
    """Every rank's rewrite done, then rank 0 prunes; a collective (every rank calls it, from
    ``save``, ``wait``, ``load`` and ``close``)."""
    if ck._distributed_pending is not None:  # an async save, now complete: its rewrite
        job, ck._distributed_pending = ck._distributed_pending, None
        rewrite_in_background(ck, job)
    if not ck._distributed_unsettled:
        return
    ck._distributed_unsettled = False
    ck._finish_rewrite()
    torch.distributed.barrier(group=ck._group)
    prune(ck)


def prune(ck: Any) -> None:
    if rank(ck) == 0:
        ck._prune()
    torch.distributed.barrier(group=ck._group)
