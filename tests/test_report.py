"""The health table HTML and the self-contained report (file, CLI, and offline in Chromium)."""

import html as htmllib
import re

import numpy as np
import pytest

from gradwidget import analyze
from gradwidget import report as gwreport
from gradwidget.storage import load_run
from gw_browser import IMAGES_JS, TABLE_LAYERS_JS, offline_page
from test_plots import LAYERS, pathological_run


def need_analysis():
    mod = pytest.importorskip("gradwidget.analysis")
    if not hasattr(mod, "analyze"):
        pytest.skip("gradwidget.analysis.analyze is not in this tree yet")
    return mod.analyze


@pytest.fixture(scope="module")
def run():
    return pathological_run()


@pytest.fixture(scope="module")
def rep(run):
    return need_analysis()(run)


def test_health_table_html_lists_layers_in_depth_order(rep):
    out = gwreport.health_table_html(rep)
    assert out.startswith('<table class="gradwidget-health"') and out.endswith("</table>")
    assert re.findall(r'data-layer="([^"]+)"', out) == list(LAYERS)
    assert "<script" not in out and "<style" not in out and "http" not in out  # inline styles only
    for h in set(rep.layers["health"]):
        assert f">{h}</td>" in out
    crit = rep.layers.set_index("layer")["health"]
    assert crit["broken"] in ("Critical", "Warning") and crit["vanish"] in ("Critical", "Warning")


def test_health_table_html_escapes_and_caps_rows(rep):
    df = rep.layers.copy()
    df.loc[0, "layer"] = "<b>evil</b>"

    class R:
        layers = df
        overall_health = "Critical"

    out = gwreport.health_table_html(R(), max_rows=2)
    assert "<b>evil</b>" not in out and htmllib.escape("<b>evil</b>") in out
    assert out.count("<tr data-layer=") == 2 and f"first 2 of {len(df)} layers" in out
    assert "overall: Critical" in out


def test_health_table_html_accepts_a_run(run, rep):
    assert re.findall(r'data-layer="([^"]+)"', gwreport.health_table_html(run)) == list(LAYERS)
    with pytest.raises(TypeError, match="Report"):
        gwreport.health_table_html(42)


def test_static_mimebundle_holds_image_and_table(run, rep):
    b = gwreport.static_mimebundle(run, step=10)
    import base64

    png = base64.b64decode(b["image/png"])
    assert png[:4] == b"\x89PNG"
    assert 'class="gradwidget-static"' in b["text/html"] and b["image/png"] in b["text/html"]
    assert re.findall(r'data-layer="([^"]+)"', b["text/html"]) == list(LAYERS)
    assert b["text/plain"].startswith("Gradient Flow Animation") and "vanish" in b["text/plain"]
    assert gwreport.static_mimebundle(None) == {
        "text/html": '<div class="gradwidget-static"><p style="font-family:sans-serif;color:#666">'
        "GradientPanel: no step recorded yet</p></div>"
    }


def test_write_report_sections_and_self_containment(tmp_path, run, rep):
    path = gwreport.write_report(rep, tmp_path / "sub" / "r.html")
    text = path.read_text()
    for anchor in ("summary", "recommendations", "flow", "health", "distributions", "weights", "thresholds"):
        assert f'id="{anchor}"' in text
    assert not re.search(r'(src|href)="(?!data:|#)', text), "nothing is loaded from outside the file"
    assert "@import" not in text and "url(" not in text
    imgs = re.findall(r'<img class="fig" alt="([^"]+)" src="data:image/png;base64,', text)
    assert "weight health" in imgs and text.count('class="gradwidget-panel-image"') == 1  # the static panel
    worst = gwreport.worst_layers(rep, 4)
    assert {"vanish", "hot", "broken"} <= set(worst)
    for name in worst:
        assert f"histogram of {name}" in imgs
    assert rep.summary_text().splitlines()[0] in htmllib.unescape(text)


def test_write_report_and_cli(tmp_path):
    from gradwidget.cli import main
    from gradwidget.collect.arrays import ArrayRecorder

    need_analysis()
    rng = np.random.default_rng(1)
    rec = ArrayRecorder(log_dir=tmp_path / "run", histogram_every=3)
    for s in range(12):
        rec.record(s, {"first": rng.normal(0, 1e-9, 16), "last": rng.normal(0, 1e-2, 16)}, loss=1 / (s + 1))
    rec.close()
    out = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "run"), "-o", str(out)]) == 0
    text = out.read_text()
    assert 'data-layer="first"' in text and 'data-layer="last"' in text
    out2 = tmp_path / "r2.html"
    gwreport.write_report(analyze(load_run(tmp_path / "run")), out2)
    assert 'data-layer="first"' in out2.read_text()
    assert main(["report", str(tmp_path / "missing"), "-o", str(out)]) == 2


def test_main_report_refuses_an_empty_run(tmp_path):
    from gradwidget.run import Run
    from gradwidget.storage import save_run

    save_run(Run(["a"]), tmp_path / "empty")
    with pytest.raises(ValueError, match="no recorded steps"):
        gwreport.main_report(tmp_path / "empty", tmp_path / "x.html")
    assert not (tmp_path / "x.html").exists()


@pytest.mark.browser
def test_report_opens_complete_offline_in_chromium(tmp_path, run, rep):
    path = gwreport.write_report(rep, tmp_path / "report.html")
    with offline_page() as (page, blocked):
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        imgs = page.evaluate(IMAGES_JS)
        layers = page.evaluate(TABLE_LAYERS_JS)
        headings = page.eval_on_selector_all("h2", "els => els.map(e => e.textContent)")
        badge = page.text_content(".badge")
    assert blocked == [], f"the report tried to fetch {blocked}"
    assert len(imgs) >= 6
    for im in imgs:
        assert im["complete"] and im["w"] > 100 and im["h"] > 50 and im["visible"], im
    assert layers == list(LAYERS)
    assert headings[:3] == ["Summary", "Recommendations", "Gradient flow"]
    assert any("Weight" in h for h in headings) and any("Distributions" in h for h in headings)
    assert badge.strip() == gwreport._enum_text(rep.overall_health)


def test_weight_section_with_and_without_weight_arrays(run):
    analyze = need_analysis()
    rng = np.random.default_rng(3)
    plain = gwreport.render_report(analyze(run))
    section = plain[plain.index('id="weights"') : plain.index('id="thresholds"')]
    assert "Update / weight drift" in section and 'alt="weight health"' in section
    weights = {n: rng.normal(0, 1, 64) for n in run.layer_names}
    weights["hot"][:3] = 1e4  # outliers
    full = gwreport.render_report(analyze(run, weights=weights))
    section = full[full.index('id="weights"') : full.index('id="thresholds"')]
    assert "Weights: 5 layers" in htmllib.unescape(section)
    assert section.count("<tr>") > 5 and "hot" in section


def _summary_of(text: str) -> tuple[str, str]:
    """(the summary section before its disclosure, the disclosure) of a report page, unescaped."""
    sec = text.split('<h2 id="summary">', 1)[1].split("<h2 ", 1)[0]
    head, _, more = sec.partition("<details")
    return htmllib.unescape(head), htmllib.unescape(more)


def test_the_summary_of_a_healthy_run_says_so_in_plain_words(tmp_path):
    """A healthy real run: the verdict says nothing was found, the loss's progress agrees with it,
    and the original crate's stability score, outlook and critical path sit behind a disclosure,
    not in a monospace dump."""
    pytest.importorskip("torch")
    from torch import nn

    from gradwidget.demo import build_demo, train_demo

    model, opt, data = build_demo(depth=3, width=16, activation=nn.ReLU, lr=0.02)
    rep = analyze(train_demo(60, model=model, optimizer=opt, data=data).run)
    assert not rep.diagnoses
    head, more = _summary_of(gwreport.write_report(rep, tmp_path / "r.html").read_text())
    assert "<pre" not in head
    assert f"Healthy: nothing found in {rep.run.n_steps} recorded steps." in head
    assert "the loss is falling" in head
    for jargon in ("Stability", "outlook", "decades", "Critical path"):
        assert jargon not in head and jargon in more, jargon
    assert more.startswith(' class="more"><summary>More analyses')


def test_the_summary_of_a_broken_run_never_contradicts_its_verdict(tmp_path):
    """Labels shuffled apart from their inputs: the loss falls a little (to chance level) while the
    model learns nothing. The verdict names that, the diagnoses follow as sentences with their
    actions, and no sentence judges the loss as falling or rising; its slope is given as numbers
    behind the disclosure."""
    pytest.importorskip("torch")
    import torch
    from torch import nn
    from torch.nn import functional as F

    from test_analysis_objective import _train

    torch.manual_seed(0)
    centers = torch.randn(4, 10) * 3
    labels = torch.arange(512) % 4
    inputs = centers[labels] + torch.randn(512, 10)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def batch(i):
        g = torch.Generator().manual_seed(i)
        return inputs[torch.randperm(512, generator=g)[:64]], labels[torch.randperm(512, generator=g)[:64]]

    rep = analyze(_train(model, opt, batch, lambda b: F.cross_entropy(model(b[0]), b[1]), 120))
    top = rep.diagnoses[0]
    assert top.cause == "learns_nothing"
    s = rep.summary_parts()
    assert (
        s.verdict
        == f"{top.priority}: {top.title}"
        + (f" since step {top.first_step}" if top.first_step is not None else "")
        + "."
    )
    assert s.progress == "" and len(s.diagnoses) == min(6, len(rep.diagnoses))
    assert s.diagnoses[0].startswith(f"{top.priority}: ") and top.action[1:] in s.diagnoses[0]
    text = rep.summary_text()
    assert "is falling" not in text and "is rising" not in text
    assert any(t.startswith("The loss's slope over the run: ") for t in s.more)
    head, more = _summary_of(gwreport.write_report(rep, tmp_path / "r.html").read_text())
    assert s.verdict in head and top.action[1:] in head and "learns nothing" in head
    assert "decades" not in head and "decades" in more
