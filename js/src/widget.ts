// GradientPanel's front end (anywidget ESM module). The contract with the kernel is protocol.ts;
// the view is view/ (DOM skeleton, drawing, input) with the leaf modules (heatmap, bars, table,
// hist, series, colormap, layout, theme) and sync.ts (the user's choice is kept until the kernel
// agrees: a kernel running a training loop in the panel's cell reads browser messages only when
// the cell ends).

import { PanelModel } from "./protocol";
import { applyPatch, applyRows, Patch } from "./sync";
import { Handover, PanelView } from "./view/panel";

export { PanelView };

/** Every view on this page. When the kernel updates a panel's output in place (after a training
 *  cell, so that the saved notebook holds the final static panel), JupyterLab renders a new view
 *  of the same model there and detaches the old one without disposing it: the new view takes over
 *  the old one's state (the user's cursor, selection, table) and disposes it. */
const VIEWS = new Set<PanelView>();

/** When a new view looks for the one it replaces: the front end attaches the new view and detaches
 *  the old one when it gets to it, seconds later on a busy page, so it keeps looking for a while. */
const TAKE_OVER_AT_MS = [0, 50, 300, 1500, 3000, 6000, 10000, 20000, 40000, 80000, 120000];
/** How long after it is made a view replaces the views of its model that are released: the last look. */
const REPLACES_FOR_MS = TAKE_OVER_AT_MS[TAKE_OVER_AT_MS.length - 1];

/** Views their front end released (disposed) while shown, with what the user set there (taken just
 *  before: a disposed view keeps no DOM and no data): a front end that replaces an output may
 *  release the old view before the new one is on the page; the view that replaces it still takes
 *  that over, for as long as it keeps looking. */
const RELEASED = new Map<PanelView, Handover>();

/** Each view's place in the order views were made (a later view of a model replaces earlier ones),
 *  and the newest place whose state a view took over: a view never takes over a state older than
 *  one it holds (a stale view of the same model, detached or released late on a busy page, would
 *  otherwise overwrite what the user set in the view it replaced). */
const MADE = new WeakMap<PanelView, number>();
/** when each view was made (``performance.now()``) */
const BORN = new WeakMap<PanelView, number>();
const HOLDS = new WeakMap<PanelView, number>();
let made = 0;

/** Hand `state`, what the user set in `old` (released by its front end just now), to the newest
 *  view of the same model made after it, and within ``REPLACES_FOR_MS`` of now, that is on the page
 *  already (a front end that renders the new view first and releases the old one late, on a busy
 *  page). False when there is none yet: the view that replaces it takes it over when it looks. An
 *  older view of the same panel shown elsewhere is never touched. */
function handOver(old: PanelView, state: Handover): boolean {
  const place = MADE.get(old) ?? 0;
  const since = performance.now() - REPLACES_FOR_MS;
  let newest: PanelView | null = null;
  for (const v of VIEWS) {
    const at = MADE.get(v) ?? 0;
    if (v === old || v.isDisposed || !v.root.isConnected || at <= place || (BORN.get(v) ?? 0) < since) continue;
    if (!v.sameModel(state)) continue;
    if (!newest || at > (MADE.get(newest) ?? 0)) newest = v;
  }
  if (!newest) return false;
  if (place > (HOLDS.get(newest) ?? 0)) {
    newest.adopt(state);
    HOLDS.set(newest, place);
  }
  return true;
}

/** `view` takes over the detached (or just released) views of its model. It keeps looking for
 *  the whole window after a take-over: a view found at one look may be a stale one of the same model
 *  (released by an earlier replacement, its state kept for its own successor), while the view this
 *  one replaces is detached only later, on a busy page; views are looked at oldest first, so the
 *  newest state found is the one kept. */
function takeOver(view: PanelView): void {
  if (view.isDisposed || !view.root.isConnected) return;
  for (const old of Array.from(VIEWS)) {
    if (old === view) continue;
    let state = RELEASED.get(old);
    if (!state) {
      if (old.isDisposed || !(old.shown || old.adopted) || old.root.isConnected) continue;
      state = old.handover();
    }
    if (!view.sameModel(state)) continue;
    const place = MADE.get(old) ?? 0;
    if (place > (HOLDS.get(view) ?? 0)) {
      view.adopt(state);
      HOLDS.set(view, place);
    }
    old.dispose();
    VIEWS.delete(old);
    RELEASED.delete(old);
  }
}

function render({ model, el, signal }: { model: PanelModel; el: HTMLElement; signal?: AbortSignal }): () => void {
  const view = new PanelView(model, el);
  MADE.set(view, ++made);
  BORN.set(view, performance.now());
  // tests and the benchmark reach the view through the element
  (el as HTMLElement & { gradwidget?: PanelView }).gradwidget = view;
  VIEWS.add(view);
  // the old view is detached once the new one is in the page: look a few times
  const timers: ReturnType<typeof setTimeout>[] = [];
  for (const ms of TAKE_OVER_AT_MS) timers.push(setTimeout(() => takeOver(view), ms));
  let released = false;
  const release = () => {
    // once: a front end may both abort the signal and call the cleanup, in either order (a second
    // call would forget the state kept for the view that replaces this one)
    if (released) return;
    released = true;
    timers.forEach(clearTimeout);
    const state = (view.shown || view.adopted) && !view.isDisposed ? view.handover() : null;  // not once taken over
    view.dispose();
    if (!state || handOver(view, state)) {
      VIEWS.delete(view);
      return;
    }
    RELEASED.set(view, state);  // for the view that replaces it, while it looks
    setTimeout(() => {
      VIEWS.delete(view);
      RELEASED.delete(view);
    }, REPLACES_FOR_MS + 1000);
  };
  signal?.addEventListener("abort", release, { once: true });
  return () => {
    signal?.removeEventListener("abort", release);
    release();
  };
}

type WidgetModel = { set_state(state: Record<string, unknown>): void };
type ProxyModel = PanelModel & {
  send?: (c: unknown) => void;
  widget_manager?: { get_model(id: string): Promise<WidgetModel> | undefined };
};

/** Once per model: patches from the kernel are applied to the model, whatever views it has, in
 *  their order, through the widget model's set_state (as a kernel update: nothing is echoed back;
 *  a plain `set` would send the patched heatmap back to the kernel with the next user change). */
function initialize({ model }: { model: ProxyModel }): () => void {
  let real: Promise<WidgetModel | undefined> | null = null;
  let chain: Promise<unknown> = Promise.resolve();
  const onMsg = (msg: unknown, buffers: unknown) => {
    const id = (msg as Patch | null)?.model_id;
    if (!real && id && model.widget_manager) real = Promise.resolve(model.widget_manager.get_model(id)).catch(() => undefined);
    const target = real ?? Promise.resolve(undefined);
    chain = chain.then(() => target).then((w) => {
      const set = w ? (s: Record<string, unknown>) => w.set_state(s) : undefined;
      return applyPatch(model, msg, (buffers ?? []) as DataView[], set) || applyRows(model, msg, set);
    });
  };
  model.on("msg:custom", onMsg as (...args: unknown[]) => void);
  return () => model.off("msg:custom", onMsg as (...args: unknown[]) => void);
}

export default { initialize, render };
