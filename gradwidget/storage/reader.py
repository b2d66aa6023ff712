"""Reading a run directory: ``load_run`` at once, ``RunReader`` following a writer as it appends
(and noticing when a restarted script replaces the run in the same folder)."""

from __future__ import annotations

import warnings

import numpy as np

from .._warnings import GradwidgetWarning
from ..run import LayerInfo, NonfiniteOrigin, Run
from .layout import RunFormatError, file_size, as_path, hist_dtype, step_dtype
from .meta import format_version, meta_signature, read_meta, run_from_meta
from ..noise_series import NoiseSeries, noise_dtype
from .records import append_records, bad_hist_record, bad_noise_record, bad_step_record, layer_mismatch, read_records


class RunReader:
    """Reads a run directory and follows it while a writer appends (``poll()``).

    When a script restarts into the same folder (``overwrite=True``) the reader notices (meta.json
    carries a new ``run_id``, or a file shrank) and starts over: ``run`` becomes the new run and
    ``replaced`` counts the restarts, so a view never splices two runs together.
    """

    def __init__(self, path) -> None:
        self.path = as_path(path)
        #: how many times the folder was taken over by a new run while this reader followed it
        self.replaced = 0
        self.run = self._load()

    def _load(self) -> Run:
        """Read the folder from scratch (meta.json, then every whole record)."""
        mp = self.path / "meta.json"
        sig = meta_signature(mp)
        meta = read_meta(self.path)
        run = run_from_meta(meta, mp)
        self._meta_sig, self._run_id = sig, meta.get("run_id")
        #: the format of the folder's records (``layout.READ_VERSIONS``)
        self.format_version = format_version(meta)
        self._sdt, self._hdt = (
            step_dtype(run.n_layers, self.format_version),
            hist_dtype(run.n_layers, self.format_version),
        )
        self._soff = self._hoff = self._noff = 0
        self._ndt = noise_dtype(run.n_layers)
        self._take_new(run)
        run.history = self._read_history(run)
        return run

    def _read_history(self, run: Run) -> Run | None:
        """The decimated steps a rolling-window run had folded away when it was saved (history.bin,
        written by ``save_run`` only), or None. Read a chunk at a time, each checked first."""
        p = self.path / "history.bin"
        size = file_size(p)
        if not size:
            return None
        if size % self._sdt.itemsize:
            raise RunFormatError(
                f"{p} is damaged: {size} bytes is not a whole number of {self._sdt.itemsize}-byte step records"
            )
        h = Run(run.layers, thresholds=run.thresholds)
        off = 0
        while off < size:
            recs, end = read_records(p, off, self._sdt, size)
            last = int(h.steps[-1]) if h.n_steps else None
            bad = bad_step_record(recs, last)
            if bad is None and end >= size and run.n_steps and recs["step"][-1] >= run.steps[0]:
                bad = len(recs) - 1, f"its step {int(recs['step'][-1])} is not before the first step in steps.bin"
            if bad:
                raise RunFormatError(
                    f"{p} is damaged: record {off // self._sdt.itemsize + bad[0]} is not a valid step ({bad[1]})"
                )
            append_records(h, recs)
            off = end
        return h

    def _read_new(self, name: str, offset: int, dt: np.dtype) -> tuple[np.ndarray, int]:
        """The whole records after ``offset``, at most ``READ_CHUNK_BYTES`` of them, and the new offset."""
        return read_records(self.path / name, offset, dt, file_size(self.path / name))

    def _take_new(self, run: Run) -> bool:
        """Take every whole record written since the last read, a chunk at a time."""
        changed = False
        while self._take_chunk(run):
            changed = True
        return changed

    def _take_chunk(self, run: Run) -> bool:
        """Append the next chunk of whole records written since the last read to ``run``, after
        checking them all (a damaged file raises RunFormatError and leaves ``run`` as it was)."""
        # histograms first: the writer appends a step's record before its histogram, so every
        # histogram read here has its step record in steps.bin by the time that is read
        hsize, ssize = file_size(self.path / "hist.bin"), file_size(self.path / "steps.bin")
        n_hist, n_steps = hsize // self._hdt.itemsize, ssize // self._sdt.itemsize
        if n_hist > n_steps + 1:  # checked before reading either: one histogram at most per step
            why = (
                layer_mismatch(self.path / "steps.bin", run.n_layers, self.format_version)
                if ssize % self._sdt.itemsize
                else None
            )
            raise RunFormatError(
                f"{self.path / 'hist.bin'} is damaged: it holds {n_hist} histogram records "
                f"but steps.bin only {n_steps} steps" + (f" ({why})" if why else "")
            )
        hists, hoff = self._read_new("hist.bin", self._hoff, self._hdt)
        recs, soff = self._read_new("steps.bin", self._soff, self._sdt)
        last = int(run.steps[-1]) if run.n_steps else None
        bad = bad_step_record(recs, last)
        if bad:
            rec_no = self._soff // self._sdt.itemsize + bad[0]
            raise RunFormatError(
                f"{self.path / 'steps.bin'} is damaged: record {rec_no} is not a valid step ({bad[1]}). "
                + (
                    layer_mismatch(self.path / "steps.bin", run.n_layers, self.format_version)
                    or f"The file is corrupt, or meta.json lists a different number of layers ({run.n_layers}) "
                    "than it was written with."
                )
            )
        steps = np.concatenate([run.steps, recs["step"]])
        if len(steps) and file_size(self.path / "steps.bin") > soff:
            # steps.bin goes on past this chunk (more whole records, or a crash cut the last record
            # short): histograms of later steps wait for their step records (load_run warns about
            # those a cut record leaves unread; a live writer may yet add the step)
            keep = int(np.searchsorted(hists["step"], steps[-1], side="right"))
            hists, hoff = hists[:keep], self._hoff + keep * self._hdt.itemsize
        last_h = int(run.hist_steps[-1]) if run._hn else None
        bad = bad_hist_record(hists, last_h, steps)
        if bad:
            raise RunFormatError(
                f"{self.path / 'hist.bin'} is damaged: record {self._hoff // self._hdt.itemsize + bad[0]} "
                f"is not a valid histogram ({bad[1]})."
            )
        append_records(run, recs)
        for h in hists:
            run.append_hist(int(h["step"]), h["counts"])
        self._soff, self._hoff = soff, hoff
        return bool(len(recs) or len(hists)) | self._take_noise(run)

    def _take_noise(self, run: Run) -> bool:
        """Append the whole noise rows (noise.bin, absent in older runs) of steps already read."""
        p = self.path / "noise.bin"
        if not file_size(p):
            return False
        rows, end = self._read_new("noise.bin", self._noff, self._ndt)
        last = int(run.noise.rows["step"][-1]) if run.noise is not None and len(run.noise) else None
        if len(rows):
            bad = bad_noise_record(rows, last)
            if bad:
                raise RunFormatError(
                    f"{p} is damaged: record {self._noff // self._ndt.itemsize + bad[0]} is not a valid "
                    f"noise row ({bad[1]})."
                )
        keep = int(np.searchsorted(rows["step"], run.steps[-1], side="right")) if run.n_steps else 0
        rows = rows[:keep]  # rows of steps not read yet wait for their step record
        if not len(rows):
            return False
        if run.noise is None:
            run.noise = NoiseSeries(run.n_layers, run.max_steps)
        run.noise.extend(rows)
        self._noff += len(rows) * self._ndt.itemsize
        return True

    def _is_replaced(self) -> bool:
        """Has the folder been taken over by another run since we last read it? (A rewrite of the
        same run's meta.json, with new edges or a layer's late status, is taken in place.)"""
        mp = self.path / "meta.json"
        sig = meta_signature(mp)
        if sig is not None and sig != self._meta_sig:
            meta = read_meta(self.path)
            names = [d["name"] for d in meta["layers"]]
            if meta.get("run_id") != self._run_id or names != self.run.layer_names:
                return True
            self._meta_sig = sig
            self._refresh_meta(meta)
        return (
            file_size(self.path / "steps.bin") < self._soff
            or file_size(self.path / "hist.bin") < self._hoff
            or file_size(self.path / "noise.bin") < self._noff
        )

    def _refresh_meta(self, meta: dict) -> None:
        """Take what a writer may change in meta.json during a run: the data-flow edges (captured
        after the first step), the layers' status / backward_index (a layer used late), the
        non-finite origin (written when it is found) and the replica check's record."""
        run = self.run
        layers = [LayerInfo.from_dict(d) for d in meta["layers"]]
        edges = np.asarray(meta.get("edges", []), np.int32).reshape(-1, 2)
        if layers != run.layers or not np.array_equal(edges, run.edges):
            run.layers[:] = layers
            run.edges = edges
            run.version += 1
        origin = (meta.get("meta") or {}).get("nonfinite_origin")
        if origin != run.meta.get("nonfinite_origin"):  # found while the reader follows the run
            run.nonfinite_origin = None if origin is None else NonfiniteOrigin.from_dict(origin)
        replicas = (meta.get("meta") or {}).get("replicas")
        if replicas != run.meta.get("replicas"):  # the replica check found a divergence (or closed)
            run.meta["replicas"] = replicas

    def poll(self) -> bool:
        """Take any whole records appended since the last call; True if the run changed.

        If the folder now holds a different run (a script restarted with ``overwrite=True``), read it
        from scratch: ``run`` becomes a new Run (its ``version`` above the old one's, so views
        refresh), ``replaced`` goes up by one, and True is returned. While meta.json is briefly
        missing (the folder being recreated) the old run stays and nothing changes.
        """
        if meta_signature(self.path / "meta.json") is None:
            return False
        if self._is_replaced():
            old = self.run
            new = self._load()
            new.version += old.version + 1
            self.run = new
            self.replaced += 1
            return True
        return self._take_new(self.run)

    @property
    def truncated_bytes(self) -> int:
        """Bytes at the end of steps.bin that do not make a whole record (a write in progress)."""
        return max(0, file_size(self.path / "steps.bin") - self._soff)

    @property
    def unread_histograms(self) -> int:
        """Whole records in hist.bin not taken: those of steps after the last whole step record."""
        return max(0, file_size(self.path / "hist.bin") - self._hoff) // self._hdt.itemsize


def load_run(path) -> Run:
    """Load a run directory written by ``Recorder(log_dir=...)`` or ``Run.save``.

    Raises RunFormatError with a plain message when the directory is missing or corrupt.
    """
    reader = RunReader(path)
    if reader.truncated_bytes:
        mismatch = layer_mismatch(reader.path / "steps.bin", reader.run.n_layers, reader.format_version)
        if mismatch:
            raise RunFormatError(f"{reader.path / 'steps.bin'} does not match meta.json: {mismatch}")
        warnings.warn(f"{path}: ignored {reader.truncated_bytes} bytes of an unfinished last step", GradwidgetWarning)
    if reader.unread_histograms:
        warnings.warn(
            f"{path}: ignored {reader.unread_histograms} histogram(s) of steps after the last whole step record",
            GradwidgetWarning,
        )
    return reader.run
