// Layer health table: sortable (click a header), filterable (type in the box), a health badge,
// key statistics and the top suggestion. Clicking a row selects the layer everywhere. Past the
// kernel's row cap a row may be a group of layers (`count`): its ▸ button expands it, and the ▾
// button of a row shown inside an expanded group (`parent`) collapses that group. A long table
// renders only the rows around its viewport; a focused ▸/▾ keeps the focus through every repaint.

import { fmt } from "./colormap";
import { distinctLabels } from "./names";
import { HEALTH_COLORS, HEALTH_NOTES, HEALTH_RANK, Row } from "./protocol";

export type { Row };


export interface Column {
  key: string;
  label: string;
  kind: "text" | "num" | "health";
  title?: string;
  /** a statistic behind the verdict: folded away until "more columns" is pressed, so that the
   *  columns a user decides with (health, layer, gradient norm, trend, suggestion) fit ~800 px */
  detail?: boolean;
}

export const COLUMNS: Column[] = [
  // a comparison's first (reference) run, then the change of the final gradient norm (GradientPanel.compare)
  { key: "health_a", label: "first run", kind: "health", title: "health in the first (reference) run" },
  { key: "health", label: "health", kind: "health" },
  { key: "change", label: "Δ log10‖g‖", kind: "num", title: "log10 of the final gradient norm, later run / first run" },
  { key: "layer", label: "layer", kind: "text" },
  { key: "module_type", label: "type", kind: "text", detail: true },
  { key: "numel", label: "params", kind: "num", detail: true },
  { key: "grad_norm_median", label: "‖g‖ median", kind: "num", title: "median over steps of the gradient L2 norm" },
  { key: "mean_abs_median", label: "mean|g| median", kind: "num", title: "median over steps of mean |g|", detail: true },
  { key: "max_abs_max", label: "max|g| max", kind: "num", title: "largest |g| seen", detail: true },
  { key: "zero_frac_mean", label: "zeros", kind: "num", title: "mean fraction of exactly-zero gradient entries", detail: true },
  { key: "nonfinite_total", label: "NaN/Inf", kind: "num", title: "non-finite gradient entries, all steps", detail: true },
  { key: "trend", label: "trend", kind: "text" },
  { key: "suggestion", label: "suggestion", kind: "text" },
];

/** A row control (a ▸/▾) by its row's layer index and its class. */
export interface ControlKey {
  index: number;
  cls: string;
}

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

/** The table's order before a user sorts: grouped by health (Critical first, Healthy then "Cannot move" last), within a
 *  health the rows of one diagnosis together (the top diagnosis first), then layer order. */
export function healthOrder(rows: Row[]): Row[] {
  const rank = (r: Row) => HEALTH_RANK[String(r.health)] ?? 1;
  const diag = (r: Row) => (typeof r.diagnosis === "number" ? r.diagnosis : Infinity);
  return rows.slice().sort((a, b) => rank(b) - rank(a) || diag(a) - diag(b) || a.index - b.index);
}

/** Rows sorted by a column (numbers numerically, NaN/missing last in both directions; ties keep
 *  layer order); without a column, in `healthOrder`. */
export function sortRows(rows: Row[], s: SortState | null): Row[] {
  if (!s) return healthOrder(rows);
  const out = rows.slice();
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

/** What the suggestion cell of `shown[i]` says: its action, or "" when the row above has the same
 *  health and action (the rows of one diagnosis read its action once, on their first row). */
export function suggestionText(shown: readonly Row[], i: number): string {
  const r = shown[i];
  const said = cellText(r.suggestion, "text");
  const above = i > 0 ? shown[i - 1] : null;
  return above && said && above.health === r.health && cellText(above.suggestion, "text") === said ? "" : said;
}

/** Whether `shown[i]` begins a health group (its health differs from the row above's). */
export function startsGroup(shown: readonly Row[], i: number): boolean {
  return i === 0 || shown[i - 1].health !== shown[i].health;
}

/** Characters of a layer name the name cell shows (longer names keep the parts that tell them apart,
 *  `distinctLabels`; the full name is the cell's tooltip). */
export const NAME_WIDTH = 36;

/** Rows drawn beyond the visible ones, above and below (a long table renders only its window). */
export const OVERSCAN = 40;
const ROW_H = 21; // CSS px of a row until one has been measured

/** The rows of `shown` that a viewport of `height` px scrolled to `top` needs, with OVERSCAN,
 *  stretched to include row `keep` (the row whose control has the keyboard focus: it stays in the
 *  page however far the table scrolls, so the focus is never dropped with it). */
export function rowWindow(n: number, top: number, height: number, rowH: number, keep = -1): [number, number] {
  let first = Math.max(0, Math.floor(top / rowH) - OVERSCAN);
  let last = Math.max(first, Math.min(n, Math.ceil((top + height) / rowH) + OVERSCAN));
  if (keep >= 0 && keep < n) [first, last] = [Math.min(first, keep), Math.max(last, keep + 1)];
  return [first, last];
}

/** ▸ for a group row, ▾ for a row shown inside an expanded group, "" otherwise. */
export function groupMark(r: Row): string {
  if (typeof r.count === "number" && r.count > 1) return "▸";
  return Array.isArray(r.parent) ? "▾" : "";
}

/** The columns shown: those the rows carry (layer and health always), the detail statistics only
 *  when `more` is on. */
export function shownColumns(present: Set<string>, more: boolean): Column[] {
  return COLUMNS.filter((c) => (c.key === "layer" || c.key === "health" || present.has(c.key)) && (more || !c.detail));
}

export class HealthTable {
  readonly el: HTMLDivElement;
  private input: HTMLInputElement;
  private scroller: HTMLDivElement;
  private table: HTMLTableElement;
  private tbody: HTMLTableSectionElement;
  private thead: HTMLTableSectionElement;
  private sizer: HTMLDivElement;
  private count: HTMLSpanElement;
  private rows: Row[] = [];
  /** the label of each row's layer name (by layer index), `distinctLabels` of all the rows' names */
  private labelOf = new Map<number, string>();
  private shown: Row[] = [];
  private sort: SortState | null = null;
  private selected = -1;
  private cols: Column[] = COLUMNS;
  private colsKey = "";
  /** rendered rows by layer index, with the text of their cells (unchanged cells are kept as they are) */
  private rendered = new Map<number, { tr: HTMLTableRowElement; texts: string[] }>();
  private rowH = 0;
  private raf = 0;
  /** the detail statistics are shown (the "more columns" button) */
  private more = false;
  private moreBtn: HTMLButtonElement;

  constructor(private onSelect: (index: number) => void, private onToggle: (index: number) => void = () => {}) {
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
    this.moreBtn = document.createElement("button");
    this.moreBtn.className = "gw-more";
    this.moreBtn.setAttribute("aria-pressed", "false");
    this.moreBtn.addEventListener("click", () => this.setMore(!this.more));
    this.setMoreLabel();
    bar.append(this.input, this.count, this.moreBtn);
    this.scroller = document.createElement("div");
    this.scroller.className = "gw-table-scroll";
    this.table = document.createElement("table");
    this.table.className = "gw-health";
    this.thead = this.table.createTHead();
    this.tbody = this.table.createTBody();
    this.sizer = document.createElement("div");
    this.scroller.append(this.table, this.sizer);
    this.el.append(bar, this.scroller);
    this.tbody.addEventListener("click", (e) => {
      const tr = (e.target as HTMLElement).closest("tr");
      if ((e.target as HTMLElement).closest("button.gw-toggle") && tr && tr.dataset.index !== undefined) {
        e.stopPropagation();
        this.onToggle(Number(tr.dataset.index));
        return;
      }
      if (tr && tr.dataset.index !== undefined) this.onSelect(Number(tr.dataset.index));
    });
    this.scroller.addEventListener("scroll", () => {
      if (!this.raf) this.raf = requestAnimationFrame(() => ((this.raf = 0), this.paint()));
    });
  }

  /** New rows from the kernel: cells whose text is unchanged keep their DOM nodes. */
  setRows(rows: Row[]): void {
    this.rows = rows;
    const labels = distinctLabels(rows.map((r) => r.layer), NAME_WIDTH);
    this.labelOf = new Map(rows.map((r, i) => [r.index, labels[i]]));
    const present = new Set<string>();
    for (const r of rows) for (const k of Object.keys(r)) if (r[k] != null && r[k] !== "") present.add(k);
    this.cols = shownColumns(present, this.more);
    const key = this.cols.map((c) => c.key).join(",");
    if (key !== this.colsKey) {
      this.colsKey = key;
      this.rendered.clear();
      this.tbody.textContent = "";
      this.renderHead();
    }
    this.render();
  }

  /** Show the detail statistics (type, size, the other medians, zeros, NaN/Inf) or fold them away. */
  setMore(on: boolean): void {
    this.more = on;
    this.setMoreLabel();
    this.setRows(this.rows);
  }

  private setMoreLabel(): void {
    const n = COLUMNS.filter((c) => c.detail).length;
    this.moreBtn.textContent = this.more ? "fewer columns" : `+${n} columns`;
    this.moreBtn.title = this.more ? "fold the statistics away" : "show every statistic (type, size, medians, zeros, NaN/Inf)";
    this.moreBtn.setAttribute("aria-pressed", String(this.more));
  }

  /** What the user set here (sort, filter, the detail columns, the scroll), for a view that takes over. */
  state(): { sort: SortState | null; filter: string; more: boolean; scroll: number } {
    return { sort: this.sort, filter: this.input.value, more: this.more, scroll: this.scroller.scrollTop };
  }

  restore(st: { sort: SortState | null; filter: string; more: boolean; scroll: number }): void {
    this.sort = st.sort;
    this.input.value = st.filter;
    this.more = st.more;
    this.setMoreLabel();
    this.colsKey = "";
    this.setRows(this.rows);
    this.scroller.scrollTop = st.scroll;
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

  /** Layer indices of the rows the table shows (filtered and sorted), in order, scrolled into view or not. */
  visibleIndices(): number[] {
    return this.shown.map((r) => r.index);
  }

  dispose(): void {
    cancelAnimationFrame(this.raf);
    this.rendered.clear();
  }

  /** A comparison's run labels (first, later): the two health columns are headed by them. */
  setLabels(labels: readonly string[]): void {
    const next = labels.length >= 2 ? [labels[0], labels[labels.length - 1]] : [];
    if (next.join("\u0000") === this.labels.join("\u0000")) return;
    this.labels = next;
    this.renderHead();
  }

  private labels: string[] = [];

  /** A column's header: a comparison's health columns carry the runs' labels. */
  private headerOf(c: Column): string {
    if (this.labels.length && c.key === "health_a") return `${this.labels[0]} health`;
    if (this.labels.length && c.key === "health") return `${this.labels[1]} health`;
    return c.label;
  }

  private renderHead(): void {
    this.thead.textContent = "";
    const tr = this.thead.insertRow();
    for (const c of this.cols) {
      const th = document.createElement("th");
      th.textContent = this.headerOf(c) + (this.sort?.key === c.key ? (this.sort.desc ? " ▼" : " ▲") : "");
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

  /** The layers the rows stand for: grouped rows (past the kernel's cap) stand for more than one. */
  get layers(): number {
    return this.rows.reduce((n, r) => n + (typeof r.count === "number" && r.count > 1 ? r.count : 1), 0);
  }

  private render(): void {
    this.shown = sortRows(filterRows(this.rows, this.input.value), this.sort);
    const layers = this.layers;
    this.count.textContent = layers > this.rows.length
      ? `${this.shown.length} of ${this.rows.length} rows · ${layers} layers`
      : `${this.shown.length} of ${this.rows.length} layers`;
    this.paint();
  }

  /** Put the window of rows the viewport needs into the tbody; spacing above and below stands for the
   *  rest. A row control with the keyboard focus (a ▸/▾) keeps it: its row stays in the window, rows
   *  already in order are not moved (moving a node drops its focus), a step's new numbers replace
   *  only their cells, and a control rebuilt or moved (a ▸ that became ▾, a new sort) gets the
   *  focus back. */
  private paint(): void {
    const focus = this.controlKey(this.activeElement());
    this.placeRows(focus ? this.shown.findIndex((r) => r.index === focus.index) : -1);
    if (focus) this.focusControl(focus);
  }

  private placeRows(keep: number): void {
    const rowH = this.rowH || ROW_H;
    const n = this.shown.length;
    const [first, last] = rowWindow(n, this.scroller.scrollTop, this.scroller.clientHeight || 300, rowH, keep);
    const order: HTMLTableRowElement[] = [];
    for (let i = first; i < last; i++) {
      const r = this.shown[i];
      const texts = this.cols.map((c) =>
        c.key === "suggestion" ? suggestionText(this.shown, i) : c.key === "layer" ? this.label(r) + groupMark(r) : cellText(r[c.key], c.kind),
      );
      const got = this.rendered.get(r.index);
      const tr = got ? got.tr : this.buildRow(r, texts);
      if (got) {
        // only the cells whose text changed (a step's new numbers): the others, and a focused ▸, stay
        for (let k = 0; k < texts.length; k++) if (texts[k] !== got.texts[k]) tr.replaceChild(this.buildCell(r, this.cols[k], texts[k]), tr.cells[k]);
        tr.dataset.layer = r.layer;
      }
      tr.classList.toggle("gw-group-start", !this.sort && i > 0 && startsGroup(this.shown, i));
      this.rendered.set(r.index, { tr, texts });
      const on = r.index === this.selected;
      tr.classList.toggle("gw-selected", on);
      tr.setAttribute("aria-selected", String(on));
      order.push(tr);
    }
    const kept = new Set(order);
    for (const [k, v] of this.rendered) if (!kept.has(v.tr)) (v.tr.remove(), this.rendered.delete(k));
    let at = this.tbody.firstChild;
    for (const tr of order) {
      if (tr === at) at = tr.nextSibling;
      else this.tbody.insertBefore(tr, at);
    }
    this.table.style.marginTop = `${first * rowH}px`;
    this.sizer.style.height = `${(n - last) * rowH}px`;
    if (!this.rowH && this.tbody.rows.length) {
      const h = this.tbody.rows[0].getBoundingClientRect().height;
      if (h > 0) {
        this.rowH = h;
        if (Math.abs(h - rowH) > 0.5) this.placeRows(keep);
      }
    }
  }

  private activeElement(): Element | null {
    return (this.el.getRootNode() as Document | ShadowRoot).activeElement ?? null;
  }

  /** The row control `el` (a ▸/▾) by its row's layer index and its class: what names the same
   *  control in a rebuilt row, or in another view of the table; null if `el` is none. */
  controlKey(el: Element | null): ControlKey | null {
    const tr = el instanceof HTMLElement && el.className && this.tbody.contains(el) ? el.closest("tr") : null;
    return tr && tr.dataset.index !== undefined ? { index: Number(tr.dataset.index), cls: (el as HTMLElement).className } : null;
  }

  /** Give the keyboard focus to the control `key` names, if its row is rendered (false if not). */
  focusControl(key: ControlKey): boolean {
    const control = this.rendered.get(key.index)?.tr.getElementsByClassName(key.cls)[0] as HTMLElement | undefined;
    if (control && control !== this.activeElement()) control.focus({ preventScroll: true });
    return !!control;
  }

  private label(r: Row): string {
    return this.labelOf.get(r.index) ?? r.layer;
  }

  private buildRow(r: Row, texts: string[]): HTMLTableRowElement {
    const tr = document.createElement("tr");
    tr.dataset.index = String(r.index);
    tr.dataset.layer = r.layer;
    this.cols.forEach((c, k) => tr.append(this.buildCell(r, c, texts[k])));
    return tr;
  }

  private buildCell(r: Row, c: Column, text: string): HTMLTableCellElement {
    const td = document.createElement("td");
    const v = r[c.key];
    if (c.kind === "health") {
      const badge = document.createElement("span");
      const h = String(v ?? "Unknown");
      badge.className = `gw-badge gw-${h.toLowerCase().replace(/\s+/g, "-")}`;
      badge.style.background = HEALTH_COLORS[h] ?? HEALTH_COLORS.Unknown;
      badge.textContent = h;
      if (HEALTH_NOTES[h]) badge.title = HEALTH_NOTES[h]; // why a state that is no grade (e.g. "Cannot move") is normal
      td.append(badge);
      return td;
    }
    td.textContent = text;
    if (c.kind === "num") td.className = "gw-num";
    if (c.key === "layer") {
      // one line: the label keeps the parts that tell the name from the others, the tooltip has it whole
      td.className = "gw-name";
      td.title = String(v ?? "");
      td.textContent = this.label(r);
      const mark = groupMark(r);
      if (mark) {
        const b = document.createElement("button");
        b.className = "gw-toggle";
        b.textContent = mark;
        const group = mark === "▸";
        b.setAttribute("aria-expanded", String(!group));
        b.title = group ? `expand: show the ${r.count} tensors of this group` : "collapse the group this layer is shown in";
        b.setAttribute("aria-label", b.title);
        td.prepend(b);
      }
    }
    if (c.key === "suggestion") {
      td.className = "gw-suggestion";
      td.title = text || !v ? String(v ?? "") : `as above: ${v}`;
    }
    return td;
  }
}
