"""The package's layers (docs/architecture.md, "The layers"): a module never imports one on a higher layer, not even
inside a function or under ``TYPE_CHECKING``.

The data flows collect -> Run -> analysis -> outputs. In imports, the Run and its folder are the data
model the others build on: the Recorder (collect) makes Runs and writes them; the analysis reads Runs
(and the loss graph that collect records) into a Report; the outputs (text, plots, HTML, the panel, the
CLI) read Runs and Reports. So a Run never renders or analyses itself and a Report never writes HTML:
a function of the higher layer takes them (``gradwidget.summary(run)``, ``gradwidget.write_report(report,
path)``). Every module of the package must be placed below, so a new module is placed on purpose.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import gradwidget

ROOT = Path(gradwidget.__file__).parent

#: rank of each layer, lowest first
LAYERS = ("base", "run", "collect", "analysis", "outputs")
#: the layer of each module or package (the longest matching prefix wins)
PLACE = {
    # shared vocabulary: no gradwidget module above it
    "gradwidget._warnings": "base",
    "gradwidget._args": "base",
    "gradwidget.files": "base",
    "gradwidget.jsonsafe": "base",
    "gradwidget.schema": "base",
    "gradwidget.thresholds": "base",
    "gradwidget.layers": "base",
    "gradwidget.origin": "base",
    "gradwidget.rules": "base",
    "gradwidget._look": "base",
    "gradwidget._scale": "run",
    # the Run and its folder
    "gradwidget.run": "run",
    "gradwidget.run_append": "run",
    "gradwidget.run_views": "run",
    "gradwidget._rows": "run",
    "gradwidget.noise_series": "run",
    "gradwidget.storage": "run",
    # recording
    "gradwidget.collect": "collect",
    "gradwidget.integrations": "collect",
    # Runs in, Reports out
    "gradwidget.analysis": "analysis",
    "gradwidget.comparison": "analysis",
    # what a person reads
    "gradwidget.outputs": "outputs",
    "gradwidget.frames": "outputs",
    "gradwidget.plots": "outputs",
    "gradwidget.report": "outputs",
    "gradwidget.fallback": "outputs",
    "gradwidget.export": "outputs",
    "gradwidget.panel": "outputs",
    "gradwidget.demo": "outputs",
    "gradwidget.cli": "outputs",
    "gradwidget.__main__": "outputs",
    "gradwidget": "outputs",  # the package's own namespace re-exports every layer
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str | None:
    best = None
    for prefix in PLACE:
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best)):
            best = prefix
    return PLACE[best] if best is not None else None


def imported(path: Path, module: str) -> list[tuple[int, str]]:
    """Every gradwidget module ``path`` imports, anywhere in the file, with its line: ``from . import x``
    counts as importing ``pkg.x``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out += [(node.lineno, f"{target}.{a.name}") for a in node.names]  # a submodule or a name in it
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == (
            "import_module"
        ):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                out.append((node.lineno, node.args[0].value))
    return [(line, t) for line, t in out if t == "gradwidget" or t.startswith("gradwidget.")]


def violations() -> list[str]:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        module = module_name(path)
        here = layer_of(module)
        if here is None:
            bad.append(f"{module}: not placed in a layer (add it to PLACE in {Path(__file__).name})")
            continue
        for line, target in imported(path, module):
            there = layer_of(target)
            if there is not None and LAYERS.index(there) > LAYERS.index(here):
                bad.append(f"{path.relative_to(ROOT.parent)}:{line}: {module} ({here}) imports {target} ({there})")
    return bad


def test_no_module_imports_one_on_a_higher_layer():
    assert violations() == []


def test_the_check_sees_an_import_inside_a_function(tmp_path, monkeypatch):
    """The walk finds a lazy import of a higher layer (the pattern this test exists to stop)."""
    fake = tmp_path / "gradwidget"
    (fake / "analysis").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "analysis" / "__init__.py").write_text("")
    (fake / "analysis" / "x.py").write_text("def to_html(r, p):\n    from ..report import write_report\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    assert violations() == [
        "gradwidget/analysis/x.py:2: gradwidget.analysis.x (analysis) imports gradwidget.report.write_report (outputs)"
    ]


def test_the_figures_never_import_the_panel():
    """``plots`` draws what the panel's static copy shows, below the panel: the words and colours
    both use live in ``gradwidget._look``, so a figure never loads the widget."""
    bad = []
    for path in sorted((ROOT / "plots").rglob("*.py")):
        module = module_name(path)
        bad += [
            f"{module}:{line} imports {t}" for line, t in imported(path, module) if t.startswith("gradwidget.panel")
        ]
    assert bad == []


def test_the_live_panel_never_imports_the_figures():
    """The panel draws in the page; its colour scale, rows and static copy are numpy
    (``gradwidget._scale``, ``gradwidget._rows``, ``panel/static.py``): only the comparison's static
    image draws a matplotlib figure (``plots``), where one is asked for."""
    bad = []
    for path in sorted((ROOT / "panel").rglob("*.py")):
        module = module_name(path)
        if module == "gradwidget.panel.compare_widget":
            continue
        bad += [
            f"{module}:{line} imports {t}" for line, t in imported(path, module) if t.startswith("gradwidget.plots")
        ]
    assert bad == []


def test_the_panel_modules_import_no_circle():
    """No panel module imports one that imports it back, directly or through others, not even inside a
    function: the widget composes its parts, and a part (``compare_widget``'s comparison among them)
    never imports the widget."""
    mods = {module_name(p): p for p in sorted((ROOT / "panel").rglob("*.py"))}

    def module_of(target: str) -> str | None:
        hits = [m for m in mods if target == m or (target.startswith(m + ".") and m != "gradwidget.panel")]
        return max(hits, key=len) if hits else None

    graph = {m: {module_of(t) for _, t in imported(p, m)} - {None, m} for m, p in mods.items()}
    assert "gradwidget.panel.compare_widget" in graph["gradwidget.panel.widget"]  # the check sees the edge

    def circle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        seen = set()
        while stack:
            m, path = stack.pop()
            for n in sorted(graph.get(m, ())):
                if n == start:
                    return [*path, n]
                if n not in seen:
                    seen.add(n)
                    stack.append((n, [*path, n]))
        return None

    circles = [c for c in map(circle_from, sorted(graph)) if c is not None]
    assert circles == []
