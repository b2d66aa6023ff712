"""The run directory: written incrementally while training, readable (and tailable) at any time.

Layout of a run directory (format version 1)::

    meta.json    layers, thresholds, edges, record layouts; replaced atomically (write + rename)
    steps.bin    append-only fixed-size records, numpy dtype ``step_dtype(n_layers)``:
                 step int64, loss/lr/global_norm float64, then each metric as float32[n_layers]
    hist.bin     append-only fixed-size records, numpy dtype ``hist_dtype(n_layers)``:
                 step int64, counts uint32[n_layers, N_BINS] (log10|g| bins, edges in meta.json)
    history.bin  only from save_run of a rolling-window run: its decimated older steps (steps.bin dtype)

A record is written with one unbuffered ``write``; a reader only takes whole records, so a crash
mid-write loses at most the step being written and never corrupts earlier ones, and a write that
fails part-way (a full disk) is cut back and retried later (``RunWriter``). The writer only works in
a folder that is new, empty or its own run (``check_log_dir``) and creates every file new, never
through a link (``files``); the reader checks sizes and file types before it reads, and reads in
bounded chunks, so a damaged or hostile folder is a RunFormatError, never a hang or a MemoryError.
"""
from __future__ import annotations

import json
import os
import uuid
import warnings
from collections import deque
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from ._warnings import GradwidgetWarning
from .files import NotPlainFile, append_whole, create_new, open_plain, replace_atomically, writable_folder
from .run import HIST_EDGES, LAYER_STATUSES, METRICS, N_BINS, SCALARS, LayerInfo, NonfiniteOrigin, Run
from .thresholds import Thresholds

FORMAT = "gradwidget-run"
FORMAT_VERSION = 1


class RunFormatError(ValueError):
    """A run directory that is missing, unreadable or not a gradwidget run."""


def step_dtype(n_layers: int) -> np.dtype:
    fields: list[tuple] = [("step", "<i8")] + [(s, "<f8") for s in SCALARS]
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
        "layers": [info.to_dict() for info in run.layers],
        "metrics": list(METRICS),
        "scalars": list(SCALARS),
        "hist_edges": [float(x) for x in HIST_EDGES],
        "thresholds": run.thresholds.to_dict(),
        "edges": run.edges.tolist(),
        "meta": run.meta,
    }
    return {k: v for k, v in d.items() if v is not None}


def _write_json_atomic(path: Path, obj: dict) -> None:
    with replace_atomically(path, sync=True) as f:
        json.dump(obj, f, indent=1)


#: the files a run directory is made of: no export or report is written over one of them, and a
#: writer never starts in a folder that holds one of them without being that folder's run
RUN_FILES = ("meta.json", "meta.json.tmp", "steps.bin", "hist.bin", "history.bin")
#: the files a writer replaces when it starts a new run (``overwrite=True``) in its own run folder
_RECORD_FILES = ("steps.bin", "hist.bin", "history.bin", "meta.json.tmp")


def check_output_file(path) -> Path:
    """An output file (export, report) as a Path, refused when it is a folder or one of a run
    directory's own files: writing a report over ``RUN/meta.json`` would destroy the run it describes."""
    p = as_path(path, "the output file must be a path")
    if p.is_dir():
        raise IsADirectoryError(f"{p} is a directory; give the file to write, e.g. {p / 'report.html'}")
    if p.name in RUN_FILES and (p.parent / "meta.json").is_file():
        raise ValueError(f"refusing to write {p}: it is one of the files of the run in {p.parent}; "
                         "choose another output file")
    return p


@contextmanager
def atomic_output(path, newline=None, encoding=None):
    """Open an output file (see ``check_output_file``) for writing via a private temporary sibling
    renamed into place at the end, so a failure half-way leaves an earlier file intact and no
    partial one, and a link planted beside it is never written through."""
    path = check_output_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replace_atomically(path, newline=newline, encoding=encoding) as f:
        yield f


def is_run_dir(path) -> bool:
    """Is ``path`` a folder holding a gradwidget run (its marker: a plain-file meta.json whose
    "format" is gradwidget's)? Read bounded, so any file there is safe to look at."""
    try:
        meta = _parse_meta(Path(path) / "meta.json")
    except RunFormatError:
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def check_log_dir(path, overwrite: bool = False, overwrite_hint: str = "pass overwrite=True") -> Path:
    """The folder a writer may use, or a clear error before training starts: a new or empty
    folder; a gradwidget run only with ``overwrite=True`` (its records are replaced); a folder of
    other files only with ``overwrite=True`` and only if none of them has a run file's name
    (they are never touched). Also refused: a file, a folder the writer cannot write in."""
    path = as_path(path, "log_dir must be a folder path")
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"log_dir {path} exists and is not a directory; pick a new log_dir")
    if path.is_dir() and any(path.iterdir()):
        if is_run_dir(path):
            if not overwrite:
                raise FileExistsError(f"{path} already holds a run; pick a new log_dir or {overwrite_hint} to replace it")
        else:
            taken = [n for n in RUN_FILES if os.path.lexists(path / n)]
            if taken:
                raise FileExistsError(
                    f"{path} is not a gradwidget run but holds {', '.join(taken)}: gradwidget never writes "
                    f"over files it did not create; pick a new or empty log_dir (e.g. {path / 'run1'})")
            if not overwrite:
                raise FileExistsError(
                    f"{path} holds other files and is not a gradwidget run; pick a new or empty log_dir "
                    f"(e.g. {path / 'run1'}), or {overwrite_hint} to write the run beside them "
                    "(none of them is touched)")
    problem = writable_folder(path)
    if problem:
        raise PermissionError(f"cannot record to log_dir {path}: {problem}; pick a log_dir you can write to")
    return path


#: unwritten record bytes a live writer holds while the disk refuses writes (a full disk) before it
#: stops writing that run directory, explicitly
BACKLOG_MAX_BYTES = 64 << 20


class RunWriteWarning(GradwidgetWarning, RuntimeWarning):
    """Writing a run directory failed, resumed or stopped (shown once per event, never silent)."""


class RunWriter:
    """Appends steps of a Run to a run directory as they are recorded.

    Records that cannot be written (a full disk, a folder made read-only) stay queued, in order, and
    are retried at every later step; a file never ends in half a record. ``live=True`` (a recorder
    writing from inside training hooks) turns a failure into one loud ``RunWriteWarning`` instead of
    an exception in the middle of ``optimizer.step()``, another when the queue is written after all,
    and stops writing, with a warning, once the queue passes ``BACKLOG_MAX_BYTES``; ``close`` warns
    about anything never written. Without ``live`` the OSError is raised (the queue is kept).
    """

    def __init__(self, path, run: Run, overwrite: bool = False, live: bool = False) -> None:
        self.path = check_log_dir(path, overwrite)
        self.path.mkdir(parents=True, exist_ok=True)
        if is_run_dir(self.path):  # our own earlier run (check_log_dir had overwrite=True): replaced
            for name in _RECORD_FILES:
                (self.path / name).unlink(missing_ok=True)  # a link is removed, never followed
        self.run, self.live = run, live
        #: a fresh id per writer: a reader following this folder sees a rerun as a different run
        self.run_id = uuid.uuid4().hex
        self.created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._sdt, self._hdt = step_dtype(run.n_layers), hist_dtype(run.n_layers)
        self._fds: dict[str, int] = {}
        self._sizes = {"steps.bin": 0, "hist.bin": 0}
        self._queue: deque = deque()   # (file name, record bytes) not yet on disk, in order
        self._meta_due = True
        #: the error that is holding records back (None while everything is on disk)
        self.error: OSError | None = None
        self.stopped = False
        self._failed_at: int | None = None
        self._flush()

    @property
    def pending_steps(self) -> int:
        """Step records recorded but not (yet) on disk."""
        return sum(1 for name, _ in self._queue if name == "steps.bin")

    def write_meta(self) -> None:
        self._meta_due = True
        self._flush()

    def append_last(self) -> None:
        """Write the run's newest step (and its histogram, if it has one)."""
        if self.stopped:
            return
        run = self.run
        i = run.n_steps - 1
        rec = np.zeros(1, self._sdt)
        rec["step"] = run.steps[i]
        for j, s in enumerate(SCALARS):
            rec[s] = run._S2[i, j]
        for j, m in enumerate(METRICS):
            rec[m] = run._M3[i, j]
        self._queue.append(("steps.bin", rec.tobytes()))
        if run._hn and run.hist_steps[-1] == run.steps[i]:
            h = np.zeros(1, self._hdt)
            h["step"], h["counts"] = run.hist_steps[-1], run.hist[-1]
            self._queue.append(("hist.bin", h.tobytes()))
        self._flush()

    def _write_due(self) -> None:
        """Write meta.json if due, then the queued records in order; raises OSError at the first
        that fails, leaving it and the ones after it queued."""
        if self._meta_due:
            _write_json_atomic(self.path / "meta.json", _meta_dict(self.run, self.run_id, self.created))
            self._meta_due = False
        for name in self._sizes:
            if name not in self._fds:
                self._fds[name] = create_new(self.path / name, append=True)
        while self._queue:
            name, data = self._queue[0]
            self._sizes[name] = append_whole(self._fds[name], data, self._sizes[name])
            self._queue.popleft()

    def _flush(self) -> None:
        if self.stopped:
            return
        try:
            self._write_due()
        except OSError as e:
            self._failed(e)
            return
        if self.error is not None:
            if self.live:
                warnings.warn(f"gradwidget: writing {self.path} works again: the steps from step "
                              f"{self._failed_at} on are now on disk", RunWriteWarning, stacklevel=4)
            self.error = self._failed_at = None

    def _failed(self, e: OSError) -> None:
        if not self.live:
            raise e
        first = self.error is None
        self.error = e
        if first:
            self._failed_at = int(self.run.steps[-1]) if self.run.n_steps else None
            warnings.warn(f"gradwidget: cannot write {self.path} ({_oserror_text(e)}): training goes on and "
                          "the steps are kept in memory and written once the folder accepts writes again",
                          RunWriteWarning, stacklevel=5)
        if sum(len(d) for _, d in self._queue) > BACKLOG_MAX_BYTES:
            n = self.pending_steps
            self._stop()
            warnings.warn(f"gradwidget: stopped recording to {self.path}: writes have failed from step "
                          f"{self._failed_at} on ({_oserror_text(e)}) and {n} steps are waiting. The run goes on in "
                          "memory only (recorder.run); save it with recorder.run.save(another_folder)",
                          RunWriteWarning, stacklevel=5)

    def _stop(self) -> None:
        self.stopped = True
        self._queue.clear()
        self._close_files()

    def _close_files(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = {}

    def close(self) -> None:
        if self.stopped:
            return
        self._flush()
        if self._queue and self.live:
            warnings.warn(f"gradwidget: {self.pending_steps} steps, from step {self._failed_at} on, were "
                          f"never written to {self.path} ({_oserror_text(self.error)}); the run in memory has "
                          "them: save it with recorder.run.save(another_folder)", RunWriteWarning, stacklevel=3)
        self._close_files()
        self.stopped = True


def _oserror_text(e: OSError | None) -> str:
    return (e.strerror or str(e)) if e is not None else ""


def save_run(run: Run, path, overwrite: bool = False) -> None:
    """Write a whole Run to a run directory. A rolling-window run also writes the steps that fell
    out of its window, as it holds them (decimated, without histograms), to ``history.bin``, so
    ``load_run`` gives back ``run.history`` too instead of silently keeping only the window."""
    w = RunWriter(path, run, overwrite=overwrite)
    try:
        w._queue.append(("steps.bin", _step_records(run).tobytes()))
        h = np.zeros(run.hist.shape[0], w._hdt)
        h["step"], h["counts"] = run.hist_steps, run.hist
        w._queue.append(("hist.bin", h.tobytes()))
        w._write_due()
        older = [r for r in (run.history, run._pending) if r is not None and r.n_steps]
        if older:
            fd = create_new(w.path / "history.bin", append=True)
            try:
                size = 0
                for r in older:
                    size = append_whole(fd, _step_records(r).tobytes(), size)
            finally:
                os.close(fd)
    finally:
        w._close_files()


def _step_records(run: Run) -> np.ndarray:
    rec = np.zeros(run.n_steps, step_dtype(run.n_layers))
    rec["step"] = run.steps
    for s in SCALARS:
        rec[s] = run.scalar(s)
    for m in METRICS:
        rec[m] = run.metric(m)
    return rec


#: the largest meta.json a reader takes (a 10,000-layer model's is ~3 MB): a meta.json linked to
#: /dev/zero or grown to gigabytes is refused instead of read into memory
META_MAX_BYTES = 64 << 20
#: bytes of records read, checked and taken at a time: a damaged or sparse multi-GB file fails at
#: its first bad record without the reader ever holding more than this of it
READ_CHUNK_BYTES = 16 << 20


def as_path(path, what: str = "expected a run directory path") -> Path:
    """``path`` as a Path, or a TypeError naming what was expected (``load_run(None)`` is refused
    here, not deep inside pathlib)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} (str or pathlib.Path), not {type(path).__name__} {path!r:.60}")
    return Path(path)


def _open_regular(p: Path):
    """``files.open_plain`` for a run file, its failures as RunFormatError."""
    try:
        return open_plain(p)
    except NotPlainFile:
        raise RunFormatError(f"{p} is not a plain file (a FIFO, device or socket): a run keeps "
                             f"{p.name} in a plain file") from None
    except OSError as e:
        raise RunFormatError(f"{p} cannot be read: {e.strerror or e}") from None


def _parse_meta(mp: Path):
    """The JSON in ``mp``, read bounded (``META_MAX_BYTES``) from a plain file; RunFormatError for
    anything else (too large, not JSON, nested too deeply)."""
    with _open_regular(mp) as f:
        try:
            raw = f.read(META_MAX_BYTES + 1)
        except OSError as e:
            raise RunFormatError(f"{mp} cannot be read: {e.strerror or e}") from None
    if len(raw) > META_MAX_BYTES:
        raise RunFormatError(f"{mp} is larger than {META_MAX_BYTES >> 20} MiB, more than any run "
                             "description: it is not a gradwidget meta.json")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunFormatError(f"{mp} is corrupt and cannot be read: {e}") from None
    except RecursionError:
        raise RunFormatError(f"{mp} is corrupt: its JSON is nested too deeply to be a run description") from None


def _read_meta(path: Path) -> dict:
    if not path.exists():
        raise RunFormatError(f"no run at {path}: the directory does not exist")
    if not path.is_dir():
        raise RunFormatError(f"{path} is not a run directory (expected a folder with meta.json)")
    mp = path / "meta.json"
    if not mp.exists():
        raise RunFormatError(f"{path} is not a gradwidget run: meta.json is missing "
                             "(was the Recorder given this log_dir?)")
    meta = _parse_meta(mp)
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
    tied = d.get("tied", [])
    if not isinstance(tied, list) or not all(isinstance(x, str) for x in tied):
        return f"layers[{j}] ({d['name']}) has tied={tied!r:.40}, expected a list of names"
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
    checks: list[tuple[Any, str]] = [(_not_after(steps, prev_step), "its step number {step} does not follow the previous step")]
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


def _read_records(p: Path, offset: int, dt: np.dtype, size: int) -> tuple[np.ndarray, int]:
    """The whole ``dt`` records of file ``p`` (``size`` bytes long) after ``offset``, at most
    ``READ_CHUNK_BYTES`` of them (one record at least), and the offset after them."""
    whole = min((size - offset) // dt.itemsize, max(1, READ_CHUNK_BYTES // dt.itemsize))
    if whole <= 0:
        return np.zeros(0, dt), offset
    with _open_regular(p) as f:
        try:
            f.seek(offset)
            buf = f.read(whole * dt.itemsize)
        except OSError as e:
            raise RunFormatError(f"{p} cannot be read: {e.strerror or e}") from None
    n = len(buf) // dt.itemsize
    return np.frombuffer(buf[: n * dt.itemsize], dtype=dt), offset + n * dt.itemsize


#: step records read to decide which layer count a steps.bin was written with
_PROBE_RECORDS = 64


def _plausible_records(recs: np.ndarray) -> bool:
    """Could a writer have produced these step records? (Stricter than ``_bad_step_record``: also
    fractions in [0, 1] and whole counts of non-finite values.)"""
    if _bad_step_record(recs, None) is not None:
        return False
    zf, nf = recs["zero_frac"], recs["nonfinite"]
    with np.errstate(invalid="ignore"):
        ok_zf = np.isnan(zf) | ((zf >= 0) & (zf <= 1))
        ok_nf = np.isnan(nf) | (nf == np.floor(nf))
    return bool(ok_zf.all() and ok_nf.all())


def _layer_mismatch(p: Path, n_layers: int) -> str | None:
    """If steps.bin is not whole records of ``n_layers`` layers but is whole, plausible records
    (at least two) of another layer count, a sentence naming both numbers; else None."""
    size = _file_size(p)
    base, per_layer = step_dtype(0).itemsize, step_dtype(1).itemsize - step_dtype(0).itemsize
    # two records of a candidate must fit in a read chunk: the probe reads no more than that
    top = (min(size, READ_CHUNK_BYTES) // 2 - base) // per_layer
    if top < 1:
        return None
    ls = np.arange(1, top + 1, dtype=np.int64)
    fits = np.flatnonzero(size % (base + per_layer * ls) == 0) + 1
    plausible = []
    for n in fits.tolist():
        if n == n_layers:
            continue
        dt = step_dtype(n)
        with _open_regular(p) as f:
            k = min(_PROBE_RECORDS, READ_CHUNK_BYTES // dt.itemsize, size // dt.itemsize)
            recs = np.frombuffer(f.read(k * dt.itemsize), dtype=dt)
        if _plausible_records(recs):
            plausible.append((not _norms_agree(recs), n))  # a layout whose norms add up comes first
    if not plausible:
        return None
    n = min(plausible)[1]
    return (f"meta.json lists {n_layers} layers, but steps.bin holds {size // step_dtype(n).itemsize} whole "
            f"records of {n} layers: meta.json belongs to another run (or was edited)")


def _norms_agree(recs: np.ndarray) -> bool:
    """Is each record's global norm the root sum of squares of its layers' norms, as recorders
    write it? True of the layout a file was written with, and of hardly any other reading of it."""
    gn = recs["global_norm"]
    g = recs["grad_norm"].astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        expect = np.sqrt(np.nansum(g * g, axis=1))
        ok = ~np.isfinite(gn) | np.isclose(gn, expect, rtol=1e-3, atol=0)
    return bool(ok.all() and np.isfinite(gn).any())


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
        self.path = as_path(path)
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
        written by ``save_run`` only), or None. Read a chunk at a time, each checked first."""
        p = self.path / "history.bin"
        size = _file_size(p)
        if not size:
            return None
        if size % self._sdt.itemsize:
            raise RunFormatError(f"{p} is damaged: {size} bytes is not a whole number of "
                                 f"{self._sdt.itemsize}-byte step records")
        h = Run(run.layers, thresholds=run.thresholds)
        off = 0
        while off < size:
            recs, end = _read_records(p, off, self._sdt, size)
            last = int(h.steps[-1]) if h.n_steps else None
            bad = _bad_step_record(recs, last)
            if bad is None and end >= size and run.n_steps and recs["step"][-1] >= run.steps[0]:
                bad = len(recs) - 1, f"its step {int(recs['step'][-1])} is not before the first step in steps.bin"
            if bad:
                raise RunFormatError(f"{p} is damaged: record {off // self._sdt.itemsize + bad[0]} is not "
                                     f"a valid step ({bad[1]})")
            _append_records(h, recs)
            off = end
        return h

    def _read_new(self, name: str, offset: int, dt: np.dtype) -> tuple[np.ndarray, int]:
        """The whole records after ``offset``, at most ``READ_CHUNK_BYTES`` of them, and the new offset."""
        return _read_records(self.path / name, offset, dt, _file_size(self.path / name))

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
        hsize, ssize = _file_size(self.path / "hist.bin"), _file_size(self.path / "steps.bin")
        n_hist, n_steps = hsize // self._hdt.itemsize, ssize // self._sdt.itemsize
        if n_hist > n_steps + 1:  # checked before reading either: one histogram at most per step
            why = _layer_mismatch(self.path / "steps.bin", run.n_layers) if ssize % self._sdt.itemsize else None
            raise RunFormatError(f"{self.path / 'hist.bin'} is damaged: it holds {n_hist} histogram records "
                                 f"but steps.bin only {n_steps} steps" + (f" ({why})" if why else ""))
        hists, hoff = self._read_new("hist.bin", self._hoff, self._hdt)
        recs, soff = self._read_new("steps.bin", self._soff, self._sdt)
        last = int(run.steps[-1]) if run.n_steps else None
        bad = _bad_step_record(recs, last)
        if bad:
            rec_no = self._soff // self._sdt.itemsize + bad[0]
            raise RunFormatError(
                f"{self.path / 'steps.bin'} is damaged: record {rec_no} is not a valid step ({bad[1]}). "
                + (_layer_mismatch(self.path / "steps.bin", run.n_layers) or
                   f"The file is corrupt, or meta.json lists a different number of layers ({run.n_layers}) "
                   "than it was written with."))
        steps = np.concatenate([run.steps, recs["step"]])
        if len(steps) and _file_size(self.path / "steps.bin") > soff:
            # steps.bin goes on past this chunk (more whole records, or a crash cut the last record
            # short): histograms of later steps wait for their step records (load_run warns about
            # those a cut record leaves unread; a live writer may yet add the step)
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
        mismatch = _layer_mismatch(reader.path / "steps.bin", reader.run.n_layers)
        if mismatch:
            raise RunFormatError(f"{reader.path / 'steps.bin'} does not match meta.json: {mismatch}")
        warnings.warn(f"{path}: ignored {reader.truncated_bytes} bytes of an unfinished last step", GradwidgetWarning)
    if reader.unread_histograms:
        warnings.warn(f"{path}: ignored {reader.unread_histograms} histogram(s) of steps after the last "
                      "whole step record", GradwidgetWarning)
    return reader.run
