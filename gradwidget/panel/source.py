"""The source, a part of the panel: what it shows (a recorder, a Run, a run directory) and how long
it holds it.

The recorder is held weakly: the model's hooks keep it alive while the model is (one the user
passed is held strongly too, until the panel is closed), so a panel never keeps a model or its
optimizer's state alive; the run it recorded stays (``run``). A run directory may be followed as
it grows, by a polling thread this part owns."""

from __future__ import annotations

import pathlib
import threading
import weakref
from typing import Callable

from ..run import Run
from .options import is_module
from .schedule import poll_directory


class Source:
    def __init__(self, source, optimizer, recorder_kwargs: dict, live: bool, on_step: Callable[[Run], None]) -> None:
        """Attach to ``source`` (``on_step``: called by a recorder after each recorded step); a bad
        source or option is a TypeError or ValueError, raised before anything is attached."""
        self._on_step = on_step
        self._recorder_ref: weakref.ref | None = None
        self._hold = None  # a recorder the user passed, until the panel is closed
        self._recorded: Run | None = None
        self._reader = None
        self._own_recorder = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: the Run given as such (it never changes); None for a recorder or a run directory
        self.fixed: Run | None = None
        if isinstance(source, (str, pathlib.PurePath)):
            from ..storage import RunReader

            if optimizer is not None or recorder_kwargs:
                raise TypeError("a run directory takes no optimizer or recorder options")
            self._reader = RunReader(source)
            return
        if live:
            raise ValueError(
                "live=True follows a run directory: pass its path (GradientPanel.from_run(path, live=True))"
            )
        if isinstance(source, Run):
            if optimizer is not None or recorder_kwargs:
                raise TypeError(
                    "a Run takes no optimizer or recorder options, got "
                    + ", ".join(["optimizer"] * (optimizer is not None) + sorted(recorder_kwargs))
                )
            self.fixed = source
            return
        if source is not None and hasattr(source, "on_step") and hasattr(source, "run") and hasattr(source, "log"):
            if optimizer is not None or recorder_kwargs:
                raise TypeError("pass optimizer and recorder options to the Recorder itself, not to GradientPanel")
            recorder = self._hold = source
        elif is_module(source):
            from ..collect.torch import Recorder

            recorder = Recorder(source, optimizer, **recorder_kwargs)
            self._own_recorder = True
        elif source is not None and isinstance(getattr(source, "run", None), Run):  # an analysis Report
            self.fixed = source.run
            return
        else:
            raise TypeError(
                "GradientPanel needs a torch.nn.Module (with its optimizer), a Recorder, a Run or the path "
                f"of a run directory, got {type(source).__name__}"
            )
        self._recorder_ref = weakref.ref(recorder)
        recorder.on_step.append(on_step)

    @property
    def recorder(self):
        """The Recorder shown (None for a run, or once its model is gone)."""
        return self._recorder_ref() if self._recorder_ref is not None else None

    @property
    def directory(self) -> bool:
        """The source is a run directory."""
        return self._reader is not None

    @property
    def run(self) -> Run | None:
        """The Run shown (None before a hooked model's first recorded step)."""
        rec = self.recorder
        if rec is not None and rec.run is not None:
            self._recorded = rec.run
        if self._recorder_ref is not None:
            return self._recorded
        if self._reader is not None:
            return self._reader.run
        return self.fixed

    def is_live(self) -> bool:
        """Steps are arriving: a directory is followed, or a recorder attached calls the panel."""
        if self._reader is not None:
            return self._thread is not None and not self._stop.is_set()
        rec = self.recorder
        return bool(rec is not None and getattr(rec, "attached", False) and self._on_step in rec.on_step)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def follow(self, interval: float, ping: Callable[[], None], done: Callable[[], None]) -> None:
        """Poll the run directory every ``interval`` seconds on a thread: ``ping()`` when it grew,
        ``done()`` when the polling ends."""
        self._thread = poll_directory(self._reader, interval, self._stop, ping, done)

    def release(self) -> None:
        """Stop calling the panel; remove the hooks of a recorder made here."""
        rec = self.recorder
        if rec is not None:
            if self._on_step in rec.on_step:
                rec.on_step.remove(self._on_step)
            if self._own_recorder:
                rec.detach()

    def stop(self) -> None:
        """Stop following the run directory (the polling thread is waited for)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def close(self) -> None:
        """Stop calling the panel, stop polling, and hold no recorder (nor its model)."""
        self._stop.set()
        rec = self.recorder
        if rec is not None and self._on_step in rec.on_step:
            rec.on_step.remove(self._on_step)
        self._hold = None
