"""Hugging Face ``Trainer`` checkpoints in TPDE: one callback, and one call when resuming.

    trainer = Trainer(..., callbacks=[tpde.transformers.TpdeCallback()])
    trainer.train(resume_from_checkpoint=tpde.transformers.resume("out/checkpoint-500"))

After the Trainer writes a ``checkpoint-N/`` folder, the callback stores its weights
(``model.safetensors``), optimizer, scheduler, scaler and RNG states in one
``checkpoint-N/checkpoint.tpde`` (``tpde.torch._folder``): a keyframe, the checkpoint before it
written again as a delta against it (``tpde.torch.Series``), so the newest decodes alone. The
folder's JSON files (``trainer_state.json``, ``config.json``) stay as they are; the pickled
``training_args.bin`` becomes ``training_args.json``. ``save_total_limit`` works as before: the
Trainer deletes the oldest folders, which no kept checkpoint needs, and the best checkpoint
(``load_best_model_at_end``) is kept a keyframe.

Why a callback and a resume helper rather than a ``Trainer`` subclass: both use only the
Trainer's public, documented surface (``TrainerCallback.on_save`` and the checkpoint folder's
file names, which the Trainer's own resume reads), not its private save and load methods, which
change between ``transformers`` releases; a subclass would also clash with the other
subclasses users already have (``Seq2SeqTrainer``, TRL's trainers).

``resume(path)`` writes the checkpoint's files back, as the Trainer wrote them, into
``OUTPUT_DIR/.tpde-resume/checkpoint-N`` and returns that path for ``resume_from_checkpoint``;
the callback deletes it once training has saved again or ended. Single process only: under
several processes the callback leaves the folders as the Trainer wrote them, with a warning
(use ``tpde.torch.dcp`` for sharded checkpoints).
"""
from __future__ import annotations

import os
import re
import shutil
import warnings
from typing import Any, Optional

from transformers import TrainerCallback

from . import _tpde
from ._errors import error
from .torch import _folder, _rewrite
from .torch.series import Series, _base_of

__all__ = ["TpdeCallback", "resume"]

PREFIX = "checkpoint"  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR
RESUME_DIR = ".tpde-resume"
_CHECKPOINT = re.compile(rf"^{PREFIX}-(\d+)$")


class TpdeCallback(TrainerCallback):
    """Stores each ``checkpoint-N/`` folder the Trainer saves as TPDE (see the module's
    docstring). ``keyframe_every`` and ``codec`` as for ``tpde.torch.Series``. With
    ``background`` (the default) a folder is stored on a thread while training goes on, and the
    end of the next step waits for it; an error there is raised at that step."""

    def __init__(self, keyframe_every: int = _rewrite.KEYFRAME_EVERY, codec: str = "auto", background: bool = True):
        # Storing a folder runs on a thread while training goes on (the folder is complete on disk);
        # the next step's end waits for it, before the Trainer's next save may rotate folders.
        self.storer = _folder.Storer(keyframe_every, codec, background)
        self.series = self.storer.series
        self._warned = False

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
        folder = os.path.join(args.output_dir, f"{PREFIX}-{step}")
        if not os.path.isdir(folder):
            return
        pickled_args = os.path.join(folder, "training_args.bin")
        if os.path.exists(pickled_args):
            with open(os.path.join(folder, "training_args.json"), "w") as f:
                f.write(args.to_json_string())
            os.remove(pickled_args)
        _folder.pack(folder, self.series, {"checkpoint.step": str(step)})
        self._keep_best_a_keyframe(best, folder)
        shutil.rmtree(os.path.join(args.output_dir, RESUME_DIR), ignore_errors=True)

    def _keep_best_a_keyframe(self, best: Optional[str], newest: str) -> None:
        """The best checkpoint outlives the folders after it (the Trainer's rotation keeps it):
        it must not need them."""
        if not best or os.path.abspath(best) == os.path.abspath(newest):
            return
        path = os.path.join(best, _folder.STORED)
        self.series.wait()
        if os.path.isfile(path) and _tpde.File(path, None, follow_hints=False).is_delta():
            _rewrite.rewrite(path, None, {}, self.series.codec)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.storer.wait()
        self.series.wait()
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


def resume(checkpoint: Any) -> str:
    """The folder to pass as ``Trainer.train(resume_from_checkpoint=...)`` for ``checkpoint``: a
    ``checkpoint-N`` folder the callback stored (or a run's output folder: its newest
    checkpoint). A folder the callback did not store is returned as it is."""
    checkpoint = os.path.abspath(os.fspath(checkpoint))
    if not _CHECKPOINT.match(os.path.basename(checkpoint)):
        steps = [int(m.group(1)) for m in map(_CHECKPOINT.match, os.listdir(checkpoint)) if m]
        if not steps:
            raise error("not-found", f"{checkpoint}: no {PREFIX}-N folder in it")
        checkpoint = os.path.join(checkpoint, f"{PREFIX}-{max(steps)}")
    if not os.path.exists(os.path.join(checkpoint, _folder.STORED)):
        return checkpoint
    protect_bases(os.path.dirname(checkpoint))
    resumes = os.path.join(os.path.dirname(checkpoint), RESUME_DIR)
    dest = os.path.join(resumes, os.path.basename(checkpoint))
    # One run resumes from one checkpoint: an earlier call's copy (a full raw checkpoint) goes.
    shutil.rmtree(resumes, ignore_errors=True)
    _folder.expand(checkpoint, dest, Series())
    return dest
