"""The run directory: written incrementally while training, readable (and tailable) at any time.

Layout of a run directory (format version 1)::

    meta.json    layers, thresholds, edges, record layouts; replaced atomically (write + rename)
    steps.bin    append-only fixed-size records, numpy dtype ``step_dtype(n_layers)``:
                 step int64, loss/lr/global_norm float64, then each metric as float32[n_layers]
    hist.bin     append-only fixed-size records, numpy dtype ``hist_dtype(n_layers)``:
                 step int64, counts uint32[n_layers, N_BINS] (log10|g| bins, edges in meta.json)
    history.bin  only from save_run of a rolling-window run: its decimated older steps (steps.bin dtype)

A record is written with one ``write`` and flushed; a reader only takes whole records, so a crash
mid-write loses at most the step being written and never corrupts earlier ones.
"""
from __future__ import annotations

import json
import os
import uuid
import warnings
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from .run import HIST_EDGES, LAYER_STATUSES, METRICS, N_BINS, SCALARS, LayerInfo, NonfiniteOrigin, Run
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


def _meta_dict(run: Run, run_id: str | None = None, created: str | None = None) -> dict:
    d = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "run_id": run_id,
        "created": created,
        "layers": [l.to_dict() for l in run.layers],
        "metrics": list(METRICS),
        "scalars": list(SCALARS),
        "hist_edges": [float(x) for x in HIST_EDGES],
        "thresholds": run.thresholds.to_dict(),
        "edges": run.edges.tolist(),
        "meta": run.meta,
    }
    return {k: v for k, v in d.items() if v is not None}


def _write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


#: the files a run directory is made of: no export or report is written over one of them
RUN_FILES = ("meta.json", "meta.json.tmp", "steps.bin", "hist.bin", "history.bin")


def check_output_file(path) -> Path:
    """An output file (export, report) as a Path, refused when it is a folder or one of a run
    directory's own files: writing a report over ``RUN/meta.json`` would destroy the run it describes."""
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(f"{p} is a directory; give the file to write, e.g. {p / 'report.html'}")
    if p.name in RUN_FILES and (p.parent / "meta.json").is_file():
        raise ValueError(f"refusing to write {p}: it is one of the files of the run in {p.parent}; "
                         "choose another output file")
    return p


@contextmanager
def atomic_output(path, newline=None, encoding=None):
    """Open an output file (see ``check_output_file``) for writing via a temporary sibling renamed
    into place at the end, so a failure half-way leaves an earlier file intact and no partial one."""
    path = check_output_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", newline=newline, encoding=encoding) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_log_dir(path, overwrite: bool = False) -> Path:
    """Refuse a run directory a writer may not use (not a path, a file, another run without
    ``overwrite``); recorders call it at construction so the error comes before training does."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"log_dir must be a folder path (str or pathlib.Path), not {type(path).__name__}")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"log_dir {path} exists and is not a directory; pick a new log_dir")
    if (path / "meta.json").exists() and not overwrite:
        raise FileExistsError(f"{path} already holds a run; pick a new log_dir or pass overwrite=True")
    return path


class RunWriter:
    """Appends steps of a Run to a run directory as they are recorded."""

    def __init__(self, path, run: Run, overwrite: bool = False) -> None:
        self.path = check_log_dir(path, overwrite)
        self.path.mkdir(parents=True, exist_ok=True)
        for name in ("steps.bin", "hist.bin", "history.bin"):
            (self.path / name).unlink(missing_ok=True)
        self.run = run
        #: a fresh id per writer: a reader following this folder sees a rerun as a different run
        self.run_id = uuid.uuid4().hex
        self.created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._sdt, self._hdt = step_dtype(run.n_layers), hist_dtype(run.n_layers)
        self.write_meta()
        self._steps = open(self.path / "steps.bin", "ab")
        self._hist = open(self.path / "hist.bin", "ab")

    def write_meta(self) -> None:
        _write_json_atomic(self.path / "meta.json", _meta_dict(self.run, self.run_id, self.created))

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
    """Write a whole Run to a run directory. A rolling-window run also writes the steps that fell
    out of its window, as it holds them (decimated, without histograms), to ``history.bin``, so
    ``load_run`` gives back ``run.history`` too instead of silently keeping only the window."""
    path = Path(path)
    w = RunWriter(path, run, overwrite=overwrite)
    try:
        w._steps.write(_step_records(run).tobytes())
        h = np.zeros(run.hist.shape[0], w._hdt)
        h["step"], h["counts"] = run.hist_steps, run.hist
        w._hist.write(h.tobytes())
        older = [r for r in (run.history, run._pending) if r is not None and r.n_steps]
        if older:
            with open(path / "history.bin", "wb") as f:
                for r in older:
                    f.write(_step_records(r).tobytes())
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
    version = meta.get("version", FORMAT_VERSION)
    if not _is_int(version) or version < 1:
        raise RunFormatError(f"{mp} is corrupt: \"version\" must be a positive integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise RunFormatError(f"{path} was written by a newer gradwidget (format {version}); "
                             "upgrade gradwidget to read it")
    if meta.get("metrics") != list(METRICS) or meta.get("scalars") != list(SCALARS):
        raise RunFormatError(f"{mp} lists metrics this gradwidget does not know: {meta.get('metrics')}")
    problem = _meta_problem(meta)
    if problem:
        raise RunFormatError(f"{mp} is corrupt: {problem}")
    return meta


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


#: the type each optional layer field must have in meta.json (name is required)
_LAYER_FIELDS = {"module": str, "module_type": str, "dtype": str, "numel": int, "backward_index": int,
                 "status": str}


def _layer_problem(j: int, d) -> str | None:
    """What is wrong with layer ``j``'s entry in meta.json, or None."""
    if not isinstance(d, dict) or not isinstance(d.get("name"), str):
        return f"layers[{j}] must be an object with a string \"name\", got {d!r:.80}"
    for key, typ in _LAYER_FIELDS.items():
        if key in d and not (_is_int(d[key]) if typ is int else isinstance(d[key], typ)):
            return f"layers[{j}] ({d['name']}) has {key}={d[key]!r:.40}, expected {typ.__name__}"
    if d.get("numel", 0) < 0:
        return f"layers[{j}] ({d['name']}) has a negative numel {d['numel']}"
    shape = d.get("shape", [])
    if not isinstance(shape, list) or not all(_is_int(n) and n >= 0 for n in shape):
        return f"layers[{j}] ({d['name']}) has shape={shape!r:.40}, expected a list of sizes"
    if d.get("status", "trainable") not in LAYER_STATUSES:
        return f"layers[{j}] ({d['name']}) has status {d['status']!r}, expected one of {LAYER_STATUSES}"
    return None


def _meta_problem(meta: dict) -> str | None:
    """The first field of meta.json with a wrong type or an impossible value, or None: checked
    here so a damaged run fails at load with one message instead of deep inside the analysis."""
    layers = meta.get("layers")
    if not isinstance(layers, list):
        return f"\"layers\" must be a list of layer objects, got {layers!r:.60}"
    for j, d in enumerate(layers):
        problem = _layer_problem(j, d)
        if problem:
            return problem
    edges = meta.get("edges", [])
    if not isinstance(edges, list):
        return f"\"edges\" must be a list of [from, to] layer indices, got {edges!r:.60}"
    for e in edges:
        if not (isinstance(e, list) and len(e) == 2 and all(_is_int(i) and 0 <= i < len(layers) for i in e)):
            return f"edge {e!r:.40} is not a pair of layer indices in 0..{len(layers) - 1}"
    for key in ("thresholds", "meta"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            return f"\"{key}\" must be an object, got {meta[key]!r:.60}"
    origin = (meta.get("meta") or {}).get("nonfinite_origin")
    if origin is not None:
        try:
            NonfiniteOrigin.from_dict(origin)
        except ValueError as e:
            return f"meta.nonfinite_origin is malformed: {e}"
    edges_h = meta.get("hist_edges", list(HIST_EDGES))
    if not isinstance(edges_h, list) or len(edges_h) != N_BINS + 1:
        return f"\"hist_edges\" must be a list of {N_BINS + 1} bin edges"
    return None


def _run_from_meta(meta: dict, mp: Path) -> Run:
    try:
        layers = [LayerInfo.from_dict(d) for d in meta["layers"]]
        return Run(layers, thresholds=Thresholds.from_dict(meta.get("thresholds")),
                   edges=meta.get("edges", []), meta=meta.get("meta") or {})
    except (KeyError, TypeError, ValueError) as e:
        raise RunFormatError(f"{mp} is corrupt: {e}") from None


def _file_size(p: Path) -> int:
    """Size of one of the run's binary files (0 while it does not exist yet)."""
    try:
        st = p.stat()
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise RunFormatError(f"{p} cannot be read: {e}") from None
    if not p.is_file():
        raise RunFormatError(f"{p} is not a file: a run keeps its records in a plain file {p.name}")
    return st.st_size


def _meta_signature(p: Path):
    """What changes when meta.json is rewritten (it is replaced by rename); None while it is absent."""
    try:
        st = p.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _not_after(steps: np.ndarray, prev_step) -> np.ndarray:
    """Which step numbers do not come after the one before them (the first after ``prev_step``,
    the last step already read, if any): step numbers only increase."""
    prev = np.concatenate([[prev_step if prev_step is not None else np.iinfo(np.int64).min], steps[:-1]])
    return steps <= prev


def _bad_step_record(recs: np.ndarray, prev_step) -> tuple[int, str] | None:
    """The first record that no writer could have produced (index, why), or None. Records carry
    their step number, which only increases, and norms, fractions and counts are never negative
(``Run.append`` enforces the first; no recorder produces the second):
    random bytes, or a meta.json listing a different number of layers, break these at once."""
    if not len(recs):
        return None
    steps = recs["step"]
    checks = [(_not_after(steps, prev_step), "its step number {step} does not follow the previous step")]
    with np.errstate(invalid="ignore"):
        checks.append((recs["global_norm"] < 0, "its global norm is negative"))
        for m in METRICS:
            checks.append(((recs[m] < 0).any(axis=1), f"its {m} is negative"))
    bad = np.zeros(len(recs), bool)
    for mask, _ in checks:
        bad |= mask
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    why = next(msg for mask, msg in checks if mask[i])
    return i, why.format(step=int(steps[i]))


def _bad_hist_record(hists: np.ndarray, prev_step, steps: np.ndarray) -> tuple[int, str] | None:
    """The first histogram record whose step is out of order or not a recorded step, or None."""
    if not len(hists):
        return None
    hs = hists["step"]
    pos = np.clip(np.searchsorted(steps, hs), 0, max(len(steps) - 1, 0))
    recorded = (steps[pos] == hs) if len(steps) else np.zeros(len(hs), bool)
    out_of_order = _not_after(hs, prev_step)
    bad = out_of_order | ~recorded
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    why = "does not follow the previous histogram" if out_of_order[i] else "is not a step in steps.bin"
    return i, f"its step number {int(hs[i])} {why}"


def _append_records(run: Run, recs: np.ndarray) -> None:
    """Append step records (``step_dtype``) to ``run``."""
    for r in recs:
        run.append(int(r["step"]), np.stack([r[m] for m in METRICS]), {s: r[s] for s in SCALARS})


class RunReader:
    """Reads a run directory and follows it while a writer appends (``poll()``).

    When a script restarts into the same folder (``overwrite=True``) the reader notices (meta.json
    carries a new ``run_id``, or a file shrank) and starts over: ``run`` becomes the new run and
    ``replaced`` counts the restarts, so a view never splices two runs together.
    """

    def __init__(self, path) -> None:
        self.path = Path(path)
        #: how many times the folder was taken over by a new run while this reader followed it
        self.replaced = 0
        self.run = self._load()

    def _load(self) -> Run:
        """Read the folder from scratch (meta.json, then every whole record)."""
        mp = self.path / "meta.json"
        sig = _meta_signature(mp)
        meta = _read_meta(self.path)
        run = _run_from_meta(meta, mp)
        self._meta_sig, self._run_id = sig, meta.get("run_id")
        self._sdt, self._hdt = step_dtype(run.n_layers), hist_dtype(run.n_layers)
        self._soff = self._hoff = 0
        self._take_new(run)
        run.history = self._read_history(run)
        return run

    def _read_history(self, run: Run) -> Run | None:
        """The decimated steps a rolling-window run had folded away when it was saved (history.bin,
        written by ``save_run`` only), or None."""
        p = self.path / "history.bin"
        size = _file_size(p)
        if not size:
            return None
        if size % self._sdt.itemsize:
            raise RunFormatError(f"{p} is damaged: {size} bytes is not a whole number of "
                                 f"{self._sdt.itemsize}-byte step records")
        recs = np.fromfile(p, dtype=self._sdt)
        bad = _bad_step_record(recs, None)
        if bad is None and run.n_steps and recs["step"][-1] >= run.steps[0]:
            bad = len(recs) - 1, f"its step {int(recs['step'][-1])} is not before the first step in steps.bin"
        if bad:
            raise RunFormatError(f"{p} is damaged: record {bad[0]} is not a valid step ({bad[1]})")
        h = Run(run.layers, thresholds=run.thresholds)
        _append_records(h, recs)
        return h

    def _read_new(self, name: str, offset: int, dt: np.dtype) -> tuple[np.ndarray, int]:
        p = self.path / name
        whole = (_file_size(p) - offset) // dt.itemsize
        if whole <= 0:
            return np.zeros(0, dt), offset
        try:
            with open(p, "rb") as f:
                f.seek(offset)
                buf = f.read(whole * dt.itemsize)
        except OSError as e:
            raise RunFormatError(f"{p} cannot be read: {e}") from None
        n = len(buf) // dt.itemsize
        return np.frombuffer(buf[: n * dt.itemsize], dtype=dt), offset + n * dt.itemsize

    def _take_new(self, run: Run) -> bool:
        """Append the whole records written since the last read to ``run``, after checking them all
        (a damaged file raises RunFormatError and leaves ``run`` as it was)."""
        # histograms first: the writer appends a step's record before its histogram, so every
        # histogram read here has its step record in steps.bin by the time that is read
        hists, hoff = self._read_new("hist.bin", self._hoff, self._hdt)
        recs, soff = self._read_new("steps.bin", self._soff, self._sdt)
        last = int(run.steps[-1]) if run.n_steps else None
        bad = _bad_step_record(recs, last)
        if bad:
            raise RunFormatError(
                f"{self.path / 'steps.bin'} is damaged: record {self._soff // self._sdt.itemsize + bad[0]} "
                f"is not a valid step ({bad[1]}). The file is corrupt, or meta.json lists a different "
                f"number of layers ({run.n_layers}) than it was written with.")
        steps = np.concatenate([run.steps, recs["step"]])
        if len(steps) and _file_size(self.path / "steps.bin") > soff:
            # a crash cut the last step record short: histograms of the steps after the last whole
            # record are left unread (load_run warns about them; a live writer may yet add the step)
            keep = int(np.searchsorted(hists["step"], steps[-1], side="right"))
            hists, hoff = hists[:keep], self._hoff + keep * self._hdt.itemsize
        last_h = int(run.hist_steps[-1]) if run._hn else None
        bad = _bad_hist_record(hists, last_h, steps)
        if bad:
            raise RunFormatError(
                f"{self.path / 'hist.bin'} is damaged: record {self._hoff // self._hdt.itemsize + bad[0]} "
                f"is not a valid histogram ({bad[1]}).")
        _append_records(run, recs)
        for h in hists:
            run.append_hist(int(h["step"]), h["counts"])
        self._soff, self._hoff = soff, hoff
        return bool(len(recs) or len(hists))

    def _is_replaced(self) -> bool:
        """Has the folder been taken over by another run since we last read it? (A rewrite of the
        same run's meta.json, with new edges or a layer's late status, is taken in place.)"""
        mp = self.path / "meta.json"
        sig = _meta_signature(mp)
        if sig is not None and sig != self._meta_sig:
            meta = _read_meta(self.path)
            names = [d["name"] for d in meta["layers"]]
            if meta.get("run_id") != self._run_id or names != self.run.layer_names:
                return True
            self._meta_sig = sig
            self._refresh_meta(meta)
        return (_file_size(self.path / "steps.bin") < self._soff
                or _file_size(self.path / "hist.bin") < self._hoff)

    def _refresh_meta(self, meta: dict) -> None:
        """Take what a writer may change in meta.json during a run: the data-flow edges (captured
        after the first step), the layers' status / backward_index (a layer used late) and the
        non-finite origin (written when it is found)."""
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

    def poll(self) -> bool:
        """Take any whole records appended since the last call; True if the run changed.

        If the folder now holds a different run (a script restarted with ``overwrite=True``), read it
        from scratch: ``run`` becomes a new Run (its ``version`` above the old one's, so views
        refresh), ``replaced`` goes up by one, and True is returned. While meta.json is briefly
        missing (the folder being recreated) the old run stays and nothing changes.
        """
        if _meta_signature(self.path / "meta.json") is None:
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
        return max(0, _file_size(self.path / "steps.bin") - self._soff)

    @property
    def unread_histograms(self) -> int:
        """Whole records in hist.bin not taken: those of steps after the last whole step record."""
        return max(0, _file_size(self.path / "hist.bin") - self._hoff) // self._hdt.itemsize


def load_run(path) -> Run:
    """Load a run directory written by ``Recorder(log_dir=...)`` or ``Run.save``.

    Raises RunFormatError with a plain message when the directory is missing or corrupt.
    """
    reader = RunReader(path)
    if reader.truncated_bytes:
        warnings.warn(f"{path}: ignored {reader.truncated_bytes} bytes of an unfinished last step")
    if reader.unread_histograms:
        warnings.warn(f"{path}: ignored {reader.unread_histograms} histogram(s) of steps after the last "
                      "whole step record")
    return reader.run
