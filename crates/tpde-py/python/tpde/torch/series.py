"""``tpde.torch.Series``: checkpoints at paths a framework chooses (Lightning's
``epoch=1-step=10.ckpt``, a Hugging Face ``checkpoint-500/`` folder), stored as the
``Checkpointer``'s reverse layout stores its steps.

Each ``save`` writes its file as a keyframe, so the newest checkpoint, the one a resume loads,
decodes alone; the file this series wrote before it is then written again (``_rewrite``, on a
background thread) as a delta against the new one, and every ``keyframe_every``-th stays a
keyframe; an Adam or AdamW state in it is predicted back from the new file's (the
``Checkpointer``'s ``predict``, format 1.9). A file records the file it is a delta against in ``checkpoint.base``, as a path
relative to its own folder (the format's hint names the same file), and its state as the
``Checkpointer``'s ``tpde-state/1``: tensors by their path in the state, the rest JSON, never pickle.

Deleting a checkpoint (``remove``) keeps the others loadable: a file in the same folder that is
a delta against it is first written again against the removed file's own base, or as a
keyframe. A framework that deletes old checkpoints itself deletes the oldest first, which no
file depends on. A file written again keeps its modification time, and so does its folder.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .. import _dtypes, _tpde
from .._errors import error
from . import _adam, _rewrite
from ._state import SCHEMA, _Flattener, load_state


class Series:
    """Writes states to files named by the caller, each the newest keyframe, the one before it
    written again as a delta against it (see the module's docstring). ``keyframe_every`` bounds
    the files a restore of an older checkpoint decodes; ``codec`` is ``tpde.save``'s. Holds the
    newest state as it decodes (one copy of its tensors) so that the next save's rewrite need
    not decode it. ``predict`` is the ``Checkpointer``'s. Thread-safe: a framework may save on
    one thread and remove on another."""

    def __init__(self, keyframe_every: int = _rewrite.KEYFRAME_EVERY, codec: str = "auto", predict: bool = True):
        if keyframe_every < 1:
            raise error("invalid-argument", "keyframe_every must be at least 1")
        self.keyframe_every = keyframe_every
        self.codec = codec
        self.predict = predict
        # The learning rates of the last save's optimizers: the step after it may have used them.
        self._last_lrs: Dict[Tuple[str, int], float] = {}
        self._lock = threading.RLock()
        # (path, Snapshot or None): the newest file this series wrote or loaded, the next save's
        # file to write again.
        self._newest: Optional[Tuple[str, Any]] = None
        self._rewriter: Optional[ThreadPoolExecutor] = None
        self._rewriting: Optional[Future] = None

    def save(self, path: Any, state: Any, metadata: Optional[Dict[str, str]] = None) -> None:
        """Writes ``state`` (nested dicts, lists and tuples of tensors, numpy arrays and JSON
        values) to ``path``, whole or not at all; ``metadata`` adds string entries. A value
        that JSON cannot carry is a TpdeError naming its key and type, before anything is written."""
        path = os.path.abspath(os.fspath(path))
        flat = _Flattener()
        tree = flat.flatten(state)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with self._lock:
            self.wait()
            predictions = _adam.reverse(_adam._adam_predictions(flat, self._last_lrs)) if self.predict else None
            self._last_lrs = _adam._learning_rates(flat)
            if os.path.exists(path):
                self._detach(path)  # written over: what depends on its old content must not
            previous, run = self._plan(path)
            meta = {
                **(metadata or {}),
                "checkpoint.format": SCHEMA,
                "checkpoint.state": json.dumps(tree, separators=(",", ":")),
                "checkpoint.reverse_run": str(run),
            }
            items = [(name, *_dtypes.from_torch(name, t)) for name, t in flat.tensors.items()]
            snapshot = _tpde.save(path, items, metadata=meta, codec=self.codec, keep=True)["snapshot"]
            self._newest = (path, snapshot)
            if previous is not None:
                if self._rewriter is None:
                    self._rewriter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpde-series")
                self._rewriting = self._rewriter.submit(self._rewrite, previous, path, snapshot, predictions)

    def _plan(self, path: str) -> Tuple[Optional[Tuple[str, Any]], int]:
        """(the file to write again against ``path`` and its content, or None; the new file's
        ``checkpoint.reverse_run``): the newest file, if still the newest keyframe of a run
        shorter than ``keyframe_every`` - 1 deltas."""
        if self._newest is None or self._newest[0] == path:
            return None, 0
        try:
            meta = _tpde.File(self._newest[0], None, follow_hints=False).metadata()
            run = int(meta.get("checkpoint.reverse_run", ""))
        except (_tpde.TpdeError, OSError, ValueError):
            return None, 0  # deleted, or no longer ours: the new file starts a run
        if "checkpoint.base" in meta or run + 1 >= self.keyframe_every:
            return None, 0
        return self._newest, run + 1

    def _rewrite(
        self, previous: Tuple[str, Any], base: str, base_snapshot: Any, predictions: Optional[List[Tuple]]
    ) -> None:
        path, content = previous
        try:
            recorded = {"checkpoint.base": _relative(base, path)}
            with _times_kept(path):
                _rewrite.rewrite(path, base, recorded, self.codec, content, base_snapshot, predictions)
        except Exception as e:
            warnings.warn(f"{path}: not written again as a delta, it stays a keyframe: {e}", stacklevel=2)

    def wait(self) -> None:
        """Blocks until the last save's rewrite of the file before it is done."""
        with self._lock:
            rewriting, self._rewriting = self._rewriting, None
            if rewriting is not None:
                rewriting.result()

    def load(self, path: Any, map_location: Any = "cpu", hints: Any = "follow") -> Any:
        """The state saved at ``path``, tensors bit-exact, on ``map_location`` (None: where each
        was saved from); ``hints`` as for ``safe_open``. The next save continues the series from
        this file."""
        path = os.path.abspath(os.fspath(path))
        with self._lock:
            self.wait()
            state = load_state(path, map_location, hints)
            if self._newest is None or self._newest[0] != path:
                self._newest = (path, None)
            return state

    def newest(self) -> Optional[str]:
        """The file the next save writes again as a delta against its own file, if any."""
        with self._lock:
            return None if self._newest is None else self._newest[0]

    def continue_from(self, path: Any) -> None:
        """Continues the series from the file ``path`` (written by a series before, in another
        process) without loading it: the next save writes it again against the new file."""
        with self._lock:
            self.wait()
            self._newest = (os.path.abspath(os.fspath(path)), None)

    def remove(self, path: Any) -> None:
        """Deletes the checkpoint ``path``. The files in its folder that are deltas against it
        are first written again against its base (or as keyframes), so that each still loads."""
        path = os.path.abspath(os.fspath(path))
        with self._lock:
            self.wait()
            self._detach(path)
            if self._newest is not None and self._newest[0] == path:
                self._newest = None
            try:
                _tpde.remove(path)
            except FileNotFoundError:
                pass

    def _detach(self, path: str) -> None:
        """Writes the files in ``path``'s folder that are deltas against it again, against its
        own base (or as keyframes), so that none needs it."""
        base = _base_of(path)
        for dependent in _dependents(path):
            recorded = {} if base is None else {"checkpoint.base": _relative(base, dependent)}
            with _times_kept(dependent):
                _rewrite.rewrite(dependent, base, recorded, self.codec)

    def close(self) -> None:
        """Waits for the last rewrite and stops its thread."""
        try:
            self.wait()
        finally:
            if self._rewriter is not None:
                self._rewriter.shutdown(wait=True)
                self._rewriter = None


@contextlib.contextmanager
def _times_kept(path: str) -> Iterator[None]:
    """Keeps the modification times of ``path`` and its folder across a rewrite: an old
    checkpoint written again stays old to whatever orders checkpoints by time (the Hugging Face
    Trainer deletes its oldest checkpoint folders by their times)."""
    folder = os.path.dirname(path)
    times = [(p, os.stat(p)) for p in (path, folder)]
    try:
        yield
    finally:  # a rewrite that failed touched the folder too
        for p, st in times:
            with contextlib.suppress(FileNotFoundError):
                os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


def _relative(target: str, source: str) -> str:
    """``target`` as ``source`` records it: relative to ``source``'s folder, ``/``-separated."""
    return os.path.relpath(target, os.path.dirname(source)).replace(os.sep, "/")


def _base_of(path: str) -> Optional[str]:
    """The file ``path`` is a delta against, by its ``checkpoint.base``; None for a keyframe or a
    file that is not a series file."""
    try:
        base = _tpde.File(path, None, follow_hints=False).metadata().get("checkpoint.base")
    except (_tpde.TpdeError, OSError):
        return None
    return None if base is None else os.path.normpath(os.path.join(os.path.dirname(path), base))


def _dependents(path: str) -> List[str]:
    """The series files in ``path``'s folder that are deltas against it."""
    folder = os.path.dirname(path)
    out = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        other = os.path.join(folder, name)
        if other != path and not os.path.islink(other) and os.path.isfile(other) and _base_of(other) == path:
            out.append(other)
    return out
