"""The reverse layout's one rule: a checkpoint file written again, under its own name, as a delta
against a newer file. It decodes to the same tensors, so its content digest is unchanged and
every delta (and DCP ``.metadata``) that names it stays valid; the file is replaced whole.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from .. import _tpde


def as_delta(path: str, base: str, codec: str, updates: Dict[str, Optional[str]], content: Any = None,
             base_snapshot: Any = None) -> None:
    """Writes the file ``path`` again as a delta against the file ``base``, its ``checkpoint.*``
    metadata changed by ``updates`` (None removes a key). The tensors come from ``content`` (a
    ``Snapshot`` of the file, used only if its digest is the file's) or else are decoded from
    the file; ``base_snapshot`` is the base as it decodes, if held."""
    f = _tpde.File(path, None)
    metadata = {k: v for k, v in f.metadata().items() if not k.startswith("tpde.")}
    for k, v in updates.items():
        if v is None:
            metadata.pop(k, None)
        else:
            metadata[k] = v
    if content is not None and content.content_digest() == f.content_digest():
        # In the file's tensor order, so that the bytes are those written from the file.
        _tpde.save_snapshot(path, content, metadata=metadata, base=base, base_snapshot=base_snapshot, codec=codec,
                            order=f.keys())
        return
    items = []
    for name in f.keys():
        dtype, shape = f.info(name)
        items.append((name, dtype, list(shape), f.read(name)))
    _tpde.save(path, items, metadata=metadata, base=base, base_snapshot=base_snapshot, codec=codec)
