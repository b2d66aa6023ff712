// The contract between the kernel and the page, written once on this side (the kernel's side is
// gradwidget/panel/protocol.py). CONSTANTS is Python's `constants_json()`, verbatim: tests/test_protocol.py
// fails when the two differ. Every trait the page reads is in `PanelModel`; binary ones are decoded
// by `decodeTraits` only, which checks each buffer's length against `meta`.

import { asFloat32, asFloat64, asUint8, Binary, byteLength } from "./decode";

// BEGIN CONSTANTS
export const CONSTANTS = {
  "traits": {
    "meta": {
      "kind": "json",
      "direction": "out",
      "dtype": ""
    },
    "heat": {
      "kind": "bytes",
      "direction": "out",
      "dtype": "float32"
    },
    "flags": {
      "kind": "bytes",
      "direction": "out",
      "dtype": "uint8"
    },
    "col_steps": {
      "kind": "bytes",
      "direction": "out",
      "dtype": "float64"
    },
    "loss": {
      "kind": "bytes",
      "direction": "out",
      "dtype": "float32"
    },
    "detail": {
      "kind": "bytes",
      "direction": "out",
      "dtype": "float64"
    },
    "detail_step": {
      "kind": "int",
      "direction": "out",
      "dtype": ""
    },
    "hists": {
      "kind": "bytes",
      "direction": "out",
      "dtype": "float64"
    },
    "hist_steps": {
      "kind": "bytes",
      "direction": "out",
      "dtype": "float64"
    },
    "hist_layer": {
      "kind": "int",
      "direction": "out",
      "dtype": ""
    },
    "hist_all": {
      "kind": "bytes",
      "direction": "out",
      "dtype": "float64"
    },
    "table": {
      "kind": "json",
      "direction": "out",
      "dtype": ""
    },
    "diagnoses": {
      "kind": "json",
      "direction": "out",
      "dtype": ""
    },
    "verdict": {
      "kind": "str",
      "direction": "out",
      "dtype": ""
    },
    "static_png": {
      "kind": "str",
      "direction": "out",
      "dtype": ""
    },
    "static_html": {
      "kind": "str",
      "direction": "out",
      "dtype": ""
    },
    "live": {
      "kind": "bool",
      "direction": "out",
      "dtype": ""
    },
    "step": {
      "kind": "int",
      "direction": "both",
      "dtype": ""
    },
    "layer": {
      "kind": "int",
      "direction": "both",
      "dtype": ""
    },
    "metric": {
      "kind": "str",
      "direction": "both",
      "dtype": ""
    },
    "follow": {
      "kind": "bool",
      "direction": "both",
      "dtype": ""
    },
    "choice": {
      "kind": "int",
      "direction": "in",
      "dtype": ""
    },
    "choice_applied": {
      "kind": "int",
      "direction": "out",
      "dtype": ""
    },
    "columns": {
      "kind": "int",
      "direction": "in",
      "dtype": ""
    },
    "expanded": {
      "kind": "json",
      "direction": "both",
      "dtype": ""
    },
    "labels": {
      "kind": "json",
      "direction": "out",
      "dtype": ""
    },
    "heat_b": {
      "kind": "bytes",
      "direction": "out",
      "dtype": "float32"
    },
    "flags_b": {
      "kind": "bytes",
      "direction": "out",
      "dtype": "uint8"
    },
    "diff": {
      "kind": "bytes",
      "direction": "out",
      "dtype": "float32"
    },
    "mode": {
      "kind": "str",
      "direction": "both",
      "dtype": ""
    },
    "noise": {
      "kind": "bytes",
      "direction": "out",
      "dtype": "float64"
    },
    "noise_text": {
      "kind": "str",
      "direction": "out",
      "dtype": ""
    }
  },
  "flags": {
    "vanishing": 1,
    "exploding": 2,
    "nonfinite": 4,
    "nodata": 8
  },
  "health_rank": {
    "Critical": 3,
    "Warning": 2,
    "Unknown": 1,
    "Healthy": 0,
    "Cannot move": -1
  },
  "health_colors": {
    "Healthy": "#2e7d32",
    "Warning": "#ef8f00",
    "Critical": "#c62828",
    "Unknown": "#8a8a8a",
    "Cannot move": "#546e7a"
  },
  "health_notes": {
    "Cannot move": "the loss cannot move it (zero by construction): its gradient stays at float rounding next to its module's other parameters on nearly every step, e.g. an attention key bias (softmax ignores a shift shared by all keys) or a bias right before BatchNorm (the norm subtracts it again)"
  },
  "marks": {
    "vanishing": "#c8c8c8",
    "exploding": "#e3120b",
    "nonfinite": "#ff00ff",
    "nodata": "#ffffff"
  },
  "metrics": [
    "grad_norm",
    "mean_abs",
    "max_abs",
    "std",
    "zero_frac",
    "nonfinite",
    "weight_norm",
    "update_norm"
  ],
  "metric_labels": {
    "grad_norm": "gradient L2 norm",
    "mean_abs": "mean |g|",
    "max_abs": "max |g|",
    "std": "std of g",
    "zero_frac": "fraction of zero entries",
    "nonfinite": "non-finite entries",
    "weight_norm": "weight L2 norm",
    "update_norm": "update L2 norm"
  },
  "merge_labels": {
    "grad_norm": "the members' norms in quadrature (one L2 norm over all their entries)",
    "mean_abs": "the members' values weighted by size",
    "max_abs": "the largest member's",
    "std": "the members' variances pooled by size",
    "zero_frac": "the members' values weighted by size",
    "nonfinite": "the members' counts summed",
    "weight_norm": "the members' norms in quadrature (one L2 norm over all their entries)",
    "update_norm": "the members' norms in quadrature (one L2 norm over all their entries)"
  },
  "max_diagnoses": 5,
  "table_keys": [
    "index",
    "layer",
    "module_type",
    "numel",
    "status",
    "health",
    "health_a",
    "change",
    "flags",
    "grad_norm_median",
    "mean_abs_median",
    "max_abs_max",
    "zero_frac_mean",
    "nonfinite_total",
    "trend",
    "suggestion",
    "diagnosis",
    "count",
    "parent"
  ],
  "compare_modes": [
    "side",
    "diff"
  ],
  "diff_stops": [
    "#053061",
    "#175290",
    "#2a71b2",
    "#3f8ec0",
    "#6bacd1",
    "#9bc9e0",
    "#c2ddec",
    "#e0ecf3",
    "#f7f6f6",
    "#fbe5d8",
    "#fbccb4",
    "#f5aa89",
    "#e48066",
    "#d05548",
    "#ba2832",
    "#930e26",
    "#67001f"
  ],
  "diff_nodata": "#cccccc",
  "viridis": "44015444025645045745055946075a46085c460a5d460b5e470d60470e6147106347116447136548146748166848176948186a481a6c481b6d481c6e481d6f481f70482071482173482374482475482576482677482878482979472a7a472c7a472d7b472e7c472f7d46307e46327e46337f463480453581453781453882443983443a83443b84433d84433e85423f854240864241864142874144874045884046883f47883f48893e49893e4a893e4c8a3d4d8a3d4e8a3c4f8a3c508b3b518b3b528b3a538b3a548c39558c39568c38588c38598c375a8c375b8d365c8d365d8d355e8d355f8d34608d34618d33628d33638d32648e32658e31668e31678e31688e30698e306a8e2f6b8e2f6c8e2e6d8e2e6e8e2e6f8e2d708e2d718e2c718e2c728e2c738e2b748e2b758e2a768e2a778e2a788e29798e297a8e297b8e287c8e287d8e277e8e277f8e27808e26818e26828e26828e25838e25848e25858e24868e24878e23888e23898e238a8d228b8d228c8d228d8d218e8d218f8d21908d21918c20928c20928c20938c1f948c1f958b1f968b1f978b1f988b1f998a1f9a8a1e9b8a1e9c891e9d891f9e891f9f881fa0881fa1881fa1871fa28720a38620a48621a58521a68522a78522a88423a98324aa8325ab8225ac8226ad8127ad8128ae8029af7f2ab07f2cb17e2db27d2eb37c2fb47c31b57b32b67a34b67935b77937b87838b9773aba763bbb753dbc743fbc7340bd7242be7144bf7046c06f48c16e4ac16d4cc26c4ec36b50c46a52c56954c56856c66758c7655ac8645cc8635ec96260ca6063cb5f65cb5e67cc5c69cd5b6ccd5a6ece5870cf5773d05675d05477d1537ad1517cd2507fd34e81d34d84d44b86d54989d5488bd6468ed64590d74393d74195d84098d83e9bd93c9dd93ba0da39a2da37a5db36a8db34aadc32addc30b0dd2fb2dd2db5de2bb8de29bade28bddf26c0df25c2df23c5e021c8e020cae11fcde11dd0e11cd2e21bd5e21ad8e219dae319dde318dfe318e2e418e5e419e7e419eae51aece51befe51cf1e51df4e61ef6e620f8e621fbe723fde725"
} as const;
// END CONSTANTS

export const FLAG_VANISHING = CONSTANTS.flags.vanishing;
/** viridis, 256 RGB colours in hex (the heatmap's colour map) */
export const VIRIDIS_HEX: string = CONSTANTS.viridis;
export const FLAG_EXPLODING = CONSTANTS.flags.exploding;
export const FLAG_NONFINITE = CONSTANTS.flags.nonfinite;
export const FLAG_NODATA = CONSTANTS.flags.nodata;
export const HEALTH_RANK: Record<string, number> = CONSTANTS.health_rank;
export const HEALTH_COLORS: Record<string, string> = CONSTANTS.health_colors;
export const HEALTH_NOTES: Record<string, string> = CONSTANTS.health_notes;
export const METRIC_LABELS: Record<string, string> = CONSTANTS.metric_labels;
/** How a group row's value is made from its members', per metric (gradwidget/rules.py merge_of). */
export const MERGE_LABELS: Record<string, string> = CONSTANTS.merge_labels;
export const MAX_DIAGNOSES = CONSTANTS.max_diagnoses;
export const COMPARE_MODES: readonly string[] = CONSTANTS.compare_modes;
/** Colour stops of the difference map (Python's plots.DIFF_CMAP), from -diff_max to +diff_max. */
export const DIFF_STOPS: readonly string[] = CONSTANTS.diff_stops;

function hexRgb(hex: string): readonly [number, number, number] {
  return [parseInt(hex.slice(1, 3), 16), parseInt(hex.slice(3, 5), 16), parseInt(hex.slice(5, 7), 16)] as const;
}

/** Colours of marked cells as RGB triples (heatmap, bars, legend). */
export const MARKS = {
  vanishing: hexRgb(CONSTANTS.marks.vanishing),
  exploding: hexRgb(CONSTANTS.marks.exploding),
  nonfinite: hexRgb(CONSTANTS.marks.nonfinite),
  nodata: hexRgb(CONSTANTS.marks.nodata),
};
/** A difference-map cell where either run has no value. */
export const DIFF_NODATA = hexRgb(CONSTANTS.diff_nodata);
export { hexRgb };

export function metricLabel(metric: string): string {
  return METRIC_LABELS[metric] ?? metric;
}

/** One heatmap row: a layer, or (past the kernel's row cap, gradwidget/panel/rows.py) a group of
 *  consecutive layers [start, start + count) measured as one tensor. */
export interface LayerMeta {
  name: string;
  module_type?: string;
  status?: string;
  numel?: number;
  /** grouped rows only: the row's first layer, its layers, how many expanded groups hold it, and
   *  the innermost expanded group [start, stop) it is shown in (null: a top-level row) */
  start?: number;
  count?: number;
  depth?: number;
  parent?: [number, number] | null;
}

export interface Meta {
  n_layers: number;
  n_steps: number;
  rows: number;
  cols: number;
  layers: LayerMeta[];
  metric: string;
  metrics: string[];
  thresholds: { vanishing: number; exploding: number };
  first_step: number;
  last_step: number;
  hist_lo: number;
  hist_hi: number;
  n_bins: number;
  block: number;
  message: string;
  level: string;
  version: number;
  /** [lo, hi] log10 colour range computed by the kernel (gradwidget.plots.color_scale) */
  scale?: [number, number];
  /** step of hist_all (-1: none) */
  hist_all_step?: number;
  /** where the first NaN/Inf was made (gradwidget/panel/payload.py origin_mark); null: none traced */
  origin?: { step: number; row: number | null; module: string; phase: string } | null;
  /** a comparison: the difference map's range in decades (symmetric around 0) */
  diff_max?: number;
  /** a comparison: rows (layers) that one of the runs lacks */
  missing?: string[];
  /** rows are groups of layers (meta.layers[i].start/count); n_layers counts the run's layers */
  grouped?: boolean;
}

/** One of the top diagnoses (gradwidget/panel/table.py diagnoses_from_report). */
export interface Diagnosis {
  cause: string;
  /** what the cause is, in a few words */
  title?: string;
  priority: string;
  text: string;
  action: string;
  layers: string[];
  n_layers: number;
  layer_index: number;
  first_step: number | null;
  /** the numbers behind it (shown under "evidence"); may be empty */
  evidence?: string;
}

export type Row = Record<string, unknown> & { index: number; layer: string };

/** Every synced trait, by name, as the page receives it. */
export interface Traits {
  meta: Partial<Meta>;
  heat: Binary;
  flags: Binary;
  col_steps: Binary;
  loss: Binary;
  detail: Binary;
  detail_step: number;
  hists: Binary;
  hist_steps: Binary;
  hist_layer: number;
  hist_all: Binary;
  table: Row[];
  diagnoses: Diagnosis[];
  verdict: string;
  static_png: string;
  static_html: string;
  live: boolean;
  step: number;
  layer: number;
  metric: string;
  follow: boolean;
  choice: number;
  choice_applied: number;
  columns: number;
  expanded: [number, number][];
  labels: string[];
  heat_b: Binary;
  flags_b: Binary;
  diff: Binary;
  mode: string;
  noise: Binary;
  noise_text: string;
}

export type TraitName = keyof Traits;

/** The anywidget model, typed by trait. */
export interface PanelModel {
  get<K extends TraitName>(key: K): Traits[K];
  set<K extends TraitName>(key: K, value: Traits[K]): void;
  save_changes(): void;
  on(event: string, cb: (...args: unknown[]) => void): void;
  off(event?: string | null, cb?: ((...args: unknown[]) => void) | null): void;
}

export function emptyMeta(): Meta {
  return {
    n_layers: 0, n_steps: 0, rows: 0, cols: 0, layers: [], metric: "mean_abs", metrics: [],
    thresholds: { vanishing: 1e-7, exploding: 1e3 }, first_step: 0, last_step: 0, hist_lo: 0,
    hist_hi: 1, n_bins: 0, block: 1, message: "", level: "", version: 0,
  };
}

/** The heatmap's data, decoded and checked against `meta`. */
export interface HeatData {
  meta: Meta;
  heat: Float32Array; // depth order, rows x cols
  flags: Uint8Array;
  colSteps: Float64Array;
  loss: Float32Array;
  histAll: Float64Array; // layers x bins, newest histogram step (counts)
  /** a comparison: the later run (rows x cols, same rows and columns) and log10(later / first) */
  heatB: Float32Array;
  flagsB: Uint8Array;
  diff: Float32Array;
  /** what was wrong with the kernel's data (the view shows it as an error message) */
  error: string;
}

/** Decode meta and the heatmap's buffers. A malformed buffer yields empty arrays and `error`,
 *  never an exception (a blank panel with a reason beats a broken notebook). */
export function decodeHeat(m: PanelModel): HeatData {
  const meta = { ...emptyMeta(), ...(m.get("meta") || {}) } as Meta;
  const out: HeatData = {
    meta, heat: new Float32Array(0), flags: new Uint8Array(0), colSteps: new Float64Array(0),
    loss: new Float32Array(0), histAll: new Float64Array(0), heatB: new Float32Array(0),
    flagsB: new Uint8Array(0), diff: new Float32Array(0), error: "",
  };
  try {
    const n = meta.rows * meta.cols;
    const heat = m.get("heat");
    if (n > 0 && byteLength(heat) === n * 4) {
      out.heat = asFloat32(heat, n);
      const fl = m.get("flags");
      out.flags = byteLength(fl) === n ? asUint8(fl, n) : new Uint8Array(n);
      out.colSteps = asFloat64(m.get("col_steps"), meta.cols);
      const ls = m.get("loss");
      out.loss = byteLength(ls) === meta.cols * 4 ? asFloat32(ls, meta.cols) : new Float32Array(0);
      const hb = m.get("heat_b");
      if (byteLength(hb) === n * 4) {  // a comparison: the later run on the same grid
        out.heatB = asFloat32(hb, n);
        const fb = m.get("flags_b");
        out.flagsB = byteLength(fb) === n ? asUint8(fb, n) : new Uint8Array(n);
        const df = m.get("diff");
        out.diff = byteLength(df) === n * 4 ? asFloat32(df, n) : new Float32Array(0);
      }
    }
  } catch (err) {
    out.heat = new Float32Array(0);
    out.flags = new Uint8Array(0);
    out.colSteps = new Float64Array(0);
    out.heatB = out.diff = new Float32Array(0);
    out.flagsB = new Uint8Array(0);
    out.error = `gradwidget could not read the data sent by the kernel: ${(err as Error).message}`;
  }
  try {
    const ha = m.get("hist_all");
    const n = rowCount(meta) * meta.n_bins;
    out.histAll = n > 0 && byteLength(ha) === n * 8 ? asFloat64(ha, n) : new Float64Array(0);
  } catch {
    out.histAll = new Float64Array(0);
  }
  return out;
}

/** Exact values at one step and one layer's histograms. */
export interface DetailData {
  detail: Float64Array; // metrics x layers (float64: the non-finite counts exact)
  detailStep: number;
  hists: Float64Array; // H x bins (counts)
  histSteps: Float64Array;
  histLayer: number;
}

/** Rows of the heatmap, detail and hist_all: layers, or groups of them (meta.grouped). */
export function rowCount(meta: Meta): number {
  return meta.grouped ? meta.layers.length : meta.n_layers;
}

/** Rows of a grouped layout: the layer each row starts at (ascending); the identity otherwise. */
export function rowStarts(meta: Meta): Int32Array {
  const out = new Int32Array(rowCount(meta));
  for (let i = 0; i < out.length; i++) {
    const s = meta.grouped ? meta.layers[i]?.start : undefined;
    out[i] = typeof s === "number" ? s : i;
  }
  return out;
}

/** The row showing layer `layer` (its own, or its group's); -1 when out of range. */
export function rowOfLayer(starts: Int32Array, nLayers: number, layer: number): number {
  if (!(layer >= 0 && layer < nLayers) || !starts.length) return -1;
  let lo = 0;
  let hi = starts.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (starts[mid] <= layer) lo = mid;
    else hi = mid - 1;
  }
  return starts[lo] <= layer ? lo : -1;
}

export function decodeDetail(m: PanelModel, meta: Meta): DetailData {
  const L = rowCount(meta);
  const nb = meta.n_bins;
  try {
    const d = m.get("detail");
    const detail = L && byteLength(d) === meta.metrics.length * L * 8 ? asFloat64(d) : new Float64Array(0);
    const histSteps = byteLength(m.get("hist_steps")) > 0 ? asFloat64(m.get("hist_steps")) : new Float64Array(0);
    const hs = m.get("hists");
    const hists = nb && byteLength(hs) === histSteps.length * nb * 8 ? asFloat64(hs) : new Float64Array(0);
    return {
      detail, detailStep: Number(m.get("detail_step") ?? -1), hists,
      histSteps: hists.length ? histSteps : new Float64Array(0), histLayer: Number(m.get("hist_layer") ?? -1),
    };
  } catch {
    return { detail: new Float64Array(0), detailStep: -1, hists: new Float64Array(0), histSteps: new Float64Array(0), histLayer: -1 };
  }
}
