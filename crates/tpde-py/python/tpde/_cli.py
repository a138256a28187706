"""The ``tpde`` and ``tpde-inspect`` commands that ``pip install`` puts on ``PATH``: the Rust
command line compiled into the extension (without the GPU decoder: ``cargo install --path
crates/tpde-cli`` builds a ``tpde`` with it)."""
import signal
import sys

from . import _tpde


def _run(inspect: bool) -> None:
    # Ctrl-C and a closed pipe end the command as they end a native one: nothing is left under a
    # final name (writes are atomic), and the Rust side handles the closed pipe itself.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    name = "tpde-inspect" if inspect else "tpde"
    sys.exit(_tpde.cli([name, *sys.argv[1:]], inspect=inspect))


def tpde() -> None:
    _run(inspect=False)


def tpde_inspect() -> None:
    _run(inspect=True)
