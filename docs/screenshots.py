"""Screenshots for the README and docs/exporting.md, made from the current build:

* ``report``: the HTML report of the demo run (``report.png``);
* ``panel``, ``gpt2``: the live panel in JupyterLab on the demo (``panel.png``) and on a Hugging Face
  GPT-2 (tiny config) trained with a learning rate 30x too high (``panel_gpt2.png``, the zoo's case);
* ``bert``: the live panel on a small random-init BERT-style classifier trained with the Hugging Face
  ``Trainer`` and ``GradwidgetCallback``, at a learning rate that works (``panel_bert.png``) and 50x
  higher (``panel_bert_lr.png``);
* ``exports``, ``exports_gpt2``: a notebook executed headless (nbclient) and exported, its static
  panel photographed: plain ``nbconvert --to html`` without the widget state (``static.png``,
  ``static_gpt2.png``) and ``nbconvert --to gradwidget`` with it (``exported.png``,
  ``exported_gpt2.png``); the demo's notebook is the README's workflow (the panel shown before
  training), the GPT-2's opens the run of ``gpt2`` (``GradientPanel.from_run``).

    python docs/screenshots.py [--out docs] [--steps 200] [--only report|panel|gpt2|bert|exports|exports_gpt2]

Each is photographed in headless Chromium with the network off; ``tests/test_screenshots.py``
runs this and checks what each drew.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "browser")]
from gw_browser import ARGS, CHROMIUM, offline_page  # noqa: E402  (the tests' Chromium setup)

#: what the panel cell runs in JupyterLab.
PANEL_CELL = """from gradwidget import GradientPanel
panel = GradientPanel.from_run({run!r})
panel"""

#: pixels of every visible canvas in the first widget output: how many are not background.
CANVAS_JS = """() => Array.from(document.querySelectorAll('.jp-OutputArea-output canvas'))
  .filter(c => c.width > 0 && c.height > 0 && c.getBoundingClientRect().height > 0)
  .map(c => {
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let painted = 0;
    for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0) painted++;
    return {w: c.width, h: c.height, painted};
  })"""


def train(run_dir: Path, steps: int) -> None:
    import torch

    from gradwidget.demo import train_demo

    torch.set_num_threads(1)
    train_demo(steps, log_dir=run_dir, overwrite=True)


def shoot_report(run_dir: Path, out: Path, work: Path) -> dict:
    from gradwidget import analyze, write_report
    from gradwidget.storage import load_run

    html = work / "report.html"
    write_report(analyze(load_run(run_dir)), html)
    with offline_page(viewport={"width": 1200, "height": 1500}) as (page, blocked):
        page.goto(html.as_uri())
        page.wait_for_load_state("load")
        page.screenshot(path=str(out / "report.png"))
        n_images = page.evaluate("() => Array.from(document.images).filter(i => i.naturalWidth > 0).length")
    return {
        "report_html": str(html),
        "report_png": str(out / "report.png"),
        "blocked": blocked,
        "report_images": n_images,
    }


def train_gpt2(run_dir: Path) -> str:
    """The zoo's GPT-2 case with a learning rate 30x too high, saved as a run directory; its id."""
    sys.path.insert(0, str(ROOT / "bench"))
    import torch
    from zoo import CASES, run_case  # bench/zoo: the diagnosis corpus (real models, real mistakes)

    torch.set_num_threads(1)
    case = next(c for c in CASES if c.arch == "gpt2" and c.mistake == "lr_too_high")
    run_case(case).save(run_dir, overwrite=True)
    return case.id


#: the learning rate that trains ``train_bert``'s classifier (to 99% accuracy in 150 steps), and 50x it.
BERT_LR = 5e-4
BERT_LR_HIGH = 50 * BERT_LR


def train_bert(run_dir: Path, lr: float, steps: int = 150, seed: int = 0) -> dict:
    """A small random-init BERT-style classifier (2 layers, d64) trained by the Hugging Face
    ``Trainer`` with ``GradwidgetCallback(log_dir=run_dir)`` (AdamW, linear decay) on token
    sequences whose label says whether token 7 occurs more often than token 8; its training loss
    and its accuracy on 512 of its sequences."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    from gradwidget.integrations.transformers import GradwidgetCallback

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=200,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        num_labels=2,
    )
    model = BertForSequenceClassification(cfg)
    g = torch.Generator().manual_seed(seed)
    n, seq = 2048, 24
    ids = torch.randint(5, 200, (n, seq), generator=g)
    label = torch.randint(0, 2, (n,), generator=g)
    extra = torch.randint(1, 5, (n,), generator=g)
    for i in range(n):  # 1-4 more of the label's token, in random places; [CLS] first
        ids[i, : extra[i]] = 7 if label[i] else 8
        ids[i] = ids[i][torch.randperm(seq, generator=g)]
    ids[:, 0] = 2
    mask = torch.ones(seq, dtype=torch.long)
    data = [{"input_ids": ids[i], "attention_mask": mask, "labels": int(label[i])} for i in range(n)]
    args = TrainingArguments(
        output_dir=str(Path(run_dir).parent / f"{Path(run_dir).name}-trainer"),
        per_device_train_batch_size=32,
        max_steps=steps,
        learning_rate=lr,
        logging_steps=steps,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=seed,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[GradwidgetCallback(log_dir=run_dir)])
    loss = trainer.train().training_loss
    model.eval()
    with torch.no_grad():
        pred = model(input_ids=ids[:512], attention_mask=mask.expand(512, seq)).logits.argmax(-1)
    return {"loss": float(loss), "accuracy": float((pred == label[:512]).float().mean())}


#: how many steps the exported demo notebook trains.
DEMO_STEPS = 120

#: the README's workflow: the panel shown before training, the loop in the next cell.
DEMO_CELLS = [
    """import torch
from gradwidget import GradientPanel
from gradwidget.demo import build_demo, train_demo
torch.manual_seed(0)
model, opt, data = build_demo()
panel = GradientPanel(model, opt)
panel""",
    f"run = train_demo({DEMO_STEPS}, recorder=panel, model=model, optimizer=opt, data=data)",
]


def demo_layers() -> list[str]:
    """The names of the demo model's parameters: the layers its panel must name."""
    from gradwidget.demo import build_demo

    return [name for name, _ in build_demo()[0].named_parameters()]


def notebook(cells: list[str]):
    """A notebook of code ``cells`` for the python3 kernel."""
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def execute(cells: list[str], timeout: float):
    """A notebook of ``cells`` executed headless by nbclient, which saves the widget state as
    ``jupyter nbconvert --execute`` does."""
    from nbclient import NotebookClient

    nb = notebook(cells)
    NotebookClient(nb, timeout=int(timeout), kernel_name="python3").execute()
    return nb


def export_plain(nb) -> str:
    """Plain ``nbconvert --to html`` of the notebook without its widget state (as GitHub, or a
    front end that keeps no widget state, has it)."""
    from nbconvert import HTMLExporter

    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    return HTMLExporter().from_notebook_node(nb)[0]


def export_gradwidget(nb) -> str:
    """``nbconvert --to gradwidget`` (the package's exporter) of the notebook, widget state kept."""
    from gradwidget.export import export_html

    return export_html(copy.deepcopy(nb))


#: the exported pictures: file stem -> how the page is made.
EXPORTS = {"static": export_plain, "exported": export_gradwidget}

#: what the first visible static panel of the page shows: the layer names beside the heatmap, each
#: diagnosis (its head line, its action, whether either is cut off), the health table's rows, the image.
STATIC_JS = """() => {
  const s = Array.from(document.querySelectorAll('.gradwidget-static')).find(e => e.offsetParent !== null);
  if (!s) return null;
  const whole = e => e.scrollWidth <= e.clientWidth + 1;
  const img = s.querySelector('img.gradwidget-panel-image');
  const box = s.getBoundingClientRect();
  return {
    title: s.firstElementChild.textContent,
    names: Array.from(s.querySelectorAll('svg text title'), t => t.textContent),
    diagnoses: Array.from(s.querySelectorAll('.gradwidget-diagnosis'), d => ({
      head: d.children[0].textContent, action: d.children[1].textContent,
      evidence: d.querySelector('details') !== null, whole: whole(d.children[0]) && whole(d.children[1])})),
    rows: Array.from(s.querySelectorAll('table.gradwidget-health tr[data-layer]'), tr => tr.dataset.layer),
    image: {w: img.naturalWidth, h: img.naturalHeight, shown_w: img.width, shown_h: img.height},
    box: {w: Math.round(box.width), h: Math.round(box.height)},
    in_export_wrap: s.closest('.gradwidget-export') !== null,
  };
}"""


def photograph_static(html: Path, png: Path) -> dict:
    """The page's visible static panel, photographed offline, and what it shows (``STATIC_JS``)."""
    with offline_page(viewport={"width": 1000, "height": 1400}) as (page, blocked):
        page.goto(html.as_uri())
        page.wait_for_load_state("load")
        seen = page.evaluate(STATIC_JS)
        if seen is None:
            raise SystemExit(f"{html}: no visible static panel")
        page.locator(".gradwidget-static:visible").first.screenshot(path=str(png))
    # nbconvert's template asks a CDN for require.js, MathJax and (with widget state) html-manager:
    # refused here; the static panel needs none of them
    return {"png": str(png), "blocked": blocked, "seen": seen}


def shoot_exports(cells: list[str], expect: dict, out: Path, work: Path, suffix: str = "") -> dict:
    """Execute ``cells`` headless, export the notebook each way of ``EXPORTS`` and photograph its
    static panel (``static{suffix}.png``, ``exported{suffix}.png``). ``expect``: what the trained
    run is (its ``layers`` and ``last_step``), passed on for the tests to check the pictures with."""
    from gradwidget.export import WIDGET_STATE

    nb = execute(cells, timeout=300)
    shots: dict = {"expect": expect}
    for stem, export in EXPORTS.items():
        body = export(nb)
        html = work / f"{stem}{suffix}.html"
        html.write_text(body, encoding="utf-8")
        shots[stem] = photograph_static(html, out / f"{stem}{suffix}.png") | {"widget_state": WIDGET_STATE in body}
    return shots


def shoot_panel(run_dir: Path, out: Path, work: Path, timeout: float = 180, name: str = "panel.png") -> dict:
    import nbformat
    from playwright.sync_api import sync_playwright

    from lab import KERNEL_READY_JS, jupyter_lab  # tests/browser/lab.py: the e2e tests' JupyterLab

    nbformat.write(notebook([PANEL_CELL.format(run=str(run_dir))]), work / "panel.ipynb")
    ms = timeout * 1000
    with jupyter_lab(work, timeout=timeout) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            ctx = browser.new_context(viewport={"width": 1500, "height": 1800})  # the whole panel in view
            ctx.route(
                "**/*", lambda r: r.continue_() if r.request.url.startswith((base, "data:", "blob:")) else r.abort()
            )
            page = ctx.new_page()
            page.goto(f"{base}/lab/tree/panel.ipynb", timeout=ms)
            page.wait_for_function(KERNEL_READY_JS, timeout=ms)
            page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for_function(
                """() => Array.from(document.querySelectorAll('.jp-OutputArea-output canvas'))
                                          .some(c => c.width > 0 && c.getBoundingClientRect().height > 0)""",
                timeout=ms,
            )
            page.wait_for_timeout(1500)  # let the first frames settle
            canvases = page.evaluate(CANVAS_JS)
            root = page.locator(".gw-root")
            target = root.first if root.count() else page.locator(".jp-OutputArea-output").last
            target.screenshot(path=str(out / name))
            diagnoses = page.evaluate("() => Array.from(document.querySelectorAll('.gw-dhead'), d => d.textContent)")
            verdict = page.evaluate("() => document.querySelector('.gw-verdict')?.textContent ?? ''")
            # the health table's layer names, as shown (each row's distinct label) and whole (its tooltip)
            names = page.evaluate(
                "() => Array.from(document.querySelectorAll('.gw-health td.gw-name'), "
                "td => [td.textContent.replace(/^[▸▾]\\s*/, '').trim(), td.title || ''])"
            )
        finally:
            browser.close()
    return {
        "panel_png": str(out / name),
        "canvases": canvases,
        "diagnoses": diagnoses,
        "verdict": verdict,
        "names": names,
    }


#: what ``--only`` picks: each makes the pictures named in the module's docstring.
PICTURES = ["report", "panel", "gpt2", "bert", "exports", "exports_gpt2"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs"), help="folder for the PNGs")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--only", choices=PICTURES, help="make one group of screenshots only")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = [args.only] if args.only else PICTURES
    with tempfile.TemporaryDirectory(prefix="gradwidget-shots-") as tmp:
        work = Path(tmp)
        run_dir, gpt2 = work / "demo-run", work / "gpt2-run"
        info: dict = {}
        if "report" in wanted or "panel" in wanted:
            train(run_dir, args.steps)
        if "report" in wanted:
            info.update(shoot_report(run_dir, out, work))
            info.pop("report_html")
        if "panel" in wanted:
            info.update(shoot_panel(run_dir, out, work))
        if "gpt2" in wanted or "exports_gpt2" in wanted:
            info["gpt2_case"] = train_gpt2(gpt2)
        if "gpt2" in wanted:
            info["gpt2"] = shoot_panel(gpt2, out, work, name="panel_gpt2.png")
        if "bert" in wanted:
            for key, lr, name in (("bert", BERT_LR, "panel_bert.png"), ("bert_lr", BERT_LR_HIGH, "panel_bert_lr.png")):
                trained = train_bert(work / f"{key}-run", lr)
                info[key] = shoot_panel(work / f"{key}-run", out, work, name=name) | {"trained": trained, "lr": lr}
        if "exports" in wanted:
            expect = {"layers": demo_layers(), "last_step": DEMO_STEPS - 1}
            info["exports"] = shoot_exports(DEMO_CELLS, expect, out, work)
        if "exports_gpt2" in wanted:
            from gradwidget.storage import load_run

            run = load_run(gpt2)
            expect = {"layers": run.layer_names, "last_step": int(run.steps[-1])}
            info["exports_gpt2"] = shoot_exports([PANEL_CELL.format(run=str(gpt2))], expect, out, work, "_gpt2")
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
