// The top diagnoses above the heatmap, stacked, each shown whole: the cause, where (the first
// layers and how many more), since when, and the action on a line of its own; its evidence (the
// numbers behind it) one click away under "evidence". A click on a diagnosis selects its first
// layer and moves the cursor to its first step. Nothing is shown when there is no diagnosis.

import { Diagnosis, MAX_DIAGNOSES } from "../protocol";

const FIRST_LAYERS = 3;

/** "cause · where · since step N": the diagnosis' first line. */
export function diagnosisHead(d: Diagnosis): string {
  const names = d.layers.slice(0, FIRST_LAYERS).join(", ");
  const more = d.n_layers > FIRST_LAYERS ? ` and ${d.n_layers - FIRST_LAYERS} more` : "";
  const parts = [d.title || d.cause.replace(/_/g, " ")];
  if (names) parts.push(names + more);
  if (d.first_step !== null && d.first_step !== undefined) parts.push(`since step ${d.first_step}`);
  return parts.join(" · ");
}

/** The whole diagnosis as text, in the order a reader acts on it (head, then the action). */
export function diagnosisText(d: Diagnosis): string {
  return `${diagnosisHead(d)} · ${d.action}`;
}

export class DiagnosesList {
  private items: Diagnosis[] = [];

  constructor(
    private el: HTMLDivElement,
    private onPick: (d: Diagnosis) => void,
  ) {
    el.setAttribute("role", "list");
    el.addEventListener("click", (e) => {
      const target = e.target as HTMLElement;
      if (target.closest("details")) return;  // opening the evidence is not a pick
      const row = target.closest("[data-i]") as HTMLElement | null;
      if (row) this.onPick(this.items[Number(row.dataset.i)]);
    });
  }

  set(items: Diagnosis[] | null | undefined): void {
    const list = (Array.isArray(items) ? items : []).slice(0, MAX_DIAGNOSES);
    // evidence left open stays open when the same diagnosis comes again
    const open = new Set(Array.from(this.el.querySelectorAll("details[open]"), (x) => (x as HTMLElement).dataset.cause));
    this.items = list;
    this.el.textContent = "";
    this.el.classList.toggle("gw-show", list.length > 0);
    list.forEach((d, i) => {
      const row = document.createElement("div");
      row.className = `gw-diagnosis gw-p-${String(d.priority).toLowerCase()}`;
      row.setAttribute("role", "listitem");
      row.dataset.i = String(i);
      row.dataset.cause = d.cause;
      row.title = "select its first layer and move to its first step";
      const head = document.createElement("div");
      head.className = "gw-dhead";
      head.textContent = diagnosisHead(d);
      const action = document.createElement("div");
      action.className = "gw-daction";
      action.textContent = `→ ${d.action}`;
      row.append(head, action);
      const evidence = [d.text, d.evidence].filter((x) => x && String(x).trim()).join("\n");
      if (evidence) {
        const det = document.createElement("details");
        det.dataset.cause = d.cause;
        det.open = open.has(d.cause);
        const sum = document.createElement("summary");
        sum.textContent = "evidence";
        const body = document.createElement("div");
        body.className = "gw-devidence";
        body.textContent = evidence;
        det.append(sum, body);
        row.append(det);
      }
      this.el.append(row);
    });
  }
}
