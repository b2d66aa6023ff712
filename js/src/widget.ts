// GradientPanel's front end (anywidget ESM module). The contract with the kernel is protocol.ts;
// the view is view/ (DOM skeleton, drawing, input) with the leaf modules (heatmap, bars, table,
// hist, series, colormap, layout, theme) and sync.ts (the user's choice is kept until the kernel
// agrees: a kernel running a training loop in the panel's cell reads browser messages only when
// the cell ends).

import { PanelModel } from "./protocol";
import { PanelView } from "./view/panel";

export { PanelView };

function render({ model, el, signal }: { model: PanelModel; el: HTMLElement; signal?: AbortSignal }): () => void {
  const view = new PanelView(model, el);
  // tests and the benchmark reach the view through the element
  (el as HTMLElement & { gradwidget?: PanelView }).gradwidget = view;
  signal?.addEventListener("abort", () => view.dispose(), { once: true });
  return () => view.dispose();
}

export default { render };
