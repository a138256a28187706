"""A framework's checkpoint folder (a Hugging Face Trainer's ``checkpoint-N/``, Accelerate's
``save_state`` folder) stored as one ``.tpde`` file in it, and given back.

``pack`` reads the folder's ``.safetensors`` files (tensors and metadata) and its ``torch.save``
files (``.pt``, ``.bin``, ``.pth``, ``.pkl``: optimizer, scheduler, RNG states) into one state,
``{"files": {NAME: {"safetensors": {...}} | {"torch": ...}}}``, saves it through a
``tpde.torch.Series`` (so it is a keyframe and the checkpoint before it a delta against it), and
deletes the files it holds. A ``torch.save`` file is read with ``weights_only=True`` (numpy's RNG
arrays allowed, as the frameworks' own loaders allow them): a file holding any other object is a
``TpdeError`` naming it, and the folder stays as the framework wrote it. Other files (JSON, the
tokenizer, the README) stay beside the ``.tpde`` file as they are.

``expand`` writes the files back, into a folder of the caller's choice, so that the framework's
own loader reads them: the same tensors bit for bit and the same states, in files written anew
(``torch.save`` and ``safetensors`` of the same content; the bytes may differ from the originals).
"""
from __future__ import annotations

import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

from .._errors import error
from . import _rewrite
from .series import Series

STORED = "checkpoint.tpde"
# A stored folder explains itself to whoever finds it (``from_pretrained`` on it fails with
# "no file named model.safetensors"): what it is and the one command that gives it back.
NOTE = "TPDE-README.txt"
NOTE_TEXT = """This checkpoint folder was stored by TPDE: its weight and state files are in checkpoint.tpde
(bit for bit; a keyframe, or a delta against the checkpoint folder beside it that it names), so
from_pretrained, torch.load and the framework's own resume cannot open the folder as it is.

The folder as the framework wrote it, in a new folder (the `tpde` command of `pip install tpde`):

    tpde unpack {name} -o {name}-exported

or in Python: tpde.transformers.export("{name}", "DEST") (HF Trainer),
tpde.transformers.resume("{name}") for Trainer.train(resume_from_checkpoint=...),
tpde.accelerate.load_state(accelerator, "{name}") (Accelerate).

`tpde inspect ..` lists which folders need which: keep the ones this one is a delta against.
"""
FORMAT = "tpde-folder/1"  # checkpoint.folder: the state is a folder's files
TORCH_FILES = (".pt", ".bin", ".pth", ".pkl")  # torch.save files, read with weights_only


def _safe_globals():
    """What ``weights_only`` loading allows beyond tensors: numpy's RNG state arrays."""
    core = getattr(np, "_core", None) or np.core
    return torch.serialization.safe_globals(
        [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    )


def _read_torch(path: str) -> Any:
    import pickle

    try:
        with _safe_globals():
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise error(
            "invalid-argument",
            f"{path}: holds an object that only a pickle can carry, so it is not stored in TPDE (never a "
            f"pickle); the folder stays as it was written. torch.load(weights_only=True) said: {first[:300]}",
        ) from None


class Storer:
    """A framework's folders stored one after another (``pack``) through one ``Series``, each on
    a thread of its own while training goes on (with ``background``), or at once. The caller
    ``wait``s before the framework may delete old folders."""

    def __init__(self, keyframe_every: int = _rewrite.KEYFRAME_EVERY, codec: str = "auto", background: bool = True):
        self.series = Series(keyframe_every=keyframe_every, codec=codec)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpde-folder") if background else None
        self._storing: Optional[Future] = None

    def submit(self, job: Callable[..., Any], *args: Any, now: bool = False) -> None:
        """Runs ``job(*args)`` (which stores a folder) on the thread, after the one before it;
        without ``background`` (or with ``now``), here and now."""
        self.wait()
        if self._pool is None or now:
            job(*args)
        else:
            self._storing = self._pool.submit(job, *args)

    def wait(self) -> None:
        """Blocks until the folder last submitted is stored; raises its error, if any."""
        storing, self._storing = self._storing, None
        if storing is not None:
            storing.result()


def save_checked(state: Any, path: str) -> None:
    """``torch.save`` of ``state`` to ``path``, whole or not at all, refused (nothing left) if
    ``torch.load(weights_only=True)`` would not read it back: a file given back never asks its
    reader to turn that safety off (a crafted ``.tpde`` file can hold what only a pickle reads)."""
    from .._tpde import TpdeError

    tmp = f"{path}.tpde-partial"
    try:
        torch.save(state, tmp)
        _read_torch(tmp)
        os.replace(tmp, path)
    except TpdeError as e:
        raise error("malformed", f"{path}: not written: its state holds what only a pickle reads: {e}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def holds_states(folder: str) -> bool:
    """Whether ``folder`` holds weight or state files as a framework writes them."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return any(n.endswith((".safetensors",) + TORCH_FILES) for n in names)


def is_native(folder: str) -> bool:
    """Whether ``folder`` is as the framework wrote it: state files, and no stored file."""
    return not os.path.exists(os.path.join(folder, STORED)) and holds_states(folder)


def continue_series(series: Any, older: List[str]) -> None:
    """A ``series`` new to this process (a resumed run) continues from the newest of the folders
    ``older`` (oldest first) that is stored, so that it is written again as a delta against the
    next folder stored, as it would have been in one process."""
    if series.newest() is None:
        stored = [f for f in older if os.path.isfile(os.path.join(f, STORED))]
        if stored:
            series.continue_from(os.path.join(stored[-1], STORED))


def pack(folder: str, series: Any, metadata: Dict[str, str]) -> List[str]:
    """Stores ``folder``'s tensor and state files in ``folder/checkpoint.tpde`` through ``series``
    and deletes them; returns their names (none: nothing is written)."""
    from safetensors import safe_open

    files: Dict[str, Any] = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        if name.endswith(".safetensors"):
            with safe_open(path, "pt") as f:  # metadata and tensors in one opening
                st = {"metadata": f.metadata(), "tensors": {k: f.get_tensor(k) for k in f.keys()}}
            files[name] = {"safetensors": st}
        elif name.endswith(TORCH_FILES):
            files[name] = {"torch": _read_torch(path)}
    if not files:
        return []
    series.save(os.path.join(folder, STORED), {"files": files}, metadata={**metadata, "checkpoint.folder": FORMAT})
    for name in files:
        os.remove(os.path.join(folder, name))
    with open(os.path.join(folder, NOTE), "w") as f:
        f.write(NOTE_TEXT.format(name=os.path.basename(os.path.abspath(folder))))
    return list(files)


def expand(folder: str, dest: str, series: Any, hints: Any = "follow") -> List[str]:
    """Writes the files ``folder/checkpoint.tpde`` holds into ``dest`` (created), beside copies
    of ``folder``'s other files; returns the names written from the ``.tpde`` file. ``hints`` as
    for ``safe_open``."""
    from safetensors.torch import save_file

    stored = os.path.join(folder, STORED)
    state = series.load(stored, hints=hints)
    files = state.get("files") if isinstance(state, dict) else None
    if not isinstance(files, dict):
        raise error("malformed", f"{stored}: not a folder's checkpoint (no files in its state)")
    os.makedirs(dest, exist_ok=True)
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name not in (STORED, NOTE) and os.path.isfile(path) and not os.path.islink(path):
            if name.endswith(TORCH_FILES) and name not in files:
                _read_torch(path)  # a pickle beside the stored files is given back only if it is safe to load
            shutil.copy2(path, os.path.join(dest, name))
    for name, content in files.items():
        # a name from the file: one plain file name, never a path
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise error("malformed", f"{stored}: {str(name)[:80]!r} is not a file name")
        out = os.path.join(dest, name)
        if "safetensors" in content:
            st = content["safetensors"]
            save_file({k: v.contiguous() for k, v in st["tensors"].items()}, out, metadata=st["metadata"])
        elif "torch" in content:
            save_checked(content["torch"], out)
        else:
            raise error("malformed", f"{stored}: {name}: neither safetensors nor torch content")
    return list(files)
