"""From rules to ranked diagnoses: run every cause's rule; cap every *symptom* (a statistical
pattern, ``CauseRule.kind``) at Low unless the objective shows measured damage
(``Context.damage``); drop what a found cause rules out, fold each symptom into the first found cause
(in precedence order) that explains it, raise the top finding to Critical when the damage is total
(the loss went NaN, diverged or never left chance level), rank (priority first, then precedence: a
root above its symptoms) and say each in words. An *observation* (a fact the Recorder saw) keeps the
priority its rule gives it."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..health import CANNOT_MOVE
from ._base import PRIORITY_ORDER, CauseRule, Context, Diagnosis


def settle(found: dict[str, Diagnosis], rules: Sequence[CauseRule]) -> None:
    """Drop what a found cause rules out, then fold each symptom into the first found cause (in
    ``rules`` order) that explains it, in place."""
    for rule in rules:
        if rule.name in found:
            for other in rule.contradicts:
                found.pop(other, None)
    _fold(found, rules)


def _fold(found: dict[str, Diagnosis], rules: Sequence[CauseRule]) -> None:
    by_name = {r.name: r for r in rules}
    for rule in rules:
        cause = found.get(rule.name)
        if cause is None:
            continue
        for sym in rule.explains:
            s = found.get(sym)
            if s is None or sym == rule.name or not rule.explains_when(cause, s):
                continue
            how = by_name[sym].folded_as(s, cause)
            if how == "keep":
                continue
            if how == "after":  # a consequence with evidence of its own: ranked right after its cause
                s.after = rule.name
            else:
                found.pop(sym)
                cause.explains.append(f"{sym}: {s.evidence}")
                cause.explains.extend(s.explains)
                for name, layers in ((sym, s.layers), *s.symptom_layers.items()):
                    held = cause.symptom_layers.setdefault(name, [])
                    held.extend(n for n in layers if n not in held)
                for d in found.values():
                    if d.after == sym:
                        d.after = rule.name
            if s.priority == "Critical":
                cause.priority = "Critical"
            elif rule.priority_explaining is not None and s.priority != "Low":
                cause.priority = min(cause.priority, rule.priority_explaining, key=PRIORITY_ORDER.index)


def is_symptom(d: Diagnosis, rule: CauseRule) -> bool:
    """A statistical pattern: its rule reads one, or an observation's rule inferred it from statistics."""
    return rule.kind == "symptom" or d.inferred


def _no_damage(c: Context) -> str:
    """Why a symptom stays information: what the objective shows (or why it cannot show damage)."""
    L = c.loss
    if not c.task.judged:
        return f"information only: {c.task.assumed}"
    if not L.logged:
        return "information only: no loss was logged to show damage (recorder.log(loss=loss))"
    return f"information only: the loss shows no damage ({L.start:.3g} at the start, {L.end:.3g} at the end)"


def cap_symptoms(found: dict[str, Diagnosis], c: Context, rules: Sequence[CauseRule]) -> None:
    """A symptom without measured damage to the objective is at most Low, and so is one that began
    after the damage did (the first NaN, the loss's rebound): it cannot be what did it. With damage
    it can explain, it keeps its priority and its evidence says what the loss shows. In place."""
    by_name = {r.name: r for r in rules}
    dmg = c.damage
    for d in found.values():
        if d.priority == "Low" or not is_symptom(d, by_name[d.cause]):
            continue
        if dmg is None:
            d.priority = "Low"
            d.evidence += f"; {_no_damage(c)}"
        elif dmg.onset is not None and d.first_step is not None and d.first_step > dmg.onset:
            # it began after the damage: a consequence of what went wrong, not what did it
            d.priority = "Low"
            d.evidence += f"; information only: it began at step {d.first_step}, after the damage ({dmg.text})"
        else:
            d.evidence += f"; {dmg.text}"


def _text(d: Diagnosis, rule: CauseRule, max_layers: int) -> str:
    title = d.title[:1].upper() + d.title[1:]
    if d.ranks:  # a distributed run: the processes at fault, after the title
        title += f" (rank{'s' * (len(d.ranks) > 1)} {', '.join(map(str, d.ranks))})"
    since = f" since step {d.first_step}" if d.first_step is not None else ""
    if not d.layers or rule.whole_run:
        return f"{title}{since}."
    n = len(d.layers)
    shown = ", ".join(d.layers[:max_layers]) + (f" and {n - max_layers} more" if n > max_layers else "")
    return f"{title} in {n} layer{'s' * (n > 1)}{since}: {shown}."


def diagnose(c: Context, rules: Sequence[CauseRule], max_layers: int = 6) -> list[Diagnosis]:
    """Every cause the evidence supports, symptoms folded into their causes, ranked, each with its
    title, sentence and action."""
    found: dict[str, Diagnosis] = {}
    for rule in rules:
        d = rule.find(c)
        if d is not None:
            found[rule.name] = d
    cap_symptoms(found, c, rules)
    settle(found, rules)
    order = [r.name for r in rules]
    out = list(found.values())
    for d in out:  # a consequence ranks with its cause
        if d.after is not None and d.after in found:
            d.priority = found[d.after].priority
    out.sort(
        key=lambda d: (
            PRIORITY_ORDER.index(d.priority),
            order.index(d.after) + 0.5 if d.after in found else order.index(d.cause),
        )
    )
    top = next((d for d in out if d.priority != "Low"), None)
    dmg = c.damage
    if top is not None and top.priority != "Critical" and dmg is not None and dmg.total:
        top.priority = "Critical"
        if dmg.text not in top.evidence:
            top.evidence += f"; {dmg.text}"
        out.sort(key=lambda d: PRIORITY_ORDER.index(d.priority))  # stable: the rest keep their order
    by_name = {r.name: r for r in rules}
    for d in out:
        rule = by_name[d.cause]
        d.title = rule.title
        d.text = _text(d, rule, max_layers)
        d.action = rule.action(d, c)
    return out


def verdict(diagnoses: list[Diagnosis]) -> str:
    """The run's health from its diagnoses, the one vocabulary of every output (analyze, summary(),
    the panel, the report, the CLI): Critical with a Critical diagnosis, Warning with a High or
    Medium one, else Healthy (Low ones, such as frozen layers or a converged plateau, are information)."""
    prios = {d.priority for d in diagnoses}
    if "Critical" in prios:
        return "Critical"
    if prios & {"High", "Medium"}:
        return "Warning"
    return "Healthy"


def layer_verdicts(run, diagnoses: list[Diagnosis], cannot_move: np.ndarray) -> np.ndarray:
    """Per layer, the worst health any diagnosis gives it: Critical for a Critical one naming it,
    Warning for a High or Medium one; Healthy otherwise, or ``CANNOT_MOVE`` for a parameter the loss
    cannot move (``cannot_move``, per layer: normal, and said so); Unknown for a layer without any
    gradient that no diagnosis names (frozen layers: their status says why)."""
    L = run.n_layers
    rank = np.zeros(L, int)  # 0 healthy, 1 warning, 2 critical
    idx = {n: i for i, n in enumerate(run.layer_names)}
    for d in diagnoses:
        lvl = 2 if d.priority == "Critical" else 1 if d.priority in ("High", "Medium") else 0
        for n in d.layers:
            i = idx.get(n)
            if i is not None:
                rank[i] = max(rank[i], lvl)
    got = np.isfinite(run.metric("grad_norm")).any(axis=0) if run.n_steps else np.zeros(L, bool)
    out = np.where(rank == 2, "Critical", np.where(rank == 1, "Warning", "Healthy")).astype(object)
    out[(rank == 0) & ~got] = "Unknown"
    out[(rank == 0) & got & np.asarray(cannot_move, bool)] = CANNOT_MOVE
    return out
