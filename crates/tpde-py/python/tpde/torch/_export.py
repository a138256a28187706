"""A checkpoint a plug-in or a ``Checkpointer`` stored, back in the framework's own form: one
implementation for ``tpde.lightning.export``, ``tpde.transformers.export`` and the pip package's
``tpde unpack`` of a framework checkpoint (``torch.save`` needs Python, so the Rust command leaves
these to it).

- A state file (``tpde-state/1``: a Lightning ``.ckpt``, a ``Checkpointer`` or ``Series`` step)
  becomes a ``torch.save`` file of the same state, tensors bit for bit.
- A checkpoint folder (a ``checkpoint.tpde`` holding ``tpde-folder/1``: the HF Trainer's
  ``checkpoint-N``, Accelerate's ``save_state`` folder) becomes the folder the framework wrote.

Either is written whole or not at all, and never over an existing file or folder. The file may
come from elsewhere, so its base hints are confined as every front end confines them (``hints``
as for ``safe_open``): by default to the folder the checkpoint lies in (a state file's folder; a
checkpoint folder's run folder, where the folders it is a delta against lie).
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Optional

import torch

from .. import _tpde
from .._errors import error
from . import _folder
from ._state import SCHEMA
from .series import Series


def kind(path: str) -> Optional[str]:
    """``"folder"`` for a checkpoint folder (or its ``checkpoint.tpde``), ``"state"`` for a state
    file, ``None`` for anything else (a plain TPDE file of tensors, a file that does not open)."""
    if os.path.isdir(path):
        return "folder" if os.path.isfile(os.path.join(path, _folder.STORED)) else None
    try:
        if not _tpde.is_tpde(path):
            return None
        meta = _tpde.File(path, None, follow_hints=False).metadata()
    except (_tpde.TpdeError, OSError):
        return None
    if meta.get("checkpoint.folder") == _folder.FORMAT:
        return "folder"
    return "state" if meta.get("checkpoint.format") == SCHEMA else None


def torch_save(state: Any, path: str) -> None:
    """``torch.save``, whole or not at all: a kill leaves the old file or the new one."""
    tmp = f"{path}.tpde-partial"
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _new(dest: Any, what: str) -> str:
    dest = os.path.abspath(os.fspath(dest))
    if os.path.lexists(dest):
        raise error("invalid-argument", f"{dest}: exists; export writes a new {what}")
    return dest


def state(path: Any, dest: Any, hints: Any = None) -> str:
    """The state file ``path`` as a ``torch.save`` file ``dest``; returns ``dest``."""
    dest = _new(dest, "file")
    path = os.path.abspath(os.fspath(path))
    _folder.save_checked(Series().load(path, hints=[os.path.dirname(path)] if hints is None else hints), dest)
    return dest


def folder(checkpoint: Any, dest: Any, hints: Any = None) -> str:
    """The checkpoint folder ``checkpoint`` (or its ``checkpoint.tpde``) as the framework wrote
    it, in the new folder ``dest``; a folder the framework wrote is copied. Returns ``dest``."""
    checkpoint = os.path.abspath(os.fspath(checkpoint))
    if os.path.basename(checkpoint) == _folder.STORED and os.path.isfile(checkpoint):
        checkpoint = os.path.dirname(checkpoint)
    dest = _new(dest, "folder")
    if not os.path.exists(os.path.join(checkpoint, _folder.STORED)):
        shutil.copytree(checkpoint, dest, symlinks=True)
        return dest
    tmp = dest + ".tpde-partial"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _folder.expand(checkpoint, tmp, Series(), [os.path.dirname(checkpoint)] if hints is None else hints)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
