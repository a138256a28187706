"""The spec's dtypes in numpy (with ml_dtypes for bf16 and f8) and torch, and the conversions
between flat uint8 arrays (what the extension reads and writes) and typed arrays."""
from __future__ import annotations

import functools
import operator
from typing import Any, List, Sequence, Tuple

import ml_dtypes
import numpy as np

from ._errors import error
from ._tpde import TpdeError, dtypes

DTYPE_SIZE = dict(dtypes())

NUMPY = {
    "bool": np.dtype(np.bool_),
    "u8": np.dtype(np.uint8),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "u16": np.dtype(np.uint16),
    "i32": np.dtype(np.int32),
    "u32": np.dtype(np.uint32),
    "i64": np.dtype(np.int64),
    "u64": np.dtype(np.uint64),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "f8_e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
    "f8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}
FROM_NUMPY = {v: k for k, v in NUMPY.items()}
assert set(NUMPY) == set(DTYPE_SIZE), "every dtype of the spec has a numpy dtype"

# Integer dtypes of each width, to move elements around without interpreting them.
STORAGE = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


def framework(name: str) -> str:
    if name in ("pt", "torch"):
        return "pt"
    if name in ("np", "numpy"):
        return "np"
    raise TpdeError(f'framework must be "pt" or "np", not {name!r}')


@functools.lru_cache(maxsize=None)
def torch_dtypes():
    """The torch dtype of each TPDE dtype name (built once: torch is imported lazily)."""
    import torch

    return {
        "bool": torch.bool,
        "u8": torch.uint8,
        "i8": torch.int8,
        "i16": torch.int16,
        "u16": torch.uint16,
        "i32": torch.int32,
        "u32": torch.uint32,
        "i64": torch.int64,
        "u64": torch.uint64,
        "f16": torch.float16,
        "bf16": torch.bfloat16,
        "f32": torch.float32,
        "f64": torch.float64,
        "f8_e4m3": torch.float8_e4m3fn,
        "f8_e5m2": torch.float8_e5m2,
    }


@functools.lru_cache(maxsize=None)
def torch_dtype_names():
    return {v: k for k, v in torch_dtypes().items()}


def to_framework(flat: np.ndarray, dtype: str, shape: Sequence[int], fw: str, device: str = "cpu") -> Any:
    """A flat uint8 array as a typed array or tensor of `shape`, without a copy where it can."""
    if fw == "np":
        if device != "cpu":
            raise TpdeError(f'framework "np" reads to the CPU only, not {device!r}')
        return flat.view(NUMPY[dtype]).reshape(shape)
    import torch

    if flat.size == 0:
        return torch.empty(tuple(shape), dtype=torch_dtypes()[dtype], device=device)
    if not flat.flags.writeable:
        # A view of the memory map: torch has no read-only tensors, and a write into a
        # read-only page would kill the interpreter, so the tensor gets its own copy.
        flat = flat.copy()
    t = torch.from_numpy(flat).view(torch_dtypes()[dtype]).reshape(tuple(shape))
    return t if device == "cpu" else t.to(device)


def _not_a_tensor(name: str, value: Any, what: str) -> TpdeError:
    hint = ""
    if isinstance(value, (int, float, str, bool, dict, list, tuple)) or value is None:
        hint = " (a file holds tensors only; keep other values in metadata, or save a state with tpde.torch.Checkpointer)"
    return error("invalid-argument", f"tensor {name!r}: {type(value).__name__} is not {what}{hint}")


def check_name(name: Any) -> None:
    """A tensor name is a str that UTF-8 can hold (a lone surrogate cannot)."""
    if not isinstance(name, str):
        raise error("invalid-argument", f"tensor names are str, not {type(name).__name__} ({name!r})")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as e:
        raise error("invalid-argument", f"tensor name {name!r} is not valid Unicode ({e.reason} at {e.start})") from None


def from_numpy(name: str, a: Any) -> Tuple[str, List[int], np.ndarray]:
    """(dtype name, shape, flat uint8 array) of a numpy array, copied only if not contiguous."""
    check_name(name)
    if isinstance(a, np.generic):
        a = np.asarray(a)  # a numpy scalar: a 0-d array
    if not isinstance(a, np.ndarray):
        raise _not_a_tensor(name, a, "a numpy array")
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))  # TPDE stores little-endian
    dtype = FROM_NUMPY.get(a.dtype.newbyteorder("="))
    if dtype is None:
        raise TpdeError(f"tensor {name!r}: numpy dtype {a.dtype} has no TPDE dtype")
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return dtype, list(a.shape), flat


def from_torch(name: str, t: Any) -> Tuple[str, List[int], np.ndarray]:
    """(dtype name, shape, flat uint8 array) of a torch tensor: a view of its memory when it is
    a contiguous CPU tensor, else a contiguous CPU copy."""
    import torch

    check_name(name)
    if not isinstance(t, torch.Tensor):
        raise _not_a_tensor(name, t, "a torch.Tensor")
    if t.is_meta:
        raise error("invalid-argument", f"tensor {name!r} is on the meta device: it has a shape but no values to save")
    names = torch_dtype_names()
    if t.dtype not in names:
        raise TpdeError(f"tensor {name!r}: torch dtype {t.dtype} has no TPDE dtype")
    if t.is_sparse or t.layout != torch.strided:
        raise TpdeError(f"tensor {name!r}: only dense (strided) tensors can be saved")
    flat = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
    return names[t.dtype], list(t.shape), flat


def row_major_strides(shape: Sequence[int]) -> List[int]:
    strides, n = [], 1
    for d in reversed(shape):
        strides.append(n)
        n *= d
    return list(reversed(strides))


def normalize_index(key: Any, shape: Sequence[int]) -> List[Tuple[Sequence[int], bool]]:
    """Per axis: the selected indices and whether the axis stays in the result. Supports ints,
    slices and one Ellipsis, as numpy's basic indexing does."""
    if not isinstance(key, tuple):
        key = (key,)
    if sum(k is Ellipsis for k in key) > 1:
        raise TpdeError("an index can have only one ellipsis")
    if Ellipsis in key:
        i = key.index(Ellipsis)
        fill = len(shape) - (len(key) - 1)
        key = key[:i] + (slice(None),) * max(fill, 0) + key[i + 1 :]
    if len(key) > len(shape):
        raise TpdeError(f"too many indices: {len(key)} for a tensor of rank {len(shape)}")
    key = key + (slice(None),) * (len(shape) - len(key))
    out = []
    for axis, (k, n) in enumerate(zip(key, shape)):
        if isinstance(k, slice):
            out.append((range(*k.indices(n)), True))
            continue
        try:
            i = operator.index(k)
        except TypeError:
            raise TpdeError(f"axis {axis}: index {k!r} is not an int, a slice or ...") from None
        if not -n <= i < n:
            raise TpdeError(f"axis {axis}: index {i} is out of range for size {n}")
        out.append(([i % n], False))
    return out
