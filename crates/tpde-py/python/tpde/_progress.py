"""``progress=`` of long saves, packs and unpacks: a bar on an interactive terminal, a callable
of the caller's, or nothing. The extension calls it from the calling thread every 50 ms while
the work runs (and once at the end) with ``(done, total)`` in logical tensor bytes."""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Optional

from ._tpde import TpdeError

Callback = Callable[[int, int], Any]


def resolve(progress: Any, what: str) -> Optional[Callback]:
    """None: a bar when stderr is a terminal; True: a bar; False: none; a callable: itself."""
    if progress is None:
        progress = sys.stderr.isatty()
    if progress is True:
        return Bar(what)
    if progress is False:
        return None
    if callable(progress):
        return progress
    raise TpdeError(f"progress must be None, True, False or a callable(done, total), not {progress!r}")


class Bar:
    """One line on stderr, redrawn at most 10 times a second, shown only once the work has run
    for half a second: short operations print nothing."""

    def __init__(self, what: str, stream: Any = None) -> None:
        self.what = what
        self.stream = stream or sys.stderr
        self.start = time.monotonic()
        self.drawn = 0.0
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        finished = total > 0 and done >= total
        if not self.shown and now - self.start < 0.5:
            return
        if not finished and now - self.drawn < 0.1:
            return
        self.drawn, self.shown = now, True
        share = min(done / total, 1.0) if total else 0.0
        filled = int(share * 30)
        rate = done / max(now - self.start, 1e-9) / 1e6
        self.stream.write(
            f"\r{self.what} [{'#' * filled}{'.' * (30 - filled)}] {share * 100:5.1f}% "
            f"{done / 1e6:,.0f}/{total / 1e6:,.0f} MB, {rate:,.0f} MB/s"
        )
        if finished:
            self.stream.write("\n")
        self.stream.flush()
