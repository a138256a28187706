"""TpdeError with a kind chosen in Python (the extension sets the kind of its own errors), and its
``not-found`` form, which is a ``FileNotFoundError`` too."""
import errno as _errno

from ._tpde import TpdeError


class TpdeNotFoundError(TpdeError, FileNotFoundError):
    """A file, object, tensor or checkpoint that is not there (kind ``not-found``): catch it as
    ``tpde.TpdeError`` or as ``FileNotFoundError``."""

    kind = "not-found"


def not_found(message: str) -> TpdeNotFoundError:
    """The not-found error; the extension raises its own through this."""
    err = TpdeNotFoundError(message)
    err.errno = _errno.ENOENT
    return err


def error(kind: str, message: str) -> TpdeError:
    """A TpdeError of the spec's category ``kind`` ("not-found", "malformed", "base-missing", ...)."""
    if kind == "not-found":
        return not_found(message)
    err = TpdeError(message)
    err.kind = kind
    return err
