"""Score gradwidget's diagnoses on the zoo: every case (cached), ``gradwidget.analyze(run)``, the
findings per case in rank order, then false alarms on healthy runs, cause accuracy (first, first
two), layer recall/precision, detection step, a confusion table and analysis times.

    python bench/diagnosis.py [--fast | --heldout | --field] [--case SUBSTR] [--no-cache] [--jobs N] [--cache-dir DIR]
    python bench/diagnosis.py --table [...]    # the zoo itself: losses, gradient ranges, no analysis
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

import zoo  # noqa: E402 (needs the sys.path above)
from zoo import score  # noqa: E402 (needs the sys.path above)
from zoo.checks import HEALTHY_FALL_T, fall_t  # noqa: E402 (needs the sys.path above)


def _diagnose(args: tuple) -> tuple[str, list, float, float, float, str | None]:
    """Run (or load) one case, check its labels, analyse it: (id, findings, loss ratio, training
    seconds, analysis seconds, label problem). Module level so worker processes can run it."""
    case, cache_dir, no_cache = args
    import torch

    from gradwidget import Thresholds, analyze

    torch.set_num_threads(1)
    try:
        run = zoo.run_case(case, cache_dir) if no_cache else zoo.load_or_run(case, cache_dir)
    except zoo.PendingCase as e:
        return case.id, None, float("nan"), float("nan"), 0.0, f"PENDING {case.id}: {e}"
    problem = None
    try:
        if no_cache:
            twin = zoo.run_case(case, cache_dir, twin=True) if case.cause in zoo.TWIN_CAUSES else None
            zoo.check_case(case, run, twin)
        else:
            zoo.check(case, run, cache_dir)
    except AssertionError as e:
        problem = str(e)
    t = time.perf_counter()
    # the current defaults, not the thresholds the cached run was recorded with (meta.json keeps those)
    report = analyze(run, thresholds=Thresholds())
    dt = time.perf_counter() - t
    train_s = float(run.meta.get("zoo_train_seconds", float("nan")))
    return case.id, score.findings_of(report), zoo.loss_ratio(run), train_s, dt, problem


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--fast", action="store_true", help="only the FAST subset")
    which.add_argument(
        "--heldout", action="store_true", help="the held-out cases (mistakes on other seeds, archs, magnitudes) instead"
    )
    which.add_argument(
        "--field",
        action="store_true",
        help="the field corpus instead: healthy loops installed packages run themselves (bench/field_corpus)",
    )
    ap.add_argument("--case", default="", help="only cases whose id contains this")
    ap.add_argument("--no-cache", action="store_true", help="train every case again, write no cache")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (the machine is shared: 1)")
    ap.add_argument("--cache-dir", default=str(zoo.DEFAULT_CACHE))
    ap.add_argument(
        "--table", action="store_true", help="print each case's losses and gradient range instead of diagnosing it"
    )
    a = ap.parse_args(argv)
    if a.jobs < 1:
        ap.error("--jobs must be at least 1")
    if a.field:
        return field_main(a.case, a.cache_dir, a.no_cache)
    cases = [c for c in (zoo.FAST if a.fast else zoo.HELDOUT if a.heldout else zoo.CASES) if a.case in c.id]
    if not cases:
        ap.error(f"no zoo case id contains {a.case!r}")
    t0 = time.perf_counter()
    if a.table:
        for c in cases:
            print(case_row(c, zoo.run_case(c) if a.no_cache else zoo.load_or_run(c, a.cache_dir)))
        print(f"{len(cases)} cases in {time.perf_counter() - t0:.1f} s")
        return 0
    print(
        f"{len(cases)} held-out cases: no bound is set from these"
        if a.heldout
        else f"{len(cases)} calibration cases (zoo.CASES: bounds are set and checked on these)"
    )
    work = [(c, a.cache_dir, a.no_cache) for c in cases]
    with ProcessPoolExecutor(a.jobs) if a.jobs > 1 else _Serial() as ex:
        results, problems, pending = _report_each(ex.map(_diagnose, work), {c.id: c for c in cases})
    wall = time.perf_counter() - t0
    print()
    print(summary(results))
    print(f"\n{len(results)} cases in {wall:.1f} s; {len(results) - len(problems)} labels hold their checks")
    if pending:
        print(f"{len(pending)} cases pending (not scored):\n  " + "\n  ".join(pending))
    if problems:
        print(f"{len(problems)} label checks failed:\n  " + "\n  ".join(problems))
    return 1 if problems else 0


def field_main(substr: str, cache_dir: str, no_cache: bool) -> int:
    """Score the field corpus: each case trained (or loaded), its health checked, analysed with
    the current defaults; every Critical/High/Medium finding is a false alarm, printed with its text.
    A case whose package is missing is skipped, saying what to install. 1 when a case did not
    train healthily."""
    import torch

    import field_corpus
    from gradwidget import Thresholds, analyze

    cases = [c for c in field_corpus.FIELD if substr in c.id]
    if not cases:
        print(f"no field case id contains {substr!r}", file=sys.stderr)
        return 2
    print(f"{len(cases)} field cases (healthy training written by others: every finding above Low is a false alarm)")
    torch.set_num_threads(1)
    results, rows, unhealthy, skipped = [], [], [], []
    for c in cases:
        reason = c.skip_reason()
        if reason:
            skipped.append(f"{c.id}: {reason}")
            print(f"{c.id}  [{c.package}]  skipped: {reason}")
            continue
        run = field_corpus.run_case(c) if no_cache else field_corpus.load_or_run(c, cache_dir)
        health = field_corpus.health_of(run)
        t = time.perf_counter()
        report = analyze(run, thresholds=Thresholds())
        dt = time.perf_counter() - t
        found = score.findings_of(report)
        results.append(score.Result(zoo.Case(c.id, c.package, "", 0, zoo.HEALTHY, None), found, dt))
        print(f"{c.id}  [{c.package}: {c.task}]  train {run.meta['field_cpu_seconds']:.1f} s CPU  {health}")
        for d in report.diagnoses:
            print(
                f"    {score.finding_of(d)}"
                + (
                    f"\n        {d.text} {d.evidence}\n        action: {d.action}"
                    if d.priority in score.ALARM_PRIORITIES
                    else ""
                )
            )
        if not found:
            print("    (nothing reported)")
        if not health.healthy:
            unhealthy.append(f"{c.id}: {health}")
        rows.append((c, health, found))
    print("\n| case | package | healthy metric | findings |\n| --- | --- | --- | --- |")
    for c, health, found in rows:
        print(f"| {c.id} | {c.package} | {health} | {'; '.join(map(str, found)) or 'none'} |")
    print()
    print(summary(results))
    if skipped:
        print(f"{len(skipped)} cases skipped:\n  " + "\n  ".join(skipped))
    if unhealthy:
        print(
            f"{len(unhealthy)} cases did not train healthily (their findings are not false alarms):\n  "
            + "\n  ".join(unhealthy)
        )
    return 1 if unhealthy else 0


def case_row(case, run) -> str:
    """One line about a case's run: label, loss (first 10 -> last 10 steps), whether it fell as a
    healthy run must, training time, the smallest and largest layer (median gradient norm), and the
    first step with a non-finite gradient or loss."""
    import numpy as np

    loss = run.scalar("loss")
    g = run.metric("grad_norm")
    med = np.array([np.median(c[np.isfinite(c)]) if np.isfinite(c).any() else np.nan for c in g.T])
    lo, hi = (int(np.nanargmin(med)), int(np.nanargmax(med))) if np.isfinite(med).any() else (0, 0)
    bad = np.nonzero((run.metric("nonfinite").sum(axis=1) > 0) | ~np.isfinite(loss))[0]
    ratio, t = zoo.loss_ratio(run), fall_t(run)
    fell = "nan" if not np.isfinite(ratio) else "falls" if t >= HEALTHY_FALL_T else "flat/up"
    return (
        f"{case.id:38s} {case.cause or 'healthy':17s} loss {np.mean(loss[:10]):8.3g} -> "
        f"{np.mean(loss[-10:]):8.3g} ({fell:7s}) train {run.meta.get('zoo_train_seconds', float('nan')):4.1f} s"
        f"  |g| min {med[lo]:.1e} {run.layer_names[lo]}  max {med[hi]:.1e} {run.layer_names[hi]}"
        + (f"  non-finite from step {run.steps[bad[0]]}" if len(bad) else "")
    )


class _Serial:
    """In-process stand-in for an executor (``--jobs 1``)."""

    map = staticmethod(map)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def _report_each(outs, by_id: dict) -> tuple[list, list, list]:
    """Print each case's findings as it arrives; return the Results, the label-check failures and the
    pending cases (gradwidget cannot record them yet: not scored)."""
    results, problems, pending = [], [], []
    for cid, found, ratio, train_s, dt, problem in outs:
        case = by_id[cid]
        if found is None:
            pending.append(problem)
            print(f"{cid}  [{case.cause}]  {problem}")
            continue
        results.append(score.Result(case, found, dt))
        label = "healthy" if case.healthy else case.cause
        print(f"{cid}  [{label}]  loss last/first {ratio:.2f}  train {train_s:.1f} s  analyse {1000 * dt:.0f} ms")
        for f in found:
            print(f"    {f}")
        if not found:
            print("    (nothing reported)")
        if problem:
            problems.append(problem)
            print(f"    LABEL CHECK FAILED: {problem}")
    return results, problems, pending


def summary(results: list) -> str:
    """The totals as text."""
    out = []
    healthy = [r for r in results if r.case.healthy]
    fa = score.false_alarms(results)
    out.append(f"== healthy runs: {len(fa)} of {len(healthy)} with a Critical/High/Medium finding (false alarms)")
    worst = [min(score.ALARM_PRIORITIES.index(f.priority) for f in r.alarms) for r in fa]
    out.append(
        "   by their highest priority: "
        + ", ".join(f"{p} {worst.count(i)}" for i, p in enumerate(score.ALARM_PRIORITIES))
    )
    out += [f"   {r.case.id}: " + "; ".join(str(f) for f in r.alarms) for r in fa]
    acc = score.cause_accuracy(results)
    if acc["n"]:
        out.append(
            f"== mistakes ({acc['n']}): right cause first {_pct(acc['top1'])}, within the first two {_pct(acc['top2'])}; "
            f"right cause first at Medium or above {_pct(acc['top1_alarm'])}"
        )
        out.append(
            "   per cause (first / first two / cases): "
            + ", ".join(f"{c} {a}/{b}/{n}" for c, (a, b, n) in score.by_cause(results).items())
        )
        byid = {r.case.id: r for r in results}
        out += [
            f"   miss {i} [{byid[i].case.cause}]: first reported {byid[i].first_cause}"
            + ("" if byid[i].rank is None else f", right cause at rank {byid[i].rank + 1}")
            for i in acc["misses"]
        ]
        out += [f"   found only at Low {i} [{byid[i].case.cause}]" for i in acc["low_only"]]
    ls = score.layer_scores(results)
    if ls["n"]:
        out.append(
            f"== layer-specific mistakes ({ls['n']}): recall {ls['recall']:.2f}, "
            f"precision {ls['precision']:.2f} (first matching finding's layers vs fault_layers)"
        )
        out += [
            f"   {i}: recall {rc:.2f} precision {pr:.2f}" for i, (rc, pr) in ls["per_case"].items() if rc < 1 or pr < 1
        ]
    det = score.detection(results)
    if det["steps"]:
        out.append(
            f"== detection: {len(det['steps']) - len(det['slow'])} of {len(det['steps'])} found "
            f"causes first apply before step {det['limit']}"
        )
        out += [
            f"   slow {i}: first_step {det['steps'][i]}" + (" (slow onset)" if i in det["expected"] else "")
            for i in det["slow"]
        ]
    out.append("== confusion (rows: true cause; columns: first reported cause)")
    out.append(score.format_confusion(score.confusion(results)))
    times = sorted(r.seconds for r in results)
    if times:
        out.append(
            f"== analyse time per run: median {1000 * times[len(times) // 2]:.0f} ms, "
            f"max {1000 * times[-1]:.0f} ms, total {sum(times):.1f} s"
        )
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
