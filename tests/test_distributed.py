"""Recording under torch.distributed: 2 CPU processes (gloo) for DDP, FSDP2, FSDP1 and tensor parallelism.

Every distributed run trains the same model on the same global batches as a single process (each
rank takes half of each batch), so the per-layer statistics must equal the single-process ones.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gradwidget import analyze
from gradwidget.storage import RunReader, load_run

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "dist_worker.py"
COMPARED = ("grad_norm", "mean_abs", "max_abs", "std", "zero_frac", "nonfinite", "weight_norm", "update_norm")

pytestmark = pytest.mark.slow  # each test starts processes

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)


def _worker_module():
    spec = importlib.util.spec_from_file_location("gw_dist_worker", WORKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launch:
    """Two worker processes with the rendezvous environment torchrun would give them."""

    def __init__(self, mode: str, log_dir: Path, out_dir: Path, *extra: str, world: int = 2) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        self.out_dir = out_dir
        self.procs = []
        for r in range(world):
            env = dict(
                os.environ,
                RANK=str(r),
                LOCAL_RANK=str(r),
                WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS="1",
                PYTHONPATH=str(ROOT),
            )
            log = open(out_dir / f"rank{r}.log", "wb")
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), mode, str(log_dir), str(out_dir), *extra],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=str(ROOT),
                )
            )
            log.close()

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def wait(self, timeout: float = 180) -> list[dict]:
        deadline = time.monotonic() + timeout
        try:
            for p in self.procs:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"workers timed out; logs:\n{self.logs()}") from None
        codes = [p.returncode for p in self.procs]
        assert codes == [0] * len(codes), f"workers exited with {codes}; logs:\n{self.logs()}"
        return [json.loads((self.out_dir / f"rank{r}.json").read_text()) for r in range(len(self.procs))]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait(timeout=30)

    def logs(self) -> str:
        return "\n".join(
            f"--- rank {r}\n" + (self.out_dir / f"rank{r}.log").read_text(errors="replace")[-3000:]
            for r in range(len(self.procs))
        )


@pytest.fixture
def launch():
    started: list[Launch] = []

    def start(*args, **kw) -> Launch:
        started.append(Launch(*args, **kw))
        return started[-1]

    yield start
    for child in started:  # always reap the children, even when a test failed
        child.kill()


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory):
    """Single-process reference runs (with and without an optimizer), recorded in this process."""
    import torch

    w = _worker_module()
    base = tmp_path_factory.mktemp("single")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        w.train("single", str(base / "opt"), 4, 0.0, 1, 1)
        w.train("single", str(base / "noopt"), 4, 0.0, 1, 1, no_optimizer=True)
        for kind in ("transformer", "even", "block"):
            w.train("single", str(base / kind), 4, 0.0, 1, 1, model_kind=kind)
        w.train("single", str(base / "block-noopt"), 4, 0.0, 1, 1, no_optimizer=True, model_kind="block")
    finally:
        torch.set_num_threads(n)
    return {k: load_run(base / k) for k in ("opt", "noopt", "transformer", "even", "block", "block-noopt")}


def assert_same_statistics(run, ref, rtol=1e-5, hist_from: float = 0.0):
    """Per-layer statistics compared by layer name; histograms must match count for count (for
    |g| >= ``hist_from``: entries at round-off level move between bins with the summation order)."""
    from gradwidget.run import HIST_LOG2_LO

    k0 = max(0, int(np.ceil(np.log2(hist_from))) - HIST_LOG2_LO) if hist_from > 0 else 0
    assert sorted(run.layer_names) == sorted(ref.layer_names)
    np.testing.assert_array_equal(run.steps, ref.steps)
    for name in ref.layer_names:
        i, j = run.layer_index(name), ref.layer_index(name)
        for m in COMPARED:
            a, b = run.metric(m)[:, i], ref.metric(m)[:, j]
            np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-7, err_msg=f"{m} of {name}")
        np.testing.assert_array_equal(run.hist[:, i, k0:], ref.hist[:, j, k0:], err_msg=f"histogram of {name}")
    np.testing.assert_allclose(run.scalar("global_norm"), ref.scalar("global_norm"), rtol=rtol)


def _fsdp1_usable():
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel  # noqa: F401
    except ImportError as e:
        return str(e)
    return None


@pytest.mark.parametrize("mode", ["ddp", "fsdp2", "fsdp1", "plain", "hsdp"])
def test_two_process_run_equals_single_process(mode, launch, single_runs, tmp_path):
    if mode == "fsdp1" and _fsdp1_usable():
        pytest.skip(f"FSDP1 unavailable: {_fsdp1_usable()}")
    log_dir = tmp_path / "run"
    infos = launch(mode, log_dir, tmp_path / "out").wait()
    ref = single_runs["opt"]
    run = load_run(log_dir)
    assert run.n_steps == 4
    assert_same_statistics(run, ref)
    # hsdp: FSDP2 on a 2 x 1 (replicate x shard) mesh, each rank a full replica: counted once
    kind = {"plain": "replicated", "hsdp": "fsdp2"}.get(mode, mode)
    assert run.meta["distributed"] == {"kind": kind, "world_size": 2}
    if kind in ("fsdp2", "fsdp1"):  # the noise scale ("auto") cannot be had there: said, not absent
        assert f"not measured under {kind}" in run.meta["noise_scale"]["unavailable"]
        assert any(f"not measured under {kind}" in n for n in analyze(run).notes)
    # the same names, order, shapes, module types and data-flow edges as the single-process run
    assert [info.to_dict() for info in run.layers] == [info.to_dict() for info in ref.layers]
    np.testing.assert_array_equal(run.edges, ref.edges)
    assert run.meta["model"] == ref.meta["model"] == "Sequential"
    # one run directory, written by rank 0 alone (DDP: with the gradient at two batch sizes)
    noise = ["noise.bin"] if mode == "ddp" else []
    assert sorted(p.name for p in log_dir.iterdir()) == sorted(["hist.bin", "meta.json", "steps.bin", *noise])
    if mode == "ddp":  # rank 0's local gradient (8 rows) and DDP's averaged one (16): the latter is the single run's
        rows = run.noise.rows
        assert list(rows["b_small"]) == [8] * 4 and list(rows["b_big"]) == [16] * 4 and list(rows["n_small"]) == [2] * 4
        cols = [run.layer_index(n) for n in ref.layer_names]
        np.testing.assert_allclose(rows["big_sq"][:, cols], ref.metric("grad_norm") ** 2, rtol=1e-4)
        assert (rows["small_total"] > rows["big_total"]).all()  # half the batch: a noisier gradient
        assert run.meta["noise_scale"]["two_sizes"] == "ddp and accumulation"
    r0, r1 = infos
    assert r0["has_writer"] and r0["has_run"]
    assert not r1["has_writer"] and not r1["has_run"]
    assert r0["kind"] == r1["kind"] == kind
    if kind in ("ddp", "replicated"):
        # the other rank records nothing and sends no collective; rank 0 reads DDP's averaged gradients.
        # It only traces its own NaN origin (module hooks and an optimizer step hook) and posts its
        # replica fingerprints to the store (a second step hook): 8 + 16 bytes x 6 layers a step
        assert r1["grad_hooks"] == 0 and r1["optimizer_hooks"] == 2 and r1["tracer_hooks"] > 0
        assert r0["collectives"] == r1["collectives"] == 0
        assert r1["replica_bytes"] == 4 * (8 + 16 * 6) and r0["replica_bytes"] == 0
        assert r0["origin"] is None  # the run stayed finite
    else:
        from gradwidget.collect.distributed import bytes_per_step

        # two reduces per recorded step (SUM, MAX); 6 layers x (9 partials + their max again + 64
        # histogram bins) x 8 bytes, whatever the number of ranks
        assert r0["collectives"] == r1["collectives"] == 2 * 4
        assert r1["bytes_sent"] == 4 * bytes_per_step(6, with_hist=True) == 4 * 6 * 74 * 8
    # the replica check: healthy replicas agree bit for bit; sharded parameters are never compared
    replicas = run.meta.get("replicas")
    if mode == "ddp" or mode == "plain" or mode == "hsdp":  # hsdp: each rank a full replica
        assert replicas["ranks"] == [0, 1] and replicas["layers_compared"] == 6
        assert replicas["steps_checked"] == 4 and replicas["diverged"] == []
    else:
        assert replicas is None and r1["replica_bytes"] == 0


@pytest.mark.parametrize("mode", ["ddp", "fsdp2", "tp"])
def test_each_rank_traces_its_own_nan_origin_and_rank_0_reports_the_earliest(mode, launch, tmp_path):
    """Rank 1's data holds a NaN at step 2. Rank 0's own forward and backward stay finite (tensor
    parallel: until the row-wise layer's all-reduce, after rank 1's input); it sees the NaN only in
    what is synchronised from rank 1, so the origin it reports (and writes to the run directory) is
    rank 1's: the model's input, step 2."""
    model = ["--model", "even"] if mode == "tp" else []
    infos = launch(mode, tmp_path / "run", tmp_path / "out", "--nan-rank", "1", *model).wait()
    origin = load_run(tmp_path / "run").nonfinite_origin
    assert (origin.module, origin.step, origin.phase, origin.rank) == ("", 2, "input", 1)
    assert origin.module_type == "Sequential" and origin.inputs_finite is False
    assert infos[0]["origin"] == origin.to_dict()
    assert infos[1]["tracer_hooks"] == 0  # rank 1 removed its hooks once it had posted its origin


@pytest.mark.parametrize("mode", ["fsdp2", "fsdp1"])
def test_sharded_transformer_equals_single_process(mode, launch, single_runs, tmp_path):
    """MultiheadAttention's out_proj is used without being called, LayerNorms hold two parameters:
    the names, module order and edges still match; only LayerNorm's weight/bias order differs."""
    if mode == "fsdp1" and _fsdp1_usable():
        pytest.skip(f"FSDP1 unavailable: {_fsdp1_usable()}")
    launch(mode, tmp_path / "run", tmp_path / "out", "--model", "transformer").wait()
    run, ref = load_run(tmp_path / "run"), single_runs["transformer"]
    # in_proj_bias's key part has a mathematically zero gradient: its round-off (~1e-10) entries
    # change bins with the reduction order (as under DDP), so histograms are compared above 1e-6
    assert_same_statistics(run, ref, hist_from=1e-6)
    assert [info.module for info in run.layers] == [info.module for info in ref.layers]
    np.testing.assert_array_equal(run.edges, ref.edges)
    assert all(info.status == "trainable" for info in run.layers)
    moved = [(a.name, b.name) for a, b in zip(run.layers, ref.layers) if a.name != b.name]
    assert moved == [
        ("layer.norm1.weight", "layer.norm1.bias"),
        ("layer.norm1.bias", "layer.norm1.weight"),
        ("layer.norm2.weight", "layer.norm2.bias"),
        ("layer.norm2.bias", "layer.norm2.weight"),
    ]


@pytest.mark.parametrize("model,compared", [("even", 3), ("transformer", 13), ("block", 5)])
def test_tensor_parallel_run_records_the_whole_tensors(model, compared, launch, single_runs, tmp_path):
    """``parallelize_module``'s column-wise and row-wise pieces next to plain layers (block: with
    sequence parallelism's LayerNorm, whose gradients are per-rank parts of a sum). Every rank
    trains on the whole batch, so the whole (logical) tensors are the single process's."""
    infos = launch("tp", tmp_path / "run", tmp_path / "out", "--model", model).wait()
    run = load_run(tmp_path / "run")  # written by rank 0, read back from its folder
    assert run.n_steps == 4 and run.meta["distributed"] == {"kind": "tensor_parallel", "world_size": 2}
    assert_whole_grad_norms(run, infos[0])
    ref = single_runs[model]
    # every statistic and histogram bin, replicated pieces counted once (the transformer's in_proj_bias:
    # above round-off, as in test_sharded_transformer_equals_single_process)
    assert_same_statistics(run, ref, hist_from=1e-6 if model == "transformer" else 0.0)
    assert [info.to_dict() for info in run.layers] == [info.to_dict() for info in ref.layers]  # autograd's order
    # two reduces a step, and the block's two LayerNorm gradients summed (an all-reduce each)
    assert [i["collectives"] for i in infos] == [4 * (4 if model == "block" else 2)] * 2
    # the shards differ by design and are not compared; the replicated parts agree
    replicas = run.meta["replicas"]
    assert (replicas["layers_compared"], replicas["layers_not_compared"]) == (compared, len(ref.layers) - compared)
    assert replicas["steps_checked"] == 4 and replicas["diverged"] == []
    assert [d for d in analyze(run).diagnoses if d.cause == "replicas_diverged"] == []


@pytest.mark.parametrize("mode,model", [("fsdp2", "transformer"), ("tp", "block")])
def test_the_fused_kernel_records_each_ranks_pieces_as_a_single_process_does(
    mode, model, launch, single_runs, tmp_path, monkeypatch
):
    """The accelerator's path on CPU: every rank takes its pieces' statistics as on a GPU, by the fused kernel
    (collect/_fused.py, in Triton's interpreter here), weights and gradients in one launch."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is off (TRITON_INTERPRET is not 1)")
    monkeypatch.setenv("GW_FOREACH_ALL", "1")
    infos = launch(mode, tmp_path / "run", tmp_path / "out", "--model", model).wait()
    assert all(info["fused_kernel"] for info in infos)
    assert_same_statistics(load_run(tmp_path / "run"), single_runs[model], hist_from=1e-6)


def test_fsdp_with_tensor_parallelism_counts_each_piece_once(launch, single_runs, tmp_path):
    """FSDP2 along one dimension of a 2 x 2 mesh, tensor parallelism along the other (4 processes).
    The head lives on the data-parallel sub-mesh only, so every tensor-parallel rank holds a copy of
    it: it still counts once."""
    infos = launch("2d", tmp_path / "run", tmp_path / "out", "--model", "even", world=4).wait()
    run = load_run(tmp_path / "run")
    assert run.meta["distributed"] == {"kind": "fsdp2", "world_size": 4}
    assert_whole_grad_norms(run, infos[0])
    assert_same_statistics(run, single_runs["even"], hist_from=1e-6)
    replicas = run.meta["replicas"]  # only the row-wise bias is replicated along a mesh dimension
    assert replicas["layers_compared"] == 1 and replicas["diverged"] == []


def assert_whole_grad_norms(run, info: dict) -> None:
    """Each recorded gradient norm is the norm of the whole gradient (``DTensor.full_tensor()``) the
    ranks held, as a worker measured it."""
    for step, full in enumerate(info["full_grad_norms"]):
        got = {name: float(run.metric("grad_norm")[step, run.layer_index(name)]) for name in full}
        assert got == pytest.approx(full, rel=1e-5)


@pytest.mark.parametrize("mode,model", [("ddp", "mlp"), ("fsdp2", "mlp"), ("tp", "block")])
def test_without_optimizer_each_backward_is_a_step(mode, model, launch, single_runs, tmp_path):
    # DDP finishes its all-reduce in an end-of-backward callback: the recorder must read after it
    launch(mode, tmp_path / "run", tmp_path / "out", "--no-optimizer", "--model", model).wait()
    run = load_run(tmp_path / "run")
    assert run.n_steps == 4
    assert np.isnan(run.metric("update_norm")).all()
    assert_same_statistics(run, single_runs["noopt" if model == "mlp" else f"{model}-noopt"])


@pytest.mark.parametrize(
    "mode,extra,message",
    [
        ("fsdp1", ["--no-optimizer"], "pass the optimizer"),
        ("fsdp1-flat", [], "use_orig_params=True"),
    ],
)
def test_fsdp1_cases_it_cannot_record_are_refused_with_a_clear_message(mode, extra, message, launch, tmp_path):
    if _fsdp1_usable():
        pytest.skip(f"FSDP1 unavailable: {_fsdp1_usable()}")
    launched = launch(mode, tmp_path / "run", tmp_path / "out", *extra)
    for p in launched.procs:
        p.wait(timeout=180)
    assert all(p.returncode != 0 for p in launched.procs)
    assert message in launched.logs()
    assert not (tmp_path / "run").exists()


def test_sparse_histograms_and_updates_still_one_collective_per_step(launch, single_runs, tmp_path):
    infos = launch(
        "fsdp2", tmp_path / "run", tmp_path / "out", "--steps", "5", "--histogram-every", "2", "--update-every", "3"
    ).wait()
    run = load_run(tmp_path / "run")
    assert run.n_steps == 5
    assert run.hist_steps.tolist() == [0, 2, 4]
    measured = np.isfinite(run.metric("update_norm")).all(axis=1)
    assert measured.tolist() == [True, False, False, True, False]
    from gradwidget.collect.distributed import bytes_per_step

    sent = 3 * bytes_per_step(6, True) + 2 * bytes_per_step(6, False)
    assert [i["collectives"] for i in infos] == [10, 10]
    assert infos[1]["bytes_sent"] == sent


def test_live_reader_sees_steps_arrive_while_the_script_runs(launch, tmp_path):
    log_dir = tmp_path / "run"
    launched = launch("ddp", log_dir, tmp_path / "out", "--steps", "12", "--delay", "0.4")
    deadline = time.monotonic() + 120
    while not (log_dir / "meta.json").exists():
        assert launched.running(), launched.logs()
        assert time.monotonic() < deadline, "no run directory appeared"
        time.sleep(0.05)
    reader = RunReader(log_dir)
    seen = [reader.run.n_steps]
    while launched.running() and time.monotonic() < deadline:
        if reader.poll():
            seen.append(reader.run.n_steps)
        time.sleep(0.05)
    launched.wait()
    reader.poll()
    seen.append(reader.run.n_steps)
    during = sorted(set(seen[:-1]))
    assert len(during) >= 3, f"the reader saw step counts {seen} while the script ran"
    assert seen[-1] == 12
    assert np.isfinite(reader.run.metric("grad_norm")).all()


@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_killing_the_script_mid_run_leaves_a_readable_run(mode, launch, tmp_path):
    log_dir = tmp_path / "run"
    launched = launch(mode, log_dir, tmp_path / "out", "--steps", "200", "--delay", "0.05")
    deadline = time.monotonic() + 120
    while True:
        assert launched.running(), launched.logs()
        assert time.monotonic() < deadline, "no steps were written"
        if (log_dir / "steps.bin").exists() and (log_dir / "steps.bin").stat().st_size > 0:
            if RunReader(log_dir).run.n_steps >= 3:
                break
        time.sleep(0.05)
    launched.kill()
    assert all(p.returncode == -signal.SIGKILL for p in launched.procs)
    run = load_run(log_dir)
    assert 3 <= run.n_steps < 200
    assert np.isfinite(run.metric("grad_norm")).all()
    assert run.steps.tolist() == list(range(run.n_steps))
    # the CLI reports on what the killed script left, after the fact
    from gradwidget.cli import main

    out = tmp_path / "report.html"
    assert main(["report", str(log_dir), "-o", str(out)]) == 0
    html = out.read_text()
    assert f"{run.n_steps} recorded steps" in html and all(name in html for name in run.layer_names)


def test_example_script_under_torchrun_and_the_documented_reader(tmp_path):
    """examples/distributed_train.py under torchrun (DDP and FSDP2); the run it leaves is read back
    with the numpy + pandas code of docs/run-format.md and equals load_run."""
    import re

    for flag in ([], ["--fsdp"]):
        log_dir = tmp_path / ("fsdp" if flag else "ddp")
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={_free_port()}",
            str(ROOT / "examples" / "distributed_train.py"),
            "--log-dir",
            str(log_dir),
            "--steps",
            "12",
            *flag,
        ]
        p = subprocess.run(
            cmd,
            env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        assert "recorded 12 steps of 8 layers" in p.stdout
        run = load_run(log_dir)
        assert run.n_steps == 12 and run.meta["distributed"]["kind"] == ("fsdp2" if flag else "ddp")

        doc = (ROOT / "docs" / "run-format.md").read_text()
        code = re.search(r"## Reading it with numpy and pandas alone\s+```python\n(.*?)```", doc, re.S).group(1)
        ns: dict = {}
        exec(code.replace('Path("runs/x")', f"Path({str(log_dir)!r})"), ns)
        np.testing.assert_array_equal(ns["steps"]["step"], run.steps)
        np.testing.assert_array_equal(ns["grad_norm"].to_numpy(), run.metric("grad_norm"))
        np.testing.assert_array_equal(ns["scalars"]["loss"].to_numpy(), run.scalar("loss"))
        np.testing.assert_array_equal(ns["hists"]["counts"], run.hist)
        frame = run.to_frame()
        np.testing.assert_array_equal(ns["long"]["max_abs"].to_numpy(), frame["max_abs"].to_numpy())
        assert list(ns["long"]["layer"]) == [str(x) for x in frame["layer"]]


def test_a_single_process_never_loads_the_distributed_code(tmp_path):
    code = (
        "import sys, torch\n"
        "from torch import nn\n"
        "from gradwidget.collect.torch import Recorder\n"
        "m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "rec = Recorder(m, opt)\n"
        "for _ in range(2):\n"
        "    opt.zero_grad(); m(torch.randn(3, 4)).sum().backward(); opt.step()\n"
        "assert rec.run.n_steps == 2 and rec._dist is None\n"
        "assert 'gradwidget.collect.distributed' not in sys.modules\n"
        "print('ok')\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]
