"""TPDE files from and to torch tensors, as safetensors.torch, and ``Checkpointer``, which
writes a training loop's checkpoints as keyframes and deltas."""
from __future__ import annotations

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("tpde.torch needs PyTorch: pip install torch (tpde and tpde.numpy work without it)") from e

from typing import Any, Dict, List, Optional, Tuple

from .. import _dtypes, _files, safe_open
from . import _staging
from .checkpointer import Checkpointer
from .series import Series
from .._errors import error

__all__ = ["save_file", "load_file", "load_into", "Checkpointer", "Series"]


def save_file(
    tensors: Dict[str, torch.Tensor],
    path: Any,
    metadata: Optional[Dict[str, str]] = None,
    base: Any = None,
    codec: str = "auto",
    max_abs_error: Optional[float] = None,
    max_rel_error: Optional[float] = None,
    progress: Any = None,
) -> Dict[str, Any]:
    """Writes ``tensors`` to ``path`` atomically; with ``base`` (a ``.tpde`` or ``.safetensors``
    path) as a bit-exact delta against it, lossy if ``max_abs_error`` (τ) or ``max_rel_error`` (ρ) is given: a float element that
    changed by at most τ + ρ·|x| keeps the base's value. Tensors on
    any device, non-contiguous and tied ones are accepted (a tied tensor is stored once).
    Returns what was written (sizes, digest)."""
    return _files.save_file(
        tensors, path, _dtypes.from_torch, metadata, base, codec, max_abs_error, max_rel_error, progress=progress
    )


def load_file(
    path: Any,
    device: str = "cpu",
    base: Any = None,
    hints: Any = "folder",
    max_tensor_bytes: Optional[int] = None,
    progress: Any = None,
) -> Dict[str, torch.Tensor]:
    """Every tensor of ``path``; a delta decodes against ``base`` or the base its hint names
    (``hints`` and ``max_tensor_bytes`` as for ``tpde.safe_open``; ``progress`` as for
    ``save_file``). On a CUDA ``device`` the tensors decode on every CPU core into a small ring
    of pinned buffers, each copied to the device while the next decodes: host memory stays
    within the ring; a device torch does not know is a TpdeError."""
    return _files.load_file(path, "pt", str(device), base, hints, max_tensor_bytes, progress)


def load_into(
    path: Any, tensors: Dict[str, torch.Tensor], base: Any = None, strict: bool = True, hints: Any = "folder"
) -> Tuple[List[str], List[str]]:
    """Decodes the tensors of ``path`` into ``tensors`` in place (for example a model's
    ``state_dict()``): a restore into memory that already exists, with no new pages and no copy,
    where ``load_file`` followed by ``load_state_dict`` allocates every tensor and then copies
    it. Each tensor must have the file's dtype and shape. Contiguous CPU tensors are decoded
    into directly, in one parallel pass; contiguous CUDA tensors through a small ring of pinned
    buffers, each copied while the next decodes; others (another device, strided) get a
    decoded copy.
    Names sharing one storage (tied weights) are decoded once. Returns ``(missing,
    unexpected)``: names of ``tensors`` the file lacks, and of the file that ``tensors`` lacks;
    with ``strict`` either one raises instead. ``hints`` as for ``tpde.safe_open``."""
    with safe_open(path, framework="pt", base=base, hints=hints) as f:
        file_names = f.keys()
        in_file = set(file_names)
        missing = [k for k in tensors if k not in in_file]
        unexpected = [k for k in file_names if k not in tensors]
        if strict and (missing or unexpected):
            raise error(
                "invalid-argument",
                f"load_into: the file and the tensors differ: missing from the file {missing[:5]}, "
                f"not in the tensors {unexpected[:5]}",
            )
        dtypes = _dtypes.torch_dtypes()
        names, outs, copies, seen = [], [], [], set()
        on_device: Dict[Any, List[Tuple[str, torch.Tensor]]] = {}
        for name in file_names:
            t = tensors.get(name)
            if t is None:
                continue
            dtype, shape = f._f().info(name)
            if t.dtype != dtypes[dtype] or tuple(t.shape) != tuple(shape):
                raise error(
                    "invalid-argument",
                    f"tensor {name!r}: the file holds {dtype} {list(shape)}, the tensor is {t.dtype} {list(t.shape)}",
                )
            if t.numel() == 0:
                continue
            staged = _staging.is_staged(t.device)
            if not (t.device.type == "cpu" or staged) or not t.is_contiguous():
                copies.append(name)
                continue
            at = (str(t.device), t.data_ptr(), t.numel() * t.element_size())
            if at in seen:
                continue  # tied: the same memory, decoded once
            seen.add(at)
            if staged:
                on_device.setdefault(t.device, []).append((name, t))
                continue
            names.append(name)
            outs.append(_staging.flat_bytes(t).numpy())
        f._f().read_into(names, outs)
        for targets in on_device.values():
            _staging.load_into(f._f(), targets)
        if copies:
            with torch.no_grad():
                for name, decoded in f._get_tensors(copies).items():
                    tensors[name].copy_(decoded)
    return missing, unexpected
