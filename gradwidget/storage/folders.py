"""Where gradwidget may write: a log_dir that is new, empty or its own run, and output files that
are never one of a run's own files (files are the user's)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from .._args import check_bool
from ..files import replace_atomically, writable_folder
from ._owner import held
from .layout import FORMAT, RUN_FILES, RunFormatError, as_path
from .meta import parse_meta


def check_output_file(path, force: bool = False, force_hint: str = "pass force=True") -> Path:
    """An output file (export, report, comparison) as a Path, refused when it is a folder, one of a
    run directory's own files (writing a report over ``RUN/meta.json`` would destroy the run it
    describes), or an existing file (a link included) without ``force``: the one rule of every file
    output, so none replaces a user's file silently."""
    p = as_path(path, "the output file must be a path")
    check_bool("force", force)
    if p.is_dir():
        raise IsADirectoryError(f"{p} is a directory; give the file to write, e.g. {p / 'report.html'}")
    if p.name in RUN_FILES and (p.parent / "meta.json").is_file():
        raise ValueError(
            f"refusing to write {p}: it is one of the files of the run in {p.parent}; choose another output file"
        )
    if not force and os.path.lexists(p):
        raise FileExistsError(f"{p} exists; {force_hint} to replace it, or choose another output file")
    return p


@contextmanager
def atomic_output(path, force: bool = False, newline=None, encoding=None):
    """Open an output file (see ``check_output_file``: an existing one only with ``force``) for
    writing via a private temporary sibling renamed into place at the end, so a failure half-way
    leaves an earlier file intact and no partial one, and a link planted beside it is never
    written through."""
    path = check_output_file(path, force)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replace_atomically(path, newline=newline, encoding=encoding) as f:
        yield f


def is_run_dir(path) -> bool:
    """Is ``path`` a folder holding a gradwidget run (its marker: a plain-file meta.json whose
    "format" is gradwidget's)? Read bounded, so any file there is safe to look at."""
    try:
        meta = parse_meta(Path(path) / "meta.json")
    except RunFormatError:
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def check_log_dir(
    path, overwrite: bool = False, overwrite_hint: str = "pass overwrite=True", handover: bool = False
) -> Path:
    """The folder a writer may use, or a clear error before training starts: a new or empty
    folder; a gradwidget run only with ``overwrite=True`` (its records are replaced); a folder of
    other files only with ``overwrite=True`` and only if none of them has a run file's name
    (they are never touched). Also refused: a file, a folder the writer cannot write in, a run a
    live writer is writing (``_owner``; ``handover``: that writer is about to be closed, as when a
    notebook cell that builds a Recorder on the same model is run again)."""
    path = as_path(path, "log_dir must be a folder path")
    check_bool("overwrite", overwrite)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"log_dir {path} exists and is not a directory; pick a new log_dir")
    if path.is_dir() and any(path.iterdir()):
        if is_run_dir(path):
            if not overwrite:
                raise FileExistsError(
                    f"{path} already holds a run; pick a new log_dir or {overwrite_hint} to replace it"
                )
            if not handover and held(path / "steps.bin"):
                raise FileExistsError(
                    f"{path} is being written by another Recorder now (in this process or another): one "
                    "writer per run folder; pick a new log_dir, or detach() that Recorder first"
                )
        else:
            taken = [n for n in RUN_FILES if os.path.lexists(path / n)]
            if taken:
                raise FileExistsError(
                    f"{path} is not a gradwidget run but holds {', '.join(taken)}: gradwidget never writes "
                    f"over files it did not create; pick a new or empty log_dir (e.g. {path / 'run1'})"
                )
            if not overwrite:
                raise FileExistsError(
                    f"{path} holds other files and is not a gradwidget run; pick a new or empty log_dir "
                    f"(e.g. {path / 'run1'}), or {overwrite_hint} to write the run beside them "
                    "(none of them is touched)"
                )
    problem = writable_folder(path)
    if problem:
        raise PermissionError(f"cannot record to log_dir {path}: {problem}; pick a log_dir you can write to")
    return path
