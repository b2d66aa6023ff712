"""The original crate's flow-animator outputs of a Run: JSON frames, CSV timeline, ASCII heatmap, summary report.

Two deliberate departures from the original crate (docs/architecture.md): layers keep the model's depth order instead
of being sorted by name, and the ASCII heatmap uses one log scale across all steps instead of
normalising each step by its own maximum (which hid network-wide vanishing).
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from enum import Enum

import numpy as np

from ._scale import log_levels
from .jsonsafe import number
from .run import Run


def _json_number(x: float) -> float | None:
    """A value in the JSON frames: null where not finite, as the original crate's serde wrote it."""
    return number(x, inf="null")  # type: ignore[return-value]


#: the original crate's CSV columns, first, as it wrote them ...
CSV_COLUMNS = ("step", "layer", "mean_abs_grad", "max_abs_grad", "grad_norm", "is_vanishing", "is_exploding")
#: ... then every other recorded metric and the step's scalars, so a CSV carries the whole run.
CSV_MORE = ("std", "zero_frac", "nonfinite", "weight_norm", "update_norm", "loss", "lr", "global_norm")
BLOCKS = " ░▒▓█"
MARK_EXPLODING = "!"
MARK_NONFINITE = "X"


class GradientHealth(str, Enum):
    """The verdict, in the one vocabulary of every output (``analysis.causes.verdict``; the original
    crate's MinorIssues / ProblemsDetected are gone: one run, one word)."""

    HEALTHY = "Healthy"
    WARNING = "Warning"
    CRITICAL = "Critical"
    #: an empty run has nothing to judge (the original crate called one Healthy)
    UNKNOWN = "Unknown"


@dataclass
class GradientFlowSummary:
    total_steps: int
    first_step: int | None
    last_step: int | None
    layers_with_vanishing_grads: list[str]
    layers_with_exploding_grads: list[str]
    layers_with_nonfinite_grads: list[str]
    issue_step_ratio: float
    overall_health: GradientHealth
    recommendations: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["overall_health"] = self.overall_health.value
        return d

    def __str__(self) -> str:
        lines = [
            f"Gradient flow summary: {self.overall_health.value}",
            f"  steps recorded: {self.total_steps}"
            + (f" (steps {self.first_step}..{self.last_step})" if self.total_steps else ""),
            f"  steps with an issue: {self.issue_step_ratio:.0%}",
        ]
        # the layers the diagnoses name: the same count the panel, the report and analyze() give
        for label, names in (
            ("vanishing", self.layers_with_vanishing_grads),
            ("exploding", self.layers_with_exploding_grads),
            ("non-finite", self.layers_with_nonfinite_grads),
        ):
            if names:
                lines.append(f"  {label} layers ({len(names)}): {', '.join(names)}")
        lines.append("Recommendations:")
        lines += [f"  - {r}" for r in self.recommendations]
        return "\n".join(lines)


def frames(run: Run) -> list[dict]:
    """The original crate's ``GradientFrame`` list: one dict per step with one entry per layer."""
    run = run.snapshot()  # a consistent view while training appends (Run.snapshot)
    mean, mx, norm = run.metric("mean_abs"), run.metric("max_abs"), run.metric("grad_norm")
    van, exp, inten = run.vanishing(), run.exploding(), run.flow_intensity()
    names = run.layer_names
    out = []
    for i, step in enumerate(run.steps.tolist()):
        out.append(
            {
                "step": step,
                "layers": [
                    {
                        "name": n,
                        "mean_abs_grad": _json_number(mean[i, j]),
                        "max_abs_grad": _json_number(mx[i, j]),
                        "grad_norm": _json_number(norm[i, j]),
                        "is_vanishing": bool(van[i, j]),
                        "is_exploding": bool(exp[i, j]),
                        "flow_intensity": float(inten[i, j]),
                    }
                    for j, n in enumerate(names)
                ],
            }
        )
    return out


def export_json(run: Run, path, force: bool = False) -> None:
    """Write the frames as JSON (non-finite numbers become null); an existing file is replaced
    only with ``force``."""
    from .storage import atomic_output

    with atomic_output(path, force) as f:
        json.dump(frames(run), f, indent=1)


#: first characters that make a spreadsheet (Excel, LibreOffice, Google Sheets) read a cell as a formula
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(text: str) -> str:
    """A text cell a spreadsheet shows as text: one that would start a formula gets a leading
    apostrophe (OWASP's advice for CSV injection), so a layer named ``=HYPERLINK(...)`` stays a name."""
    return "'" + text if text.startswith(FORMULA_START) else text


def _cell(x: float) -> str:
    """A number for the CSV: empty where nothing was recorded (NaN), as written otherwise."""
    return "" if x != x else f"{x:.8e}"


def _count_cell(x: float) -> str:
    """A count for the CSV (the non-finite entries): empty where nothing was recorded (NaN), else
    its whole number, every digit of it."""
    return "" if x != x else str(int(x))


def export_csv(run: Run, path, force: bool = False) -> None:
    """Write the CSV timeline, one row per step and layer: the original crate's columns first
    (``CSV_COLUMNS``), then every other metric and the step's loss, learning rate and global norm
    (``CSV_MORE``; empty where not recorded). Layer names made ``spreadsheet_safe``. An existing
    file is replaced only with ``force``."""
    from .storage import check_output_file

    check_output_file(path, force)  # before the work
    run = run.snapshot()  # a consistent view while training appends (Run.snapshot)
    mean, mx, norm = run.metric("mean_abs"), run.metric("max_abs"), run.metric("grad_norm")
    van, exp = run.vanishing(), run.exploding()
    more = [run.metric(m) for m in CSV_MORE[:5]]
    scal = [run.scalar(s) for s in CSV_MORE[5:]]
    names = [spreadsheet_safe(n) for n in run.layer_names]
    from .storage import atomic_output

    with atomic_output(path, force, newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS + CSV_MORE)
        for i, step in enumerate(run.steps.tolist()):
            sc = [_cell(float(x[i])) for x in scal]
            for j, n in enumerate(names):
                w.writerow(
                    [
                        step,
                        n,
                        f"{mean[i, j]:.8e}",
                        f"{mx[i, j]:.8e}",
                        f"{norm[i, j]:.8e}",
                        int(van[i, j]),
                        int(exp[i, j]),
                    ]
                    + [
                        (_count_cell if name == "nonfinite" else _cell)(float(m[i, j]))
                        for name, m in zip(CSV_MORE, more)
                    ]
                    + sc
                )


def to_ascii(run: Run, width: int = 80, metric: str = "grad_norm") -> str:
    """Block heatmap: one row per layer (depth order), one column per step (downsampled to ``width``).

    ``' ░▒▓█'`` encode log10 of the metric on one scale across steps; ``!`` marks exploding cells
    and ``X`` non-finite ones.
    """
    run = run.snapshot()  # a consistent view while training appends (Run.snapshot)
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 1:
        raise ValueError(f"width must be a positive number of columns, got {width!r}")
    if run.n_steps == 0:
        return "(no gradient frames recorded)\n"
    if run.n_layers == 0:
        return "(no layers recorded)\n"
    r = run.downsample(width) if run.n_steps > width else run
    vals = r.metric(metric)
    lo, hi = log_levels(vals)
    with np.errstate(divide="ignore", invalid="ignore"):
        lv = np.clip((np.log10(vals) - lo) / (hi - lo), 0, 1)
    idx = np.where(np.isfinite(lv), np.rint(lv * (len(BLOCKS) - 1)), 0).astype(int)
    grid = np.array(list(BLOCKS))[idx]
    grid[r.exploding()] = MARK_EXPLODING
    grid[r.nonfinite()] = MARK_NONFINITE
    names = r.layer_names
    wname = max(5, max(len(n) for n in names))
    out = [
        f"Gradient Flow Animation ({metric}, log scale {10.0**lo:.2g}..{10.0**hi:.2g}; step → right, layer ↓;"
        f" {MARK_EXPLODING} exploding, {MARK_NONFINITE} non-finite)",
        f"{'layer':>{wname}}  " + "".join(str(i % 10) for i in range(r.n_steps)),
        "─" * (wname + 2 + r.n_steps),
    ]
    for j, n in enumerate(names):
        out.append(f"{n:>{wname}}  " + "".join(grid[:, j]))
    out.append(
        f"{'':>{wname}}  steps {int(r.steps[0])}..{int(run.steps[-1])}"
        + (f" ({run.n_steps} steps, {r.n_steps} columns)" if r is not run else "")
    )
    return "\n".join(out) + "\n"


def issue_step_ratio(run: Run) -> float:
    """Share of recorded steps on which any layer was vanishing or exploding (the original crate's
    measure; 0 without steps)."""
    if run.n_steps == 0:
        return 0.0
    return float((run.vanishing() | run.exploding()).any(axis=1).mean())


def summary(run: Run, report=None) -> GradientFlowSummary:
    """The original crate's summary report, judged by the analysis (``report``, computed when not
    given) so that it and ``analyze`` never disagree: the same verdict, the layers the vanishing,
    exploding and NaN/Inf diagnoses name (depth order), and the ranked diagnoses as its
    recommendations."""
    run = run.snapshot()  # a consistent view while training appends (Run.snapshot)
    if run.n_layers == 0 or run.n_steps == 0:
        health, found, recs = GradientHealth.UNKNOWN, [], []
    else:
        if report is None:
            from .analysis import analyze

            report = analyze(run)
        health, found = GradientHealth(report.overall_health), report.diagnoses
        recs = [f"{d.text} {d.action[:1].upper()}{d.action[1:]}." for d in found]

    def named(cause: str) -> list[str]:  # named by a diagnosis of that cause, or folded into another one
        said = {n for d in found for n in (d.layers if d.cause == cause else d.symptom_layers.get(cause, ()))}
        return [n for n in run.layer_names if n in said]

    recs.append(
        {
            GradientHealth.CRITICAL: "CRITICAL: Training stability is severely compromised — halt training "
            "and diagnose before continuing.",
            GradientHealth.WARNING: "Gradient issues detected: act on the diagnoses above.",
            GradientHealth.HEALTHY: "Gradients appear healthy — no immediate action required.",
            GradientHealth.UNKNOWN: "No steps were recorded yet, so there is nothing to judge: train for a few "
            "steps (with the Recorder attached, or record() called) and look again.",
        }[health]
    )
    return GradientFlowSummary(
        total_steps=run.n_steps,
        first_step=int(run.steps[0]) if run.n_steps else None,
        last_step=int(run.steps[-1]) if run.n_steps else None,
        layers_with_vanishing_grads=named("vanishing"),
        layers_with_exploding_grads=named("exploding"),
        layers_with_nonfinite_grads=named("nonfinite"),
        issue_step_ratio=issue_step_ratio(run),
        overall_health=health,
        recommendations=recs,
    )
