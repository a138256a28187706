"""Accelerate's ``save_state`` / ``load_state`` through TPDE:

    tpde.accelerate.save_state(accelerator, "ckpt/step_100")   # for accelerator.save_state(...)
    tpde.accelerate.load_state(accelerator, "ckpt/step_100")   # for accelerator.load_state(...)

``save_state`` lets Accelerate write its folder (models, optimizers, schedulers, scaler,
dataloader states, RNG states, objects registered with ``register_for_checkpointing``), then
stores its tensor and state files in one ``checkpoint.tpde`` in that folder
(``tpde.torch._folder``): a keyframe, the folder saved before it (by the same accelerator)
written again as a delta against it. Accelerate's own ``total_limit`` deletes the oldest
folders, which no kept one needs. ``load_state`` writes the files back into a temporary folder
and lets Accelerate load them; a folder Accelerate wrote itself loads as before. Nothing is
pickled: a state file holding an object that only a pickle carries is a ``TpdeError`` naming it
(Accelerate's seedable sampler is such an object: ``use_seedable_sampler`` is off by default).

Single process (or one folder per process with ``save_on_each_node``) only; a sharded FSDP
model is saved by Accelerate as DCP folders, which stay as Accelerate wrote them (use
``tpde.torch.dcp`` directly to store them as TPDE).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from typing import Any, Optional

from .torch import _folder
from .torch.series import Series

__all__ = ["save_state", "load_state"]

# One series per accelerator: each save is a delta base for the one before it.
_SERIES: "weakref.WeakKeyDictionary[Any, Series]" = weakref.WeakKeyDictionary()


def _series(accelerator: Any, keyframe_every: int) -> Series:
    s = _SERIES.get(accelerator)
    if s is None:
        s = _SERIES[accelerator] = Series(keyframe_every=keyframe_every)
    return s


def save_state(accelerator: Any, output_dir: Optional[str] = None, keyframe_every: int = 4, **kwargs: Any) -> str:
    """``accelerator.save_state(output_dir, **kwargs)``, stored as TPDE; returns the folder.
    Every process calls it, as ``save_state``; the main process stores the folder."""
    location = accelerator.save_state(output_dir, **kwargs)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if accelerator.num_processes > 1:
            from ._errors import error

            raise error("unsupported-feature", "tpde.accelerate.save_state: one process only (the folder is saved by Accelerate)")
        _folder.pack(location, _series(accelerator, keyframe_every), {"checkpoint.step": str(accelerator.step)})
    accelerator.wait_for_everyone()
    return location


def load_state(accelerator: Any, input_dir: Optional[str] = None, **kwargs: Any) -> None:
    """``accelerator.load_state(input_dir, **kwargs)`` from a folder ``save_state`` stored (or one
    Accelerate wrote); ``input_dir`` None: the newest under automatic checkpoint naming."""
    if input_dir is None:
        checkpoints = os.path.join(accelerator.project_dir, "checkpoints")
        names = [n for n in os.listdir(checkpoints) if n.rsplit("_", 1)[-1].isdigit()]
        input_dir = os.path.join(checkpoints, max(names, key=lambda n: int(n.rsplit("_", 1)[-1])))
    input_dir = os.path.abspath(os.path.expanduser(input_dir))
    if not os.path.exists(os.path.join(input_dir, _folder.STORED)):
        accelerator.load_state(input_dir, **kwargs)
        return
    series = _series(accelerator, 4)
    with tempfile.TemporaryDirectory(prefix="tpde-load-state-") as tmp:
        # the folder's own name, which Accelerate reads an iteration from
        dest = os.path.join(tmp, os.path.basename(input_dir))
        _folder.expand(input_dir, dest, series)
        accelerator.load_state(dest, **kwargs)
        shutil.rmtree(dest)

