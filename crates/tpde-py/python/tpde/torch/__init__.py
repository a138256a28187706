"""TPDE files from and to torch tensors, as safetensors.torch, and ``Checkpointer``, which
writes a training loop's checkpoints as keyframes and deltas."""
from __future__ import annotations

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("tpde.torch needs PyTorch: pip install torch (tpde and tpde.numpy work without it)") from e

from typing import Any, Dict, Optional

from .. import _dtypes, _files
from .._checkpointer import Checkpointer

__all__ = ["save_file", "load_file", "Checkpointer"]


def save_file(
    tensors: Dict[str, torch.Tensor],
    path: Any,
    metadata: Optional[Dict[str, str]] = None,
    base: Any = None,
    codec: str = "auto",
    max_abs_error: Optional[float] = None,
    max_rel_error: Optional[float] = None,
) -> Dict[str, Any]:
    """Writes ``tensors`` to ``path`` atomically; with ``base`` (a ``.tpde`` or ``.safetensors``
    path) as a bit-exact delta against it, lossy if ``max_abs_error`` (τ) or ``max_rel_error`` (ρ) is given: a float element that
    changed by at most τ + ρ·|x| keeps the base's value. Tensors on
    any device, non-contiguous and tied ones are accepted (a tied tensor is stored once).
    Returns what was written (sizes, digest)."""
    return _files.save_file(tensors, path, _dtypes.from_torch, metadata, base, codec, max_abs_error, max_rel_error)


def load_file(path: Any, device: str = "cpu", base: Any = None) -> Dict[str, torch.Tensor]:
    """Every tensor of ``path``; a delta decodes against ``base`` or the base its hint names."""
    return _files.load_file(path, "pt", str(device), base)
