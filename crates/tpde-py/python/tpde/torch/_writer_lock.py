"""One writer per checkpoint folder: the lock a ``Checkpointer`` takes before its first save.

Two writers in one folder corrupt it (each picks the other's newest step as its base, or
replaces it), so the second is refused, with an error that names the folder and the holder.
Readers take no lock and are never blocked.

- A local folder: ``flock`` on ``DIR/.tpde-writer.lock``. The kernel releases it when the holder
  exits, however it dies, so a crashed run never leaves its folder locked.
- An object-store prefix: a lease object ``PREFIX/.tpde-writer.lock``, created only if absent
  (a conditional PUT, ``If-None-Match: *``, atomic in the store). It records its holder and
  expiry; the holder renews it every third of its term on a background thread and deletes it
  when closed. A lease past its expiry belongs to a writer that is gone, and the next writer
  replaces it.

Either way a writer checks, before each save writes anything (``check``), that the lock is still
its own: a writer that was stopped (SIGSTOP, a long pause) past its lease, or whose lock file was
deleted or replaced under it, may now share the folder with another, so its save fails with a
``TpdeError`` and writes nothing, rather than warn and go on.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
import warnings
from typing import Any, Dict, Optional

from .. import _tpde
from .._errors import error

LOCK_NAME = ".tpde-writer.lock"
# How long an object-store lease lasts without renewal.
LEASE_SECONDS = 60.0


def _lost(where: str, why: str) -> Exception:
    return error(
        "invalid-argument",
        f"{where}: this writer no longer holds the folder's writer lock ({why}); nothing was saved. Another "
        "Checkpointer may be writing here: close this one (its saves would mix with the other's)",
    )


def _holder(expires: Optional[float] = None) -> Dict[str, Any]:
    h: Dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
    if expires is not None:
        h["expires"] = expires
    return h


def _describe(holder: Any) -> str:
    if not isinstance(holder, dict):
        return "a writer that left no readable note"
    since = holder.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, since {when}"


def _refused(directory: str, holder: Any) -> Exception:
    return error(
        "invalid-argument",
        f"{directory}: another Checkpointer is writing to this folder ({_describe(holder)}); one writer per "
        "folder: close the other one or save elsewhere (loading needs no lock)",
    )


class LocalLock:
    """``flock`` on the folder's lock file, held until ``release`` or the process ends."""

    def __init__(self, directory: str):
        import fcntl

        self.path = os.path.join(directory, LOCK_NAME)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise error(
                "io",
                f"{directory}: cannot take the folder's writer lock ({LOCK_NAME}): {e.strerror or e}; a Checkpointer "
                "saves into a folder it can write (loading needs no lock)",
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(fd, 4096, 0) or b"null")
            except ValueError:
                holder = None
            os.close(fd)
            raise _refused(directory, holder) from None
        except BaseException:
            os.close(fd)
            raise
        # Who holds it, for the error a second writer gets.
        note = json.dumps(_holder()).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, note, 0)
        self._fd: Optional[int] = fd
        self._inode = _inode(os.fstat(fd))

    def check(self) -> None:
        """Raises if the lock file this writer holds is no longer the folder's: deleted or
        replaced, so that a second writer could lock the new one."""
        try:
            now = _inode(os.stat(self.path))
        except FileNotFoundError:
            now = None
        if now != self._inode:
            raise _lost(self.path, "its lock file was deleted or replaced")

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # releases the flock; the file stays, empty of meaning


class ObjectLease:
    """A lease object under the prefix, renewed in the background until ``release``."""

    def __init__(self, directory: str, seconds: Optional[float] = None):
        self.url = f"{directory.rstrip('/')}/{LOCK_NAME}"
        self.seconds = LEASE_SECONDS if seconds is None else seconds
        self.token = uuid.uuid4().hex
        self._expires = 0.0  # of the last note this writer wrote
        self._taken: Optional[str] = None  # who took the lease over, once seen
        for attempt in range(2):
            if _tpde.object_create_new(self.url, self._note()):
                break
            current = self._read()
            if isinstance(current, dict) and current.get("token") == self.token:
                break  # ours: a retried PUT whose first try took, its answer lost
            expires = current.get("expires") if isinstance(current, dict) else None
            if attempt == 0 and isinstance(expires, (int, float)) and expires < time.time():
                # Its writer stopped renewing it: gone. Replace it (a race with a third writer
                # is decided by the conditional PUT that follows).
                warnings.warn(f"{self.url}: replacing the expired lease of {_describe(current)}", stacklevel=3)
                _tpde.remove(self.url)
                continue
            raise _refused(directory, current)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="tpde-lease", daemon=True)
        self._thread.start()

    def _note(self) -> bytes:
        h = _holder(time.time() + self.seconds)
        h["token"] = self.token
        self._expires = h["expires"]
        return json.dumps(h).encode()

    def check(self) -> None:
        """Raises if the lease is no longer this writer's. A lease not renewed for half its term
        (the process was stopped, the store out of reach) is read first, and renewed if it is
        still ours, so that the save after it has half a term before anyone may take it over."""
        if self._taken is None and time.time() > self._expires - self.seconds / 2:
            current = self._read()
            if isinstance(current, dict) and current.get("token") == self.token:
                _tpde.object_write(self.url, self._note())
            else:
                self._taken = _describe(current)
        if self._taken is not None:
            raise _lost(self.url, f"its lease was taken over by {self._taken}")

    def _read(self) -> Any:
        data = _tpde.object_read(self.url)
        try:
            return None if data is None else json.loads(data)
        except ValueError:
            return None

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                current = self._read()
                if not (isinstance(current, dict) and current.get("token") == self.token):
                    self._taken = _describe(current)  # the next save fails (check)
                    warnings.warn(f"{self.url}: this writer's lease was taken over ({self._taken})")
                    return
                _tpde.object_write(self.url, self._note())
            except Exception as e:  # a passing network failure: try again at the next renewal
                warnings.warn(f"{self.url}: renewing the writer lease failed: {e}")

    def release(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        try:
            current = self._read()
            if isinstance(current, dict) and current.get("token") == self.token:
                _tpde.remove(self.url)
        except Exception as e:
            warnings.warn(f"{self.url}: removing the writer lease failed (it expires by itself): {e}")


def _inode(st: os.stat_result) -> Any:
    return (st.st_dev, st.st_ino)


def acquire(directory: str, remote: bool):
    """The writer lock of ``directory``: refused, naming the holder, if another writer has it."""
    return ObjectLease(directory) if remote else LocalLock(directory)
