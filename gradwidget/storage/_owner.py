"""One writer per run folder: a live writer holds an advisory lock (``flock``) on its ``steps.bin``
for as long as it writes, so a second writer (another Recorder on the same ``log_dir`` with
``overwrite=True``, in this process or another) is refused instead of deleting the files under it;
and a writer whose ``steps.bin`` was removed from the folder all the same (by hand, by a writer on a
system without ``flock``) sees it at its next write and stops, saying so, instead of writing into a
deleted file and then rewriting ``meta.json`` over the new run's."""

from __future__ import annotations

import os
import stat

try:  # POSIX; elsewhere only the check for a removed file guards the folder
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def hold(fd: int) -> None:
    """Take the folder's writer lock on the open ``steps.bin`` (released when ``fd`` closes)."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass  # held by someone who got here in between: their writes win, ours stop (``removed``)


def held(path) -> bool:
    """Is ``path`` (a run folder's ``steps.bin``) held by a live writer?"""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False  # absent, a link, unreadable: no writer of ours holds it
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False  # a file system without flock (some network mounts): no lock to read
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def removed(fd: int) -> bool:
    """Has the file open at ``fd`` been removed from its folder (no link left)?"""
    return os.fstat(fd).st_nlink == 0
