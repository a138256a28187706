"""TpdeError with a kind chosen in Python (the extension sets the kind of its own errors)."""
from ._tpde import TpdeError


def error(kind: str, message: str) -> TpdeError:
    """A TpdeError of the spec's category ``kind`` ("not-found", "malformed", "base-missing", ...)."""
    err = TpdeError(message)
    err.kind = kind
    return err
