"""The reverse layout's one rule: a checkpoint file written again, under its own name, as a delta
against a newer file. It decodes to the same tensors, so its content digest is unchanged and
every delta (and DCP ``.metadata``) that names it stays valid; the file is replaced whole.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

from .. import _tpde


# The reverse layout's entries that a file written again sheds: it is no longer the newest.
_NEWEST_ONLY = ("checkpoint.reverse_run", "checkpoint.raw")


def rewrite(path: str, base: Optional[Tuple[str, int]], codec: str, content: Any = None, base_snapshot: Any = None) -> None:
    """Writes the file ``path`` again with ``codec``: as a delta against ``base``, (the file of a
    step, that step), or a keyframe if None (a newest checkpoint stored raw, compressed once a
    newer one exists). The tensors come from ``content`` (a ``Snapshot`` of the file, used only
    if its digest is the file's) or else are decoded from the file; ``base_snapshot`` is the base
    as it decodes, if held. Its metadata records the base step (``checkpoint.base_step``)."""
    f = _tpde.File(path, None)
    metadata = {k: v for k, v in f.metadata().items() if k not in _NEWEST_ONLY}  # tpde.* left out
    if base is not None:
        metadata["checkpoint.base_step"] = str(base[1])
        metadata["checkpoint.depth"] = "1"
    base_path = None if base is None else base[0]
    names = f.keys()
    if content is not None and content.content_digest() == f.content_digest():
        # In the file's tensor order, so that the bytes are those written from the file.
        _tpde.save_snapshot(path, content, metadata=metadata, base=base_path, base_snapshot=base_snapshot, codec=codec,
                            order=names)
        return
    items = [(name, *f.info(name), flat) for name, flat in zip(names, f.read_many(names))]
    _tpde.save(path, items, metadata=metadata, base=base_path, base_snapshot=base_snapshot, codec=codec)
