"""Continuing a run folder after a crash (``Recorder(..., resume=True)``): the run already there,
checked against the model that continues it, and where its files end."""

from __future__ import annotations

from dataclasses import dataclass

from ..run import Run
from .folders import check_log_dir, is_run_dir
from .layout import as_path
from .meta import parse_meta
from .reader import RunReader


@dataclass
class ResumePoint:
    """The run in a folder to continue: its steps (``run``), its id and creation time (kept, so a
    reader following the folder goes on with it), and the bytes of whole records in its files (a
    record the crash cut short is cut off before the first new one is appended)."""

    run: Run
    run_id: str | None
    created: str | None
    sizes: dict[str, int]

    @property
    def next_step(self) -> int:
        return int(self.run.steps[-1]) + 1 if self.run.n_steps else 0


def resume_point(path, shapes: dict[str, tuple]) -> ResumePoint | None:
    """The run in ``path`` to continue with a model whose recorded parameters have ``shapes``
    (name: shape), or None for a new or empty folder (a run starts there). Refused, saying why: a
    folder of other files, a run a live writer is writing, a run of different layers."""
    path = as_path(path, "log_dir must be a folder path")
    if not is_run_dir(path):
        check_log_dir(path, False, overwrite_hint="pass overwrite=True instead of resume=True")
        return None
    check_log_dir(path, True)  # writable, not being written
    reader = RunReader(path)
    run = reader.run
    theirs = {info.name: tuple(info.shape) for info in run.layers}
    if theirs != shapes:
        missing = [n for n in theirs if n not in shapes]
        new = [n for n in shapes if n not in theirs]
        changed = [f"{n} {theirs[n]} -> {shapes[n]}" for n in theirs if n in shapes and theirs[n] != shapes[n]]
        parts = [
            f"{what}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''} ({len(names)})"
            for what, names in (("not in this model", missing), ("new in this model", new), ("reshaped", changed))
            if names
        ]
        raise ValueError(
            f"cannot resume {path}: it holds a run of other layers ({'; '.join(parts)}). Resume with the "
            "model that made it, or record into a new log_dir"
        )
    meta = parse_meta(path / "meta.json")
    return ResumePoint(
        run,
        meta.get("run_id"),
        meta.get("created"),
        {"steps.bin": reader._soff, "hist.bin": reader._hoff},
    )
