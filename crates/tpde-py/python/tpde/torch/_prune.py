"""Deleting what ``keep_last`` no longer keeps: never a base that a kept checkpoint's chain
needs, newest first, so that a kill while pruning leaves no delta without its base.
"""
from __future__ import annotations

import os
import shutil
import warnings
from typing import Any

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
    # Newest first: a delta goes before its base, so no remaining file loses its base.
    for s in sorted(set(steps) - keep, reverse=True):
        path = ck.path(s)
        try:
            if ck.distributed:
                # Uncommitted first: a folder being deleted is no longer a checkpoint.
                os.remove(os.path.join(path, _dcp().METADATA_FILE))
                shutil.rmtree(path)
            else:
                _tpde.remove(path)
        except FileNotFoundError:
            pass
