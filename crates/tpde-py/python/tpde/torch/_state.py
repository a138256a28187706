"""The state a ``Checkpointer`` saves, flattened: tensors by their path in the state, the rest as
JSON (never pickle), and back.

``tpde-state/1``: a value is a JSON scalar (str, int, float, bool, null) or an object with one
key: ``{"tensor": NAME}`` (a tensor stored under NAME; ``"device"`` may follow),
``{"list": [...]}``; a tensor node with ``"numpy": true`` is a numpy array (an RNG state's),
``{"list": [...]}``, ``{"tuple": [...]}``, ``{"dict": [[KEY, VALUE], ...]}`` (KEY a JSON scalar:
optimizer states are keyed by int), ``{"float": "nan" | "inf" | "-inf"}``.
"""
from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Tuple

import numpy as np
import torch

from .. import _dtypes, _tpde, safe_open
from . import _staging
from .._errors import error

SCHEMA = "tpde-state/1"
SCHEMA_DCP = "tpde-dcp-state/1"  # a step saved through DCP: the state's layout is DCP's metadata


class _Flattener:
    """Turns a nested state into (JSON tree, tensors by name)."""

    def __init__(self) -> None:
        self.tensors: Dict[str, torch.Tensor] = {}
        self.exact: List[str] = []
        # Tensors already seen, by storage and view: a tensor met twice (tied weights) is
        # stored once and restored as one tensor.
        self._seen: Dict[Tuple, str] = {}
        # Optimizer state dicts met (``state`` and ``param_groups``), by path.
        self.optimizers: List[Tuple[str, Dict[str, Any]]] = []
        # The containers on the path being flattened: one met again holds itself.
        self._open: set = set()

    def flatten(self, state: Any) -> Any:
        """The JSON tree of ``state``; its tensors go to ``self.tensors``."""
        try:
            return self.value(state, "")
        except RecursionError:
            raise error("invalid-argument", "state: nested too deeply to be saved") from None

    def value(self, v: Any, path: str) -> Any:
        if isinstance(v, (dict, list, tuple)):
            if id(v) in self._open:
                raise error("invalid-argument", f"{path or 'state'}: a {type(v).__name__} that holds itself cannot be saved")
            self._open.add(id(v))
            try:
                return self._value(v, path)
            finally:
                self._open.discard(id(v))
        return self._value(v, path)

    def _value(self, v: Any, path: str) -> Any:
        if isinstance(v, torch.Tensor):
            return self._tensor(v, path)
        if isinstance(v, np.ndarray) and v.dtype.kind in "biuf":
            # numpy's RNG state holds one; restored as an array (a copy: the array may be read-only)
            return {**self._tensor(torch.from_numpy(v.copy()), path), "numpy": True}
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            return v if math.isfinite(v) else {"float": repr(v)}
        if isinstance(v, dict):
            if isinstance(v.get("state"), dict) and isinstance(v.get("param_groups"), list):
                self.optimizers.append((path, v))
            items = []
            for k, x in v.items():
                if not (k is None or isinstance(k, (bool, int, float, str))):
                    raise error(
                        "invalid-argument",
                        f"{path or 'state'}: dict key {k!r} of type {type(k).__name__} cannot be saved",
                    )
                items.append([k, self.value(x, f"{path}/{k}" if path else str(k))])
            return {"dict": items}
        if isinstance(v, (list, tuple)):
            out = [self.value(x, f"{path}/{i}") for i, x in enumerate(v)]
            return {"tuple": out} if isinstance(v, tuple) else {"list": out}
        raise error(
            "invalid-argument",
            f"{path or 'state'}: a {type(v).__name__} cannot be saved (tensors, dicts, lists, tuples, "
            "str, int, float, bool and None can; never a pickle)",
        )

    def _tensor(self, t: torch.Tensor, path: str) -> Dict[str, Any]:
        _dtypes.check_name(path)
        if t.layout != torch.strided:
            raise error("invalid-argument", f"{path}: a {t.layout} tensor cannot be saved; only dense (strided) ones can (.to_dense() first)")
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        name = self._seen.get(key) if t.numel() > 0 else None
        if name is None:
            name = path
            n = 1
            while name in self.tensors:  # a key with a "/" in it could repeat a path
                n += 1
                name = f"{path}#{n}"
            self.tensors[name] = t
            self._seen[key] = name
            # An optimizer's step counter stays exact in a lossy checkpoint.
            if path.rsplit("/", 1)[-1] == "step" or not (t.is_floating_point()):
                self.exact.append(name)
        node: Dict[str, Any] = {"tensor": name}
        if t.device.type != "cpu":
            node["device"] = str(t.device)
        return node


def _unflatten(node: Any, tensors: Dict[str, torch.Tensor], map_location: Any) -> Any:
    if not isinstance(node, dict):
        return node
    (kind, v), *rest = node.items()
    if kind == "tensor":
        t = tensors[v]
        if node.get("numpy"):
            return t.numpy()
        if map_location is None:
            device = node.get("device", "cpu")
            return t if device == "cpu" else t.to(device)
        return t if str(map_location) == "cpu" else t.to(map_location)
    if kind == "dict":
        return {k: _unflatten(x, tensors, map_location) for k, x in v}
    if kind == "list":
        return [_unflatten(x, tensors, map_location) for x in v]
    if kind == "tuple":
        return tuple(_unflatten(x, tensors, map_location) for x in v)
    if kind == "float":
        return float(v)
    raise _tpde.TpdeError(f"checkpoint state: unknown node {kind!r} (schema {SCHEMA})")


def _devices(node: Any, map_location: Any, out: Dict[str, Any]) -> None:
    """Where each tensor of a state tree goes: a torch device (CPU for numpy arrays)."""
    if not isinstance(node, dict):
        return
    (kind, v), *_ = node.items()
    if kind == "tensor":
        if node.get("numpy"):
            out.setdefault(v, torch.device("cpu"))
        elif isinstance(map_location, torch.device):
            out.setdefault(v, map_location)
        elif map_location is None:
            out.setdefault(v, _staging.device_of(node.get("device", "cpu")))
    elif kind == "dict":
        for _, x in v:
            _devices(x, map_location, out)
    elif kind in ("list", "tuple"):
        for x in v:
            _devices(x, map_location, out)


def load_state(path: str, map_location: Any = "cpu", hints: Any = "follow") -> Any:
    """The state saved in the file ``path`` (``tpde-state/1``), tensors bit-exact, on
    ``map_location`` (None: the device each was saved from); a file that is not a state file is
    a ``malformed`` TpdeError naming it. ``hints`` as for ``safe_open``: by default followed
    wherever they lead, for the files of the user's own run (a framework's checkpoint folders
    are siblings); an export of a file from elsewhere confines them (``_export``)."""
    if isinstance(map_location, (str, torch.device)):
        map_location = _staging.device_of(map_location)
    with safe_open(path, "pt", hints=hints) as f:
        meta = f.metadata()
        if meta.get("checkpoint.format") != SCHEMA:
            raise error("malformed", f"{path}: not a Checkpointer file (no {SCHEMA} state in its metadata)")
        try:
            tree = json.loads(meta["checkpoint.state"])
            devices: Dict[str, Any] = {}
            _devices(tree, map_location, devices)
        except (KeyError, ValueError, TypeError, AttributeError, RecursionError) as e:
            raise error("malformed", f"{path}: its checkpoint.state does not describe its tensors: {type(e).__name__}: {e}") from None
        # Tensors bound for a GPU stream there through the pinned ring, a pass per device; the
        # rest decode in one parallel pass over their chunks.
        by_device: Dict[Any, List[str]] = {}
        for name in f.keys():
            d = devices.get(name, torch.device("cpu"))
            by_device.setdefault(d if _staging.is_staged(d) else None, []).append(name)
        tensors = f._get_tensors(by_device.pop(None, []))
        for d, names in by_device.items():
            tensors.update(_staging.load(f._f(), names, d))
    try:
        return _unflatten(tree, tensors, map_location)
    except _tpde.TpdeError as e:
        raise error("malformed", f"{path}: {e}") from None
    except (KeyError, ValueError, TypeError, AttributeError, RecursionError) as e:
        raise error("malformed", f"{path}: its checkpoint.state does not describe its tensors: {type(e).__name__}: {e}") from None
