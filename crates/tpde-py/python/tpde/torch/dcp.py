"""TPDE as a storage backend of ``torch.distributed.checkpoint`` (DCP)::

    import torch.distributed.checkpoint as dcp
    from tpde.torch.dcp import TpdeStorageWriter, TpdeStorageReader

    dcp.save(state_dict, storage_writer=TpdeStorageWriter("ckpt/step-200", base="ckpt/step-100"))
    dcp.load(state_dict, storage_reader=TpdeStorageReader("ckpt/step-200"))

DCP plans the save (which rank writes which shard, one copy of each replicated tensor) and the
load (which part of which stored shard each rank needs, for any world size); this module stores
what it plans. Layout of a checkpoint folder::

    DIR/rank-00000.tpde   one file per rank with something to write: its tensor shards and
    DIR/rank-00001.tpde   DCP's byte items (pickled Python values), as TPDE tensors
    DIR/.metadata         DCP's Metadata (pickled, as FileSystemWriter writes it), written last

Names in a rank file: a tensor shard is ``FQN@O0,O1,...`` (its offsets in the whole tensor), a
byte item ``FQN`` (uint8). ``Metadata.storage_data`` maps each item's ``MetadataIndex`` to the
tuple ``(file, name, file's content digest)``: plain values, so that the metadata unpickles
without this module's classes.

Deltas: with ``base=`` (an earlier checkpoint folder written by this writer), each rank's file is
a delta against the base file that holds most of the same shards (same FQN, offsets and shape),
found through the base's metadata. A shard in no such place (moved to another rank, resharded to
another world size) is stored as keyframe chunks inside the delta file: smaller savings, never a
wrong answer. Base files are named by relative path hints, so a folder of checkpoints can move.

The folder may be an object-store prefix (``s3://bucket/run/step-200``): each rank's file is then
an object written by multipart upload, which appears only whole (a failed upload is aborted),
the base is found in the same bucket (or given as a local folder), a load reads each rank's
chunks by ranged, coalesced GETs, and ``.metadata`` is one PUT, atomic in the store.

Without DCP's collectives (``dcp.save(..., use_collectives=False)``) each rank plans alone,
writes ``rank-R.tpde`` and commits its own part with ``__R.metadata`` (as FileSystemWriter does);
such a checkpoint loads at the same world size, each rank from its own metadata.

Commit: the folder is a checkpoint once ``.metadata`` exists. The coordinator removes an
earlier ``.metadata`` before any rank writes (``prepare_global_plan``) and writes the new one
atomically in ``finish``, after every rank's file is complete; the reader also checks each rank
file's content digest against the metadata. A save that dies part way therefore leaves a folder
``TpdeStorageReader`` refuses, never a mix of two saves.
"""
from __future__ import annotations

import dataclasses
import io
import math
import os
import pickle
import threading
import uuid
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from .. import _dtypes, _tpde
from .._errors import error
from . import _staging

__all__ = ["TpdeStorageWriter", "TpdeStorageReader", "METADATA_FILE", "FORMAT"]

METADATA_FILE = ".metadata"
FORMAT = "tpde-dcp/1"
# The DCP metadata version this writer produces (FileSystemWriter's of the same torch).
_DCP_VERSION = "1.0.0"


# The rank file this process wrote last, as it decodes (real path, Snapshot): the base of this
# process's next delta, so that a delta save does not decode the last save and its chain again.
_LAST: Optional[Tuple[str, Any]] = None
_LAST_LOCK = threading.Lock()


def last_written() -> Optional[Tuple[str, Any]]:
    """(real path, Snapshot) of the rank file this process wrote last, if kept in memory."""
    with _LAST_LOCK:
        return _LAST


def rank_file(i: int) -> str:
    """The file rank ``i`` of a save writes."""
    return f"rank-{i:05d}.tpde"


def _item_name(index: MetadataIndex) -> str:
    """A write item's tensor name in its rank file: the same for the same shard at every save,
    so that a delta finds its base tensor."""
    if index.offset is None:
        return index.fqn
    return f"{index.fqn}@{','.join(str(o) for o in index.offset)}"


# -- where a checkpoint is: a local folder, or an object-store prefix (s3://bucket/run/step-100) --

def _remote(path: str) -> bool:
    return "://" in path


def join(folder: str, name: str) -> str:
    """``name`` in checkpoint folder ``folder`` (a path, or a URL prefix: ``/``-joined)."""
    return f"{folder.rstrip('/')}/{name}" if _remote(folder) else os.path.join(folder, name)


def identity(path: str) -> str:
    """What names a written file in ``_LAST``: its resolved path, or its URL."""
    return path if _remote(path) else os.path.realpath(path)


def is_file(path: str) -> bool:
    return _tpde.is_file(path) if _remote(path) else os.path.isfile(path)


def _read_whole(path: str) -> Optional[bytes]:
    """The bytes of the file or object ``path``; None if there is none."""
    if _remote(path):
        return _tpde.object_read(path)
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _write_whole(path: str, data: bytes) -> None:
    """``path`` written whole or not at all: one PUT (atomic in the store), or ``_write_atomically``."""
    if _remote(path):
        _tpde.object_write(path, data)
    else:
        _write_atomically(path, data)


def _delete(path: str) -> None:
    """Removes the file or object ``path`` (a missing one is not an error)."""
    if _remote(path):
        _tpde.remove(path)
    elif os.path.exists(path):
        os.remove(path)
        _sync_folder(os.path.dirname(path) or ".")


def metadata_name(rank: Optional[int] = None) -> str:
    """The metadata file: ``.metadata``, or a rank's own ``__R.metadata`` for a save without
    collectives (each rank then commits its own part, as DCP's FileSystemWriter does)."""
    return METADATA_FILE if rank is None else f"__{rank}{METADATA_FILE}"


def _read_metadata(path: str, role: str, rank: Optional[int] = None) -> Metadata:
    """The committed DCP metadata of checkpoint folder ``path`` (a rank's own with ``rank``),
    checked to be this module's."""
    file = join(path, metadata_name(rank))
    missing = "base-missing" if role == "base" else "not-found"
    if not _remote(path) and not os.path.isdir(path):
        raise error(missing, f"{path}: no such checkpoint folder")
    data = _read_whole(file)
    if data is None:
        raise error(
            missing, f"{path}: not a complete checkpoint (no {metadata_name(rank)}: its save did not finish)"
        )
    try:
        metadata = pickle.loads(data)
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError, TypeError) as e:
        raise error("malformed", f"{file}: unreadable DCP metadata ({e})") from None
    wrong = "base-mismatch" if role == "base" else "malformed"
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise error(wrong, f"{file}: not DCP metadata")
    for v in metadata.storage_data.values():
        if not (isinstance(v, tuple) and len(v) == 3 and all(isinstance(x, str) for x in v)):
            raise error(
                wrong,
                f"{path}: not a TPDE checkpoint (its metadata was written by another storage writer, "
                "e.g. FileSystemWriter)",
            )
    return metadata


def _write_atomically(path: str, data: bytes) -> None:
    """Writes ``path`` whole or not at all: a synced temporary file renamed into place, then the
    folder synced so that the rename survives a power loss."""
    folder = os.path.dirname(path) or "."
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _sync_folder(folder)


def _sync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TpdeStorageWriter(StorageWriter):
    """Writes a DCP checkpoint into folder ``path``: one ``.tpde`` file per rank, deltas against
    the checkpoint folder ``base`` if given (see the module's documentation).

    ``codec`` is the TPDE codec (default: the writer's choice per chunk). ``max_abs_error`` (τ)
    and ``max_rel_error`` (ρ) make the floating-point shards of a delta lossy within τ + ρ·|x|
    (byte items, integer tensors and optimizer step counters stay exact); they are recorded in
    each file. ``metadata`` (str to str) is
    stored in every rank file. ``base_in_memory`` keeps, in each process, the rank file it wrote
    last as it decodes (one copy of that rank's shards), so that a save against it as the base
    does not decode it again; the file is still the reference (a stale copy is never used).
    """

    def __init__(
        self,
        path: Any,
        base: Any = None,
        *,
        codec: str = "auto",
        max_abs_error: Optional[float] = None,
        metadata: Optional[Dict[str, str]] = None,
        base_in_memory: bool = True,
        max_rel_error: Optional[float] = None,
    ) -> None:
        super().__init__()
        self.base_in_memory = base_in_memory
        self.path = os.fspath(path)
        self.base = None if base is None else os.fspath(base)
        self.codec = codec
        for name, bound in (("max_abs_error", max_abs_error), ("max_rel_error", max_rel_error)):
            if bound is not None and not (math.isfinite(bound) and bound >= 0):
                raise error("invalid-argument", f"{name} must be a finite number >= 0")
            if bound is not None and base is None:
                raise error("invalid-argument", f"{name} drops changes against a base: it needs base=")
        self.max_abs_error = max_abs_error
        self.max_rel_error = max_rel_error
        self.metadata = dict(metadata or {})
        self._base_metadata: Optional[Metadata] = None
        if self.base is not None:
            self._check_base_path()
            # A base saved without collectives has only per-rank metadata: read in set_up_storage_writer.
            if is_file(join(self.base, METADATA_FILE)) or not is_file(join(self.base, metadata_name(0))):
                self._base_metadata = _read_metadata(self.base, "base")
        # Without DCP's collectives (use_collectives=False) each rank is its own coordinator.
        self.rank: Optional[int] = None
        self.use_collectives = True
        self.save_id = uuid.uuid4().hex

    def _check_base_path(self) -> None:
        same = self.path.rstrip("/") == self.base.rstrip("/") if _remote(self.path) or _remote(self.base) else (
            os.path.exists(self.path) and os.path.exists(self.base) and os.path.samefile(self.path, self.base))
        if same:
            raise error("invalid-argument", f"{self.path}: a checkpoint cannot be its own base")

    @property
    def checkpoint_id(self) -> str:
        return self.path

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
            if self.base is not None:
                self._check_base_path()
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)
        if not self.use_collectives:
            if self.rank is None:
                raise error("invalid-argument", "TpdeStorageWriter without collectives needs DCP to say the rank")
            if self.base is not None and self._base_metadata is None:
                self._base_metadata = _read_metadata(self.base, "base", self.rank)

    def storage_meta(self) -> StorageMeta:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        if not _remote(self.path):
            os.makedirs(self.path, exist_ok=True)
        if not self.use_collectives:
            # This rank's own part: its file, and its metadata withdrawn until its file is whole.
            _delete(join(self.path, metadata_name(self.rank)))
            return dataclasses.replace(plan, storage_data=rank_file(self.rank))
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        if not self.use_collectives:
            return plans  # each rank plans alone and has named its file
        # The coordinator runs this before any rank writes: withdrawing an earlier checkpoint's
        # metadata makes a save into a used folder all or nothing.
        _delete(join(self.path, METADATA_FILE))
        return [dataclasses.replace(p, storage_data=rank_file(i)) for i, p in enumerate(plans)]

    def _base_file(self, items: List[WriteItem]) -> Optional[str]:
        """The base checkpoint's file that holds most of ``items``' bytes, or None."""
        if self._base_metadata is None:
            return None
        held: Dict[str, int] = {}
        for item in items:
            stored = self._base_metadata.storage_data.get(item.index)
            if stored is not None and stored[1] == _item_name(item.index):
                held[stored[0]] = held.get(stored[0], 0) + (item.tensor_storage_size() or 0)
        if not held:
            return None
        file = max(sorted(held), key=held.__getitem__)
        path = join(self.base, file)
        digest = next(v[2] for v in self._base_metadata.storage_data.values() if v[0] == file)
        if not is_file(path):
            raise error("base-missing", f"{path}: the base checkpoint's file is missing")
        actual = _tpde.File(path, None).content_digest()
        if actual != digest:
            raise error(
                "base-mismatch",
                f"{path}: content digest {actual} is not the {digest} the base's metadata records",
            )
        return path

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> "Future[List[WriteResult]]":
        file = plan.storage_data
        tensors: List[Tuple[str, str, List[int], np.ndarray]] = []
        exact = set()
        sizes = []
        for item in plan.items:
            name = _item_name(item.index)
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                raw = np.frombuffer(data.getvalue(), dtype=np.uint8)
                tensors.append((name, "u8", [raw.size], raw))
                exact.add(name)
                sizes.append(raw.size)
            else:
                dtype, shape, flat = _dtypes.from_torch(name, data)
                tensors.append((name, dtype, shape, flat))
                if not data.is_floating_point() or item.index.fqn.rsplit(".", 1)[-1] == "step":
                    exact.add(name)
                sizes.append(flat.size)
        results: List[WriteResult] = []
        if tensors:
            global _LAST
            base = self._base_file(plan.items)
            metadata = {**self.metadata, "dcp.format": FORMAT}
            out = join(self.path, file)
            with _LAST_LOCK:
                last = _LAST
            snapshot = last[1] if last is not None and base is not None and last[0] == identity(base) else None
            report = _tpde.save(
                out,
                tensors,
                metadata=metadata,
                base=base,
                codec=self.codec,
                max_abs_error=self.max_abs_error if base is not None else None,
                max_rel_error=self.max_rel_error if base is not None else None,
                exact=exact,
                keep=self.base_in_memory,
                base_snapshot=snapshot,
            )
            with _LAST_LOCK:
                _LAST = (identity(out), report["snapshot"]) if self.base_in_memory else None
            digest = report["content_digest"]
            for item, (name, *_), size in zip(plan.items, tensors, sizes):
                results.append(WriteResult(index=item.index, size_in_bytes=size, storage_data=(file, name, digest)))
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        metadata.version = _DCP_VERSION
        metadata.storage_data = {r.index: r.storage_data for rank in results for r in rank}
        metadata.storage_meta = self.storage_meta()
        name = metadata_name(None if self.use_collectives else self.rank)
        _write_whole(join(self.path, name), pickle.dumps(metadata))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        if not isinstance(checkpoint_id, (str, os.PathLike)):
            return False
        path = os.fspath(checkpoint_id)
        return not _remote(path) or path.startswith(("s3://", "file://"))


class TpdeStorageReader(StorageReader):
    """Reads a checkpoint folder written by ``TpdeStorageWriter``, with any world size: each
    rank decodes only the chunks of the stored shards that cover the parts it loads (from a
    bucket: ranged, coalesced GETs of only those chunks; ``object_requests`` and
    ``object_bytes`` count what this rank fetched). A delta's base files are found through their
    path hints."""

    def __init__(self, path: Any) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.storage_data: Dict[MetadataIndex, Tuple[str, str, str]] = {}
        self.load_id = uuid.uuid4().hex
        # Requests and bytes this rank's loads fetched from object storage (0, 0 for local files).
        self.object_requests = 0
        self.object_bytes = 0
        # Read now, so that a folder that is no checkpoint fails here with its TpdeError: inside
        # dcp.load, torch turns a storage reader's metadata error into an AssertionError. A save
        # without collectives has only per-rank metadata, which DCP asks for by rank.
        self._metadata: Optional[Metadata] = None
        try:
            self._metadata = _read_metadata(self.path, "checkpoint")
        except _tpde.TpdeError as e:
            if e.kind != "not-found" or not is_file(join(self.path, metadata_name(0))):
                raise

    @property
    def checkpoint_id(self) -> str:
        return self.path

    def reset(self, checkpoint_id: Any = None) -> None:
        self.storage_data = {}
        if checkpoint_id and os.fspath(checkpoint_id) != self.path:
            self.path = os.fspath(checkpoint_id)
            self._metadata = None
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        if rank is not None:
            metadata = _read_metadata(self.path, "checkpoint", rank)
        else:
            metadata = self._metadata or _read_metadata(self.path, "checkpoint")
        self._metadata = None  # a later load reads the folder again
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def _open(self, file: str, digest: str) -> Any:
        path = join(self.path, file)
        if not _remote(path) and not os.path.isfile(path):  # an object that is not there: File says so
            raise error("not-found", f"{path}: a file of the checkpoint is missing")
        f = _tpde.File(path, None)
        if f.content_digest() != digest:
            raise error(
                "checksum-mismatch",
                f"{path}: content digest {f.content_digest()} is not the {digest} the checkpoint's "
                "metadata records (a file of another save)",
            )
        return f

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> "Future[None]":
        files: Dict[str, Any] = {}
        located = []
        # Whole stored tensors (a load at the world size of the save asks for nothing else) are
        # decoded in one parallel pass per file: from a bucket, every chunk's GET at once.
        whole_names: Dict[str, List[str]] = {}
        # Targets on a GPU: their rows stream there through the pinned ring, a pass per file.
        on_device: Dict[Tuple[str, Any], List[Tuple[Any, str, torch.Tensor]]] = {}
        for req in plan.items:
            stored = self.storage_data.get(req.storage_index)
            if stored is None:
                raise error("not-found", f"{self.path}: no stored item {req.storage_index}")
            file, name, digest = stored
            if file not in files:
                files[file] = self._open(file, digest)
            target = None
            if req.type != LoadItemType.BYTE_IO:
                target = planner.resolve_tensor(req).detach()
                if _staging.is_staged(target.device):
                    on_device.setdefault((file, target.device), []).append((req, name, target))
                    continue
            located.append((req, files[file], file, name, target))
            if _is_whole(req, files[file], name):
                whole_names.setdefault(file, []).append(name)
        for (file, device), items in on_device.items():
            _read_to_device(files[file], file, device, items, planner)
        whole: Dict[Tuple[str, str], Any] = {}
        for file, names in whole_names.items():
            if len(names) > 1:
                whole.update({(file, n): x for n, x in zip(names, files[file].read_many(names))})
        for req, f, file, name, target in located:
            flat = whole.get((file, name))
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO((f.read(name) if flat is None else flat).tobytes()))
                continue
            if flat is not None:
                dtype, shape = f.info(name)
                part = _dtypes.to_framework(flat, dtype, shape, "pt")
            else:
                part = _read_box(f, name, req.storage_offsets, req.lengths)
            _copy_part(file, name, target, part)
            planner.commit_tensor(req, target)
        for f in files.values():
            stats = f.object_stats()
            if stats is not None:
                self.object_requests += stats[0]
                self.object_bytes += stats[1]
        fut: Future = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike)) and is_file(join(os.fspath(checkpoint_id), METADATA_FILE))


def _is_whole(req: Any, f: Any, name: str) -> bool:
    """Whether load request ``req`` asks for all of stored tensor ``name`` (a byte item always)."""
    if req.type == LoadItemType.BYTE_IO:
        return True
    _, shape = f.info(name)
    return all(o == 0 for o in req.storage_offsets) and list(req.lengths) == list(shape)


def _rows(f: Any, name: str, offsets: Any, lengths: Any) -> Tuple[str, List[int], int, int, Tuple[slice, ...]]:
    """The rows of stored tensor ``name`` that hold the box ``offsets`` + ``lengths`` (a
    row-major tensor's box lies within the rows it spans): ``(dtype, their shape, their byte
    range, the box's index into them)``."""
    dtype, shape = f.info(name)
    if len(offsets) != len(shape) or any(o < 0 or o + n > s for o, n, s in zip(offsets, lengths, shape)):
        raise error("malformed", f"{name}: box {list(offsets)}+{list(lengths)} is outside its shape {shape}")
    size = _dtypes.DTYPE_SIZE[dtype]
    if not shape:
        return dtype, [], 0, size, ()
    row = math.prod(shape[1:]) * size
    first, count = offsets[0], lengths[0]
    index = (slice(None),) + tuple(slice(o, o + n) for o, n in zip(offsets[1:], lengths[1:]))
    return dtype, [count, *shape[1:]], first * row, (first + count) * row, index


def _read_box(f: Any, name: str, offsets: Any, lengths: Any) -> torch.Tensor:
    """The box ``offsets`` + ``lengths`` of stored tensor ``name``, decoding only the chunks that
    hold its rows."""
    dtype, shape, start, end, index = _rows(f, name, offsets, lengths)
    return _dtypes.to_framework(f.read_range(name, start, end), dtype, shape, "pt")[index]


def _read_to_device(f: Any, file: str, device: Any, items: List[Tuple[Any, str, torch.Tensor]], planner: Any) -> None:
    """Load requests whose targets are on one GPU, from one file: the rows each box spans
    stream through the pinned ring, straight into a target that is those rows, else into a
    device buffer the box is then copied from, on the device."""
    dtypes = _dtypes.torch_dtypes()
    rows_of = [(req, name, target, *_rows(f, name, req.storage_offsets, req.lengths)) for req, name, target in items]
    stages = _staging.plan(f, [(name, start, end) for _, name, _, _, _, start, end, _ in rows_of if end > start])
    requests, landed = [], []
    for req, name, target, dtype, shape, start, end, index in rows_of:
        direct = target.is_contiguous() and target.dtype == dtypes[dtype] and list(target.shape) == shape
        rows = target if direct else torch.empty(shape, dtype=dtypes[dtype], device=device)
        if end > start:
            requests.append((name, start, end, _staging.flat_bytes(rows)))
        landed.append((req, name, target, None if direct else rows[index]))
    _staging.stream_into(f, requests, _staging.copier_for(device), stages=stages)
    for req, name, target, part in landed:
        if part is not None:
            _copy_part(file, name, target, part)
        planner.commit_tensor(req, target)


def _copy_part(file: str, name: str, target: torch.Tensor, part: torch.Tensor) -> None:
    """The part read of stored tensor ``name`` into the planner's ``target``, which must be its size."""
    if target.size() != part.size():
        raise error("malformed", f"{file}: {name} gives a {list(part.size())} part where {list(target.size())} is asked")
    target.copy_(part)
