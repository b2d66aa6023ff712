"""The live sync, a part of the panel: sending its state to the page. Full updates (traits),
patches while training (only the new heatmap columns, a custom message that js/src/sync.ts
applies), at most ``max_rate`` a second (``schedule.Throttle``).

It owns what it has sent (the update's number, the shape of the heatmap, whether the page holds
patched columns, the run version sent) and asks the panel, through ``SyncHost``, for the run, the
payload of a full update, and to set, hold or send traits."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Protocol

from ..run import Run
from . import payload as P
from .protocol import TRAITS
from .rows import Rows
from .schedule import Throttle

#: seconds between refreshes of every layer's newest histogram while training.
HIST_ALL_EVERY = 2.0


class SyncHost(Protocol):
    """What the live sync asks of the panel."""

    _lock: threading.RLock
    model_id: str
    meta: Any
    hists: Any
    hist_steps: Any
    hist_all: Any

    @property
    def run(self) -> Run | None: ...
    def _rows_of(self, run: Run | None) -> Rows | None: ...
    def _payload(self, run: Run | None, version: int) -> dict: ...
    def _is_live(self) -> bool: ...
    def _set(self, values: dict) -> None: ...
    def _hold(self, values: dict) -> None: ...
    def send(self, content: Any, buffers: Any = None) -> None: ...
    def send_state(self, key: Any = None) -> None: ...


class LiveSync:
    def __init__(self, host: SyncHost, max_rate: float, trailing: Callable[[], object], patches: bool = True) -> None:
        self._host = host
        self._patches = patches  # new columns may travel alone (a comparison sends whole updates)
        self.throttle = Throttle(max_rate, lambda: self.push(patch=True), trailing)
        self._seq = 0  # numbers the heatmap updates: a patch names the one it extends (meta["seq"])
        self._shape: dict | None = None  # payload.view_shape of the last heatmap sent
        self._patched = False  # the page holds columns sent as patches (custom messages)
        self._hist_all_sent = 0.0  # when a patch last carried hist_all
        #: the run version last sent (-1: none)
        self.version = -1
        #: updates sent (tests and benchmarks read it)
        self.count = 0

    def ping(self) -> None:
        """A step arrived: send now, or when the rate limit allows."""
        self.throttle.ping()

    def cancel(self) -> None:
        """Drop an update held back by the rate limit (a full one follows)."""
        self.throttle.cancel()

    def resend(self) -> None:
        """The page could not apply a patch (it missed the update it extends): send everything."""
        self._shape = None
        self._patched = True  # what the page holds is unknown: every trait travels
        self.push(force=True)

    def push(self, force: bool = False, check_version: bool = False, patch: bool = False) -> bool:
        """Compute and send the data traits. Returns False (sending nothing) when ``check_version``
        is set and the run changed while the payload was computed (another thread appended).
        ``patch``: new steps alone travel when only steps were appended (the live path)."""
        host = self._host
        with host._lock:
            run = host.run
            version = run.version if run is not None else -1
            if not force and version == self.version:
                return True
            t_start = time.monotonic()
            try:
                values = host._payload(run, version)
            except Exception as e:
                if check_version:
                    return False  # a torn read while training appends; the next step sends again
                raise RuntimeError(f"gradwidget could not build the panel's data: {e!r}") from e
            if check_version and run is not None and run.version != version:
                return False
            values["live"] = host._is_live()
            base, self._seq = self._seq, self._seq + 1
            values["meta"] = {**values["meta"], "seq": self._seq}
            shape = P.view_shape(run, values["meta"], host._rows_of(run)) if run is not None else None
            start = P.patch_start(self._shape, shape) if patch and self._patches and shape is not None else None
            if start is not None:
                self._send_patch(values, start, base)
            elif self._patched:  # the traits here already hold the patched values: send them all
                host._hold(values)
                host.send_state(list(values))
                self._patched = False
            else:
                host._set(values)
            self._shape = shape
            self.version = version
            self.throttle.sent(t_start)
            self.count += 1
            return True

    def _send_patch(self, values: dict, start: int, base: int) -> None:
        """Send only the heatmap's columns from ``start`` on, and the other traits that changed,
        as one custom message (js/src/sync.ts applyPatch); hold the full values in the panel."""
        host = self._host
        # a layer's histograms over time wait for the next full update (the page shows the newest
        # histogram of every layer from hist_all meanwhile), and hist_all (256 bytes a layer)
        # refreshes every HIST_ALL_EVERY seconds
        held = {"hists": host.hists, "hist_steps": host.hist_steps}
        now = time.monotonic()
        if now - self._hist_all_sent < HIST_ALL_EVERY:
            held["hist_all"] = host.hist_all
            values["meta"] = {**values["meta"], "hist_all_step": host.meta.get("hist_all_step", -1)}
        else:
            self._hist_all_sent = now
        values = {**values, **held}
        tails = {
            "heat": values["heat"][:, start:],
            "flags": values["flags"][:, start:],
            "col_steps": values["col_steps"][start:],
            "loss": values["loss"][start:],
        }
        binary = [k for k in values if TRAITS[k].kind == "bytes"]
        small = {k: v for k, v in values.items() if k not in binary}
        if small["meta"].get("layers") == host.meta.get("layers"):  # the page keeps the layers it has
            small["meta"] = {k: v for k, v in small["meta"].items() if k != "layers"}
        other = {k: TRAITS[k].validate(values[k]) for k in binary if k not in tails and k not in held}
        other = {k: b for k, b in other.items() if b != getattr(host, k)}
        names = list(tails) + list(other)
        buffers = [TRAITS[k].validate(v) for k, v in tails.items()] + list(other.values())
        host.send(
            {
                "kind": "patch",
                "model_id": host.model_id,
                "base": base,
                "start": int(start),
                "values": small,
                "buffers": names,
            },
            buffers,
        )
        host._hold(values)
        self._patched = True
