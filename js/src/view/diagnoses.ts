// The top diagnoses above the heatmap: one row each, "cause · layers (first few) · since step N ·
// the action"; a click selects the first layer and moves the cursor to the first step. Nothing is
// shown when there is no diagnosis.

import { Diagnosis, MAX_DIAGNOSES } from "../protocol";

const FIRST_LAYERS = 3;

/** The row's text, in the order a reader acts on it. */
export function diagnosisText(d: Diagnosis): string {
  const names = d.layers.slice(0, FIRST_LAYERS).join(", ");
  const more = d.n_layers > FIRST_LAYERS ? ` +${d.n_layers - FIRST_LAYERS}` : "";
  const parts = [d.cause.replace(/_/g, " ")];
  if (names) parts.push(names + more);
  if (d.first_step !== null && d.first_step !== undefined) parts.push(`since step ${d.first_step}`);
  parts.push(d.action);
  return parts.join(" · ");
}

export class DiagnosesList {
  private items: Diagnosis[] = [];

  constructor(
    private el: HTMLDivElement,
    private onPick: (d: Diagnosis) => void,
  ) {
    el.setAttribute("role", "list");
    el.addEventListener("click", (e) => {
      const row = (e.target as HTMLElement).closest("[data-i]") as HTMLElement | null;
      if (row) this.onPick(this.items[Number(row.dataset.i)]);
    });
  }

  set(items: Diagnosis[] | null | undefined): void {
    const list = (Array.isArray(items) ? items : []).slice(0, MAX_DIAGNOSES);
    this.items = list;
    this.el.textContent = "";
    this.el.classList.toggle("gw-show", list.length > 0);
    list.forEach((d, i) => {
      const row = document.createElement("div");
      row.className = `gw-diagnosis gw-p-${String(d.priority).toLowerCase()}`;
      row.setAttribute("role", "listitem");
      row.dataset.i = String(i);
      row.dataset.cause = d.cause;
      row.textContent = diagnosisText(d);
      row.title = d.text;
      this.el.append(row);
    });
  }
}
