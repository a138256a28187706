"""Accelerate's ``save_state`` / ``load_state`` through TPDE:

    tpde.accelerate.save_state(accelerator, "ckpt/step_100")   # for accelerator.save_state(...)
    tpde.accelerate.load_state(accelerator, "ckpt/step_100")   # for accelerator.load_state(...)

``save_state`` lets Accelerate write its folder (models, optimizers, schedulers, scaler,
dataloader states, RNG states, objects registered with ``register_for_checkpointing``). The
newest folder stays as Accelerate wrote it (``newest="native"``, the default), so that
``accelerator.load_state`` opens it without TPDE; when the next one is saved, the one before it
is stored: its tensor and state files go into one ``checkpoint.tpde`` in that folder
(``tpde.torch._folder``), a keyframe, and the folder stored before it is written again as a delta
against it. ``newest="tpde"`` stores each folder at once. Under automatic checkpoint naming,
folders an earlier run left as Accelerate wrote them are stored at the first save. Accelerate's
own ``total_limit`` deletes the oldest folders, which no kept one needs. ``load_state`` writes a
stored folder's files back into a temporary folder and lets Accelerate load them; a folder
Accelerate wrote itself loads as before. Nothing is pickled in a stored folder: a state file
holding an object that only a pickle carries is a ``TpdeError`` naming it (Accelerate's seedable
sampler is such an object: ``use_seedable_sampler`` is off by default).

One process or several (DDP: the main process stores the folder, every process's RNG states
included). Under FSDP (and DeepSpeed, Megatron-LM) Accelerate writes its own sharded folders, DCP
through its FileSystemWriter, which no hook reaches: ``save_state`` refuses, naming the way that
works (``tpde.torch.dcp`` or ``Checkpointer(process_group=...)`` with the state from
``torch.distributed.checkpoint.state_dict.get_state_dict``).
"""
from __future__ import annotations

import os
import re
import tempfile
import weakref
from typing import Any, Dict, List, Optional

from ._errors import error
from .torch import _folder, _rewrite

__all__ = ["save_state", "load_state", "wait"]

# One storer per accelerator: its series (each save a delta base for the one before it) and the
# storing of its last folder.
_STORES: "weakref.WeakKeyDictionary[Any, _folder.Storer]" = weakref.WeakKeyDictionary()
# The folder each accelerator saved last, left as Accelerate wrote it until the next save.
_NEWEST: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
_AUTOMATIC = re.compile(r"^checkpoint_(\d+)$")  # Accelerate's automatic checkpoint naming


def _store(accelerator: Any, keyframe_every: int = _rewrite.KEYFRAME_EVERY) -> _folder.Storer:
    s = _STORES.get(accelerator)
    if s is None:
        s = _STORES[accelerator] = _folder.Storer(keyframe_every)
    return s


def wait(accelerator: Any) -> None:
    """Blocks until the last ``save_state``'s folder is stored; raises its error, if any."""
    if accelerator in _STORES:
        _STORES[accelerator].wait()
        _STORES[accelerator].series.wait()


def _check(accelerator: Any) -> None:
    kind = getattr(accelerator.distributed_type, "name", str(accelerator.distributed_type))
    if kind in ("FSDP", "DEEPSPEED", "MEGATRON_LM"):
        raise error(
            "unsupported-feature",
            f"tpde.accelerate: under {kind} Accelerate writes its own sharded folders (DCP's FileSystemWriter under "
            "FSDP); save the sharded state through tpde.torch.dcp or Checkpointer(process_group=...) instead "
            "(torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer) gives it)",
        )


def save_state(
    accelerator: Any,
    output_dir: Optional[str] = None,
    keyframe_every: int = _rewrite.KEYFRAME_EVERY,
    background: bool = True,
    newest: str = "native",
    **kwargs: Any,
) -> str:
    """``accelerator.save_state(output_dir, **kwargs)``, stored as TPDE; returns the folder.
    Every process calls it, as ``save_state``; the main process stores folders once every
    process has written its part (under DDP, each its RNG states): with ``newest="native"`` the
    folders before this one, with ``"tpde"`` this one. With ``background`` (the default) they are
    stored on a thread while training goes on; the next ``save_state`` or ``load_state`` (or
    ``wait``) waits for it and raises its error. A kill before it ends leaves a folder that loads
    (the ``.tpde`` file is whole or absent, and a file is deleted only once it holds it)."""
    if newest not in ("native", "tpde"):
        raise error("invalid-argument", f"tpde.accelerate.save_state: newest is 'native' or 'tpde', not {newest!r}")
    _check(accelerator)
    store = _store(accelerator, keyframe_every)
    wait(accelerator)  # before Accelerate's total_limit may delete old folders
    location = os.path.abspath(accelerator.save_state(output_dir, **kwargs))
    accelerator.wait_for_everyone()  # every process's files are in the folder
    if accelerator.is_main_process:
        if newest == "native":
            targets = [f for f in _older(location, _NEWEST.get(accelerator)) if _folder.is_native(f)]
            _NEWEST[accelerator] = location
        else:
            targets = [location]
        step = {"checkpoint.step": str(accelerator.step)}
        store.submit(_pack_all, targets, store.series, step, now=not background)
    return location


def _iteration(folder: str) -> int:
    """K of an automatically named ``checkpoint_K`` folder; -1 for any other name."""
    m = _AUTOMATIC.match(os.path.basename(folder))
    return int(m.group(1)) if m else -1


def _older(location: str, previous: Optional[str]) -> List[str]:
    """The folders saved before ``location``, oldest first: the one this accelerator saved last,
    and under automatic naming every ``checkpoint_K`` beside it with a smaller K."""
    found = {previous} if previous and previous != location else set()
    k = _iteration(location)
    if k >= 0:
        parent = os.path.dirname(location)
        found.update(os.path.join(parent, n) for n in os.listdir(parent) if 0 <= _iteration(n) < k)
    return sorted((f for f in found if os.path.isdir(f)), key=lambda f: (_iteration(f), f))


def _pack_all(folders: List[str], series: Any, metadata: Dict[str, str]) -> None:
    """Stores ``folders`` in order, the series continuing from the folders stored before them."""
    if folders:
        _folder.continue_series(series, _older(folders[0], None))
    for folder in folders:
        _folder.pack(folder, series, metadata)


def load_state(accelerator: Any, input_dir: Optional[str] = None, **kwargs: Any) -> None:
    """``accelerator.load_state(input_dir, **kwargs)`` from a folder ``save_state`` stored (or one
    Accelerate wrote); ``input_dir`` None: the newest under automatic checkpoint naming. Every
    process calls it; each gives the folder back to Accelerate in a temporary folder of its own.
    Under automatic naming the next ``save_state`` goes after the folder loaded (``checkpoint_K``:
    ``project_configuration.iteration`` set to K + 1), where Accelerate's own would start again
    from ``checkpoint_0``."""
    _check(accelerator)
    store = _store(accelerator)
    wait(accelerator)
    accelerator.wait_for_everyone()  # the main process's storing is done before anyone reads
    if input_dir is None:
        checkpoints = os.path.join(accelerator.project_dir, "checkpoints")
        names = [n for n in os.listdir(checkpoints) if n.rsplit("_", 1)[-1].isdigit()]
        input_dir = os.path.join(checkpoints, max(names, key=lambda n: int(n.rsplit("_", 1)[-1])))
    input_dir = os.path.abspath(os.path.expanduser(input_dir))
    if not os.path.exists(os.path.join(input_dir, _folder.STORED)):
        accelerator.load_state(input_dir, **kwargs)
    else:
        with tempfile.TemporaryDirectory(prefix="tpde-load-state-") as tmp:
            # the folder's own name, which Accelerate reads an iteration from
            dest = os.path.join(tmp, os.path.basename(input_dir))
            _folder.expand(input_dir, dest, store.series)
            accelerator.load_state(dest, **kwargs)
    # Accelerate's automatic naming would start again from checkpoint_0 (and its total_limit then
    # delete the new folders first): the next save goes after the folder loaded.
    config = accelerator.project_configuration
    if config.automatic_checkpoint_naming and _iteration(input_dir) >= 0:
        config.iteration = max(config.iteration, _iteration(input_dir) + 1)
