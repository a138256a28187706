"""The ``tpde`` and ``tpde-inspect`` commands that ``pip install`` puts on ``PATH``: the Rust
command line compiled into the extension (without the GPU decoder: ``cargo install --path
crates/tpde-cli`` builds a ``tpde`` with it). One thing is done here: ``tpde unpack`` of a
framework checkpoint (a Lightning ``.ckpt``, a ``checkpoint-N`` folder), which writes
``torch.save`` files and so needs Python."""
import argparse
import signal
import sys
from typing import List, Optional

from . import _tpde


def _unpack_framework(argv: List[str]) -> Optional[int]:
    """``tpde unpack IN -o OUT`` of a state file or a checkpoint folder, back to the framework's
    own form; ``None`` for every other command, left to the Rust command line (which also
    writes a state file's tensors to an output ending in ``.safetensors``)."""
    if not argv or argv[0] != "unpack":
        return None
    p = argparse.ArgumentParser(prog="tpde unpack", add_help=False)
    p.add_argument("input")
    p.add_argument("-o", "--output")
    # The Rust command's hint options, with its meaning: one confinement rule for every front end.
    p.add_argument("--hint-root", action="append", default=[])
    p.add_argument("--follow-hints", action="store_true")
    p.add_argument("--no-hints", action="store_true")
    try:
        a, rest = p.parse_known_args(argv[1:])
    except SystemExit:
        return None  # the Rust parser says what is wrong
    if a.output is None or a.output.endswith(".safetensors") or rest:
        return None
    from .torch import _export  # torch only for a framework checkpoint

    kind = _export.kind(a.input)
    if kind is None:
        return None
    hints = "none" if a.no_hints else "follow" if a.follow_hints else a.hint_root or None
    try:
        export = _export.state if kind == "state" else _export.folder
        dest = export(a.input, a.output, hints)
    except _tpde.TpdeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    what = "a torch.save file" if kind == "state" else "the framework's folder"
    print(f"unpacked {a.input} into {dest} ({what})")
    return 0


def _run(inspect: bool) -> None:
    # Ctrl-C and a closed pipe end the command as they end a native one: nothing is left under a
    # final name (writes are atomic), and the Rust side handles the closed pipe itself.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    name = "tpde-inspect" if inspect else "tpde"
    done = None if inspect else _unpack_framework(sys.argv[1:])
    sys.exit(done if done is not None else _tpde.cli([name, *sys.argv[1:]], inspect=inspect))


def tpde() -> None:
    _run(inspect=False)


def tpde_inspect() -> None:
    _run(inspect=True)
