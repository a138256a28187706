"""A ``Checkpointer`` under torch.distributed: one DCP checkpoint per step (``tpde.torch.dcp``),
rank 0 choosing the chain and holding the writer lock, every rank told through one broadcast.
In the reverse layout each rank then writes its own file of the step before again, as a delta
against its file of the new step (``_rewrite``); the step's ``.metadata`` still holds, since the
file's content digest is unchanged.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, List, Optional, Tuple

import torch

from .. import _tpde
from . import _rewrite
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
            elif ck.layout == "reverse":
                previous, run = ck._reverse_previous(ck._newest_usable(ck.steps()))
                rebase = previous is not None and run + 1 < ck.keyframe_every
                plan[0] = ("ok", None, 0, previous if rebase else None, run + 1 if rebase else 0)
            else:
                plan[0] = ("ok",) + ck._base_of_next(ck._newest_usable(ck.steps())) + (None, 0)
    src = torch.distributed.get_global_rank(ck._group, 0) if ck._group is not None else 0
    torch.distributed.broadcast_object_list(plan, src=src, group=ck._group)
    if plan[0][0] == "error":
        raise _tpde.TpdeError(plan[0][1])
    _, base, depth, previous, run = plan[0]
    metadata = {"checkpoint.format": SCHEMA_DCP, "checkpoint.step": str(step), "checkpoint.depth": str(depth)}
    if base is not None:
        metadata["checkpoint.base_step"] = str(base)
    if ck.layout == "reverse":
        metadata["checkpoint.reverse_run"] = str(run)
    last = _dcp().last_written()  # this rank's file of the step before, as it decodes, if held
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
        ck._distributed_pending = (previous, step, last)
    else:
        dcp.save(state, storage_writer=writer, process_group=ck._group)
        finish(ck, previous, step, last)


def finish(ck: Any, previous: Optional[int], step: int, last: Optional[Tuple[str, Any]]) -> None:
    """After a save: each rank writes its file of ``previous`` again against its file of
    ``step`` (reverse layout), then rank 0 prunes; every rank waits for all."""
    if previous is not None:
        name = _dcp().rank_file(rank(ck))
        path, base = os.path.join(ck.path(previous), name), os.path.join(ck.path(step), name)
        if os.path.isfile(path) and os.path.isfile(base):  # a world size that changed has no pair
            content = last[1] if last is not None and last[0] == os.path.realpath(path) else None
            new = _dcp().last_written()
            base_snapshot = new[1] if new is not None and new[0] == os.path.realpath(base) else None
            updates = {"checkpoint.base_step": str(step), "checkpoint.depth": "1", "checkpoint.reverse_run": None}
            try:
                _rewrite.as_delta(path, base, ck.codec, updates, content, base_snapshot)
            except Exception as e:  # the file stays a keyframe: nothing is lost
                warnings.warn(f"{path}: not written again as a delta, it stays a keyframe: {e}", stacklevel=2)
        torch.distributed.barrier(group=ck._group)
    prune(ck)


def prune(ck: Any) -> None:
    if rank(ck) == 0:
        ck._prune()
    torch.distributed.barrier(group=ck._group)
