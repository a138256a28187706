"""``tpde.torch.Checkpointer``: a training loop's checkpoints as a chain of keyframes and deltas.

Layout of a checkpoint folder::

    DIR/step-0000000100.tpde   one file per complete checkpoint, named by its step
    DIR/step-0000000100/       or, under torch.distributed, one DCP checkpoint folder per step
                               (tpde.torch.dcp: a .tpde file per rank, complete once its
                               .metadata exists)

Two layouts (``Checkpointer(layout=...)``):

- ``"reverse"`` (the default): the newest checkpoint is always a keyframe, so a
  resume decodes one file. When a newer one is saved, the one before it is written again, under
  its own name, as a delta against the newer one (a reverse delta, as version-control systems
  store history); every ``keyframe_every``-th stays a keyframe, so restoring an older step
  decodes at most ``keyframe_every`` files. A file written again decodes to the same tensors
  (the same content digest), so the deltas that name it as their base stay valid.
- ``"forward"``: each checkpoint is a delta against the one before, a keyframe every
  ``keyframe_every``; files are never written again. The newest costs a walk down its chain.
  Lossy bounds apply to this layout only.

Optimizer predictions (``predict``) work in both: forward, a step is predicted from the one
before (format 1.6); reverse, the step before is predicted back from the newer one when it is
written again (format 1.9).

Under torch.distributed each rank writes its own file of the step before again, against its
own file of the new step.

Each file holds the state's tensors under names that are their paths in the state
(``model/encoder.weight``, ``optim/state/3/exp_avg``), so that a tensor's name is the same at
every step and a delta finds its base tensor. The rest of the state (nesting, ints, floats,
strings, lists, tuples, ``None``, the optimizer's ``param_groups``) is stored as JSON in the
file's metadata under ``checkpoint.state`` (schema ``tpde-state/1``, see ``_state``), never as pickle.

The folder may be an object-store prefix, ``s3://bucket/prefix``: the files are then objects,
written by multipart upload, each appearing only when its upload completes (an interrupted
upload is aborted and shows nothing); under torch.distributed each step is a prefix holding
every rank's object and, once they are all written, its ``.metadata`` (one PUT).

Commit protocol: a checkpoint exists once its file has its final name, and a file gets its
final name only whole (the writer writes an unnamed file, ``O_TMPFILE``, and links it into place
after syncing it, then syncs the folder; where the filesystem has no unnamed files, a hidden
``.partial`` file is renamed instead, and the partial files of writers that are gone are removed
by the next writer). A save killed at any moment therefore leaves the folder as it was before
it, or with the new checkpoint complete. In the reverse layout the new keyframe is complete
before the one before it is written again, and that rewrite replaces the file whole, so a kill
between the two leaves two keyframes. Old checkpoints are deleted bases last, so that a kill
during ``keep_last`` pruning never leaves a delta whose base is gone.

One writer per folder: the first ``save`` takes the folder's writer lock (``flock`` on
``.tpde-writer.lock`` in a local folder, a lease object under an object-store prefix; see
``tpde.torch._writer_lock``), held until ``close``; a second writer is refused with an error naming the
holder. Loading takes no lock.

Every file in the folder is treated as hostile: a name that looks like a step but is not a
regular file, or a file that is not a readable ``Checkpointer`` file, is skipped with a
warning when choosing the next base and the newest checkpoint to load; a chain of
``checkpoint.base_step`` references is followed with a loop and length check.

The state's layout (``tpde-state/1``) is ``_state``'s; the optimizer predictions ``_adam``'s;
deleting old checkpoints ``_prune``'s; the distributed path ``_distributed``'s.
"""
from __future__ import annotations

import collections
import json
import math
import os
import re
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Deque, Dict, List, Optional, Tuple

import torch

from .. import _dtypes, _tpde
from .._errors import error
from . import _adam, _distributed, _prune, _rewrite, _writer_lock
from ._adam import _adam_predictions, _learning_rates
from ._state import SCHEMA, SCHEMA_DCP, _Flattener, load_state

# An async save queued behind others: its write finds the newest checkpoint when it runs.
_FIND_NEWEST = object()
_NAME = re.compile(r"^step-(\d{10})(\.tpde)?$")


def _dcp():
    """tpde.torch.dcp, imported only when used (it imports torch.distributed.checkpoint)."""
    from . import dcp

    return dcp


def _file_name(step: int, distributed: bool = False) -> str:
    return f"step-{step:010d}" if distributed else f"step-{step:010d}.tpde"


def _identity(path: str) -> Optional[Tuple[int, int]]:
    """The file at ``path`` (device, inode), or None if there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _say_pending_at_exit(ck: "Checkpointer") -> None:
    """At interpreter exit (a script's end, Ctrl-C) the save threads are joined, and pending
    asynchronous saves finish first: say so rather than wait without a word. Registered with
    ``threading``'s exit hooks, which run before the executors' join (newest first)."""
    import sys
    import weakref

    ref = weakref.ref(ck)

    def say() -> None:
        c = ref()
        pending = 0 if c is None else sum(not f.done() for f in c._pending)
        if pending:
            print(
                f"tpde: waiting for {pending} pending checkpoint save(s) to {c.directory} to finish "
                "(interrupt again to abandon them: nothing is left half-written)",
                file=sys.stderr,
                flush=True,
            )

    register = getattr(threading, "_register_atexit", None)  # CPython 3.9+
    if register is not None:
        try:
            register(say)
        except RuntimeError:  # the interpreter is already shutting down
            pass


class Checkpointer:
    """Saves and restores a training state (any nesting of dicts, lists and tuples of tensors
    and plain values) in ``directory``, one ``.tpde`` file per step.

    ``layout`` (see the module's docstring): ``"reverse"``, the default, keeps the newest
    checkpoint a keyframe (a resume decodes one file) and writes the one before it again as a
    delta against it; ``"forward"``, the default with a lossy bound, writes each checkpoint as a
    delta against the one before. Either way every
    ``keyframe_every``-th checkpoint is a keyframe, so a restore decodes at most
    ``keyframe_every`` files (default: 3 in the reverse layout, where it bounds only the
    restores of older steps, to at most about 3 times ``torch.load``'s time; 10 in the forward). ``keep_last``
    keeps that many checkpoints (and the files they need as bases). ``async_save`` returns from
    ``save`` once the tensors are copied to host memory, and encodes and writes on a background
    thread, one save after another. Up to ``max_pending`` saves wait there (default 2), each
    holding its own host copy of the state; a ``save`` while that many are pending waits for the
    oldest to finish (saving more often than a save takes), and warns the first time it does.
    ``max_abs_error`` (τ) and ``max_rel_error`` (ρ) make deltas lossy for floating-point tensors:
    an element x that changed by at most τ + ρ·|x| keeps the last checkpoint's value (integer
    tensors and optimizer step counters stay exact); the bounds are recorded in each file. A
    relative bound suits states whose tensors differ in scale by orders of magnitude (weights
    and Adam's moments; ``tools/bench/lossy.py`` measures both).
    ``predict`` (default on) codes the weights and second moments of an Adam or AdamW optimizer
    in the state against what its step predicts (``delta-predicted``): from the last checkpoint
    in the forward layout (format 1.6), or, in the reverse layout, back from the newer
    checkpoint when the one before it is written again (format 1.9), where that is smaller than
    the plain delta: on a run checkpointed every optimizer step, most of them are predicted
    bit-exactly (or within an ulp, reversed) and cost almost nothing. The
    optimizer's ``state_dict()`` must be in the state; its moments are matched to the weights
    by shape and order, and each guess is checked on a sample first, so a state it does not fit
    (other spacings, other optimizers) costs a little time, never bytes.
    ``base_in_memory`` keeps the last checkpoint as it decodes in memory (one copy of the
    state's tensors), so that the next delta is encoded against it without decoding the last
    file and its chain again; a process that restarts decodes it once.

    Under ``torch.distributed`` (``process_group`` given, or a default group of more than one
    rank) every rank calls ``save`` and ``load`` together, and each step is a DCP checkpoint
    folder written through ``tpde.torch.dcp``: sharded states (FSDP, DTensor) are saved by
    every rank at once, deltas included, and ``load(step, state=...)`` loads into ``state`` in
    place (DCP resharding it to the current world size). Rank 0 decides the chain and prunes.
    """

    def __init__(
        self,
        directory: Any,
        keyframe_every: Optional[int] = None,
        keep_last: Optional[int] = None,
        async_save: bool = False,
        max_abs_error: Optional[float] = None,
        codec: str = "auto",
        process_group: Any = None,
        base_in_memory: bool = True,
        max_rel_error: Optional[float] = None,
        predict: bool = True,
        max_pending: int = 2,
        layout: Optional[str] = None,
        raw_newest: bool = True,
    ):
        """A checkpointer saving into ``directory`` (a folder, or an ``s3://bucket/prefix/``).

        - ``keyframe_every``: a keyframe every this many checkpoints (default: 3 in the reverse
          layout, 10 in the forward one); a restore decodes at most this many files.
        - ``keep_last``: how many checkpoints to keep, with the files they need (default None:
          every one).
        - ``async_save`` (default False): ``save`` returns once the tensors are copied; the file
          is written on a thread. ``max_pending`` (default 2) such saves wait at most.
        - ``max_abs_error`` / ``max_rel_error`` (default None: lossless): the lossy bounds τ, ρ.
        - ``codec`` (default ``"auto"``): how chunks are coded (``tpde.torch.save_file``'s).
        - ``process_group`` (default None): save and load under ``torch.distributed`` (DCP).
        - ``base_in_memory`` (default True): keep the last checkpoint decoded, for the next delta.
        - ``predict`` (default True): code Adam's state against what its step predicts.
        - ``layout``: ``"reverse"`` (default, lossless) or ``"forward"`` (default when lossy).
        - ``raw_newest`` (default True): store the newest checkpoint uncompressed (a resume reads
          it at memory speed) until the next save compresses it.

        The class's docstring says more of each."""
        if keyframe_every is not None and keyframe_every < 1:
            raise _tpde.TpdeError("keyframe_every must be at least 1")
        if max_pending < 1:
            raise _tpde.TpdeError("max_pending must be at least 1")
        if keep_last is not None and keep_last < 1:
            raise _tpde.TpdeError("keep_last must be at least 1 (or None to keep all)")
        for name, bound in (("max_abs_error", max_abs_error), ("max_rel_error", max_rel_error)):
            if bound is not None and not (math.isfinite(bound) and bound >= 0):
                raise _tpde.TpdeError(f"{name} must be a finite number >= 0")
        lossy = max_abs_error is not None or max_rel_error is not None
        if layout not in (None, "reverse", "forward"):
            raise _tpde.TpdeError(f"layout must be 'reverse' or 'forward', not {layout!r}")
        if layout == "reverse" and lossy:
            raise _tpde.TpdeError(
                "a lossy bound needs layout='forward': a reverse delta rewrites a checkpoint, which must decode as it did"
            )
        self.directory = os.fspath(directory)
        if self.directory.startswith("file://"):
            self.directory = self.directory[len("file://") :]
        # An object-store prefix (s3://bucket/prefix) rather than a local folder.
        self.remote = "://" in self.directory
        self.keep_last = keep_last
        self.async_save = async_save
        self.max_abs_error = max_abs_error
        self.max_rel_error = max_rel_error
        self.codec = codec
        self.base_in_memory = base_in_memory
        self.predict = predict
        # The learning rates of the last save's optimizer groups: the step between it and the
        # next save ran with them if a scheduler changed them since.
        self._last_lrs: Dict[Tuple[str, int], float] = {}
        # (step, Snapshot): the last checkpoint written, as it decodes, when it may be a base.
        self._last: Optional[Tuple[int, Any]] = None
        self.process_group = process_group
        self.distributed = process_group is not None or (
            torch.distributed.is_available()
            and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1
        )
        self.layout = layout or ("forward" if lossy else "reverse")
        self.keyframe_every = keyframe_every or (_rewrite.KEYFRAME_EVERY if self.layout == "reverse" else 10)
        self.raw_newest = raw_newest and self.layout == "reverse"
        if not self.remote:
            try:
                os.makedirs(self.directory, exist_ok=True)
            except OSError as e:
                raise error("io", f"{self.directory}: cannot make the checkpoint folder: {e.strerror or e}") from None
        # The group the checkpoint's collectives run on. An asynchronous save runs them on a
        # background thread, so it gets a group of its own (gloo: the staged state is on the
        # CPU), lest they interleave with the training's collectives on the same group.
        self._group = process_group
        if self.distributed and async_save:
            dist = torch.distributed
            ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
            self._group = dist.new_group(ranks=ranks, backend="gloo")
        self._pool = None if self.distributed else (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpde-save") if async_save else None
        )
        if self._pool is not None:
            _say_pending_at_exit(self)
        self.max_pending = max_pending
        # Asynchronous saves submitted and not yet waited for, oldest first.
        self._pending: Deque[Future] = collections.deque()
        # The step of the newest save submitted (on disk once the pending ones are).
        self._submitted: Optional[int] = None
        # Host copies of finished async saves' tensors, reused when the next has the same layout.
        self._free_buffers: List[Dict[str, torch.Tensor]] = []
        self._warned_stall = False
        self._leftovers_checked = False  # see _compress_leftovers
        self._lock = threading.Lock()
        self._lock_buffers = threading.Lock()
        # Under torch.distributed: an async save's rewrite job, waiting for the save; and whether
        # a save's rewrite and pruning are still to be settled by every rank (_distributed).
        self._distributed_pending: Optional[Tuple] = None
        self._distributed_unsettled = False
        # The folder's writer lock (rank 0's under torch.distributed), from the first save on.
        self._writer_lock: Any = None
        # A synchronous save's rewrite of the checkpoint before it (layout='reverse'), running.
        self._rewriting: Optional[Future] = None
        self._rewriter: Optional[ThreadPoolExecutor] = None

    # -- listing -----------------------------------------------------------------------------

    def steps(self) -> List[int]:
        """The steps of the complete checkpoints in the folder, ascending: files named
        ``step-NNNNNNNNNN.tpde`` (under torch.distributed, folders holding DCP's ``.metadata``).
        A link, or an entry of the wrong kind under such a name, is not a checkpoint."""
        out = []
        if self.remote and self.distributed:
            # every object under the prefix: a step is a folder holding its .metadata
            names = [n.rsplit("/", 1)[0] for n in _tpde.list_files(self.directory) if n.endswith("/" + _dcp().METADATA_FILE)]
            return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m and not m.group(2))
        for name in _tpde.list_files(self.directory) if self.remote else os.listdir(self.directory):
            m = _NAME.match(name)
            if not m or bool(m.group(2)) == self.distributed:
                continue
            if not self.remote:
                path = os.path.join(self.directory, name)
                if os.path.islink(path):
                    continue
                if m.group(2) and not os.path.isfile(path):
                    continue
                if not m.group(2) and not os.path.isfile(os.path.join(path, _dcp().METADATA_FILE)):
                    continue
            out.append(int(m.group(1)))
        return sorted(out)

    def latest(self) -> Optional[int]:
        """The newest complete checkpoint's step, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    def path(self, step: int) -> str:
        """The file (under torch.distributed: the folder) of the checkpoint of ``step``."""
        if self.remote:
            return f"{self.directory.rstrip('/')}/{_file_name(step, self.distributed)}"
        return os.path.join(self.directory, _file_name(step, self.distributed))

    def _metadata(self, step: int) -> Dict[str, str]:
        """The ``checkpoint.*`` metadata of a step's file (of a folder: its first rank file's).
        A file that is not one this class wrote is a ``malformed`` TpdeError naming it."""
        path = self.path(step)
        if self.distributed:
            files = {v[0] for v in _dcp()._read_metadata(path, "checkpoint").storage_data.values()}
            path = _dcp().join(path, min(files))
        meta = _tpde.File(path, None, follow_hints=False).metadata()
        if meta.get("checkpoint.format") not in (SCHEMA, SCHEMA_DCP):
            raise error("malformed", f"{path}: not a Checkpointer file (no {SCHEMA} state in its metadata)")
        return meta

    def _base_step(self, meta: Dict[str, str], path: str) -> Optional[int]:
        """A file's ``checkpoint.base_step``, checked."""
        base = meta.get("checkpoint.base_step")
        if base is None:
            return None
        if not re.fullmatch(r"\d{1,10}", base):
            raise error("malformed", f"{path}: checkpoint.base_step {base[:40]!r} is not a step")
        return int(base)

    def _chain(self, step: int) -> List[int]:
        """``step`` and the steps of its bases in chain order, through ``checkpoint.base_step``
        (older steps in the forward layout, newer ones in the reverse): a loop, or a chain
        longer than 10000, is a ``base-chain`` TpdeError."""
        chain = [step]
        while True:
            s = chain[-1]
            base = self._base_step(self._metadata(s), self.path(s))
            if base is None:
                return chain
            if base in chain:
                raise error("base-chain", f"{self.path(s)}: checkpoint.base_step {base} refers back into its chain {chain}")
            if len(chain) > 10_000:
                raise error("base-chain", f"{self.path(step)}: a chain of more than 10000 checkpoints")
            chain.append(base)

    def _newest_usable(self, steps: List[int]) -> Optional[Tuple[int, Dict[str, str]]]:
        """The newest of ``steps`` whose file reads as a Checkpointer file, with its metadata;
        each newer one that does not is skipped with a warning."""
        for s in reversed(steps):
            try:
                return s, self._metadata(s)
            except (_tpde.TpdeError, OSError, ValueError) as e:
                warnings.warn(f"skipping {self.path(s)}: {e}", stacklevel=3)
        return None

    # -- saving ------------------------------------------------------------------------------

    def save(self, step: int, state: Any) -> None:
        """Saves ``state`` as the checkpoint of ``step`` (an int ≥ 0, above every saved step).
        With ``async_save`` this returns once the tensors are copied; an error of an earlier
        asynchronous save is raised here."""
        step = int(step)
        if not 0 <= step < 10**10:
            raise _tpde.TpdeError(f"step must be in 0..10^10, not {step}")
        if self.distributed:
            self.wait()
            self._save_distributed(step, state)
            return
        self._finish_rewrite()
        self._make_room()
        self._take_lock()
        if self._pending:
            # The newest checkpoint is still being written: the write finds it when it runs.
            newest: Any = _FIND_NEWEST
            latest = self._submitted
        else:
            newest = self._newest_usable(self.steps())
            latest = None if newest is None else newest[0]
        if latest is not None and step <= latest:
            raise _tpde.TpdeError(f"step {step} is not after the latest checkpoint, step {latest}")
        flat = _Flattener()
        tree = flat.flatten(state)
        predictions = _adam_predictions(flat, self._last_lrs) if self.predict else []
        self._last_lrs = _learning_rates(flat)
        if self._pool is None:
            self._write(step, newest, tree, flat.tensors, flat.exact, predictions)
            return
        snapshot = self._snapshot(flat.tensors)
        self._pending.append(self._pool.submit(self._write_async, step, newest, tree, snapshot, flat.exact, predictions))
        self._submitted = step

    def _make_room(self) -> None:
        """Collects the asynchronous saves that finished (raising the first error), then waits
        for the oldest while ``max_pending`` are still pending."""
        while self._pending and self._pending[0].done():
            self._pending.popleft().result()
        if len(self._pending) < self.max_pending:
            return
        start = time.monotonic()
        self._pending.popleft().result()
        waited = time.monotonic() - start
        if waited > 0.05 and not self._warned_stall:
            self._warned_stall = True
            warnings.warn(
                f"{self.directory}: save() waited {waited:.2f} s for an earlier save to finish: saves are "
                f"requested faster than they are written ({self.max_pending} pending at most). Save less often, "
                "or raise max_pending (each pending save holds a copy of the state in host memory).",
                stacklevel=3,
            )

    def wait(self) -> None:
        """Blocks until every pending asynchronous save is on disk; raises the first error, if one
        failed (the saves after it are still waited for)."""
        if not self.distributed:
            self._finish_rewrite()
        first: Optional[BaseException] = None
        while self._pending:
            try:
                self._pending.popleft().result()
            except BaseException as e:  # noqa: B036 - re-raised below, after the rest are done
                first = first or e
        if first is not None:
            raise first
        if self.distributed:
            _distributed.settle(self)

    def _take_lock(self) -> None:
        """The folder's writer lock, taken before this object's first save and checked to be
        still this writer's before each later one (``_writer_lock``)."""
        if self._writer_lock is None:
            self._writer_lock = _writer_lock.acquire(self.directory, self.remote)
        else:
            self._writer_lock.check()

    def _check_lock(self) -> None:
        """Before a write that runs after ``save`` returned (an asynchronous save, a rewrite):
        the lock is still this writer's."""
        if self._writer_lock is not None:
            self._writer_lock.check()

    def _fence(self, path: str) -> Optional[str]:
        """Checks the lock before a write of ``path``; in object storage, returns the version of
        ``path`` seen *before* that check, for the write's ``expect``: the upload then completes
        only if no other writer replaced the object since. A writer stopped past its lease (in
        its check, its upload, anywhere) never replaces what the writer that took over saved."""
        version = _tpde.object_version(path) if self.remote else None
        self._check_lock()
        return version

    def _snapshot(self, tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """CPU copies of ``tensors`` as they are now, into buffers reused from a finished save."""
        with self._lock_buffers:
            buffers = self._free_buffers.pop() if self._free_buffers else {}
        out = {}
        for name, t in tensors.items():
            buf = buffers.get(name)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)
            buf.copy_(t.detach(), non_blocking=t.is_cuda)
            out[name] = buf
        if any(t.is_cuda for t in tensors.values()):
            torch.cuda.synchronize()
        return out

    def _write_async(self, step: int, newest: Any, tree: Any, snapshot: Dict[str, torch.Tensor], *rest: Any) -> None:
        """``_write`` on the background thread; the snapshot's buffers go back to be reused."""
        try:
            if newest is _FIND_NEWEST:
                newest = self._newest_usable(self.steps())
            self._write(step, newest, tree, snapshot, *rest)
        finally:
            with self._lock_buffers:
                self._free_buffers.append(snapshot)

    def _base_of_next(self, newest: Optional[Tuple[int, Dict[str, str]]]) -> Tuple[Optional[int], int]:
        """(base step, depth in its chain) for the next checkpoint: ``newest`` (the newest
        usable checkpoint and its metadata, from ``_newest_usable``), or None for a keyframe."""
        if newest is None or self.keyframe_every == 1:
            return None, 0
        latest, meta = newest
        depth = meta.get("checkpoint.depth", "0")
        if not re.fullmatch(r"\d{1,10}", depth):
            warnings.warn(f"{self.path(latest)}: checkpoint.depth {depth[:40]!r} is not a depth; the next checkpoint is a keyframe", stacklevel=3)
            return None, 0
        if int(depth) + 1 >= self.keyframe_every:
            return None, 0
        return latest, int(depth) + 1

    def _write(
        self,
        step: int,
        newest: Optional[Tuple[int, Dict[str, str]]],
        tree: Any,
        tensors: Dict[str, torch.Tensor],
        exact: List[str],
        predictions: List[Tuple],
    ) -> None:
        if self.layout == "reverse":
            self._write_reverse(step, newest, tree, tensors, predictions)
            return
        with self._lock:
            expect = self._fence(self.path(step))
            base, depth = self._base_of_next(newest)
            metadata = {
                "checkpoint.format": SCHEMA,
                "checkpoint.step": str(step),
                "checkpoint.depth": str(depth),
                "checkpoint.state": json.dumps(tree, separators=(",", ":")),
            }
            if base is not None:
                metadata["checkpoint.base_step"] = str(base)
            items = []
            for name, t in tensors.items():
                dtype, shape, data = _dtypes.from_torch(name, t)
                items.append((name, dtype, shape, data))
            snapshot = self._last[1] if self._last is not None and self._last[0] == base else None
            self._last = None
            # Keep this one if the next checkpoint may be a delta against it.
            keep = self.base_in_memory and depth + 1 < self.keyframe_every
            report = self._save_file(
                step,
                items,
                metadata=metadata,
                base=None if base is None else self.path(base),
                codec=self.codec,
                max_abs_error=self.max_abs_error if base is not None else None,
                max_rel_error=self.max_rel_error if base is not None else None,
                exact=set(exact),
                keep=keep,
                base_snapshot=snapshot,
                predictions=predictions if base is not None else None,
                expect=expect,
            )
            if keep and "snapshot" in report:
                self._last = (step, report["snapshot"])
            self._prune()

    def _write_reverse(
        self,
        step: int,
        newest: Optional[Tuple[int, Dict[str, str]]],
        tree: Any,
        tensors: Dict[str, torch.Tensor],
        predictions: List[Tuple],
    ) -> None:
        """The reverse layout: ``step`` as a keyframe (stored raw with ``raw_newest``), then the
        checkpoint before it written again (``_reverse_plan``), its Adam state predicted back
        from this step's (``predictions``, the forward ones of this step, reversed)."""
        with self._lock:
            expect = self._fence(self.path(step))
            previous, mode, run = self._reverse_plan(newest)
            metadata = {
                "checkpoint.format": SCHEMA,
                "checkpoint.step": str(step),
                "checkpoint.depth": "0",
                "checkpoint.state": json.dumps(tree, separators=(",", ":")),
                **self._newest_metadata(run),
            }
            items = [(name, *_dtypes.from_torch(name, t)) for name, t in tensors.items()]
            last, self._last = self._last, None
            # A raw newest file is as cheap to read as a copy in memory: copying it there would only
            # add to the save's stall (0.24 s → 0.56 s for a 273 MB state).
            keep = self.base_in_memory and not self.raw_newest
            report = self._save_file(step, items, metadata=metadata, codec=self._newest_codec(), keep=keep, expect=expect)
            snapshot = report.get("snapshot")
            if snapshot is not None:
                self._last = (step, snapshot)
            content = last[1] if last is not None and last[0] == previous else None
            back = _adam.reverse(predictions) if mode == "delta" else None
            job = (self.path(previous), self.path(step), step, mode, content, snapshot, back) if mode is not None else None
            if job is not None and self._pool is None:
                # The new checkpoint is complete: a synchronous save returns now, and the one
                # before is written again while training goes on (the next save waits for it).
                if self._rewriter is None:
                    self._rewriter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpde-rewrite")
                self._rewriting = self._rewriter.submit(self._rewrite_and_prune, job, step)
                return
            self._rewrite_and_prune(job, step)

    def _save_file(self, step: int, items: List[Tuple], **kwargs: Any) -> Dict[str, Any]:
        """``_tpde.save`` of the file of ``step``. A file appears whole or not at all, so one that
        is in place after an error was saved, and only what came after failed (the folder's
        sync): the step is reported saved, with a warning that it may not survive a power loss,
        rather than raised as lost while it loads (and its retry refused as not after it)."""
        path = self.path(step)
        before = None if self.remote else _identity(path)  # a damaged file of that step may be there
        try:
            return _tpde.save(path, items, **kwargs)
        except _tpde.TpdeError as e:
            if self.remote or _identity(path) in (None, before):
                raise
            warnings.warn(f"{path}: saved, but {e}; it may not survive a power loss", stacklevel=3)
            return {}

    def _rewrite_and_prune(self, job: Optional[Tuple], newest: int) -> None:
        """Writes the checkpoint before the newest again (if ``job``), then prunes: in this order,
        so that pruning never deletes a file while it is being written again. Neither runs for
        a writer that lost the folder's lock: the files may be another writer's now."""
        try:
            self._check_lock()
        except _tpde.TpdeError as e:
            warnings.warn(f"{self.directory}: not written again nor pruned: {e}", stacklevel=2)
            return
        if job is not None:
            self._rewrite(*job)
        self._compress_leftovers(job, newest)
        self._prune()

    def _compress_leftovers(self, job: Optional[Tuple], newest: int) -> None:
        """Compresses, as keyframes, the checkpoints other than the newest still stored raw: the
        ones a rewrite that a kill interrupted left as they were (each keeps its content digest,
        so what depends on it stays valid). A raw file is the newest's (``newest``, the step just
        saved) only until the next save."""
        # Left by an earlier process, so looked for once, at this object's first save: a rewrite
        # that fails in this one leaves its file as it was, with a warning.
        if not self.raw_newest or self.distributed or self._leftovers_checked:
            return
        self._leftovers_checked = True
        done = {job[0]} if job is not None else set()
        for s in [s for s in self.steps() if s < newest]:
            path = self.path(s)
            if path in done:
                continue
            try:
                raw = self._metadata(s).get("checkpoint.raw") == "1"
            except (_tpde.TpdeError, OSError, ValueError):
                continue  # not ours, or damaged: pruning and loading skip it already
            if raw:
                self._rewrite(path, "", s, "keyframe", None, None)

    def _rewrite(
        self,
        path: str,
        newest: str,
        step: int,
        mode: str,
        content: Any,
        newest_snapshot: Any,
        predictions: Optional[List[Tuple]] = None,
    ) -> None:
        """``_rewrite.rewrite`` of ``path``: against ``newest``, the file of ``step`` ("delta",
        trying ``predictions``), or alone ("keyframe"); a failure is a warning (the file stays as
        it was: nothing is lost)."""
        try:
            expect = self._fence(path)
            if mode == "delta":
                recorded = {"checkpoint.base_step": str(step), "checkpoint.depth": "1"}
                _rewrite.rewrite(path, newest, recorded, self.codec, content, newest_snapshot, predictions, expect)
            else:
                _rewrite.rewrite(path, None, {}, self.codec, content, expect=expect)
        except Exception as e:
            warnings.warn(f"{path}: not written again ({mode}), it stays as it was: {e}", stacklevel=2)

    def _finish_rewrite(self) -> None:
        """Waits for a synchronous save's rewrite of the checkpoint before it."""
        rewriting, self._rewriting = self._rewriting, None
        if rewriting is not None:
            rewriting.result()

    def _newest_codec(self) -> str:
        return "raw" if self.raw_newest else self.codec

    def _newest_metadata(self, run: int) -> Dict[str, str]:
        """The reverse layout's entries in the newest checkpoint's metadata."""
        # How many reverse deltas in a row end at this keyframe (once the one before is written
        # again against it): the next save keeps it a keyframe at keyframe_every.
        meta = {"checkpoint.reverse_run": str(run)}
        if self.raw_newest:
            meta["checkpoint.raw"] = "1"  # stored uncompressed until the next save compresses it
        return meta

    def _reverse_plan(self, newest: Optional[Tuple[int, Dict[str, str]]]) -> Tuple[Optional[int], Optional[str], int]:
        """For a save in the reverse layout: (the step to write again, how: "delta" against the
        new step or, at the end of a run of ``keyframe_every`` - 1 deltas, "keyframe" if it was
        stored raw; None if neither, the new step's ``checkpoint.reverse_run``)."""
        if newest is None:
            return None, None, 0
        previous, meta = newest
        if "checkpoint.base_step" in meta:
            return None, None, 0  # a forward delta (a folder written with layout='forward'): left as it is
        run = meta.get("checkpoint.reverse_run")
        if run is None:
            # Not written as the newest (a keyframe that ended a run, found newest only because a
            # newer file is damaged): it ends its run already, and stays a keyframe.
            return None, None, 0
        if not re.fullmatch(r"\d{1,10}", run):
            warnings.warn(f"{self.path(previous)}: checkpoint.reverse_run {run[:40]!r} is not a count; it stays a keyframe", stacklevel=3)
            return None, None, 0
        if int(run) + 1 < self.keyframe_every:
            return previous, "delta", int(run) + 1
        return (previous, "keyframe", 0) if meta.get("checkpoint.raw") == "1" else (None, None, 0)

    def _prune(self) -> None:
        _prune.prune(self)

    # -- under torch.distributed: tpde/torch/_distributed.py -----------------------------------

    def _rank(self) -> int:
        return _distributed.rank(self)

    def _save_distributed(self, step: int, state: Any) -> None:
        _distributed.save(self, step, state)

    # -- loading -----------------------------------------------------------------------------

    def load(
        self, step: Optional[int] = None, map_location: Any = "cpu", state: Any = None, device: Any = None
    ) -> Any:
        """The state saved at ``step`` (default: the latest), tensors bit-exact. Tensors go to
        ``device`` if given, else ``map_location`` (None: the device they were saved from); onto
        a GPU they stream through a small ring of pinned buffers, never a CPU copy of the state.
        Under torch.distributed, the checkpoint is loaded into ``state`` (a state dict of the
        layout to load into, DTensors as sharded now), which is returned."""
        if device is not None:
            map_location = device
        self.wait()
        if step is None and not self.distributed:
            # The newest checkpoint that loads: a damaged newer one is skipped with a warning
            # naming it, never returned.
            steps = self.steps()
            for s in reversed(steps):
                try:
                    return self.load(s, map_location)
                except _tpde.TpdeError as e:
                    if e.kind == "invalid-argument":
                        raise
                    warnings.warn(f"skipping step {s} ({self.path(s)}), which does not load: {e}", stacklevel=2)
            raise error("not-found", f"{self.directory}: no checkpoint" + (" that loads" if steps else ""))
        if step is None:
            step = self.latest()
            if step is None:
                raise error("not-found", f"{self.directory}: no checkpoint")
        path = self.path(step)
        if self.distributed:
            import torch.distributed.checkpoint as dcp

            if state is None:
                raise error("invalid-argument", "under torch.distributed, load needs state= (the state dict to load into)")
            dcp.load(state, storage_reader=_dcp().TpdeStorageReader(path), process_group=self._group)
            return state
        if not _tpde.is_file(path):
            raise error("not-found", f"{path}: no checkpoint of step {step}")
        return load_state(path, map_location)

    def close(self) -> None:
        """Waits for pending saves, stops the background thread and releases the folder's
        writer lock."""
        try:
            self.wait()
        finally:
            for pool in (self._pool, self._rewriter):
                if pool is not None:
                    pool.shutdown(wait=True)
            lock, self._writer_lock = self._writer_lock, None
            if lock is not None:
                lock.release()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
