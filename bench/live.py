"""What the live panel costs a user, measured as one works: JupyterLab + headless Chromium, one kernel.

    python bench/live.py [--steps 40] [--rounds 3] [--big-layers 1000] [--big-steps 2000] [--redisplays 10]

1. Training cost. Three identical 8-layer transformers (99 parameter tensors) in one kernel:
   ``bare`` (no hooks), ``recorder`` (a Recorder only), ``panel`` (a GradientPanel on screen). Blocks of
   ``--steps`` steps run interleaved (the order rotates each round), each as a cell would (an
   ``execute_request``: IPython's post-cell hooks run before the reply), with a pause between blocks
   for trailing timers. Prints ms/step median and mean ratios, cell wall time (the page's execute ->
   reply) and the post-cell time (wall minus the training loop).
2. Traffic while training: comm messages on the kernel's websocket during the panel's blocks:
   updates per second, bytes per update, bytes per new step; the page's long tasks (> 50 ms).
3. Latency: kernel send of step S (``panel._send`` stamped) -> the page's step label shows S.
4. A big run: ``GradientPanel(run)`` of ``--big-layers`` x ``--big-steps``: kernel time of the cell,
   time to the heatmap's first paint in the page, to the full health table, bytes sent; then the
   table's re-render with every row (and with 3 rows changed).
5. Re-displays: the panel's cell run ``--redisplays`` more times; canvases reachable, JS heap and DOM
   nodes after a forced GC (Chrome DevTools protocol), per re-display, and over the second half alone
   (a leak grows with every re-display; something kept once does not).

The machine is shared: medians over interleaved blocks, and the spread of the block ratios is printed.
Prints a summary and one JSON line.

Where a front end draws the panel, the end of a cell waits for nothing new (the static panel is
made by the analysis thread after the reply); the panel's own work on the training thread is
bounded at 5% by the throttle (``schedule.TRAINING_SHARE``); the analysis thread's GIL time is on
top of it and shows only in the step times. The figures, with the commands that reproduce them,
are in docs/costs.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "browser"))
sys.path.insert(0, str(ROOT / "tests"))

SETUP = r'''
import json, time, math
import numpy as np, torch
from torch import nn
from IPython.display import display
from gradwidget import GradientPanel, Recorder, Run, METRICS
from gradwidget.run import N_BINS
torch.set_num_threads(1)
D, T, B, VOCAB = {d_model}, 32, 16, 100

class Net(nn.Module):
    """8 encoder layers (12 tensors each) + embedding + head: 99 parameter tensors."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        layer = nn.TransformerEncoderLayer(D, 4, 2 * D, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 8, enable_nested_tensor=False)
        self.head = nn.Linear(D, VOCAB)
    def forward(self, x):
        return self.head(self.enc(self.emb(x)))

def make():
    torch.manual_seed(0)
    m = Net()
    return m, torch.optim.AdamW(m.parameters(), 1e-3)

g = torch.Generator().manual_seed(1)
X = torch.randint(0, VOCAB, (B, T + 1), generator=g)
nets = {{k: make() for k in ("bare", "recorder", "panel")}}
rec = Recorder(*nets["recorder"])
panel = GradientPanel(*nets["panel"])
SENDS = []   # (unix ms, newest step, bytes) of every message the panel sends
_send0 = panel._send
def _send(msg, buffers=None):
    kind = msg.get("content", {{}}).get("kind") if msg.get("method") == "custom" else "+".join(sorted(msg.get("state", {{}})))
    SENDS.append((time.time() * 1e3, int(panel.run.steps[-1]) if panel.run is not None and panel.run.n_steps else -1,
                  len(json.dumps(msg, default=str)) + sum(len(memoryview(b).cast("B")) for b in (buffers or [])), kind))
    return _send0(msg, buffers=buffers)
panel._send = _send

def block(mode, n):
    model, opt = nets[mode]
    times = []
    cb0 = getattr(panel, "training_thread_s", float("nan"))
    c0, th0 = time.process_time(), time.thread_time()
    t0 = time.perf_counter()
    for _ in range(n):
        s = time.perf_counter()
        opt.zero_grad()
        out = model(X[:, :-1])
        loss = nn.functional.cross_entropy(out.reshape(-1, VOCAB), X[:, 1:].reshape(-1))
        loss.backward()
        if mode == "recorder":
            rec.log(loss=loss)
        elif mode == "panel":
            panel.log(loss=loss)
        opt.step()
        times.append((time.perf_counter() - s) * 1e3)
    cb = (getattr(panel, "training_thread_s", float("nan")) - cb0) * 1e3 if mode == "panel" else 0.0
    return {{"mode": mode, "loop_ms": (time.perf_counter() - t0) * 1e3, "step_ms": times, "cb_ms": cb,
            "cpu_ms": (time.process_time() - c0) * 1e3, "thread_cpu_ms": (time.thread_time() - th0) * 1e3}}

def big_run(L, S):
    names = [f"blocks.{{j // 4}}.layer{{j % 4}}.weight" for j in range(L)]
    run = Run(names)
    rng = np.random.default_rng(0)
    scale = np.logspace(-9, -1, L)
    for s in range(S):
        v = np.empty((len(METRICS), L), np.float32)
        v[:] = scale * (1 + 0.1 * rng.standard_normal(L))
        v[METRICS.index("nonfinite")] = 0
        h = None
        if s % 50 == 0:
            h = np.zeros((L, N_BINS), np.uint32); h[:, 20:30] = 50
        run.append(s, v, {{"loss": 1.0 / (1 + s)}}, hist=h)
    return run
'''

SHOW = "panel"
BIG = """_t0 = time.perf_counter()
bp = GradientPanel(big)
display(bp)
big_kernel_s = time.perf_counter() - _t0"""

#: run ``code`` as a cell would be (execute_request, post-cell hooks included); stdout and wall ms.
EXEC_JS = """async (code) => {
  const w = window.jupyterapp.shell.currentWidget;
  const kernel = w.sessionContext.session.kernel;
  const t0 = performance.now();
  const future = kernel.requestExecute({code, silent: false, store_history: false});
  let out = "";
  future.onIOPub = (msg) => {
    const t = msg.header.msg_type;
    if (t === "stream") out += msg.content.text;
    if (t === "error") out += "ERROR " + msg.content.ename + ": " + msg.content.evalue;
  };
  await future.done;
  return {out, wall_ms: performance.now() - t0, t0, t1: performance.now()};
}"""

#: page instrumentation: every change of the first panel's step label (unix ms, text) and long tasks.
INSTRUMENT_JS = """() => {
  window.__gw = {labels: [], longtasks: []};
  const info = document.querySelector('.gw-root .gw-info');
  new MutationObserver(() => window.__gw.labels.push([Date.now(), info.textContent]))
    .observe(info, {childList: true, characterData: true, subtree: true});
  new PerformanceObserver((l) => { for (const e of l.getEntries()) window.__gw.longtasks.push([e.startTime, e.duration]); })
    .observe({type: 'longtask', buffered: false});
  return !!info;
}"""

BIG_READY_JS = """(n) => { const roots = document.querySelectorAll('.gw-root');
  if (roots.length < 2) return false;
  const v = roots[roots.length - 1].parentElement.gradwidget;
  return !!(v && v.heat.length && v.layout && v.lastDrawMs > 0) && {t: performance.now()}; }"""

#: the table holds all ``n`` layers (past the kernel's cap a grouped row stands for several)
BIG_TABLE_JS = """(n) => { const roots = document.querySelectorAll('.gw-root');
  const v = roots[roots.length - 1].parentElement.gradwidget;
  return v && v.table.layers >= n && {t: performance.now()}; }"""

TABLE_RERENDER_JS = """() => { const roots = document.querySelectorAll('.gw-root');
  const v = roots[roots.length - 1].parentElement.gradwidget;
  const base = v.table.rows;
  const full = [], diff = [];
  for (let i = 0; i < 7; i++) {
    const rows = base.map((r) => ({...r, grad_norm_median: 1 + i + r.index}));
    const t0 = performance.now(); v.table.setRows(rows); document.body.offsetHeight; full.push(performance.now() - t0);
    const few = rows.slice(); for (const k of [3, base.length >> 1, base.length - 1]) few[k] = {...few[k], health: i % 2 ? 'Critical' : 'Healthy'};
    const t1 = performance.now(); v.table.setRows(few); document.body.offsetHeight; diff.push(performance.now() - t1);
  }
  full.sort((a, b) => a - b); diff.sort((a, b) => a - b);
  return {rows: base.length, full_ms: full[3], three_changed_ms: diff[3]}; }"""


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def mean(xs):
    return statistics.fmean(xs) if xs else float("nan")


def comm_bytes(frames, i0, i1, patches=None):
    """Sizes of the comm messages among frames[i0:i1] (only patches / only the others)."""
    return [n for n, is_comm, is_patch in frames[i0:i1] if is_comm and (patches is None or is_patch == patches)]


def run_bench(args) -> dict:
    from lab import KERNEL_IDLE_JS, RUN_CELL_JS, notebook_page

    cells = [SETUP.format(d_model=args.d_model), SHOW, BIG]
    out: dict = {"args": vars(args)}
    frames: list[tuple[int, bool, bool]] = []  # (bytes, comm message, patch) of every websocket frame the page got

    def on_ws(ws):
        def got(payload):
            b = payload if isinstance(payload, (bytes, bytearray)) else payload.encode()
            head = b[:4096]
            frames.append((len(b), b"comm_msg" in head, b'"kind": "patch"' in head))

        ws.on("framereceived", got)

    with (
        tempfile.TemporaryDirectory() as tmp,
        notebook_page(
            Path(tmp), cells, name="live.ipynb", timeout_ms=600_000, on_page=lambda p: p.on("websocket", on_ws)
        ) as page,
    ):

        def run_cell(i):
            page.evaluate(RUN_CELL_JS, i)
            page.wait_for_timeout(200)
            page.wait_for_function(KERNEL_IDLE_JS)

        def kexec(code):
            r = page.evaluate(EXEC_JS, code)
            if "ERROR" in r["out"]:
                raise RuntimeError(r["out"])
            return r

        run_cell(0)
        run_cell(1)
        page.wait_for_function(
            "() => { const r = document.querySelector('.gw-root'); return r && r.parentElement.gradwidget; }"
        )
        page.evaluate(INSTRUMENT_JS)
        # warm-up: one short block of each
        for mode in ("bare", "recorder", "panel"):
            kexec(f"print(json.dumps(block({mode!r}, 5)))")
        page.wait_for_timeout(1500)
        blocks = []
        modes = ["bare", "recorder", "panel"]
        for r in range(args.rounds):
            order = modes[r % 3 :] + modes[: r % 3]
            for mode in order:
                i0 = len(frames)
                res = kexec(f"print(json.dumps(block({mode!r}, {args.steps})))")
                page.wait_for_timeout(args.pause_ms)
                b = json.loads(res["out"])
                b.update(
                    wall_ms=res["wall_ms"],
                    t0=res["t0"],
                    t1=res["t1"] + args.pause_ms,
                    comm=comm_bytes(frames, i0, len(frames)),
                    patches=comm_bytes(frames, i0, len(frames), True),
                )
                blocks.append(b)
        by = {m: [b for b in blocks if b["mode"] == m] for m in modes}
        steps = {m: [x for b in by[m] for x in b["step_ms"]] for m in modes}
        cell = {m: [b["wall_ms"] for b in by[m]] for m in modes}
        post = {m: [b["wall_ms"] - b["loop_ms"] for b in by[m]] for m in modes}
        rounds_ratio = [p["wall_ms"] / r["wall_ms"] for p, r in zip(by["panel"], by["recorder"])]
        # CPU time over the loop, each round's panel block against its recorder block: the kernel
        # process (every thread: the analysis, the sends, ipykernel's) and the training thread alone
        cpu_ratio = {k: [p[k] / r[k] for p, r in zip(by["panel"], by["recorder"])] for k in ("cpu_ms", "thread_cpu_ms")}
        out["training"] = {
            "ms_per_step_median": {m: round(med(steps[m]), 2) for m in modes},
            "ms_per_step_mean": {m: round(mean(steps[m]), 2) for m in modes},
            "ms_per_step_p99": {m: round(sorted(steps[m])[int(0.99 * (len(steps[m]) - 1))], 1) for m in modes},
            "cell_ms_median": {m: round(med(cell[m]), 1) for m in modes},
            "cell_ms_mean": {m: round(mean(cell[m]), 1) for m in modes},
            "post_cell_ms_median": {m: round(med(post[m]), 1) for m in modes},
            "panel_over_recorder_cell_by_round": [round(x, 3) for x in rounds_ratio],
            "panel_over_recorder_cpu_by_round": [round(x, 3) for x in cpu_ratio["cpu_ms"]],
            "panel_over_recorder_thread_cpu_by_round": [round(x, 3) for x in cpu_ratio["thread_cpu_ms"]],
            # the panel's own work on the training thread (GradientPanel.training_thread_s): sends,
            # encoding, the run's copy for the analysis; the analysis thread's GIL time is not in it
            "panel_training_thread_share_by_block": [
                round(b.get("cb_ms", float("nan")) / b["loop_ms"], 4) for b in by["panel"]
            ],
        }
        tr = out["training"]
        # how each recorder looks for a NaN origin: "auto" keeps the per-module tracer only where it
        # measured it free, and a kept tracer would be the recorder's cost, not the panel's
        tr["tracing"] = kexec("print(json.dumps([rec.tracing_text(), panel.recorder.tracing_text()]))")["out"].strip()
        tr["ratios"] = {
            "step_median_panel/bare": tr["ms_per_step_median"]["panel"] / tr["ms_per_step_median"]["bare"],
            "step_mean_panel/bare": tr["ms_per_step_mean"]["panel"] / tr["ms_per_step_mean"]["bare"],
            "step_median_recorder/bare": tr["ms_per_step_median"]["recorder"] / tr["ms_per_step_median"]["bare"],
            "step_median_panel/recorder": tr["ms_per_step_median"]["panel"] / tr["ms_per_step_median"]["recorder"],
            "step_mean_panel/recorder": tr["ms_per_step_mean"]["panel"] / tr["ms_per_step_mean"]["recorder"],
            "cell_median_panel/recorder": tr["cell_ms_median"]["panel"] / tr["cell_ms_median"]["recorder"],
            "cell_mean_panel/recorder": tr["cell_ms_mean"]["panel"] / tr["cell_ms_mean"]["recorder"],
            "cpu_median_panel/recorder": med(cpu_ratio["cpu_ms"]),
            "thread_cpu_median_panel/recorder": med(cpu_ratio["thread_cpu_ms"]),
        }
        tr["ratios"] = {k: round(v, 3) for k, v in tr["ratios"].items()}
        # traffic and long tasks in the panel's blocks
        comm = [n for b in by["panel"] for n in b["comm"]]
        patches = [n for b in by["panel"] for n in b["patches"]]

        def comm_bytes_other(b):
            rest = list(b["comm"])
            for n in b["patches"]:
                rest.remove(n)
            return rest

        secs = sum(b["wall_ms"] + args.pause_ms for b in by["panel"]) / 1e3
        gw = page.evaluate("() => window.__gw")
        lt = [d for s, d in gw["longtasks"] if any(b["t0"] <= s <= b["t1"] for b in by["panel"])]
        out["traffic"] = {
            "updates": len(comm),
            "updates_per_s": round(len(comm) / secs, 2),
            "bytes_per_update_median": int(med(comm)) if comm else 0,
            "bytes_per_s": int(sum(comm) / secs),
            "bytes_per_new_step": int(sum(comm) / (args.steps * args.rounds)),
            "patches": len(patches),
            "patch_bytes_median": int(med(patches)) if patches else 0,
            "other_messages": sorted(n for b in by["panel"] for n in comm_bytes_other(b)),
            "long_tasks": len(lt),
            "long_task_ms_median": round(med(lt), 1) if lt else 0,
            "long_task_ms_max": round(max(lt), 1) if lt else 0,
        }
        # latency: kernel send of step S -> the label first shows a step >= S
        sends = json.loads(kexec("print(json.dumps(SENDS))")["out"])
        labels = []
        for ts, text in gw["labels"]:
            try:
                labels.append((ts, float(text.split("step ", 1)[1].split(" ", 1)[0].replace(",", ""))))
            except (IndexError, ValueError):
                pass
        lat, newest = [], -1
        kinds: dict = {}
        for _, _, n, kind in sends:
            kinds.setdefault(kind, []).append(n)
        out["traffic"]["kernel_sends"] = {k: {"n": len(v), "median_bytes": int(med(v))} for k, v in kinds.items()}
        for ts, step, _, _ in sends:  # only sends that carry a new step change the label
            if step <= newest:
                continue
            newest = step
            later = [t for t, s in labels if s >= step and t >= ts - 5]
            if later:
                lat.append(min(later) - ts)
        out["latency_ms"] = {
            "sends": len(sends),
            "median": round(med(lat), 1) if lat else None,
            # nearest rank (the floor of 0.9 * (n - 1) read the smallest of two as their 90th percentile)
            "p90": round(sorted(lat)[math.ceil(0.9 * len(lat)) - 1], 1) if lat else None,
        }
        # a big run
        if args.big_layers:
            kexec(f"big = big_run({args.big_layers}, {args.big_steps}); print(big.n_steps)")
            page.wait_for_timeout(500)
            i0 = len(frames)
            t0 = page.evaluate("() => performance.now()")
            page.evaluate(RUN_CELL_JS, 2)
            t_paint = page.wait_for_function(BIG_READY_JS, arg=args.big_layers, polling="raf").json_value()["t"]
            t_table = page.wait_for_function(BIG_TABLE_JS, arg=args.big_layers, polling=50).json_value()["t"]
            page.wait_for_function(KERNEL_IDLE_JS)
            page.wait_for_timeout(2000)
            ks = float(kexec("print(big_kernel_s)")["out"])
            big_bytes = comm_bytes(frames, i0, len(frames))
            out["big"] = {
                "layers": args.big_layers,
                "steps": args.big_steps,
                "cell_kernel_s": round(ks, 3),
                "first_paint_s": round((t_paint - t0) / 1e3, 3),
                "table_s": round((t_table - t0) / 1e3, 3),
                "messages": len(big_bytes),
                "bytes": sum(big_bytes),
                "largest_messages": sorted(big_bytes, reverse=True)[:4],
            }
            out["table_rerender"] = page.evaluate(TABLE_RERENDER_JS)
            kexec("bp.close(); del bp")
        # re-displays
        cdp = page.context.new_cdp_session(page)

        def counts():
            cdp.send("HeapProfiler.collectGarbage")
            cdp.send("HeapProfiler.collectGarbage")
            # the handles live in their own object group, released at once: a handle kept would keep
            # the canvases it lists alive, and the next count would find them again
            g = {"objectGroup": "gw-count"}
            proto = cdp.send("Runtime.evaluate", {"expression": "HTMLCanvasElement.prototype", **g})["result"][
                "objectId"
            ]
            objs = cdp.send("Runtime.queryObjects", {"prototypeObjectId": proto, **g})["objects"]["objectId"]
            n = cdp.send(
                "Runtime.callFunctionOn",
                {"objectId": objs, "functionDeclaration": "function(){return this.length}", "returnByValue": True, **g},
            )["result"]["value"]
            cdp.send("Runtime.releaseObjectGroup", g)
            cdp.send("HeapProfiler.collectGarbage")
            dom = cdp.send("Memory.getDOMCounters")
            heap = cdp.send("Runtime.getHeapUsage")["usedSize"]
            return {
                "canvases": n,
                "heap_mib": round(heap / 2**20, 2),
                "nodes": dom["nodes"],
                "listeners": dom["jsEventListeners"],
            }

        run_cell(1)
        page.wait_for_timeout(1000)
        before = counts()
        half = max(1, args.redisplays // 2)
        mid = before
        for i in range(args.redisplays):
            run_cell(1)
            page.wait_for_timeout(300)
            if i + 1 == half:
                page.wait_for_timeout(1500)
                mid = counts()
        page.wait_for_timeout(1500)
        after = counts()
        # growth over the second half: a leak grows with every re-display, a view kept once does not
        n2 = max(1, args.redisplays - half)
        out["redisplay"] = {
            "before": before,
            "mid": mid,
            "after": after,
            "per_redisplay": {k: round((after[k] - before[k]) / max(1, args.redisplays), 3) for k in before},
            "per_redisplay_second_half": {k: round((after[k] - mid[k]) / n2, 3) for k in before},
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="training steps per block")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of bare / recorder / panel blocks")
    ap.add_argument("--pause-ms", type=int, default=1500, help="pause after each block (trailing timers)")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--big-layers", type=int, default=1000, help="0: skip the big run")
    ap.add_argument("--big-steps", type=int, default=2000)
    ap.add_argument("--redisplays", type=int, default=10)
    args = ap.parse_args(argv)
    t0 = time.time()
    res = run_bench(args)
    res["bench_s"] = round(time.time() - t0, 1)
    tr = res["training"]
    print(
        "ms/step median",
        tr["ms_per_step_median"],
        "mean",
        tr["ms_per_step_mean"],
        "p99",
        tr["ms_per_step_p99"],
        file=sys.stderr,
    )
    print(
        "cell ms median",
        tr["cell_ms_median"],
        "mean",
        tr["cell_ms_mean"],
        "post-cell ms",
        tr["post_cell_ms_median"],
        file=sys.stderr,
    )
    print(
        "ratios", tr["ratios"], "panel/recorder cell by round", tr["panel_over_recorder_cell_by_round"], file=sys.stderr
    )
    print("panel's share of the training thread by block", tr["panel_training_thread_share_by_block"], file=sys.stderr)
    print(
        "panel/recorder CPU by round: process",
        tr["panel_over_recorder_cpu_by_round"],
        "training thread",
        tr["panel_over_recorder_thread_cpu_by_round"],
        file=sys.stderr,
    )
    print("traffic", res["traffic"], "latency", res["latency_ms"], file=sys.stderr)
    if "big" in res:
        print("big run", res["big"], "table", res["table_rerender"], file=sys.stderr)
    print("re-displays", res["redisplay"], file=sys.stderr)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
