"""TPDE files from and to numpy arrays (bf16 and f8 through ml_dtypes), as safetensors.numpy."""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from . import _dtypes, _files

__all__ = ["save_file", "load_file"]


def save_file(
    tensors: Dict[str, np.ndarray],
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
    changed by at most τ + ρ·|x| keeps the base's value. Returns
    what was written (sizes, digest)."""
    return _files.save_file(
        tensors, path, _dtypes.from_numpy, metadata, base, codec, max_abs_error, max_rel_error, progress=progress
    )


def load_file(
    path: Any,
    device: str = "cpu",
    base: Any = None,
    hints: Any = "folder",
    max_tensor_bytes: Optional[int] = None,
    progress: Any = None,
) -> Dict[str, np.ndarray]:
    """Every tensor of ``path``; a delta decodes against ``base`` or the base its hint names
    (``hints`` and ``max_tensor_bytes`` as for ``tpde.safe_open``; ``progress`` as for
    ``save_file``)."""
    return _files.load_file(path, "np", device, base, hints, max_tensor_bytes, progress)
