"""PyTorch Lightning checkpoints in TPDE files: ``Trainer(plugins=[TpdeCheckpointIO()])``.

Lightning's checkpoint dict (weights, optimizer and scheduler states, loops, callbacks,
hyperparameters) is stored at the path Lightning chooses, through ``tpde.torch.Series``: the
newest checkpoint a keyframe that decodes alone, the one before it written again as a delta
against it, every ``keyframe_every``-th a keyframe. Tensors are stored by their path in the
dict; everything else is JSON, never pickle: a value JSON cannot carry is a ``TpdeError`` naming
its key and type. ``Trainer.fit(ckpt_path=...)`` resumes from such a file; ``ModelCheckpoint``'s
deletions (``save_top_k``) keep every other checkpoint loadable. Works under Lightning's
``AsyncCheckpointIO(TpdeCheckpointIO())``: saves run on its thread, deletions on the trainer's,
so a deletion can arrive before the save it deletes has run; the save is then skipped (with the
stock ``TorchCheckpointIO`` that file would stay on disk for good).
"""
from __future__ import annotations

import os
import threading
from typing import Any, Dict, Optional, Set

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO

from .torch import _rewrite
from .torch.series import Series

__all__ = ["TpdeCheckpointIO"]


class TpdeCheckpointIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` that writes ``.tpde`` files (under Lightning's own names,
    such as ``epoch=0-step=100.ckpt``). ``keyframe_every`` and ``codec`` as for
    ``tpde.torch.Series``."""

    def __init__(self, keyframe_every: int = _rewrite.KEYFRAME_EVERY, codec: str = "auto"):
        super().__init__()
        self.series = Series(keyframe_every=keyframe_every, codec=codec)
        # Paths deleted before they were written (under AsyncCheckpointIO): their saves are skipped.
        self._deleted_early: Set[str] = set()
        self._lock = threading.Lock()

    def save_checkpoint(self, checkpoint: Dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(f"TpdeCheckpointIO.save_checkpoint takes no storage_options (given {storage_options!r})")
        with self._lock:
            key = os.path.abspath(os.fspath(path))
            if key in self._deleted_early:
                self._deleted_early.discard(key)
                return
            self.series.save(path, checkpoint)

    def load_checkpoint(self, path: Any, map_location: Optional[Any] = None, weights_only: Optional[bool] = None) -> Dict[str, Any]:
        # Nothing is unpickled, so weights_only holds whatever it asks. A map_location that is a
        # function or a dict (torch.load's forms) loads to the CPU, as Lightning's own calls expect.
        if callable(map_location) or isinstance(map_location, dict):
            map_location = "cpu"
        return self.series.load(path, map_location)

    def remove_checkpoint(self, path: Any) -> None:
        with self._lock:
            if not os.path.lexists(path):
                self._deleted_early.add(os.path.abspath(os.fspath(path)))
                return
            self.series.remove(path)

    def teardown(self) -> None:
        with self._lock:
            self._deleted_early.clear()
        self.series.wait()
