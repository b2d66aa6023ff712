"""Sending the panel's state to the page: full updates (traits), patches while training (only the
new heatmap columns, a custom message that js/src/sync.ts applies), exact values on demand.
A mixin of GradientPanel: it reads the panel's run, view traits, throttle and lock."""

from __future__ import annotations

import time

import numpy as np

from ..run import Run
from . import payload as P
from .base import PanelBase
from .protocol import CHOICE_KEYS, TRAITS, encode
from .rows import Rows, row_layout

#: seconds between refreshes of every layer's newest histogram while training.
HIST_ALL_EVERY = 2.0


class PanelSync(PanelBase):
    def set_state(self, sync_data) -> None:
        """A message from the page (ipywidgets calls this on the kernel's thread).

        The cursor and the selected layer (``CHOICE_KEYS``) have one owner, the kernel, and one
        order: the page numbers each choice it makes (``choice``) and the kernel applies one only
        when it is newer than the last it applied (``choice_applied``, sent back in the same
        update), so a drag position that arrives late never overwrites a later one. The message
        waits for an update a training thread is sending (an update reads the selection and writes
        it back)."""
        with self._lock:
            seq = sync_data.get("choice")
            fresh = seq is not None and int(seq) > self.choice_applied
            if seq is not None and not fresh:
                sync_data = {k: v for k, v in sync_data.items() if k not in CHOICE_KEYS and k != "choice"}
            with self.hold_sync():
                if sync_data:
                    super().set_state(sync_data)  # type: ignore[misc]  # ipywidgets' Widget, later in the MRO
                if fresh:
                    self._internal += 1
                    try:
                        self.choice_applied = int(seq)
                    finally:
                        self._internal -= 1

    def _set(self, values: dict) -> None:
        """Set traits from the kernel (binary ones encoded by the protocol), in one message."""
        self._internal += 1
        try:
            with self.hold_sync():
                for k, v in values.items():
                    setattr(self, k, encode(k, v) if TRAITS[k].kind == "bytes" else v)
        finally:
            self._internal -= 1

    def _hold(self, values: dict) -> None:
        """Keep ``values`` as the traits' values without sending them (the page has them from a
        patch); set straight into traitlets' storage, so no observer runs and nothing is sent."""
        for k, v in values.items():
            self._trait_values[k] = encode(k, v) if TRAITS[k].kind == "bytes" and not isinstance(v, bytes) else v

    def _send_patch(self, values: dict, start: int, base: int) -> None:
        """Send only the heatmap's columns from ``start`` on, and the other traits that changed,
        as one custom message (js/src/sync.ts applyPatch); hold the full values here."""
        # a layer's histograms over time wait for the next full update (the page shows the newest
        # histogram of every layer from hist_all meanwhile), and hist_all (256 bytes a layer)
        # refreshes every HIST_ALL_EVERY seconds
        held = {"hists": self.hists, "hist_steps": self.hist_steps}
        now = time.monotonic()
        if now - self._hist_all_sent < HIST_ALL_EVERY:
            held["hist_all"] = self.hist_all
            values["meta"] = {**values["meta"], "hist_all_step": self.meta.get("hist_all_step", -1)}
        else:
            self._hist_all_sent = now
        values = {**values, **held}
        tails = {
            "heat": values["heat"][:, start:],
            "flags": values["flags"][:, start:],
            "col_steps": values["col_steps"][start:],
            "loss": values["loss"][start:],
        }
        small = {k: v for k, v in values.items() if TRAITS[k].kind != "bytes"}
        if small["meta"].get("layers") == self.meta.get("layers"):  # the page keeps the layers it has
            small["meta"] = {k: v for k, v in small["meta"].items() if k != "layers"}
        other = {
            k: encode(k, v) for k, v in values.items() if TRAITS[k].kind == "bytes" and k not in tails and k not in held
        }
        other = {k: b for k, b in other.items() if b != getattr(self, k)}
        names = list(tails) + list(other)
        buffers = [encode(k, v) for k, v in tails.items()] + list(other.values())
        self.send(
            {
                "kind": "patch",
                "model_id": self.model_id,
                "base": base,
                "start": int(start),
                "values": small,
                "buffers": names,
            },
            buffers,
        )
        self._hold(values)
        self._patched = True

    def _on_page_message(self, widget, content, buffers) -> None:
        """The page could not apply a patch (it missed the update it extends): send everything.
        Or the page drew the panel: a front end shows it live (``background._after_cell``)."""
        if isinstance(content, dict) and content.get("kind") == "rendered":
            self._views_seen = True
        if isinstance(content, dict) and content.get("kind") == "resend":
            self._shape = None
            self._patched = True  # what the page holds is unknown: every trait travels
            self._push(force=True)
            self.send_state(["table"])

    #: new columns may travel alone (a comparison sends whole updates: both runs change together)
    _patches = True

    def _rows_of(self, run: Run | None) -> Rows | None:
        """The panel's rows (``rows.row_layout``) for ``run``'s layers and the ``expanded`` groups,
        kept while neither changes (a few ms for 10,000 tensors)."""
        if run is None:
            return None
        key = (run.layer_names, tuple(map(tuple, self.expanded)))
        cached = getattr(self, "_rows_cache", None)
        if cached is None or cached[0] != key:
            cached = self._rows_cache = (key, row_layout(run, self.expanded))
        return cached[1]

    def _payload(self, run: Run | None, version: int) -> dict:
        """The traits of a full update of ``run`` (and ``self._view``, what the static image shows)."""
        empty = {k: b"" for k in ("heat", "flags", "col_steps", "loss", "hist_all", "detail", "hists", "hist_steps")}
        if run is None:
            meta, arrays = P.empty_view(self.metric, len(getattr(self.recorder, "layer_names", None) or []))
            return {**empty, "meta": meta}
        rows = self._rows_of(run)
        meta, arrays = P.heat_view(run, self.metric, self.columns, rows)
        values: dict = {**empty, "meta": meta, **arrays}
        if run.n_steps:
            step = int(run.steps[-1]) if self.follow else self._snap(self.step)
            layer = self.layer if 0 <= self.layer < run.n_layers else self._default_layer(run)
            scalars, detail = P.detail_view(run, step, layer, rows)
            values.update(scalars, **detail, step=step, layer=layer)
            col = int(np.searchsorted(arrays["col_steps"], step, side="right")) - 1
            self._view = (version, step, arrays["heat"], arrays["flags"], meta["scale"], col, meta, arrays["col_steps"])
        return values

    def _push(self, force: bool = False, check_version: bool = False, patch: bool = False) -> bool:
        """Compute and send the data traits. Returns False (sending nothing) when ``check_version``
        is set and the run changed while the payload was computed (another thread appended).
        ``patch``: new steps alone travel when only steps were appended (the live path)."""
        with self._lock:
            run = self.run
            version = run.version if run is not None else -1
            if not force and version == self._pushed_version:
                return True
            t_start = time.monotonic()
            try:
                values = self._payload(run, version)
            except Exception as e:
                if check_version:
                    return False  # a torn read while training appends; the next step sends again
                raise RuntimeError(f"gradwidget could not build the panel's data: {e!r}") from e
            if check_version and run is not None and run.version != version:
                return False
            values["live"] = self._is_live()
            base, self._seq = self._seq, self._seq + 1
            values["meta"] = {**values["meta"], "seq": self._seq}
            shape = P.view_shape(run, values["meta"], self._rows_of(run)) if run is not None else None
            start = P.patch_start(self._shape, shape) if patch and self._patches and shape is not None else None
            if start is not None:
                self._send_patch(values, start, base)
            elif self._patched:  # the traits here already hold the patched values: send them all
                self._hold(values)
                self.send_state(list(values))
                self._patched = False
            else:
                self._set(values)
            self._shape = shape
            self._pushed_version = version
            self._throttle.sent(t_start)
            self.push_count += 1
            return True

    def _is_live(self) -> bool:
        if self._reader is not None:
            return self._thread is not None and not self._stop.is_set()
        rec = self.recorder
        return bool(rec is not None and getattr(rec, "attached", False) and self._on_step in rec.on_step)

    def _default_layer(self, run: Run) -> int:
        if self._initial_layer is not None:
            try:
                return run.layer_index(self._initial_layer)
            except (KeyError, IndexError):
                pass
        from .._rows import default_layer

        return int(default_layer(run))

    def _catch_up(self) -> None:
        """Send an update still held back by the rate limit (so ``step`` is the newest when following)."""
        run = self.run
        if run is not None and run.version != self._pushed_version:
            self._throttle.cancel()
            self._push(force=True)

    def _send_detail(self) -> None:
        with self._lock:
            try:
                scalars, arrays = P.detail_view(self.run, self.step, self.layer, self._rows_of(self.run))
            except Exception:  # a torn read while a training thread appends: its next update
                return  # carries the detail of this step and layer
            self._set({"detail": b"", "hists": b"", "hist_steps": b"", **scalars, **arrays})
