"""The reverse layout's one rule: a checkpoint file written again, under its own name, as a delta
against a newer file (or as a keyframe). It decodes to the same tensors, so its content digest is unchanged and
every delta (and DCP ``.metadata``) that names it stays valid; the file is replaced whole.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from .. import _tpde


# The reverse layout's default keyframe_every: a file in three a keyframe, so every retained step
# decodes at most two deltas and loads in at most about 3 times torch.load's time, in real runs
# saved every step (where a keyframe costs three deltas) and every 10 (where it costs about one);
# the trade is measured in docs/guide.md.
KEYFRAME_EVERY = 3

# The entries that a file written again sheds: the reverse layout's newest-only ones (it is no
# longer the newest) and the base it named (``recorded`` names the new one).
_SHED = ("checkpoint.reverse_run", "checkpoint.raw", "checkpoint.base")


def rewrite(
    path: str,
    base_path: Optional[str],
    recorded: Dict[str, str],
    codec: str,
    content: Any = None,
    base_snapshot: Any = None,
    predictions: Optional[List[Tuple]] = None,
    expect: Optional[str] = None,
) -> None:
    """Writes the file ``path`` again with ``codec``: as a delta against the file ``base_path``,
    or a keyframe if None (a newest checkpoint stored raw, compressed once a newer one exists; a
    delta whose base is deleted). ``recorded`` goes into its metadata (how it names its base:
    ``checkpoint.base_step`` in a ``Checkpointer`` folder, ``checkpoint.base`` in a
    ``tpde.torch.Series``). The tensors come from ``content`` (a ``Snapshot`` of the file, used
    only if its digest is the file's) or else are decoded from the file; ``base_snapshot`` is the
    base as it decodes, if held. ``predictions`` (``_adam.reverse``'s, with a newer base) are
    offered to the writer, which codes a tensor against one only where that is smaller. ``expect``
    (object storage): the version of ``path`` the file must still be, else nothing is written."""
    f = _tpde.File(path, None)
    metadata = {k: v for k, v in f.metadata().items() if k not in _SHED}  # tpde.* left out
    metadata.update(recorded)
    names = f.keys()
    if content is not None and content.content_digest() == f.content_digest():
        # In the file's tensor order, so that the bytes are those written from the file.
        _tpde.save_snapshot(path, content, metadata=metadata, base=base_path, base_snapshot=base_snapshot, codec=codec,
                            order=names, predictions=predictions, expect=expect)
        return
    items = [(name, *f.info(name), flat) for name, flat in zip(names, f.read_many(names))]
    _tpde.save(path, items, metadata=metadata, base=base_path, base_snapshot=base_snapshot, codec=codec,
               predictions=predictions, expect=expect)
