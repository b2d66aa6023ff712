// Layer health table: sortable (click a header), filterable (type in the box), a health badge,
// key statistics and the top suggestion. Clicking a row selects the layer everywhere.

import { fmt } from "./colormap";

export type Row = Record<string, unknown> & { index: number; layer: string };

export interface Column {
  key: string;
  label: string;
  kind: "text" | "num" | "health";
  title?: string;
}

export const COLUMNS: Column[] = [
  { key: "health", label: "health", kind: "health" },
  { key: "layer", label: "layer", kind: "text" },
  { key: "module_type", label: "type", kind: "text" },
  { key: "numel", label: "params", kind: "num" },
  { key: "grad_norm_median", label: "‖g‖ median", kind: "num", title: "median over steps of the gradient L2 norm" },
  { key: "mean_abs_median", label: "mean|g| median", kind: "num", title: "median over steps of mean |g|" },
  { key: "max_abs_max", label: "max|g| max", kind: "num", title: "largest |g| seen" },
  { key: "zero_frac_mean", label: "zeros", kind: "num", title: "mean fraction of exactly-zero gradient entries" },
  { key: "nonfinite_total", label: "NaN/Inf", kind: "num", title: "non-finite gradient entries, all steps" },
  { key: "trend", label: "trend", kind: "text" },
  { key: "suggestion", label: "suggestion", kind: "text" },
];

export const HEALTH_RANK: Record<string, number> = { Critical: 3, Warning: 2, Unknown: 1, Healthy: 0 };
export const HEALTH_COLORS: Record<string, string> = {
  Healthy: "#2e7d32",
  Warning: "#ef8f00",
  Critical: "#c62828",
  Unknown: "#8a8a8a",
};

export interface SortState {
  key: string;
  desc: boolean;
}

/** The kernel's spelling of non-finite numbers (JSON has none; NaN itself travels as null). */
const NONFINITE: Record<string, number> = { Infinity: Infinity, "-Infinity": -Infinity, NaN: NaN };

/** A table value as a number: numbers as they are, "Infinity"/"-Infinity"/"NaN" (how the kernel
 *  sends non-finite values) as those numbers; null for anything else (missing, text). */
export function numberOf(v: unknown): number | null {
  if (typeof v === "number") return v;
  if (typeof v === "string" && v in NONFINITE) return NONFINITE[v];
  return null;
}

/** The key a row sorts by; null when the value is missing (null, "" or NaN), which sorts last. */
function sortValue(row: Row, key: string): number | string | null {
  const v = row[key];
  if (key === "health") return HEALTH_RANK[String(v)] ?? 1;
  const n = numberOf(v);
  if (n !== null) return n === n ? n : null;
  if (v == null || v === "") return null;
  return String(v).toLowerCase();
}

/** Rows sorted by a column (numbers numerically, NaN/missing last in both directions; ties keep
 *  layer order). */
export function sortRows(rows: Row[], s: SortState | null): Row[] {
  const out = rows.slice();
  if (!s) return out;
  const dir = s.desc ? -1 : 1;
  out.sort((a, b) => {
    const va = sortValue(a, s.key);
    const vb = sortValue(b, s.key);
    if ((va === null) !== (vb === null)) return va === null ? 1 : -1;
    if (va === null || vb === null) return a.index - b.index;
    if (va < vb) return -dir;
    if (va > vb) return dir;
    return a.index - b.index;
  });
  return out;
}

/** Rows whose layer name, type, health, status or flags contain every word of `q` (not the
 *  suggestion text: it names other layers and remedies, and would blur the filter). */
export function filterRows(rows: Row[], q: string): Row[] {
  const words = q.toLowerCase().split(/\s+/).filter(Boolean);
  if (!words.length) return rows;
  return rows.filter((r) => {
    const hay = ["layer", "module_type", "health", "status", "flags"]
      .map((k) => String(r[k] ?? ""))
      .join(" ")
      .toLowerCase();
    return words.every((w) => hay.includes(w));
  });
}

export function cellText(v: unknown, kind: Column["kind"]): string {
  if (v == null) return "";
  const n = kind === "num" ? numberOf(v) : null;
  if (n !== null) return fmt(n); // Inf, -Inf, NaN spelled out
  if (Array.isArray(v)) return v.join(", ");
  return String(v);
}

export class HealthTable {
  readonly el: HTMLDivElement;
  private input: HTMLInputElement;
  private tbody: HTMLTableSectionElement;
  private thead: HTMLTableSectionElement;
  private count: HTMLSpanElement;
  private rows: Row[] = [];
  private sort: SortState | null = null;
  private selected = -1;
  private cols: Column[] = COLUMNS;

  constructor(private onSelect: (index: number) => void) {
    this.el = document.createElement("div");
    this.el.className = "gw-table";
    const bar = document.createElement("div");
    bar.className = "gw-table-bar";
    this.input = document.createElement("input");
    this.input.type = "search";
    this.input.placeholder = "filter layers (name, type, health…)";
    this.input.className = "gw-filter";
    this.input.addEventListener("input", () => this.render());
    this.input.addEventListener("keydown", (e) => e.stopPropagation());
    this.count = document.createElement("span");
    this.count.className = "gw-count";
    bar.append(this.input, this.count);
    const scroller = document.createElement("div");
    scroller.className = "gw-table-scroll";
    const table = document.createElement("table");
    table.className = "gw-health";
    this.thead = table.createTHead();
    this.tbody = table.createTBody();
    scroller.append(table);
    this.el.append(bar, scroller);
    this.tbody.addEventListener("click", (e) => {
      const tr = (e.target as HTMLElement).closest("tr");
      if (tr && tr.dataset.index !== undefined) this.onSelect(Number(tr.dataset.index));
    });
  }

  setRows(rows: Row[]): void {
    this.rows = rows;
    const present = new Set<string>();
    for (const r of rows) for (const k of Object.keys(r)) if (r[k] != null && r[k] !== "") present.add(k);
    this.cols = COLUMNS.filter((c) => c.key === "layer" || c.key === "health" || present.has(c.key));
    this.renderHead();
    this.render();
  }

  setFilter(q: string): void {
    this.input.value = q;
    this.render();
  }

  setSort(s: SortState | null): void {
    this.sort = s;
    this.renderHead();
    this.render();
  }

  select(index: number): void {
    this.selected = index;
    for (const tr of Array.from(this.tbody.rows)) {
      const on = Number(tr.dataset.index) === index;
      tr.classList.toggle("gw-selected", on);
      tr.setAttribute("aria-selected", String(on));
    }
  }

  visibleIndices(): number[] {
    return Array.from(this.tbody.rows).map((tr) => Number(tr.dataset.index));
  }

  private renderHead(): void {
    this.thead.textContent = "";
    const tr = this.thead.insertRow();
    for (const c of this.cols) {
      const th = document.createElement("th");
      th.textContent = c.label + (this.sort?.key === c.key ? (this.sort.desc ? " ▼" : " ▲") : "");
      if (c.title) th.title = c.title;
      th.dataset.key = c.key;
      th.className = c.kind === "num" ? "gw-num" : "";
      th.addEventListener("click", () => {
        const desc = this.sort?.key === c.key ? !this.sort.desc : c.kind !== "text";
        this.setSort({ key: c.key, desc });
      });
      tr.append(th);
    }
  }

  private render(): void {
    const shown = sortRows(filterRows(this.rows, this.input.value), this.sort);
    const frag = document.createDocumentFragment();
    for (const r of shown) {
      const tr = document.createElement("tr");
      tr.dataset.index = String(r.index);
      tr.dataset.layer = r.layer;
      if (r.index === this.selected) {
        tr.classList.add("gw-selected");
        tr.setAttribute("aria-selected", "true");
      }
      for (const c of this.cols) {
        const td = document.createElement("td");
        const v = r[c.key];
        if (c.kind === "health") {
          const badge = document.createElement("span");
          const h = String(v ?? "Unknown");
          badge.className = `gw-badge gw-${h.toLowerCase()}`;
          badge.style.background = HEALTH_COLORS[h] ?? HEALTH_COLORS.Unknown;
          badge.textContent = h;
          td.append(badge);
        } else {
          td.textContent = cellText(v, c.kind);
          if (c.kind === "num") td.className = "gw-num";
          if (c.key === "layer") td.className = "gw-name";
          if (c.key === "suggestion") {
            td.className = "gw-suggestion";
            td.title = String(v ?? "");
          }
        }
        tr.append(td);
      }
      frag.append(tr);
    }
    this.tbody.textContent = "";
    this.tbody.append(frag);
    this.count.textContent = `${shown.length} of ${this.rows.length} layers`;
  }
}
