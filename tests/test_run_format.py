"""Run format 2: every non-finite count exact (16,777,217 NaNs read 16,777,217, not the float32
16,777,216) and 64-bit histogram counts, from the recorder through memory, the folder, the
tables, the analysis and the panel; format-1 folders (float32 counts of NaNs, uint32 histogram
counts) still load, are never continued, and the marker and version errors say what to do."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from torch import nn

from gradwidget import Recorder, Run, analyze, load_run
from gradwidget.outputs import export_csv
from gradwidget.panel import payload as P
from gradwidget.panel.protocol import encode
from gradwidget.schema import METRICS, N_BINS, SCALARS
from gradwidget.storage import FORMAT_VERSION, RunFormatError, RunReader, RunWriter, hist_dtype, save_run, step_dtype

#: one more NaN than float32 can count: float32(16_777_217) == 16_777_216
NANS = 2**24 + 1
#: a histogram bin's count past what uint32 holds
BIG = 2**32 + 7

#: the format-1 records, written out here as they were (not from gradwidget), so the test pins them
V1_SCALARS = [("step", "<i8")] + [(s, "<f8") for s in SCALARS]


def v1_step_dtype(n_layers: int) -> np.dtype:
    return np.dtype(V1_SCALARS + [(m, "<f4", (n_layers,)) for m in METRICS])


def v1_hist_dtype(n_layers: int) -> np.dtype:
    return np.dtype([("step", "<i8"), ("counts", "<u4", (n_layers, N_BINS))])


def as_format_1(path, keep_version_key: bool = True) -> None:
    """Rewrite the format-2 run in ``path`` in format 1, with the old dtypes."""
    meta = json.loads((path / "meta.json").read_text())
    L = len(meta["layers"])
    for name, new, old in (
        ("steps.bin", step_dtype(L), v1_step_dtype(L)),
        ("hist.bin", hist_dtype(L), v1_hist_dtype(L)),
    ):
        recs = np.frombuffer((path / name).read_bytes(), new)
        out = np.zeros(len(recs), old)
        for field in old.names:
            out[field] = recs[field]
        (path / name).write_bytes(out.tobytes())
    if keep_version_key:
        meta["version"] = 1
    else:
        del meta["version"]
    (path / "meta.json").write_text(json.dumps(meta))


def test_the_writer_writes_format_2():
    assert FORMAT_VERSION == 2
    assert step_dtype(3)["nonfinite"].base == np.dtype("<f8")
    assert step_dtype(3)["grad_norm"].base == np.dtype("<f4")
    assert hist_dtype(3)["counts"].base == np.dtype("<u8")
    assert step_dtype(3).itemsize == 8 + 3 * 8 + (7 * 4 + 8) * 3
    assert hist_dtype(3).itemsize == 8 + 8 * 3 * N_BINS


class Fan(nn.Module):
    """One input fanned out to 2**24 + 1 outputs: a NaN input makes every weight gradient NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.fan = nn.Linear(1, NANS, bias=False)
        self.head = nn.Linear(4, 1)

    def forward(self, x, z):
        return self.fan(x).sum() + self.head(z).sum()


def test_16777217_nans_are_counted_exactly_from_the_recorder_to_the_folder_tables_and_analysis(tmp_path):
    torch.manual_seed(0)
    model = Fan()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    rec = Recorder(model, opt, log_dir=tmp_path / "run", histogram_every=1, trace_nonfinite=False)
    try:
        for x in (torch.ones(1, 1), torch.full((1, 1), float("nan"))):
            opt.zero_grad()
            model(x, torch.ones(1, 4)).backward()
            opt.step()
    finally:
        rec.detach()
    j = rec.run.layer_index("fan.weight")
    live = rec.run.metric("nonfinite")
    assert live.dtype == np.float64
    assert int(live[1, j]) == NANS and int(live[0, j]) == 0
    assert int(np.float32(NANS)) == NANS - 1  # what format 1 kept
    run = load_run(tmp_path / "run")
    assert int(run.metric("nonfinite")[1, j]) == NANS
    assert int(run.metric("nonfinite")[1, run.layer_index("head.weight")]) == 0
    # derived runs and tables keep it
    assert int(run.slice(layers=["fan.weight"]).metric("nonfinite")[1, 0]) == NANS
    assert int(run.downsample_by(2).metric("nonfinite")[0, j]) == NANS
    assert int(run.merge_layers([[0, 1, 2]], ["all"]).metric("nonfinite")[1, 0]) == NANS
    assert int(run.to_frame().query("layer == 'fan.weight'")["nonfinite"].iloc[1]) == NANS
    export_csv(run, tmp_path / "run.csv")
    with open(tmp_path / "run.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["layer"] == "fan.weight"]
    assert rows[1]["nonfinite"] == str(NANS)
    # the analysis counts them exactly too
    report = analyze(run)
    texts = [d.evidence for d in report.diagnoses] + [e for d in report.diagnoses for e in d.explains]
    assert any(f"{NANS} entries" in t for t in texts), texts


def test_a_histogram_count_above_2_32_round_trips_a_folder_and_reaches_the_panel_unwrapped(tmp_path):
    run = Run(["embed.weight", "proj.weight"])
    hist = np.zeros((2, N_BINS), np.uint64)
    hist[0, 30], hist[1, 31] = BIG, 3
    values = np.ones((len(METRICS), 2))
    values[METRICS.index("nonfinite")] = [NANS, 0]
    run.append(5, values, {"loss": 1.0}, hist)
    assert run.hist.dtype == np.uint64 and int(run.hist[0, 0, 30]) == BIG
    save_run(run, tmp_path / "saved")
    w = RunWriter(tmp_path / "live", run, live=True)  # the Recorder's writer
    w.append_new()
    w.close()
    for path in ("saved", "live"):
        back = load_run(tmp_path / path)
        assert int(back.hist[0, 0, 30]) == BIG and int(back.hist[0, 1, 31]) == 3
        assert int(back.metric("nonfinite")[0, 0]) == NANS
    # the panel sends histograms as float64: exact, never wrapped to 7
    _, arrays = P.detail_view(run, 5, 0)
    assert np.frombuffer(encode("hists", arrays["hists"]), np.float64)[30] == BIG
    _, arrays = P.heat_view(run, "grad_norm", 100)
    assert np.frombuffer(encode("hist_all", arrays["hist_all"]), np.float64).reshape(2, N_BINS)[0, 30] == BIG


def test_the_nonfinite_counts_have_one_owner_the_exact_column_never_the_float32_block():
    nf = METRICS.index("nonfinite")
    run = Run(["a", "b", "c"])
    for step in range(4):
        values = np.ones((len(METRICS), 3))
        values[nf] = [NANS, 0, np.nan]  # c: no gradient
        run.append(step, values, {"loss": 1.0}, complete=step != 3)
    run.set_last(nf, np.array([1]), np.array([NANS + 2.0]))  # the open step, filled in later
    run.complete_last()
    for r in (run, run.slice(layers=["a", "b"]), run.downsample_by(2), run.merge_layers([[0, 1]], ["ab"])):
        assert np.isnan(r.block()[:, nf]).all()  # never a rounded second copy
        assert r.metric("nonfinite").dtype == np.float64
    assert run.metric("nonfinite")[:, 0].tolist() == [NANS] * 4
    assert run.metric("nonfinite")[-1, 1] == NANS + 2 and run.metric("nonfinite")[0, 1] == 0
    assert int(run.merge_layers([[0, 1]], ["ab"]).metric("nonfinite")[-1, 0]) == 2 * NANS + 2
    # the panel's detail row takes the exact column, sent as float64
    _, arrays = P.detail_view(run, 3, 0)
    d = arrays["detail"][nf]
    assert d.dtype == np.float64 and d[0] == NANS and d[1] == NANS + 2 and np.isnan(d[2])


def _recorded(path, steps: int = 4):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv1d(2, 3, 3), nn.Flatten(), nn.Linear(3 * 6, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    rec = Recorder(model, opt, log_dir=path, histogram_every=2, trace_nonfinite=False)
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(5, 2, 8, generator=g)).pow(2).mean().backward()
        opt.step()
    rec.detach()
    return model, opt, rec.run


@pytest.mark.parametrize("keep_version_key", [True, False], ids=["version 1", "no version key"])
def test_a_format_1_folder_still_loads(tmp_path, keep_version_key):
    path = tmp_path / "old"
    _, _, run = _recorded(path)
    as_format_1(path, keep_version_key)
    assert (path / "steps.bin").stat().st_size == run.n_steps * v1_step_dtype(run.n_layers).itemsize
    old = load_run(path)
    reader = RunReader(path)
    assert reader.format_version == 1
    np.testing.assert_array_equal(old.steps, run.steps)
    for m in METRICS:
        np.testing.assert_array_equal(old.metric(m), run.metric(m), err_msg=m)
    np.testing.assert_array_equal(old.hist, run.hist)
    np.testing.assert_array_equal(old.hist_steps, run.hist_steps)
    assert old.hist.dtype == np.uint64  # a format-1 count is held in 64 bits like any other


def test_resuming_a_format_1_folder_is_refused_and_the_copy_it_names_resumes(tmp_path):
    path = tmp_path / "old"
    model, opt, run = _recorded(path)
    as_format_1(path)
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    with pytest.raises(ValueError, match="run format 1") as e:
        Recorder(model, opt, log_dir=path, resume=True, trace_nonfinite=False)
    message = str(e.value)
    copy = f"{path}-v2"
    assert f"gradwidget.load_run({str(path)!r}).save({copy!r})" in message
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before  # nothing in the folder changed
    load_run(path).save(copy)  # what the message says
    rec = Recorder(model, opt, log_dir=copy, resume=True, trace_nonfinite=False)
    try:
        opt.zero_grad()
        model(torch.randn(5, 2, 8)).pow(2).mean().backward()
        opt.step()
    finally:
        rec.detach()
    resumed = load_run(copy)
    assert resumed.steps.tolist() == run.steps.tolist() + [int(run.steps[-1]) + 1]
    assert json.loads((tmp_path / "old-v2" / "meta.json").read_text())["version"] == 2


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(format="tensorboard"), "not a gradwidget run description: its \"format\" is 'tensorboard'"),
        (dict(version=3), "written by a newer gradwidget \\(run format 3; this gradwidget reads formats 1 to 2\\)"),
        (dict(version=0), '"version" must be a positive integer, got 0'),
        (dict(version=True), '"version" must be a positive integer, got True'),
        (dict(version=1.5), '"version" must be a positive integer, got 1.5'),
    ],
)
def test_format_marker_and_version_errors_say_what_is_wrong(tmp_path, change, match):
    run = Run(["a.weight"])
    run.append(0, np.ones((len(METRICS), 1)))
    save_run(run, tmp_path / "r")
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    meta.update(change)
    (tmp_path / "r" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(RunFormatError, match=match):
        load_run(tmp_path / "r")
