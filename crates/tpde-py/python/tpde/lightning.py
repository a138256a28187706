"""PyTorch Lightning checkpoints in TPDE files: ``Trainer(plugins=[TpdeCheckpointIO()])``.

Lightning's checkpoint dict (weights, optimizer and scheduler states, loops, callbacks,
hyperparameters) is stored at the path Lightning chooses, through ``tpde.torch.Series``. The
newest checkpoint is the file Lightning itself writes (``torch.save``'s), so
``LightningModule.load_from_checkpoint``, ``torch.load``, an eval script or a hub upload open
it as they always did; once a newer one is saved it is stored as TPDE, a keyframe, and the one
before it written again as a delta against it, every ``keyframe_every``-th a keyframe. Tensors are stored by their path in the
dict; everything else is JSON, never pickle: a value JSON cannot carry is a ``TpdeError`` naming
its key and type. ``Trainer.fit(ckpt_path=...)`` resumes from such a file, and from a file
``torch.save`` wrote (a run taken over: its files are Lightning's own until they are saved
again). ``ModelCheckpoint``'s deletions (``save_top_k``) keep every other checkpoint loadable.
Works under Lightning's ``AsyncCheckpointIO(TpdeCheckpointIO())``: saves run on its thread,
deletions on the trainer's, so a deletion can arrive before the save it deletes has run; the
save is then skipped (with the stock ``TorchCheckpointIO`` that file would stay on disk for good).

An older (stored) checkpoint is a TPDE file under its ``.ckpt`` name, not a pickle:
``torch.load`` and ``load_from_checkpoint`` fail on it with torch's "Weights only load failed
... Unsupported operand 84" (or, with ``weights_only=False``, "pickle data was truncated"):
``tpde unpack FILE.ckpt -o OUT.ckpt`` or ``export(path, dest)`` writes it back as Lightning
writes it, and ``Trainer.fit(ckpt_path=...)`` with the plug-in resumes from it directly.
``newest="tpde"`` stores every checkpoint as TPDE, the newest too (nothing pickled in the
folder, and less space; only the plug-in and ``export`` open the files). torch's message cannot
name TPDE (it shows the first byte of the spec's magic as an opcode), so the folder does: the
first stored checkpoint writes ``TPDE-README.txt`` beside the ``.ckpt`` files, saying what they are
and the command that exports them.
"""
from __future__ import annotations

import os
import pickle
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, Optional, Set

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO

from . import _tpde
from ._errors import error
from .torch import _export, _rewrite
from .torch._folder import NOTE
from .torch._state import _Flattener
from .torch.series import Series

__all__ = ["TpdeCheckpointIO", "export"]

_is_tpde = _tpde.is_tpde  # the facade's test of the magic: a torch.save file is left to Lightning

# What a Lightning folder's NOTE (the file the HF and Accelerate folders explain themselves in) says.
NOTE_TEXT = """The older .ckpt files in this folder were stored by TPDE (tpde.lightning.TpdeCheckpointIO):
each is a TPDE file under Lightning's name (a keyframe, or a delta against the .ckpt file it
names), not a pickle. torch.load and LightningModule.load_from_checkpoint fail on them with
torch's "Weights only load failed ... Unsupported operand 84" (or, with weights_only=False,
"pickle data was truncated"): they are not damaged, they are stored. The checkpoint saved last
(last.ckpt, where Lightning keeps one) is the file Lightning wrote; it is stored when the next
one is saved.

One of them back as Lightning writes it (the `tpde` command of `pip install tpde`):

    tpde unpack {example} -o eval.ckpt

or in Python: tpde.lightning.export("{example}", "eval.ckpt"). Trainer.fit(ckpt_path=...) with
plugins=[tpde.lightning.TpdeCheckpointIO()] resumes from one as it is.

`tpde inspect .` lists which files need which: keep the ones a file you keep is a delta against.
"""


class TpdeCheckpointIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` that writes ``.tpde`` files (under Lightning's own names,
    such as ``epoch=0-step=100.ckpt``). ``keyframe_every`` and ``codec`` as for
    ``tpde.torch.Series``; ``newest``: ``"native"`` (the default: the newest as Lightning writes
    it, see the module's docstring) or ``"tpde"`` (every file TPDE, nothing pickled)."""

    def __init__(self, keyframe_every: int = _rewrite.KEYFRAME_EVERY, codec: str = "auto", newest: str = "native"):
        super().__init__()
        if newest not in ("tpde", "native"):
            raise error("invalid-argument", f"TpdeCheckpointIO: newest is 'tpde' or 'native', not {newest!r}")
        self.newest = newest
        self.series = Series(keyframe_every=keyframe_every, codec=codec)
        # Paths deleted before they were written (under AsyncCheckpointIO): their saves are skipped.
        self._deleted_early: Set[str] = set()
        # newest="native": the file written last by torch.save, stored as TPDE at the next save,
        # on a thread of its own while training goes on; what touches the files waits for it.
        self._native: Optional[str] = None
        self._storing: Optional[Future] = None
        self._storer: Optional[ThreadPoolExecutor] = None
        self._lock = threading.Lock()

    def _wait_store(self) -> None:
        """Waits for the storing of the checkpoint before the newest; raises its error, if any."""
        storing, self._storing = self._storing, None
        if storing is not None:
            storing.result()

    def save_checkpoint(self, checkpoint: Dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(f"TpdeCheckpointIO.save_checkpoint takes no storage_options (given {storage_options!r})")
        with self._lock:
            key = os.path.abspath(os.fspath(path))
            if key in self._deleted_early:
                self._deleted_early.discard(key)
                return
            self._wait_store()
            if self.newest == "tpde":
                self.series.save(path, checkpoint)
                _explain(key)
                return
            # What TPDE cannot store is said at this save, naming its key, not at the next (when
            # this one is stored) and before anything is written.
            _Flattener().flatten(checkpoint)
            if os.path.isfile(key) and _is_tpde(key):
                self.series.remove(key)  # written over: the files that are deltas against it first
            os.makedirs(os.path.dirname(key), exist_ok=True)
            _export.torch_save(checkpoint, key)
            previous, self._native = self._native, key
            if previous is not None and previous != key and os.path.isfile(previous) and not _is_tpde(previous):
                # The save stalls the loop only for torch.save's own time: the one before is
                # stored on a thread (measured: storing it here made the stall 1.4 s against
                # torch.save's 1.0 s on a 2-core machine, every step).
                if self._storer is None:
                    self._storer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpde-lightning")
                self._storing = self._storer.submit(self._store, previous)

    def _store(self, path: str) -> None:
        """Writes the ``torch.save`` file ``path`` again as TPDE, read back without running a pickle."""
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            warnings.warn(f"{path}: left as torch.save wrote it: torch.load(weights_only=True) refused it ({e})", stacklevel=3)
            return
        try:
            self.series.save(path, state)
        except _tpde.TpdeError as e:  # a file of a run taken over that holds what TPDE cannot store
            if e.kind != "invalid-argument":
                raise
            warnings.warn(f"{path}: left as torch.save wrote it: {e}", stacklevel=3)
            return
        _explain(path)

    def load_checkpoint(self, path: Any, map_location: Optional[Any] = None, weights_only: Optional[bool] = None) -> Dict[str, Any]:
        with self._lock:
            self._wait_store()
        if not _is_tpde(os.fspath(path)):
            # torch.save's file (a run taken over, or the newest under newest="native"): Lightning's own reader
            from lightning.fabric.utilities.cloud_io import _load

            return _load(path, map_location=map_location, weights_only=weights_only)
        # Nothing is unpickled, so weights_only holds whatever it asks. A map_location that is a
        # function or a dict (torch.load's forms) loads to the CPU, as Lightning's own calls expect.
        if callable(map_location) or isinstance(map_location, dict):
            map_location = "cpu"
        return self.series.load(path, map_location)

    def remove_checkpoint(self, path: Any) -> None:
        with self._lock:
            self._wait_store()
            if not os.path.lexists(path):
                self._deleted_early.add(os.path.abspath(os.fspath(path)))
                return
            key = os.path.abspath(os.fspath(path))
            if self._native == key:
                self._native = None
            if os.path.islink(key) or not _is_tpde(key):
                os.remove(key)
            else:
                self.series.remove(path)

    def teardown(self) -> None:
        with self._lock:
            self._deleted_early.clear()
            self._wait_store()
        self.series.wait()


def _explain(path: str) -> None:
    """Writes the folder's note beside the stored checkpoint ``path``, once: what reaches
    ``torch.load`` or ``load_from_checkpoint`` there fails in torch's words, not TPDE's."""
    note = os.path.join(os.path.dirname(os.path.abspath(path)), NOTE)
    if not os.path.lexists(note):
        try:
            with open(note, "x") as f:
                f.write(NOTE_TEXT.format(example=os.path.basename(path)))
        except FileExistsError:
            pass
        except OSError as e:  # a note is help, not the checkpoint: a save never fails for it
            warnings.warn(f"{note}: not written ({e})", stacklevel=3)


def export(path: Any, dest: Any) -> str:
    """Writes the checkpoint ``path`` (a TPDE file ``TpdeCheckpointIO`` wrote) to ``dest`` as
    Lightning writes it (``torch.save`` of the same dict, tensors bit for bit), for
    ``torch.load``, ``load_from_checkpoint`` or a script without the plug-in; returns ``dest``.
    Never over an existing file. The command ``tpde unpack PATH -o DEST.ckpt`` does the same."""
    return _export.state(path, dest)
