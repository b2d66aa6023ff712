"""One writer per run folder: a live writer holds an advisory lock (``flock``) on its ``steps.bin``
for as long as it writes, so a second writer (another Recorder on the same ``log_dir`` with
``overwrite=True``, in this process or another) is refused instead of deleting the files under it;
a resumer takes that lock when it is built (``claim``), before it reads where the files end, and
hands it to its writer, so a second resumer is refused and no one appends between the read and the
first new record; and a writer whose ``steps.bin`` was removed from the folder all the same (by hand, by a writer on a
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


def claim(path) -> int:
    """Open a run folder's ``steps.bin`` to append and take its writer lock, or FileExistsError if a
    live writer (or another resumer) holds it. The lock is held until the descriptor is closed."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileExistsError(f"{path} is not a plain file: a run keeps its steps in a plain file")
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise FileExistsError(
                    f"{path.parent} is being written by another Recorder now (in this process or another, "
                    "a resumer included): one writer per run folder; detach() that Recorder first, or "
                    "record into a new log_dir"
                ) from None
            except OSError:
                pass  # a file system without flock (some network mounts): no lock to take
    except BaseException:
        os.close(fd)
        raise
    return fd


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
