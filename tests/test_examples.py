"""The integration examples run: each notebook in examples/ top to bottom in a real kernel (its
panel is a widget view, its numbers printed), and each script from the command line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: notebook -> (library it needs, text its outputs must contain)
NOTEBOOKS = {
    "hf_trainer": ("transformers", "recorded 20 steps of 20; clipped at 1.0"),
    "lightning": ("lightning", "recorded 30 steps of 30; layers: net.0."),
    "accelerate": ("accelerate", "recorded 20 steps; layers: 0.weight, 0.bias, 2.weight"),
}
SCRIPTS = {"hf_trainer.py": "transformers", "lightning_train.py": "lightning", "accelerate_train.py": "accelerate"}

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _env() -> dict:
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        MPLBACKEND="Agg",
    )


def _texts(nb) -> str:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", ""))
            out.extend(str(v) for k, v in o.get("data", {}).items() if k == "text/plain")
    return "\n".join(out)


@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_integration_notebook_runs_and_shows_a_panel(tmp_path, name):
    lib, expected = NOTEBOOKS[name]
    pytest.importorskip(lib)
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    shutil.copytree(EXAMPLES, tmp_path, dirs_exist_ok=True, ignore=shutil.ignore_patterns("runs"))
    nb = nbformat.read(tmp_path / f"{name}.ipynb", as_version=4)
    old = dict(os.environ)
    os.environ.update(_env())  # the kernel inherits it
    try:
        NotebookClient(
            nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert any(WIDGET_VIEW in o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])), (
        "no GradientPanel view in the outputs"
    )
    text = _texts(nb)
    assert expected in text, text[-2000:]
    assert "recommend" in text.lower()  # the run's summary, printed by the last cell


def test_example_notebooks_are_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    for name in NOTEBOOKS:
        nb = nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), name


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_example_script_writes_a_run_directory(tmp_path, script):
    pytest.importorskip(SCRIPTS[script])
    from gradwidget import load_run

    out = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--log-dir", str(tmp_path / "run"), "--steps", "4"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run = load_run(tmp_path / "run")
    assert run.n_steps == 4 and run.n_layers > 0
    assert "Recommendations" in out.stdout


def test_accelerate_example_under_ddp_records_on_rank_0(tmp_path):
    """Two CPU processes (torchrun, gloo): accelerate wraps the model in DDP, the plain Recorder
    records the averaged gradients on rank 0 only, which alone writes the run directory."""
    pytest.importorskip("accelerate")
    from gradwidget import load_run

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        str(EXAMPLES / "accelerate_train.py"),
        "--log-dir",
        str(tmp_path / "run"),
        "--steps",
        "3",
    ]
    out = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    run = load_run(tmp_path / "run")
    assert run.n_steps == 3 and run.meta["distributed"] == {"kind": "ddp", "world_size": 2}
    assert run.layer_names[0] == "0.weight"  # no "module." prefix
    assert out.stdout.count("Recommendations") == 1  # one rank printed a summary
