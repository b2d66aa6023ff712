// Input: dragging on the heatmap scrubs, a click selects the layer under the pointer (a group's
// name, ▸/▾, expands or collapses it), hover shows a tooltip, the keyboard scrubs (← → Home End,
// shift for 10), plays (space), selects (↑ ↓) and expands or collapses the selected row's group (Enter).

import { fmt } from "../colormap";
import { colAt, rowAt } from "../layout";
import { FLAG_EXPLODING, FLAG_NONFINITE, FLAG_VANISHING, MERGE_LABELS, metricLabel } from "../protocol";
import { barValues, displayRow, heatRectIndex, heatRects } from "./draw";
import type { PanelView } from "./panel";

type Listen = <K extends keyof HTMLElementEventMap>(
  target: HTMLElement, type: K, fn: (e: HTMLElementEventMap[K]) => void) => void;

export function bindInput(v: PanelView, listen: Listen): void {
  const d = v.dom;
  listen(d.playBtn, "click", () => v.togglePlay());
  listen(d.speedSel, "change", () => (v.speed = Number(d.speedSel.value)));
  listen(d.slider, "input", () => v.scrub(Number(d.slider.value)));
  listen(d.slider, "keydown", (e) => e.stopPropagation());
  listen(d.root, "keydown", (e) => onKey(v, e));
  let dragging = false;
  listen(d.canvas, "pointerdown", (e) => {
    const p = pointer(v, e);
    if (!p || !v.layout) return;
    // a group's name (▸) expands it, the ▾ of an expanded group's first row collapses it
    const toggled = p.inGutter && p.row >= 0 && groupMarked(v, v.order[p.row]) && v.toggleGroup(v.order[p.row]);
    if (!toggled && (p.inHeat || p.inBars || p.inGutter) && p.row >= 0) v.selectRow(v.order[p.row], true);
    if (p.inHeat) {
      dragging = true;
      d.canvas.setPointerCapture(e.pointerId);
      v.scrub(colAt(scrubRect(v, p.x), v.meta.cols, p.x));
    }
    d.root.focus({ preventScroll: true });
  });
  listen(d.canvas, "pointermove", (e) => {
    const p = pointer(v, e);
    if (dragging && p && v.layout) v.scrub(colAt(scrubRect(v, p.x), v.meta.cols, p.x));
    hover(v, p);
  });
  listen(d.canvas, "pointerup", () => (dragging = false));
  listen(d.canvas, "pointercancel", () => (dragging = false));
  listen(d.canvas, "pointerleave", () => (d.tip.style.display = "none"));
}

/** The heatmap under x (a comparison side by side has two, on the same columns). */
function scrubRect(v: PanelView, x: number) {
  return heatRects(v, v.layout!.heat)[heatRectIndex(v, x)];
}

function onKey(v: PanelView, e: KeyboardEvent): void {
  // Enter or space on a control of its own (a table row's ▸/▾, the play button) is that control's
  const t = e.target as HTMLElement | null;
  if ((e.key === "Enter" || e.key === " ") && t && t !== v.dom.root && t.closest("button, select, input, a")) return;
  const C = v.meta.cols;
  let handled = true;
  switch (e.key) {
    case "ArrowLeft":
      v.scrub(v.cursor - (e.shiftKey ? 10 : 1));
      break;
    case "ArrowRight":
      v.scrub(v.cursor + (e.shiftKey ? 10 : 1));
      break;
    case "Home":
      v.scrub(0);
      break;
    case "End":
      v.scrub(C - 1);
      break;
    case " ":
      v.togglePlay();
      break;
    case "ArrowUp":
    case "ArrowDown": {
      const pos = displayRow(v, v.layer);
      const next = pos < 0 ? 0 : pos + (e.key === "ArrowUp" ? -1 : 1);
      if (next >= 0 && next < v.order.length) v.selectRow(v.order[next], true);
      break;
    }
    case "Enter":
      handled = v.layer >= 0 && v.toggleGroup(v.layer);
      break;
    default:
      handled = false;
  }
  if (handled) {
    e.preventDefault();
    e.stopPropagation();
  }
}

interface Pointer {
  x: number;
  y: number;
  inHeat: boolean;
  inBars: boolean;
  inGutter: boolean;
  row: number;
}

/** A row whose name carries ▸ or ▾ (a group, or the first row of an expanded one). */
function groupMarked(v: PanelView, row: number): boolean {
  const r = v.meta.layers[row];
  return !!v.meta.grouped && !!r && ((r.count ?? 1) > 1 || (!!r.parent && r.parent[0] === r.start));
}

function pointer(v: PanelView, e: PointerEvent): Pointer | null {
  if (!v.layout) return null;
  const b = v.dom.canvas.getBoundingClientRect();
  const x = e.clientX - b.left;
  const y = e.clientY - b.top;
  const L = v.layout;
  const inRect = (r: { x: number; y: number; w: number; h: number }) => x >= r.x && x < r.x + r.w && y >= r.y && y < r.y + r.h;
  const inHeat = inRect(L.heat);
  const inBars = inRect(L.bars);
  const inGutter = inRect(L.gutter);
  const R = v.order.length;
  const row = inHeat || inGutter ? rowAt(L.heat, R, y) : inBars ? rowAt(L.bars, R, y) : -1;
  return { x, y, inHeat, inBars, inGutter, row };
}

function hover(v: PanelView, p: Pointer | null): void {
  const tip = v.dom.tip;
  if (!p || p.row < 0 || !v.heat.length || !v.layout) {
    tip.style.display = "none";
    return;
  }
  const C = v.meta.cols;
  const j = v.order[p.row];
  const name = v.meta.layers[j]?.name ?? String(j);
  let col: number;
  let val: number;
  let f: number;
  if (p.inBars) {
    const bv = barValues(v);
    col = v.cursor;
    val = bv.values[p.row];
    f = bv.flags[p.row];
  } else {
    col = colAt(scrubRect(v, p.x), C, p.x);
    const k = heatRectIndex(v, p.x);
    const diff = v.comparing && v.mode === "diff";
    const [hv, hf] = diff ? [v.dispDiff, null] : k ? [v.dispHeatB, v.dispFlagsB] : [v.dispHeat, v.dispFlags];
    val = hv[p.row * C + col];
    f = hf ? hf[p.row * C + col] : 0;
  }
  const s0 = v.colSteps[col];
  const s1 = col + 1 < C ? v.colSteps[col + 1] - 1 : v.meta.last_step;
  const marks = [f & FLAG_VANISHING ? "vanishing" : "", f & FLAG_EXPLODING ? "exploding" : "", f & FLAG_NONFINITE ? "NaN/Inf" : ""]
    .filter(Boolean)
    .join(", ");
  const count = v.meta.grouped ? v.meta.layers[j]?.count ?? 1 : 1;
  tip.textContent =
    `${name}\nstep ${fmt(s0)}${s1 > s0 ? `–${fmt(s1)}` : ""}\n${metricLabel(v.meta.metric)}` +
    `${v.comparing ? ` (${p.inBars ? v.labels[1] : v.mode === "diff" ? "log10 ratio" : v.labels[heatRectIndex(v, p.x)]})` : ""}: ${fmt(val)}` +
    (marks ? `\n${marks}` : "") +
    (count > 1 ? `\n${count} tensors as one: ${MERGE_LABELS[v.meta.metric] ?? ""}` : "");
  tip.style.display = "block";
  const bw = v.dom.mainBox.clientWidth;
  const left = p.x + 14 + 180 > bw ? p.x - 190 : p.x + 14;
  tip.style.left = `${Math.max(0, left)}px`;
  tip.style.top = `${p.y + 12}px`;
}
