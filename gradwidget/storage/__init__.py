"""The run directory: written incrementally while training, readable (and tailable) at any time.

Layout of a run directory (format version 2; ``FORMAT_VERSION``)::

    meta.json    layers, thresholds, edges, record layouts, "version"; replaced atomically (write + rename)
    steps.bin    append-only fixed-size records, numpy dtype ``step_dtype(n_layers)``:
                 step int64, loss/lr/global_norm float64, then each metric as float32[n_layers],
                 except the non-finite count: float64[n_layers] (whole numbers, exact to 2**53)
    hist.bin     append-only fixed-size records, numpy dtype ``hist_dtype(n_layers)``:
                 step int64, counts uint64[n_layers, N_BINS] (log10|g| bins, edges in meta.json)
    noise.bin    append-only rows of the gradient at two batch sizes (``noise_series.noise_dtype``)
    history.bin  only from save_run of a rolling-window run: its decimated older steps (steps.bin dtype)

Format 1 (``step_dtype(n, 1)``, ``hist_dtype(n, 1)``: a float32 non-finite count, uint32 histogram
counts) is read, never written: ``load_run`` reads both (``READ_VERSIONS``), and resuming a format-1
run is refused with the one line that copies it into format 2 (``_resume``).

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
from .layout import FORMAT, FORMAT_VERSION, READ_VERSIONS, RUN_FILES, RunFormatError, as_path, hist_dtype, step_dtype
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
    "READ_VERSIONS",
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
