"""What gradwidget writes and prints never harms what is already there: every file output refuses to
replace an existing file (or a link) without ``force`` (one rule, ``storage.check_output_file``);
layer names carrying terminal escape sequences are printed escaped by the command line; the demo
never writes into a folder of the user's other files, ``--force`` or not."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from gradwidget import Recorder, analyze, compare, load_run
from gradwidget.cli import main, terminal_safe
from gradwidget.outputs import export_csv, export_json
from gradwidget.report import write_comparison, write_report

#: a layer name that would clear the screen, set the window title and recolour the terminal
HOSTILE = "\x1b[2J\x1b]0;owned\x07\x1b[31mred\u202e"


def _run_dir(path, seed: int = 0, middle: str = HOSTILE):
    torch.manual_seed(seed)
    model = nn.Sequential()
    model.add_module("embed", nn.EmbeddingBag(20, 8))
    model.add_module(middle, nn.Linear(8, 8))
    model.add_module("head", nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(seed)
    with Recorder(model, opt, log_dir=path, trace_nonfinite=False) as rec:
        for _ in range(6):
            x, y = torch.randint(0, 20, (4, 5), generator=g), torch.randint(0, 3, (4,), generator=g)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            rec.log(loss=loss)
            opt.step()
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    return _run_dir(base / "a"), _run_dir(base / "b", seed=1, middle="mid")  # b: the layer renamed


def test_terminal_safe_escapes_control_characters_and_keeps_layout():
    assert terminal_safe("a\x1b[31mb\x07c\rd\u202ee\n\tf") == "a\\x1b[31mb\\x07c\\rd\\u202ee\n\tf"
    assert terminal_safe("Ünïcödé layer.weight") == "Ünïcödé layer.weight"


@pytest.mark.parametrize("command", ["ascii", "compare", "report"])
def test_the_command_line_prints_escape_sequences_in_names_escaped(runs, tmp_path, capsys, command):
    a, b = runs
    assert HOSTILE + ".weight" in load_run(a).layer_names  # the name is recorded as it is
    argv = {
        "ascii": ["ascii", str(a)],
        "compare": ["compare", str(a), str(b)],
        "report": ["report", str(a), "-o", str(tmp_path / "r.html")],
    }[command]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "\x1b" not in out + err and "\x07" not in out + err and "\u202e" not in out + err
    if command != "report":  # (the report's terminal line names no layer)
        assert "\\x1b]0;owned\\x07" in out


def _writers(runs, tmp_path):
    a, b = runs
    run = load_run(a)
    report = analyze(run)
    cmp = compare(str(a), str(b))

    def html(path, force):
        nbformat = pytest.importorskip("nbformat")
        from gradwidget.export import export_html

        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# a run")])
        export_html(nb, path, force=force)

    return {
        "write_report": lambda p, force: write_report(report, p, force=force),
        "export_csv": lambda p, force: export_csv(run, p, force=force),
        "export_json": lambda p, force: export_json(run, p, force=force),
        "Report.to_json": lambda p, force: report.to_json(p, force=force),
        "write_comparison": lambda p, force: write_comparison(cmp, p, force=force),
        "export_html": html,
    }


@pytest.mark.parametrize(
    "writer", ["write_report", "export_csv", "export_json", "Report.to_json", "write_comparison", "export_html"]
)
def test_every_file_output_replaces_an_existing_file_only_with_force(runs, tmp_path, writer):
    write = _writers(runs, tmp_path)[writer]
    mine = tmp_path / "mine.out"
    mine.write_text("the user's own file")
    with pytest.raises(FileExistsError, match=r"mine.out exists; pass force=True to replace it"):
        write(mine, False)
    assert mine.read_text() == "the user's own file"
    target = tmp_path / "target.txt"
    target.write_text("kept")
    link = tmp_path / "link.out"
    os.symlink(target, link)
    with pytest.raises(FileExistsError, match="exists"):
        write(link, False)  # a link there counts as a file there
    assert target.read_text() == "kept"
    write(mine, True)
    assert mine.read_text() != "the user's own file"
    write(tmp_path / "new.out", False)  # a new file needs nothing
    assert (tmp_path / "new.out").stat().st_size > 0
    with pytest.raises(TypeError, match="force must be True or False"):
        write(tmp_path / "other.out", "yes")


def test_report_with_force_replaces_its_file(runs, tmp_path, capsys):
    out = tmp_path / "r.html"
    out.write_text("old")
    assert main(["report", str(runs[0]), "-o", str(out)]) == 2
    assert "pass --force to replace it" in capsys.readouterr().err and out.read_text() == "old"
    assert main(["report", str(runs[0]), "-o", str(out), "--force"]) == 0
    assert out.read_text() != "old"


def test_demo_never_writes_into_a_folder_of_other_files_even_with_force(tmp_path, capsys):
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "notes.md").write_text("mine")
    (mine / "data").mkdir()
    before = sorted(p.name for p in mine.iterdir())
    assert main(["demo", "--steps", "3", "--out", str(mine), "--quiet", "--force"]) == 2
    err = capsys.readouterr().err
    assert "holds other files and is not a gradwidget run" in err and "--force or not" in err
    assert sorted(p.name for p in mine.iterdir()) == before
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["demo", "--steps", "3", "--out", str(empty), "--quiet", "--force"]) == 0
    assert load_run(empty).n_steps == 3
