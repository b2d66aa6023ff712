"""The run directory: written incrementally while training, readable (and tailable) at any time.

Layout of a run directory (format version 1)::

    meta.json    layers, thresholds, edges, record layouts; replaced atomically (write + rename)
    steps.bin    append-only fixed-size records, numpy dtype ``step_dtype(n_layers)``:
                 step int64, loss/lr/global_norm float64, then each metric as float32[n_layers]
    hist.bin     append-only fixed-size records, numpy dtype ``hist_dtype(n_layers)``:
                 step int64, counts uint32[n_layers, N_BINS] (log10|g| bins, edges in meta.json)

A record is written with one ``write`` and flushed; a reader only takes whole records, so a crash
mid-write loses at most the step being written and never corrupts earlier ones.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np

from .run import HIST_EDGES, METRICS, N_BINS, SCALARS, LayerInfo, Run
from .thresholds import Thresholds

FORMAT = "gradwidget-run"
FORMAT_VERSION = 1


class RunFormatError(ValueError):
    """A run directory that is missing, unreadable or not a gradwidget run."""


def step_dtype(n_layers: int) -> np.dtype:
    fields = [("step", "<i8")] + [(s, "<f8") for s in SCALARS]
    fields += [(m, "<f4", (n_layers,)) for m in METRICS]
    return np.dtype(fields)


def hist_dtype(n_layers: int) -> np.dtype:
    return np.dtype([("step", "<i8"), ("counts", "<u4", (n_layers, N_BINS))])


def _meta_dict(run: Run) -> dict:
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "layers": [l.to_dict() for l in run.layers],
        "metrics": list(METRICS),
        "scalars": list(SCALARS),
        "hist_edges": [float(x) for x in HIST_EDGES],
        "thresholds": run.thresholds.to_dict(),
        "edges": run.edges.tolist(),
        "meta": run.meta,
    }


def _write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunWriter:
    """Appends steps of a Run to a run directory as they are recorded."""

    def __init__(self, path, run: Run, overwrite: bool = False) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise RunFormatError(f"{self.path} exists and is not a directory")
        self.path.mkdir(parents=True, exist_ok=True)
        if (self.path / "meta.json").exists() and not overwrite:
            raise FileExistsError(
                f"{self.path} already holds a run; pick a new log_dir or pass overwrite=True")
        for name in ("steps.bin", "hist.bin"):
            (self.path / name).unlink(missing_ok=True)
        self.run = run
        self._sdt, self._hdt = step_dtype(run.n_layers), hist_dtype(run.n_layers)
        self.write_meta()
        self._steps = open(self.path / "steps.bin", "ab")
        self._hist = open(self.path / "hist.bin", "ab")

    def write_meta(self) -> None:
        _write_json_atomic(self.path / "meta.json", _meta_dict(self.run))

    def append_last(self) -> None:
        """Write the run's newest step (and its histogram, if it has one)."""
        run = self.run
        i = run.n_steps - 1
        rec = np.zeros(1, self._sdt)
        rec["step"] = run.steps[i]
        for j, s in enumerate(SCALARS):
            rec[s] = run._S2[i, j]
        for j, m in enumerate(METRICS):
            rec[m] = run._M3[i, j]
        self._steps.write(rec.tobytes())
        self._steps.flush()
        if run._hn and run.hist_steps[-1] == run.steps[i]:
            h = np.zeros(1, self._hdt)
            h["step"], h["counts"] = run.hist_steps[-1], run.hist[-1]
            self._hist.write(h.tobytes())
            self._hist.flush()

    def close(self) -> None:
        for f in (self._steps, self._hist):
            if not f.closed:
                f.close()


def save_run(run: Run, path, overwrite: bool = False) -> None:
    """Write a whole Run (window only; the decimated history is not saved) to a run directory."""
    path = Path(path)
    w = RunWriter(path, run, overwrite=overwrite)
    try:
        w._steps.write(_step_records(run).tobytes())
        h = np.zeros(run.hist.shape[0], w._hdt)
        h["step"], h["counts"] = run.hist_steps, run.hist
        w._hist.write(h.tobytes())
    finally:
        w.close()


def _step_records(run: Run) -> np.ndarray:
    rec = np.zeros(run.n_steps, step_dtype(run.n_layers))
    rec["step"] = run.steps
    for s in SCALARS:
        rec[s] = run.scalar(s)
    for m in METRICS:
        rec[m] = run.metric(m)
    return rec


def _read_meta(path: Path) -> dict:
    if not path.exists():
        raise RunFormatError(f"no run at {path}: the directory does not exist")
    if not path.is_dir():
        raise RunFormatError(f"{path} is not a run directory (expected a folder with meta.json)")
    mp = path / "meta.json"
    if not mp.exists():
        raise RunFormatError(f"{path} is not a gradwidget run: meta.json is missing "
                             "(was the Recorder given this log_dir?)")
    try:
        meta = json.loads(mp.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunFormatError(f"{mp} is corrupt and cannot be read: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise RunFormatError(f"{mp} is not a gradwidget run description")
    if meta.get("version", 0) > FORMAT_VERSION:
        raise RunFormatError(f"{path} was written by a newer gradwidget (format {meta['version']}); "
                             "upgrade gradwidget to read it")
    if meta.get("metrics") != list(METRICS) or meta.get("scalars") != list(SCALARS):
        raise RunFormatError(f"{mp} lists metrics this gradwidget does not know: {meta.get('metrics')}")
    return meta


class RunReader:
    """Reads a run directory and follows it while a writer appends (``poll()``)."""

    def __init__(self, path) -> None:
        self.path = Path(path)
        meta = _read_meta(self.path)
        try:
            layers = [LayerInfo.from_dict(d) for d in meta["layers"]]
            self.run = Run(layers, thresholds=Thresholds.from_dict(meta.get("thresholds")),
                           edges=meta.get("edges", []), meta=meta.get("meta", {}))
        except (KeyError, TypeError, ValueError) as e:
            raise RunFormatError(f"{self.path / 'meta.json'} is corrupt: {e}") from None
        self._sdt, self._hdt = step_dtype(self.run.n_layers), hist_dtype(self.run.n_layers)
        self._soff = 0
        self._hoff = 0
        self.poll()

    def _read_new(self, name: str, offset: int, dt: np.dtype) -> tuple[np.ndarray, int]:
        p = self.path / name
        if not p.exists():
            return np.zeros(0, dt), offset
        size = p.stat().st_size
        whole = (size - offset) // dt.itemsize
        if whole <= 0:
            return np.zeros(0, dt), offset
        with open(p, "rb") as f:
            f.seek(offset)
            buf = f.read(whole * dt.itemsize)
        n = len(buf) // dt.itemsize
        return np.frombuffer(buf[: n * dt.itemsize], dtype=dt), offset + n * dt.itemsize

    def poll(self) -> bool:
        """Take any whole records appended since the last call; True if there were any."""
        recs, self._soff = self._read_new("steps.bin", self._soff, self._sdt)
        hists, self._hoff = self._read_new("hist.bin", self._hoff, self._hdt)
        run = self.run
        for r in recs:
            if run.n_steps and r["step"] <= run.steps[-1]:
                warnings.warn(f"{self.path}: step {int(r['step'])} is out of order; skipped")
                continue
            vals = np.stack([r[m] for m in METRICS])
            run.append(int(r["step"]), vals, {s: r[s] for s in SCALARS})
        for h in hists:
            run.append_hist(int(h["step"]), h["counts"])
        return bool(len(recs) or len(hists))

    @property
    def truncated_bytes(self) -> int:
        """Bytes at the end of steps.bin that do not make a whole record (a write in progress)."""
        p = self.path / "steps.bin"
        return (p.stat().st_size - self._soff) if p.exists() else 0


def load_run(path) -> Run:
    """Load a run directory written by ``Recorder(log_dir=...)`` or ``Run.save``.

    Raises RunFormatError with a plain message when the directory is missing or corrupt.
    """
    reader = RunReader(path)
    if reader.truncated_bytes:
        warnings.warn(f"{path}: ignored {reader.truncated_bytes} bytes of an unfinished last step")
    return reader.run
