"""Loads onto a GPU in a pipeline. A staged read (``tpde._tpde.Stages``) cuts the requested bytes
into stages of one slot each, at chunk boundaries. Each stage decodes on every CPU core into one
buffer of a small ring of pinned host buffers, then is copied to the device on a CUDA stream of
its own while the next stage decodes. Host memory stays bounded by the ring (``SLOTS`` slots of
``SLOT_BYTES``, or of the largest chunk if larger), never a copy of the checkpoint, and each
tensor is written once, in place, on the device.

The copy step is an object (``CudaCopier`` on a GPU) so that the pipeline's logic is tested on
a CPU with a stand-in."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import _dtypes, _tpde
from .._errors import error

SLOT_BYTES = 64 << 20
SLOTS = 3
# The ring's bound, whatever a file's chunks: a stage holds whole chunks, so a file of larger
# chunks (up to 1 GiB each, spec §8) gets fewer slots, down to one, rather than more memory.
RING_BYTES = 192 << 20

# (tensor name, first byte, end byte, destination: a flat uint8 tensor of end - first bytes)
Request = Tuple[str, int, int, torch.Tensor]


def device_of(device: Any) -> torch.device:
    """``device`` as a torch device. One torch does not know, or a CUDA device it cannot
    reach, is an ``invalid-argument`` TpdeError naming it."""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise error("invalid-argument", f"device {device!r}: torch does not know it ({e})") from None
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise error("invalid-argument", f"device {device!r}: torch has no CUDA here (torch.cuda.is_available() is False)")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise error("invalid-argument", f"device {device!r}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    return d


def is_staged(device: torch.device) -> bool:
    """Whether loads onto ``device`` go through the pipeline (CUDA); others decode on the CPU
    and move the tensors after, as before."""
    return device.type == "cuda"


class CudaCopier:
    """The copy step on a GPU: pinned buffers, copied on a stream of its own that first waits
    for the work already queued on ``device`` (which may still use the tensors loaded into)."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device)
        self.stream.wait_stream(torch.cuda.current_stream(device))

    def buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)

    def mark(self) -> Any:
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def wait(self, mark: Any) -> None:
        mark.synchronize()

    def finish(self) -> None:
        # Every copy has landed: the device's other streams see the tensors whole.
        self.stream.synchronize()


def copier_for(device: torch.device) -> Any:
    """The copy step onto ``device`` (a test puts a CPU stand-in here)."""
    return CudaCopier(device)


def plan(f: Any, ranges: Sequence[Tuple[str, int, int]]) -> Any:
    """The stages of ``ranges``, ``(name, start, end)`` of the open file ``f``: made before the
    destinations are, since it refuses a range outside its tensor and a tensor over the file's
    ``max_tensor_bytes`` (a hostile file's declared size is never allocated on the device)."""
    return _tpde.Stages(f, list(ranges), SLOT_BYTES)


def stream_into(
    f: Any,
    requests: Sequence[Request],
    copier: Any,
    progress: Optional[Callable[[int, int], Any]] = None,
    stages: Any = None,
) -> None:
    """Decodes ``requests`` of the open file ``f`` (a ``tpde._tpde.File``; ``stages`` their
    ``plan``, if made already) through a ring of ``SLOTS`` buffers from ``copier.buffer`` and
    copies each stage out with ``copier.copy``; a buffer is refilled only once ``copier.wait``
    says its copies are done. On an error or Ctrl-C mid-way, the copies in flight end before the
    ring is dropped; what was copied stays."""
    if stages is None:
        stages = plan(f, [(name, start, end) for name, start, end, _ in requests])
    slots = max(1, min(SLOTS, RING_BYTES // max(stages.slot, 1)))
    total, done = sum(end - start for _, start, end, _ in requests), 0
    ring: List[torch.Tensor] = []
    marks: List[Any] = []
    try:
        for k in range(len(stages)):
            i = k % slots
            if i == len(ring):
                ring.append(allocate(f"a pinned buffer of {stages.slot} bytes", lambda: copier.buffer(stages.slot)))
                marks.append(None)
            elif marks[i] is not None:
                copier.wait(marks[i])  # the copies out of this buffer are done: refill it
            buf = ring[i]
            stages.read(k, buf.numpy())
            for r, start, end, at in stages.pieces(k):
                first, dst = requests[r][1], requests[r][3]
                copier.copy(dst[start - first : end - first], buf[at : at + end - start])
                done += end - start
            marks[i] = copier.mark()
            if progress is not None:
                progress(done, total)
    finally:
        copier.finish()  # copies still reading the ring end before it is freed, error or not


def allocate(what: str, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``make()``, memory the host or the device cannot give being a ``limit-exceeded``
    TpdeError naming ``what`` (torch raises its own ``OutOfMemoryError`` or ``RuntimeError``), as
    a load onto the CPU says it."""
    try:
        return make()
    except RuntimeError as e:  # torch.OutOfMemoryError is one
        text = str(e)
        if isinstance(e, getattr(torch, "OutOfMemoryError", ())) or "out of memory" in text or "alloc" in text.lower():
            raise error("limit-exceeded", f"{what}: the memory cannot be had: {text.splitlines()[0] if text else e}") from None
        raise


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a flat uint8 tensor (the same memory)."""
    return t.detach().reshape(-1).view(torch.uint8)


def load(
    f: Any,
    names: Sequence[str],
    device: torch.device,
    progress: Optional[Callable[[int, int], Any]] = None,
) -> Dict[str, torch.Tensor]:
    """Tensors ``names`` of the open file ``f``, new on ``device``, through the pipeline."""
    dtypes = _dtypes.torch_dtypes()
    infos = [(name, *f.info(name)) for name in names]
    sized = [(name, 0, math.prod(shape) * _dtypes.DTYPE_SIZE[dtype]) for name, dtype, shape in infos]
    stages = plan(f, [r for r in sized if r[2]])
    out: Dict[str, torch.Tensor] = {}
    requests: List[Request] = []
    for (name, dtype, shape), (_, _, nbytes) in zip(infos, sized):
        t = allocate(f"tensor {name!r} ({nbytes} bytes on {device})",
                     lambda: torch.empty(tuple(shape), dtype=dtypes[dtype], device=device))
        out[name] = t
        if nbytes:
            requests.append((name, 0, nbytes, flat_bytes(t)))
    stream_into(f, requests, copier_for(device), progress=progress, stages=stages)
    return out


def load_range(f: Any, name: str, start: int, end: int, shape: Sequence[int], device: torch.device) -> torch.Tensor:
    """Bytes ``start..end`` of tensor ``name`` as a new tensor of ``shape`` on ``device`` (rows
    of a slice), decoding only the chunks that hold them."""
    stages = plan(f, [(name, start, end)] if end > start else [])
    dtype = _dtypes.torch_dtypes()[f.info(name)[0]]
    t = allocate(f"tensor {name!r} (rows of it on {device})", lambda: torch.empty(tuple(shape), dtype=dtype, device=device))
    if t.numel():
        stream_into(f, [(name, start, end, flat_bytes(t))], copier_for(device), stages=stages)
    return t


def load_into(f: Any, targets: Sequence[Tuple[str, torch.Tensor]]) -> None:
    """Decodes tensors into ``targets``, ``(name, tensor)`` pairs of contiguous tensors on one
    CUDA device, in place, through the pipeline."""
    if not targets:
        return
    requests = [(name, 0, t.numel() * t.element_size(), flat_bytes(t)) for name, t in targets]
    stream_into(f, requests, copier_for(targets[0][1].device))
