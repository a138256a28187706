"""save_file and load_file, shared by tpde.numpy and tpde.torch: one function each, given the
framework's conversion."""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterable, Optional

from . import _tpde
from . import safe_open
from ._progress import resolve


def save_file(
    tensors: Dict[str, Any],
    path: Any,
    convert: Callable[[str, Any], Any],
    metadata: Optional[Dict[str, str]] = None,
    base: Any = None,
    codec: str = "auto",
    max_abs_error: Optional[float] = None,
    max_rel_error: Optional[float] = None,
    exact: Optional[Iterable[str]] = None,
    progress: Any = None,
) -> Dict[str, Any]:
    if not isinstance(tensors, dict):
        raise _tpde.TpdeError(f"tensors must be a dict of name to tensor, not {type(tensors).__name__}")
    items = []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise _tpde.TpdeError(f"tensor names must be str, not {name!r}")
        dtype, shape, flat = convert(name, t)
        items.append((name, dtype, shape, flat))
    if metadata is not None:
        bad = [k for k, v in metadata.items() if not (isinstance(k, str) and isinstance(v, str))]
        if bad:
            raise _tpde.TpdeError(f"metadata must map str to str; {bad[0]!r} does not")
    return _tpde.save(
        os.fspath(path),
        items,
        metadata=metadata,
        base=None if base is None else os.fspath(base),
        codec=codec,
        max_abs_error=max_abs_error,
        max_rel_error=max_rel_error,
        exact=None if exact is None else set(exact),
        progress=resolve(progress, f"saving {os.fspath(path)}"),
    )


def load_file(
    path: Any,
    framework: str,
    device: str = "cpu",
    base: Any = None,
    hints: Any = "folder",
    max_tensor_bytes: Optional[int] = None,
    progress: Any = None,
) -> Dict[str, Any]:
    with safe_open(path, framework=framework, device=device, base=base, hints=hints, max_tensor_bytes=max_tensor_bytes) as f:
        return f._get_tensors(f.keys(), resolve(progress, f"loading {os.fspath(path)}"))
