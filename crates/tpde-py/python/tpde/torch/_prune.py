"""Deleting what ``keep_last`` no longer keeps: never a base that a kept checkpoint's chain
needs, and bases last (newest first in the forward layout, oldest first in the reverse), so
that a kill while pruning leaves no delta without its base.
"""
from __future__ import annotations

import os
import shutil
import warnings
from typing import Any, Dict, List, Optional, Set

from .. import _tpde


def _dcp():
    from . import dcp

    return dcp


def prune(ck: Any) -> None:
    """Deletes what ``keep_last`` no longer keeps. The checkpoint just saved is complete
    whatever happens here: a failure is a warning, never the save's error."""
    if ck.keep_last is None:
        return
    try:
        _prune_now(ck)
    except Exception as e:
        warnings.warn(f"{ck.directory}: pruning old checkpoints failed; they stay until the next save: {e}", stacklevel=3)

def _prune_now(ck: Any) -> None:
    steps = ck.steps()
    keep = set(steps[-ck.keep_last :])
    # Every kept checkpoint needs its chain of bases; a chain that does not check out keeps
    # every older file (nothing is deleted on the word of a file that is not ours).
    for s in list(keep):
        try:
            keep.update(ck._chain(s))
        except (_tpde.TpdeError, OSError, ValueError) as e:
            warnings.warn(f"{ck.path(s)}: its chain of bases does not check out ({e}); keeping every older checkpoint", stacklevel=3)
            keep.update(x for x in steps if x < s)
    # A delta goes before its base, so no remaining file loses its base.
    for s in _bases_last(ck, set(steps) - keep):
        path = ck.path(s)
        try:
            if ck.distributed and ck.remote:
                # Uncommitted first: a folder being deleted is no longer a checkpoint.
                _tpde.remove(_dcp().join(path, _dcp().METADATA_FILE))
                for name in _tpde.list_files(path):
                    _tpde.remove(_dcp().join(path, name))
            elif ck.distributed:
                os.remove(os.path.join(path, _dcp().METADATA_FILE))
                shutil.rmtree(path)
            else:
                _tpde.remove(path)
        except FileNotFoundError:
            pass


def _bases_last(ck: Any, doomed: Set[int]) -> List[int]:
    """``doomed`` in an order that deletes each file before the base it names: newest first,
    except that a reverse delta (its base newer than itself) goes before its base."""
    base: Dict[int, Optional[int]] = {}
    for s in doomed:
        try:
            base[s] = ck._base_step(ck._metadata(s), ck.path(s))
        except (_tpde.TpdeError, OSError, ValueError):
            base[s] = None  # not ours, or unreadable: nothing depends on it being kept
    order: List[int] = []
    left = set(doomed)
    while left:
        named = {base[s] for s in left}
        free = sorted((s for s in left if s not in named), reverse=True) or sorted(left, reverse=True)
        order.extend(free)
        left.difference_update(free)
    return order
