"""Hugging Face ``Trainer`` checkpoints in TPDE: one callback.

    trainer = Trainer(..., callbacks=[tpde.transformers.TpdeCallback()])
    trainer.train(resume_from_checkpoint=True)          # the newest, as the Trainer wrote it
    trainer.train(resume_from_checkpoint=tpde.transformers.resume("out/checkpoint-500"))  # any

The newest ``checkpoint-N/`` folder stays as the Trainer wrote it (``newest="native"``, the
default), so that everything that reads a Trainer's folders opens it: ``from_pretrained``,
``train(resume_from_checkpoint=True)``, a script that forgot the callback. When the Trainer saves
the next one, the callback stores the one before it: its weights (``model.safetensors``),
optimizer, scheduler, scaler and RNG states go into one ``checkpoint-N/checkpoint.tpde``
(``tpde.torch._folder``), a keyframe, and the checkpoint stored before it is written again as a
delta against it (``tpde.torch.Series``). ``newest="tpde"`` stores each folder at once (the
newest is then a keyframe too, and takes less space, but only ``resume()`` opens it). The
folder's JSON files (``trainer_state.json``, ``config.json``) stay as they are; the pickled
``training_args.bin`` becomes ``training_args.json`` (this run's arguments). ``save_total_limit``
works as before: the Trainer deletes the oldest folders, which no kept checkpoint needs, and the
best checkpoint (``load_best_model_at_end``) is kept a keyframe, given its files back for the
Trainer's load at the end and stored again after it. Folders the Trainer wrote before
the callback was added (an existing run taken over) are stored at the first save.

Why a callback and a resume helper rather than a ``Trainer`` subclass: both use only the
Trainer's public, documented surface (``TrainerCallback.on_save`` and the checkpoint folder's
file names, which the Trainer's own resume reads), not its private save and load methods, which
change between ``transformers`` releases; a subclass would also clash with the other
subclasses users already have (``Seq2SeqTrainer``, TRL's trainers).

``resume(path)`` writes a stored checkpoint's files back, as the Trainer wrote them, into
``OUTPUT_DIR/.tpde-resume/checkpoint-N`` and returns that path for ``resume_from_checkpoint``
(a folder as the Trainer wrote it is returned as it is); the callback deletes that copy once
training has saved again or ended. ``export(path, dest)`` writes one into a folder of the caller's
choice, for good. Single process only: under several processes the callback leaves the folders
as the Trainer wrote them, with a warning (use ``tpde.torch.dcp`` for sharded checkpoints).
"""
from __future__ import annotations

import os
import re
import shutil
import warnings
from typing import Any, List, Optional, Tuple

from transformers import TrainerCallback

from . import _tpde
from ._errors import error
from .torch import _export, _folder, _rewrite
from .torch.series import Series, _base_of

__all__ = ["TpdeCallback", "resume", "export"]

PREFIX = "checkpoint"  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR
RESUME_DIR = ".tpde-resume"
NEWEST = ("native", "tpde")
_CHECKPOINT = re.compile(rf"^{PREFIX}-(\d+)$")


class TpdeCallback(TrainerCallback):
    """Stores the ``checkpoint-N/`` folders the Trainer saves as TPDE (see the module's
    docstring): each once a newer one exists (``newest="native"``), or each at once
    (``newest="tpde"``). ``keyframe_every`` and ``codec`` as for ``tpde.torch.Series``. With
    ``background`` (the default) a folder is stored on a thread while training goes on, and the
    end of the next step waits for it; an error there is raised at that step."""

    def __init__(
        self, keyframe_every: int = _rewrite.KEYFRAME_EVERY, codec: str = "auto", background: bool = True, newest: str = "native"
    ):
        if newest not in NEWEST:
            raise error("invalid-argument", f"TpdeCallback: newest is 'native' or 'tpde', not {newest!r}")
        self.newest = newest
        # Storing a folder runs on a thread while training goes on (the folder is complete on disk);
        # the next step's end waits for it, before the Trainer's next save may rotate folders.
        self.storer = _folder.Storer(keyframe_every, codec, background)
        self.series = self.storer.series
        self._warned = False
        self._best_files: List[str] = []  # files given back to a stored best folder until the run ends

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Before the first save's rotation: a run killed mid-rewrite may have left a delta's
        # folder newer than its base's.
        if args.world_size == 1 and os.path.isdir(args.output_dir):
            protect_bases(args.output_dir)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.storer.wait()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # the state's values now: the Trainer goes on changing it while the thread runs
        self.storer.submit(self._store, args, state.global_step, state.best_model_checkpoint)

    def _store(self, args: Any, step: int, best: Optional[str]) -> None:
        if args.world_size > 1:
            if not self._warned:
                self._warned = True
                warnings.warn("tpde.transformers.TpdeCallback: several processes; checkpoints are left as the Trainer wrote them")
            return
        output_dir = os.path.abspath(args.output_dir)
        saved = os.path.join(output_dir, f"{PREFIX}-{step}")
        if _folder.holds_states(saved) and os.path.exists(os.path.join(saved, _folder.STORED)):
            # saved over a stored checkpoint (a run resumed from an older one): the stored file
            # is stale; the deltas against it are first written against its own base
            self.series.remove(os.path.join(saved, _folder.STORED))
        if self.newest == "native":
            # Every folder as the Trainer wrote it but the newest, oldest first: the one before
            # it, and at a first save those of a run taken over.
            targets = [f for s, f in _checkpoints(output_dir) if s < step and _folder.is_native(f)]
        else:
            folder = os.path.join(output_dir, f"{PREFIX}-{step}")
            targets = [folder] if os.path.isdir(folder) else []
        if targets:
            _folder.continue_series(self.series, [f for s, f in _checkpoints(output_dir) if s < _step(targets[0])])
        for folder in targets:
            self._pack(args, folder)
        if targets:
            self._keep_best_a_keyframe(best, targets[-1])
            # Every folder made a delta here (the one before, written again against the one just
            # stored, whatever time a kill left on it) older than its base, before the Trainer
            # can rotate: the next step's end waits for this job.
            self.series.wait()
            protect_bases(output_dir)
        shutil.rmtree(os.path.join(output_dir, RESUME_DIR), ignore_errors=True)

    def _pack(self, args: Any, folder: str) -> None:
        """Stores ``folder``; its modification time stays (the Trainer's rotation may read it).
        The pickled ``training_args.bin`` becomes ``training_args.json``, written from this run's
        arguments (a folder of the same output folder; the Trainer never reads either back)."""
        st = os.stat(folder)
        pickled_args = os.path.join(folder, "training_args.bin")
        if os.path.exists(pickled_args):
            with open(os.path.join(folder, "training_args.json"), "w") as f:
                f.write(args.to_json_string())
            os.remove(pickled_args)
        _folder.pack(folder, self.series, {"checkpoint.step": str(_step(folder))})
        os.utime(folder, ns=(st.st_atime_ns, st.st_mtime_ns))

    def _keep_best_a_keyframe(self, best: Optional[str], newest: str) -> None:
        """The best checkpoint outlives the folders after it (the Trainer's rotation keeps it):
        it must not need them."""
        if not best or os.path.abspath(best) == os.path.abspath(newest):
            return
        path = os.path.join(best, _folder.STORED)
        self.series.wait()
        if os.path.isfile(path) and _tpde.File(path, None, follow_hints=False).is_delta():
            _rewrite.rewrite(path, None, {}, self.series.codec)

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[dict] = None, **kwargs: Any) -> None:
        # The Trainer's last log (its train metrics) comes just before load_best_model_at_end reads
        # the best folder's weight files, and a folder without them is only a warning to the
        # Trainer: a stored best folder gets its files back until the run ends.
        if not (args.load_best_model_at_end and logs and "train_runtime" in logs and state.best_model_checkpoint):
            return
        self.storer.wait()
        self.series.wait()
        best = state.best_model_checkpoint
        if not os.path.isfile(os.path.join(best, _folder.STORED)):
            return
        tmp = best.rstrip(os.sep) + ".tpde-best"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            for name in _folder.expand(best, tmp, self.series):
                os.replace(os.path.join(tmp, name), os.path.join(best, name))
                self._best_files.append(os.path.join(best, name))
        except Exception as e:  # a full disk: the Trainer only warns of a best folder without weights
            warnings.warn(f"{best}: its files were not given back for the Trainer's load of the best model, which "
                          f"keeps the last weights: {e}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.storer.wait()
        self.series.wait()
        for path in self._best_files:  # the best model is loaded: its folder is stored again
            if os.path.exists(path):
                os.remove(path)
        self._best_files.clear()
        shutil.rmtree(os.path.join(args.output_dir, RESUME_DIR), ignore_errors=True)


def protect_bases(output_dir: str) -> None:
    """Makes each stored ``checkpoint-N`` folder older, by its modification time, than the folder
    of the checkpoint it is a delta against. The Trainer's rotation deletes the oldest folders
    first, by these times, so it then deletes a delta before its base, never a base that a kept
    checkpoint needs. A rewrite keeps its folder's time, but a kill between the rewrite and
    that restore (or a failed rewrite) leaves the folder newer: this puts it back."""
    folders = [os.path.join(output_dir, d) for d in os.listdir(output_dir) if _CHECKPOINT.match(d)]
    bases = {}
    for f in folders:
        base = _base_of(os.path.join(f, _folder.STORED))
        if base is not None and os.path.dirname(base) != f and os.path.isdir(os.path.dirname(base)):
            bases[f] = os.path.dirname(base)
    for _ in range(len(bases)):  # a chain of k deltas settles in k passes at most
        moved = False
        for f, b in bases.items():
            st, limit = os.stat(f), os.stat(b).st_mtime_ns - 1_000_000_000
            if st.st_mtime_ns > limit:
                os.utime(f, ns=(st.st_atime_ns, limit))
                moved = True
        if not moved:
            break


def _step(folder: str) -> int:
    m = _CHECKPOINT.match(os.path.basename(folder))
    return int(m.group(1)) if m else -1


def _checkpoints(output_dir: str) -> List[Tuple[int, str]]:
    """The ``checkpoint-N`` folders of ``output_dir``, by step."""
    names = os.listdir(output_dir) if os.path.isdir(output_dir) else []
    found = [(_step(n), os.path.join(output_dir, n)) for n in names if _CHECKPOINT.match(n)]
    return sorted((s, f) for s, f in found if os.path.isdir(f) and not os.path.islink(f))


def _newest(checkpoint: str) -> str:
    """``checkpoint`` itself if it is a ``checkpoint-N`` folder, else its newest one."""
    if _CHECKPOINT.match(os.path.basename(checkpoint)):
        return checkpoint
    found = _checkpoints(checkpoint)
    if not found:
        raise error("not-found", f"{checkpoint}: no {PREFIX}-N folder in it")
    return found[-1][1]


def resume(checkpoint: Any) -> str:
    """The folder to pass as ``Trainer.train(resume_from_checkpoint=...)`` for ``checkpoint``: a
    ``checkpoint-N`` folder the callback stored (or a run's output folder: its newest
    checkpoint). A folder as the Trainer wrote it (the newest, by default) is returned as it is."""
    checkpoint = _newest(os.path.abspath(os.fspath(checkpoint)))
    if not os.path.exists(os.path.join(checkpoint, _folder.STORED)):
        return checkpoint
    protect_bases(os.path.dirname(checkpoint))
    resumes = os.path.join(os.path.dirname(checkpoint), RESUME_DIR)
    dest = os.path.join(resumes, os.path.basename(checkpoint))
    # One run resumes from one checkpoint: an earlier call's copy (a full raw checkpoint) goes.
    shutil.rmtree(resumes, ignore_errors=True)
    _folder.expand(checkpoint, dest, Series())
    return dest


def export(checkpoint: Any, dest: Any) -> str:
    """Writes ``checkpoint`` (a ``checkpoint-N`` folder, or a run's output folder: its newest)
    into the new folder ``dest`` as the Trainer writes it, for ``from_pretrained`` or another
    tool: the same tensors bit for bit and the same states; returns ``dest``. A folder as the
    Trainer wrote it is copied. The command ``tpde unpack checkpoint-N -o DEST`` does the same."""
    return _export.folder(_newest(os.path.abspath(os.fspath(checkpoint))), dest)
