"""Small real training runs that the framework tests start, kill and resume, each its own
process: ``run(script, *args)``."""
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def run(script: str, *args, check: bool = True, launcher=()) -> subprocess.CompletedProcess:
    """Runs ``frameworks/SCRIPT`` with ``args`` (under ``launcher``, such as torchrun's module,
    if given); with ``check`` a non-zero exit fails the test, showing the run's stderr."""
    cmd = [sys.executable, *launcher, str(HERE / script), *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())
    if check and p.returncode != 0:
        raise AssertionError(p.stderr[-3000:])
    return p


def _env():
    import os

    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def tpde_command(*args) -> subprocess.CompletedProcess:
    """The ``tpde`` command ``pip install`` put beside this interpreter, run with ``args``; a
    non-zero exit fails the test, showing its stderr."""
    import os

    cmd = [os.path.join(os.path.dirname(sys.executable), "tpde"), *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())
    if p.returncode != 0:
        raise AssertionError(p.stderr[-3000:])
    return p
