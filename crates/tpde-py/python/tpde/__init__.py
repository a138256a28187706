"""TPDE: neural-network checkpoints as keyframes and bit-exact temporal deltas.

The API follows safetensors', so that existing code changes one import::

    import tpde.torch
    tpde.torch.save_file(model.state_dict(), "step1000.tpde")
    tpde.torch.save_file(model.state_dict(), "step1100.tpde", base="step1000.tpde")  # a delta
    tensors = tpde.torch.load_file("step1100.tpde")  # its base found through its path hint

    with tpde.safe_open("step1100.tpde", framework="pt") as f:
        w = f.get_slice("lm_head.weight")[:128]  # decodes only the chunks it needs

``tpde.torch.Checkpointer`` writes a training loop's checkpoints as a chain of deltas. Every
path may also be an object URL, ``s3://bucket/key`` (configured by the ``AWS_*`` variables).
Everything is done by the Rust crates; this package converts types.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Optional, Union

from . import _dtypes
from ._errors import TpdeNotFoundError
from ._tpde import TpdeError, __version__

__all__ = ["TpdeError", "TpdeNotFoundError", "safe_open", "pack", "unpack", "copy", "__version__"]

PathLike = Union[str, "os.PathLike[str]"]

# TpdeError is raised by the extension with a `kind`; one made in Python gets one too.
TpdeError.kind = "invalid-argument"


def pack(
    input: PathLike,
    output: PathLike,
    base: Optional[PathLike] = None,
    codec: str = "auto",
    max_abs_error: Optional[float] = None,
    max_rel_error: Optional[float] = None,
    progress: Any = None,
) -> Dict[str, Any]:
    """As ``tpde pack``: a ``.safetensors`` file, or a Hugging Face model folder (its
    ``model.safetensors`` or its shards and ``*.safetensors.index.json``, with the files beside
    them: config, tokenizer, README), into one ``.tpde`` file; a delta against ``base`` (a
    ``.tpde``, a ``.safetensors`` or a model folder: a fine-tune against its base model) if
    given. Returns what was written (sizes, digest, ``files`` carried, ``skipped_files`` left
    out: weights and their indexes, hidden folders; ``links``, the ``(path, target)`` of each
    carried file that is a link). Links are read through only inside the folder or into a
    Hugging Face cache's blobs, and a FIFO or device is refused. ``progress``: None draws a bar on an
    interactive terminal, False none, or a callable gets ``(done, total)`` bytes as it goes. A base
    outside ``output``'s folder is a warning saying what the unpack will need (``hint_note``)."""
    from ._progress import resolve
    from ._tpde import pack as _pack

    base = None if base is None else os.fspath(base)
    bar = resolve(progress, f"packing {os.fspath(input)}")
    report = _pack(os.fspath(input), os.fspath(output), base, codec, max_abs_error, max_rel_error, progress=bar)
    if report.get("hint_note"):
        # pack and unpack agree: what a default unpack of this delta will need
        warnings.warn(report["hint_note"], stacklevel=2)
    return report


def unpack(
    input: PathLike,
    output: PathLike,
    base: Optional[PathLike] = None,
    hints: Any = "folder",
    progress: Any = None,
    replace: bool = False,
) -> None:
    """As ``tpde unpack``: a ``.tpde`` file into a ``.safetensors`` file; a file packed from a
    model folder into that folder again (its files and its weights byte for byte what was
    packed, and the index written from the tensors' layout: loadable by ``from_pretrained``),
    unless ``output`` ends in ``.safetensors``. The folder is written beside ``output`` and put
    there only when whole: a refused or failed unpack leaves nothing. A folder ``output`` that
    has files is refused, or with ``replace=True`` replaced whole in one step (never a mix of two
    versions). ``progress`` as for ``pack``; ``hints`` as for ``safe_open``."""
    from ._progress import resolve
    from ._tpde import unpack as _unpack

    bar = resolve(progress, f"unpacking {os.fspath(input)}")
    base = None if base is None else os.fspath(base)
    _unpack(os.fspath(input), os.fspath(output), base, progress=bar, replace=replace, **_hint_args(input, hints))


def copy(source: PathLike, dest: PathLike) -> int:
    """As ``tpde cp``: copies a file between local paths and ``s3://bucket/key`` URLs,
    streaming; the copy appears whole or not at all. Returns the bytes copied."""
    from ._tpde import copy as _copy

    return _copy(os.fspath(source), os.fspath(dest))


HINTS = ("folder", "follow", "none")


def _hint_args(path: PathLike, hints: Any) -> Dict[str, Any]:
    """The binding's arguments for ``hints``: ``"folder"`` (the file's own folder, or for an
    ``s3://`` file its bucket), ``"follow"`` (every hint), ``"none"``, or a list of folders."""
    if isinstance(hints, str):
        if hints not in HINTS:
            raise TpdeError(f'hints must be "folder", "follow", "none" or a list of folders, not {hints!r}')
        if hints == "folder":
            p = os.fspath(path)
            roots = [] if p.startswith(("s3://", "s3a://")) else [os.path.dirname(os.path.abspath(p))]
            return {"follow_hints": True, "hint_roots": roots}
        return {"follow_hints": hints == "follow", "hint_roots": None}
    return {"follow_hints": True, "hint_roots": [os.fspath(r) for r in hints]}


def _file(path: PathLike, base: Optional[PathLike], hints: Any = "folder", max_tensor_bytes: Optional[int] = None):
    from ._tpde import File

    return File(
        os.fspath(path),
        None if base is None else os.fspath(base),
        max_tensor_bytes=max_tensor_bytes,
        **_hint_args(path, hints),
    )


class safe_open:
    """An open `.tpde` file, as `safetensors.safe_open`.

    ``framework`` is ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays). ``base`` is the
    checkpoint a delta decodes against (a ``.tpde`` or ``.safetensors`` path); without it a
    delta's base is found through the path hint it records. ``hints`` says which hints are
    followed: ``"folder"`` (the default: only into the file's own folder and below, or for an
    ``s3://`` file its bucket, so that a file from elsewhere cannot make the reader open a path
    of its choosing), ``"follow"`` (every local path, for your own files; ``s3://`` URLs only
    when object storage is configured or the file was opened by URL), ``"none"``, or a list of
    folders that a hint must lead into. ``max_tensor_bytes`` caps a tensor's decoded size (default 16 GiB): a
    larger one is a ``limit-exceeded`` error before anything is allocated. Tensors stored ``raw`` come back
    as read-only numpy views of the memory map (torch tensors are copied once, since torch has
    no read-only tensors); others are decoded straight into the returned array.
    """

    def __init__(
        self,
        path: PathLike,
        framework: str = "pt",
        device: str = "cpu",
        base: Optional[PathLike] = None,
        hints: Any = "folder",
        max_tensor_bytes: Optional[int] = None,
    ):
        self._framework = _dtypes.framework(framework)
        self._device, self._staged = device, None
        if self._framework == "pt":
            from .torch import _staging

            d = _staging.device_of(device)
            self._device = str(d)
            # Onto a GPU: decoded into a ring of pinned buffers, each copied while the next decodes.
            self._staged = d if _staging.is_staged(d) else None
        self._file = _file(path, base, hints, max_tensor_bytes)

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._file = None

    def _f(self):
        if self._file is None:
            raise TpdeError("the file is closed")
        return self._file

    def keys(self) -> List[str]:
        """Tensor names, in the file's order."""
        return self._f().keys()

    def metadata(self) -> Dict[str, str]:
        """The user's metadata (entries outside TPDE's reserved ``tpde.`` namespace)."""
        return self._f().metadata()

    def get_tensor(self, name: str):
        """The whole tensor ``name``."""
        if self._staged is not None:
            return self._get_tensors([name])[name]
        dtype, shape = self._f().info(name)
        flat = self._f().read(name)
        return _dtypes.to_framework(flat, dtype, shape, self._framework, self._device)

    def _get_tensors(self, names: List[str], progress: Any = None) -> Dict[str, Any]:
        """Tensors ``names``, decoded in one parallel pass (what ``load_file`` reads)."""
        f = self._f()
        if self._staged is not None:
            from .torch import _staging

            return _staging.load(f, names, self._staged, progress)
        # torch copies a view of the map anyway (see to_framework): decode those copies in the
        # same pass.
        flats = f.read_many(list(names), copy_raw=self._framework == "pt", progress=progress)
        out = {}
        for name, flat in zip(names, flats):
            dtype, shape = f.info(name)
            out[name] = _dtypes.to_framework(flat, dtype, shape, self._framework, self._device)
        return out

    def get_slice(self, name: str) -> "TensorSlice":
        """A lazy view of tensor ``name``: index it to read part of it."""
        return TensorSlice(self, name)


class TensorSlice:
    """A tensor not yet read. ``[...]`` with ints, slices (any step) and ``...`` reads only the
    chunks that hold the selected elements."""

    def __init__(self, f: safe_open, name: str):
        self._open = f
        self._name = name
        self._dtype, self._shape = f._f().info(name)

    def get_shape(self) -> List[int]:
        return list(self._shape)

    def get_dtype(self) -> str:
        return self._dtype

    def __getitem__(self, key: Any):
        import numpy as np

        sel = _dtypes.normalize_index(key, self._shape)
        size = _dtypes.DTYPE_SIZE[self._dtype]
        out_shape = [len(ix) for ix, keep in sel if keep]
        if any(len(ix) == 0 for ix, _ in sel):
            flat = np.zeros(0, dtype=np.uint8)
            return _dtypes.to_framework(flat, self._dtype, out_shape, self._open._framework, self._open._device)
        strides = _dtypes.row_major_strides(self._shape)
        # The flat element offsets of every selected element, by broadcasting each axis's
        # indices over the others.
        offsets = np.zeros((), dtype=np.int64)
        for (ix, _), stride in zip(sel, strides):
            offsets = offsets[..., None] + np.asarray(ix, dtype=np.int64) * stride
        lo, hi = int(offsets.min()), int(offsets.max()) + 1
        device = self._open._staged
        if device is not None and hi - lo == offsets.size and (offsets.reshape(-1) == np.arange(lo, hi)).all():
            # One run of bytes (rows of a row-major tensor): streamed straight into the device.
            from .torch import _staging

            return _staging.load_range(self._open._f(), self._name, lo * size, hi * size, out_shape, device)
        raw = self._open._f().read_range(self._name, lo * size, hi * size)
        elems = raw.view(_dtypes.STORAGE[size])[offsets - lo]
        flat = np.ascontiguousarray(elems).reshape(-1).view(np.uint8)
        return _dtypes.to_framework(flat, self._dtype, out_shape, self._open._framework, self._open._device)
