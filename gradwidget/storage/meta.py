"""meta.json: written atomically by the writer, read bounded and checked field by field by the
reader, so a damaged description fails at load with one message instead of deep in the analysis."""

from __future__ import annotations

import json
from pathlib import Path

from ..files import replace_atomically
from ..run import HIST_EDGES, LAYER_STATUSES, METRICS, N_BINS, SCALARS, LayerInfo, NonfiniteOrigin, Run
from ..thresholds import Thresholds
from .layout import FORMAT, FORMAT_VERSION, READ_VERSIONS, RunFormatError, open_regular


def meta_dict(run: Run, run_id: str | None = None, created: str | None = None) -> dict:
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


def write_json_atomic(path: Path, obj: dict) -> None:
    with replace_atomically(path, sync=True) as f:
        json.dump(obj, f, indent=1)


#: the largest meta.json a reader takes (a 10,000-layer model's is ~3 MB): a meta.json linked to
#: /dev/zero or grown to gigabytes is refused instead of read into memory
META_MAX_BYTES = 64 << 20


def parse_meta(mp: Path):
    """The JSON in ``mp``, read bounded (``META_MAX_BYTES``) from a plain file; RunFormatError for
    anything else (too large, not JSON, nested too deeply)."""
    with open_regular(mp) as f:
        try:
            raw = f.read(META_MAX_BYTES + 1)
        except OSError as e:
            raise RunFormatError(f"{mp} cannot be read: {e.strerror or e}") from None
    if len(raw) > META_MAX_BYTES:
        raise RunFormatError(
            f"{mp} is larger than {META_MAX_BYTES >> 20} MiB, more than any run "
            "description: it is not a gradwidget meta.json"
        )
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunFormatError(f"{mp} is corrupt and cannot be read: {e}") from None
    except RecursionError:
        raise RunFormatError(f"{mp} is corrupt: its JSON is nested too deeply to be a run description") from None


def read_meta(path: Path) -> dict:
    if not path.exists():
        raise RunFormatError(f"no run at {path}: the directory does not exist")
    if not path.is_dir():
        raise RunFormatError(f"{path} is not a run directory (expected a folder with meta.json)")
    mp = path / "meta.json"
    if not mp.exists():
        raise RunFormatError(
            f"{path} is not a gradwidget run: meta.json is missing (was the Recorder given this log_dir?)"
        )
    meta = parse_meta(mp)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        said = meta.get("format") if isinstance(meta, dict) else None
        raise RunFormatError(
            f'{mp} is not a gradwidget run description: its "format" is {said!r:.40}, a run\'s is {FORMAT!r}'
        )
    version = format_version(meta)
    if not _is_int(version) or version < 1:
        raise RunFormatError(f'{mp} is corrupt: "version" must be a positive integer, got {version!r:.40}')
    if version not in READ_VERSIONS:
        raise RunFormatError(
            f"{path} was written by a newer gradwidget (run format {version}; this gradwidget reads formats "
            f"{READ_VERSIONS[0]} to {READ_VERSIONS[-1]}): upgrade gradwidget to read it"
        )
    if meta.get("metrics") != list(METRICS) or meta.get("scalars") != list(SCALARS):
        raise RunFormatError(f"{mp} lists metrics this gradwidget does not know: {meta.get('metrics')}")
    problem = _meta_problem(meta)
    if problem:
        raise RunFormatError(f"{mp} is corrupt: {problem}")
    return meta


def format_version(meta: dict):
    """The run format a meta.json says its records have ("version"; format 1 when it says none)."""
    return meta.get("version", 1)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


#: the type each optional layer field must have in meta.json (name is required)
_LAYER_FIELDS = {"module": str, "module_type": str, "dtype": str, "numel": int, "backward_index": int, "status": str}


def _layer_problem(j: int, d) -> str | None:
    """What is wrong with layer ``j``'s entry in meta.json, or None."""
    if not isinstance(d, dict) or not isinstance(d.get("name"), str):
        return f'layers[{j}] must be an object with a string "name", got {d!r:.80}'
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


#: what each of the run's own fields in meta.json ("meta", ``Run.meta``) holds: a type, or for an
#: object the types of its fields. Checked at load, so a wrong type is refused there, naming the key,
#: instead of failing deep inside an analysis; null stands for absent; a field not listed here (one
#: a newer gradwidget adds) is kept unchecked
RUN_META_FIELDS: dict[str, type | tuple | dict] = {
    "model": str,
    "optimizer": str,
    "every": int,
    "skipped": dict,
    "optimizer_extra": dict,
    "distributed": {"kind": str, "world_size": int},
    "noise_scale": {
        "batch_size": str,
        "two_sizes": str,
        "world_size": int,
        "every": int,
        "first": int,
        "one_size": str,
        "unavailable": str,
    },
    "grad_reset": {"layer": str, "checked": int, "carried": int, "first_step": int},
    "loss_graph": dict,
    "read_by": str,
    "nonfinite_tracing": dict,
    "replicas": dict,
    "clipped_at": (int, float),
    "global_norm": str,
    "discarded_backwards": int,
}


def _type_problem(key: str, value, typ) -> str | None:
    """Why ``value`` is not what ``RUN_META_FIELDS`` says field ``key`` holds, or None."""
    if value is None:
        return None
    if isinstance(typ, dict):
        if not isinstance(value, dict):
            return f"meta.{key} must be an object, got {value!r:.60}"
        for sub, t in typ.items():
            problem = _type_problem(f"{key}.{sub}", value.get(sub), t)
            if problem:
                return problem
        return None
    types = typ if isinstance(typ, tuple) else (typ,)
    if isinstance(value, bool) or not isinstance(value, types):
        what = "a number" if float in types else {int: "a whole number", str: "a string", dict: "an object"}[typ]
        return f"meta.{key} must be {what}, got {value!r:.60}"
    return None


def _meta_problem(meta: dict) -> str | None:
    """The first field of meta.json with a wrong type or an impossible value, or None: checked
    here so a damaged run fails at load with one message instead of deep inside the analysis."""
    layers = meta.get("layers")
    if not isinstance(layers, list):
        return f'"layers" must be a list of layer objects, got {layers!r:.60}'
    for j, d in enumerate(layers):
        problem = _layer_problem(j, d)
        if problem:
            return problem
    edges = meta.get("edges", [])
    if not isinstance(edges, list):
        return f'"edges" must be a list of [from, to] layer indices, got {edges!r:.60}'
    for e in edges:
        if not (isinstance(e, list) and len(e) == 2 and all(_is_int(i) and 0 <= i < len(layers) for i in e)):
            return f"edge {e!r:.40} is not a pair of layer indices in 0..{len(layers) - 1}"
    for key in ("thresholds", "meta"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            return f'"{key}" must be an object, got {meta[key]!r:.60}'
    for key, typ in RUN_META_FIELDS.items():
        problem = _type_problem(key, (meta.get("meta") or {}).get(key), typ)
        if problem:
            return problem
    origin = (meta.get("meta") or {}).get("nonfinite_origin")
    if origin is not None:
        try:
            NonfiniteOrigin.from_dict(origin)
        except ValueError as e:
            return f"meta.nonfinite_origin is malformed: {e}"
    edges_h = meta.get("hist_edges", list(HIST_EDGES))
    if not isinstance(edges_h, list) or len(edges_h) != N_BINS + 1:
        return f'"hist_edges" must be a list of {N_BINS + 1} bin edges'
    return None


def run_from_meta(meta: dict, mp: Path) -> Run:
    try:
        layers = [LayerInfo.from_dict(d) for d in meta["layers"]]
        return Run(
            layers,
            thresholds=Thresholds.from_dict(meta.get("thresholds")),
            edges=meta.get("edges", []),
            meta=meta.get("meta") or {},
        )
    except (KeyError, TypeError, ValueError) as e:
        raise RunFormatError(f"{mp} is corrupt: {e}") from None


def meta_signature(p: Path):
    """What changes when meta.json is rewritten (it is replaced by rename); None while it is absent."""
    try:
        st = p.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)
