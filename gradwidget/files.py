"""Touching files safely: the user's files are the user's.

Every file gradwidget writes is created new (``O_EXCL``), never through a symlink or hard link it
did not make (``O_NOFOLLOW``, and a fresh private temporary name for what is replaced by rename);
every file it reads must be a plain file (a FIFO would block, a device never ends); an append
either lands whole or is cut back, so a full disk never leaves half a record.
"""

from __future__ import annotations

import os
import stat
import uuid
from contextlib import contextmanager
from pathlib import Path

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class NotPlainFile(OSError):
    """A path that should be a plain file is a FIFO, device, socket or folder."""


def create_new(path, append: bool = False) -> int:
    """A file descriptor for a file that did not exist (FileExistsError if anything, a symlink
    included, is at ``path``): what it writes can land nowhere else."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | (os.O_APPEND if append else 0)
    return os.open(path, flags, 0o644)


def private_temp(path: Path) -> Path:
    """A temporary sibling name for ``path`` no one else uses (so a file or link planted at
    ``path.tmp`` is never written through)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")


@contextmanager
def replace_atomically(path, mode: str = "w", newline=None, encoding=None, sync: bool = False):
    """Write ``path`` through a private temporary sibling renamed over it at the end (rename
    replaces a link at ``path``, never follows it); a failure half-way leaves the earlier file as
    it was and no temporary behind."""
    path = Path(path)
    tmp = private_temp(path)
    fd = create_new(tmp)
    try:
        with open(fd, mode, newline=newline, encoding=encoding) as f:
            yield f
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def open_plain(path):
    """Open ``path`` for reading only if it is a plain file (NotPlainFile otherwise). Opened
    non-blocking and checked on the open descriptor, so what is checked is what is read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotPlainFile(f"{path} is not a plain file (a FIFO, device, socket or folder)")
    return os.fdopen(fd, "rb")


def open_to_append(path) -> int:
    """A file descriptor appending to our own existing plain file ``path`` (never through a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | _NOFOLLOW | _CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotPlainFile(f"{path} is not a plain file (a FIFO, device, socket or folder)")
    return fd


def append_whole(fd: int, data: bytes, size: int) -> int:
    """Append ``data`` to the file of ``fd``, which holds ``size`` bytes, and return its new size.
    If the write fails part-way (a full disk), the file is cut back to ``size`` before the error
    is raised, so it never ends in half a record."""
    if os.fstat(fd).st_size != size:  # an earlier failed append could not be cut back: do it now
        os.ftruncate(fd, size)
    view, done = memoryview(data), 0
    try:
        while done < len(view):
            done += os.write(fd, view[done:])
    except OSError:
        try:
            os.ftruncate(fd, size)
        except OSError:
            pass  # the reader ignores a partial last record; the next append starts after it
        raise
    return size + done


def writable_folder(path: Path) -> str | None:
    """Why a writer could not create files in folder ``path`` (or in the folder that would hold
    it, if it does not exist yet), or None: checked before training, not at its first step."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable (read-only file system or no permission)"
    return None
