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

The package, one job per module: ``layout`` (format marker, record dtypes, file names, safe file
access), ``meta`` (meta.json), ``records`` (the binary records), ``folders`` (where gradwidget may
write), ``writer`` and ``reader``. Every name is importable from ``gradwidget.storage``.
"""

from __future__ import annotations

from .folders import atomic_output, check_log_dir, check_output_file, is_run_dir
from .layout import FORMAT, FORMAT_VERSION, RUN_FILES, RunFormatError, as_path, hist_dtype, step_dtype
from .meta import META_MAX_BYTES
from .reader import RunReader, load_run
from .records import READ_CHUNK_BYTES
from ._resume import ResumePoint, check_resume, resume_point
from .writer import BACKLOG_MAX_BYTES, RunWriter, RunWriteWarning, save_run

__all__ = [
    "BACKLOG_MAX_BYTES",
    "FORMAT",
    "FORMAT_VERSION",
    "META_MAX_BYTES",
    "READ_CHUNK_BYTES",
    "RUN_FILES",
    "ResumePoint",
    "RunFormatError",
    "RunReader",
    "RunWriteWarning",
    "RunWriter",
    "as_path",
    "atomic_output",
    "check_log_dir",
    "check_output_file",
    "check_resume",
    "hist_dtype",
    "is_run_dir",
    "load_run",
    "resume_point",
    "save_run",
    "step_dtype",
]
