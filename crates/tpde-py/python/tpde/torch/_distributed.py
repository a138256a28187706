"""A ``Checkpointer`` under torch.distributed: one DCP checkpoint per step (``tpde.torch.dcp``),
rank 0 choosing the chain and holding the writer lock, every rank told through one broadcast.
"""
from __future__ import annotations

from typing import Any, List

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

    # Rank 0 decides the chain; every rank must use the same base.
    plan: List[Any] = [None]
    if rank(ck) == 0:
        latest = ck.latest()
        try:
            ck._take_lock()
        except _tpde.TpdeError as e:
            plan[0] = ("error", str(e))
        else:
            if latest is not None and step <= latest:
                plan[0] = ("error", f"step {step} is not after the latest checkpoint, step {latest}")
            else:
                plan[0] = ("ok",) + ck._base_of_next(ck._newest_usable(ck.steps()))
    src = torch.distributed.get_global_rank(ck._group, 0) if ck._group is not None else 0
    torch.distributed.broadcast_object_list(plan, src=src, group=ck._group)
    if plan[0][0] == "error":
        raise _tpde.TpdeError(plan[0][1])
    _, base, depth = plan[0]
    metadata = {"checkpoint.format": SCHEMA_DCP, "checkpoint.step": str(step), "checkpoint.depth": str(depth)}
    if base is not None:
        metadata["checkpoint.base_step"] = str(base)
    writer = _dcp().TpdeStorageWriter(
        ck.path(step),
        base=None if base is None else ck.path(base),
        codec=ck.codec,
        max_abs_error=ck.max_abs_error if base is not None else None,
        max_rel_error=ck.max_rel_error if base is not None else None,
        metadata=metadata,
        base_in_memory=ck.base_in_memory,
    )
    if ck.async_save:
        ck._pending.append(dcp.async_save(state, storage_writer=writer, process_group=ck._group))
        ck._distributed_pending = True
    else:
        dcp.save(state, storage_writer=writer, process_group=ck._group)
        prune(ck)

def prune(ck: Any) -> None:
    if rank(ck) == 0:
        ck._prune()
    torch.distributed.barrier(group=ck._group)
