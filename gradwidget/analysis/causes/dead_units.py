"""``dead_units``: layers whose gradient entries are exactly zero (``Thresholds.dead_zero_fraction``)
on at least ``Thresholds.minor_issue_ratio`` of steps; embedding tables (sparse by design) never
count. Dead from the first step it is an init problem (``at_init``), folded only into another
init cause; dead later, a symptom of too large steps."""

from __future__ import annotations

import numpy as np

from ..stats import dead_flags
from ._base import CauseRule, Context, Diagnosis, Fold
from ._shared import first_flagged_step, names_of


def find(c: Context) -> Diagnosis | None:
    run, ex, t = c.run, c.s.exact, c.t
    dead = c.dead_layers
    if not dead.any():
        return None
    mods = [info.module for info in run.layers]
    alive_bias = {
        mods[i]
        for i, info in enumerate(run.layers)
        if info.name.endswith("bias") and not dead[i] and ex["known_steps"][i] > 0
    }
    # a weight whose own bias still gets a gradient is dead because its *input* is zero: the dead
    # units are in the layer feeding it, so it is evidence, not the culprit
    starved_input = [i for i in np.flatnonzero(dead) if run.layers[i].name.endswith("weight") and mods[i] in alive_bias]
    culprits = [i for i in np.flatnonzero(dead) if i not in starved_input]
    if not culprits:
        culprits = list(np.flatnonzero(dead))
    bi = np.array([run.layers[i].backward_index for i in culprits])
    culprits = [culprits[j] for j in np.argsort(np.where(bi >= 0, bi, 1 << 30), kind="stable")]
    ds = ex["dead_share"]
    flags = dead_flags(run.metric("zero_frac")[:, culprits], run.metric("grad_norm")[:, culprits], t)
    reaches_input = any(i in culprits for i in c.arch.input_layers)
    share = float(ds[culprits].mean())
    pr = "Critical" if share >= t.critical_issue_ratio and reaches_input else "High"
    text = (
        f"{len(culprits)} layer{'s' * (len(culprits) != 1)} had at least {t.dead_zero_fraction:.0%} of their "
        f"gradient entries exactly zero on {share:.0%} of steps, starting at {run.layer_names[culprits[0]]} "
        "(the loss side of the dead zone: its units output zero, so nothing flows back through them)"
    )
    if starved_input:
        text += (
            f"; {', '.join(names_of(run, starved_input[:3]))} get{'s' * (len(starved_input) == 1)} zero weight "
            "gradients because their input is all zeros"
        )
    # the starved next-layer weights are named last: affected (their gradient is zero too), not the cause
    return Diagnosis(
        "dead_units",
        pr,
        names_of(run, culprits) + names_of(run, starved_input),
        first_flagged_step(run, flags),
        text,
        float(np.clip(share, 0, 1)),
        at_init=bool(run.n_steps and flags[0].any()),
    )


def action(d: Diagnosis, c: Context) -> str:
    first = d.layers[0] if d.layers else "the first dead layer"
    if d.at_init:
        return (
            f"re-initialise {first}: its units are off from the first step (a large negative bias or "
            "a bad init); reset its bias to 0, or use LeakyReLU/GELU so units cannot die"
        )
    return (
        f"lower the learning rate: the units of {first} died during training (large updates pushed them "
        "off); LeakyReLU/GELU keeps a gradient flowing"
    )


def _folded_as(symptom: Diagnosis, cause: Diagnosis) -> Fold:
    """Dead from the start: the init, folded only into a cause that was there before any update."""
    return "keep" if symptom.at_init and not cause.at_init else "fold"


RULE = CauseRule(
    "dead_units",
    "dead units (gradients exactly zero)",
    find,
    action,
    kind="observation",
    contradicts=("learns_nothing",),
    explains=("vanishing", "plateau", "lr_too_low", "saturated_output"),
    folded_as=_folded_as,
)
