"""Readers of a live run: while training appends in another thread (the README's threaded
pattern), every reader (to_frame, to_ascii, summary, analyze, export, the panel's copy) sees one
consistent snapshot: ``Run.snapshot()``, views bounded by the last complete step."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch import nn

from gradwidget import Recorder, analyze, summary
from gradwidget.collect.arrays import ArrayRecorder
from gradwidget.outputs import to_ascii
from gradwidget.run import METRICS, N_BINS, Run


class TinyEncoder(nn.Module):
    """A small transformer encoder classifier: embedding, one encoder layer, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.enc = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True, dropout=0.0)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)).mean(1))


def _train_in_thread(rec: Recorder, model: nn.Module, opt, steps: int) -> threading.Thread:
    g = torch.Generator().manual_seed(0)
    xs = torch.randint(0, 32, (steps, 8, 6), generator=g)
    ys = torch.randint(0, 4, (steps, 8), generator=g)

    def train() -> None:
        for i in range(steps):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xs[i]), ys[i])
            loss.backward()
            rec.log(loss=loss)
            opt.step()

    t = threading.Thread(target=train)
    t.start()
    return t


def _consistent(snap: Run) -> None:
    n, L = snap.n_steps, snap.n_layers
    assert snap.steps.shape == (n,)
    assert all(snap.metric(m).shape == (n, L) for m in METRICS)
    assert snap.scalar("loss").shape == (n,)
    assert np.all(np.diff(snap.steps) > 0)
    assert snap.hist.shape == (len(snap.hist_steps), L, N_BINS)
    assert np.isin(snap.hist_steps, snap.steps).all()


@pytest.mark.parametrize("max_steps", [None, 7])  # 7: a rolling window that slides and folds history
def test_every_reader_is_consistent_while_training_appends(max_steps):
    torch.manual_seed(0)
    model = TinyEncoder()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt, histogram_every=1, max_steps=max_steps, update_every=1)
    t = _train_in_thread(rec, model, opt, steps=80)
    reads = 0
    try:
        while rec.run is None and t.is_alive():
            t.join(0.001)
        while t.is_alive() or reads < 4:
            run = rec.run
            snap = run.snapshot()
            _consistent(snap)
            df = run.to_frame()
            assert len(df) % run.n_layers == 0
            assert df["step"].is_monotonic_increasing
            text = to_ascii(run)
            assert isinstance(text, str) and repr(run).startswith("<Run")
            if reads % 4 == 0:  # the heavier readers less often: the machine is shared
                rep = analyze(run)
                assert len(rep.layers) == run.n_layers
                assert summary(run).overall_health is not None
            if max_steps is None:
                # a complete step's update norm is in the snapshot, never the open row's NaNs
                assert not np.isnan(snap.metric("update_norm")[:, snap.trainable_mask()]).any()
            reads += 1
    finally:
        t.join()
        rec.detach()
    assert reads >= 4
    _consistent(rec.run.snapshot())


def test_a_snapshot_never_changes_while_the_run_appends_slides_and_folds():
    rec = ArrayRecorder(max_steps=5, histogram_every=1)
    rng = np.random.default_rng(0)
    for s in range(3):
        rec.record(s, {"w": rng.normal(size=8), "b": rng.normal(size=3)})
    snap = rec.run.snapshot()
    before = (snap.steps.copy(), snap._M3.copy(), snap._S2.copy(), snap.hist.copy(), snap.hist_steps.copy())
    for s in range(3, 60):  # slides the window back to row 0 many times, grows, folds into history
        rec.record(s, {"w": rng.normal(size=8), "b": rng.normal(size=3)})
    after = (snap.steps, snap._M3, snap._S2, snap.hist, snap.hist_steps)
    for x, y in zip(before, after):
        np.testing.assert_array_equal(x, y)
    assert snap.snapshot() is snap
    with pytest.raises(ValueError, match="read-only"):
        snap.append(99, np.zeros((len(METRICS), 2)))
    assert not snap.steps.flags.writeable


def test_an_open_step_is_left_out_until_complete():
    run = Run(["a", "b"])
    run.append(0, np.ones((len(METRICS), 2)))
    run.append(1, np.ones((len(METRICS), 2)), hist=np.ones((2, N_BINS), np.uint32), complete=False)
    assert run.n_steps == 2  # the recorder sees its row ...
    snap = run.snapshot()
    assert snap.n_steps == 1 and len(snap.hist_steps) == 0  # ... readers do not, histogram included
    run.set_last(METRICS.index("update_norm"), np.array([0, 1]), np.array([2.0, 3.0]))
    run.complete_last()
    snap = run.snapshot()
    assert snap.n_steps == 2 and list(snap.hist_steps) == [1]
    assert list(snap.metric("update_norm")[1]) == [2.0, 3.0]
    with pytest.raises(ValueError, match="complete=False"):
        run.set_last(0, np.array([0]), np.array([1.0]))


def test_a_run_pickles_and_copies_without_its_lock():
    import copy
    import pickle

    run = Run(["a"])
    run.append(0, np.ones((len(METRICS), 1)))
    for r in (pickle.loads(pickle.dumps(run)), copy.deepcopy(run), copy.copy(run)):
        assert r._lock is not run._lock
        r.append(1, np.ones((len(METRICS), 1)))
        assert r.n_steps == 2
