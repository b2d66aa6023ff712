"""``eval_mode``: normalisation or dropout layers in eval mode while the optimizer steps. ``model.eval()`` left
on (called before the loop, or for an evaluation with no ``model.train()`` after it) makes BatchNorm
normalise with running statistics that never update, and switches dropout off, while training goes
on. Seen by the Recorder (``run.meta["train_mode"]``, ``collect/_train_mode``): the modules'
training flags at each recorded optimizer step. An observation.

Freezing BatchNorm's statistics on purpose is a fine-tuning recipe: the model trains
(``model.train()``), its normalisation modules, their statistics estimated in pretraining, are
switched to eval mode, dropout still on. What tells the mistake from the recipe is what was seen:
the model itself in eval mode, or every normalisation and dropout module in eval mode at once, or
normalisation modules frozen at statistics never estimated from data (``num_batches_tracked`` 0:
they normalise with mean 0 and variance 1, which no recipe freezes) are the mistake (High). The
recipe is information (Low, whatever the loss does: frozen pretrained statistics are what the user
chose, and a fine-tune's loss says nothing of whether they fit) and explains no other finding.

A model whose only such modules are dropout (a transformer with LayerNorm, an MLP) under
``model.eval()`` steps on the right gradients of a model without its regularisation: Medium, and it
explains no other finding (dropout off makes no gradient wrong)."""

from __future__ import annotations

from ._base import CauseRule, Context, Diagnosis

#: in eval mode on at least this share of the recorded optimizer steps (an evaluation left on from
#: a quarter of the way through training on: every step after it)
EVAL_SHARE = 0.25
#: ... and on at least this many (one step after an evaluation, before ``model.train()``, is not it)
EVAL_MIN_STEPS = 2


def _bound(steps: int) -> float:
    return max(EVAL_MIN_STEPS, EVAL_SHARE * steps)


def _whole(seen: dict) -> bool:
    """The model itself was in eval mode, or every normalisation and dropout module at once."""
    bound = _bound(int(seen.get("steps", 0)))
    norm, dropout = int(seen.get("norm", 0)), int(seen.get("dropout", 0))
    return int(seen.get("model_eval", 0)) >= bound or (
        norm > 0
        and int(seen.get("most_norm_eval", 0)) == norm
        and dropout > 0
        and int(seen.get("dropout_eval", 0)) >= bound
    )


def find(c: Context) -> Diagnosis | None:
    seen = c.run.meta.get("train_mode") if isinstance(c.run.meta, dict) else None
    if not isinstance(seen, dict):
        return None
    steps, norm, dropout = int(seen.get("steps", 0)), int(seen.get("norm", 0)), int(seen.get("dropout", 0))
    norm_eval, model_eval = int(seen.get("norm_eval", 0)), int(seen.get("model_eval", 0))
    dropout_eval, most = int(seen.get("dropout_eval", 0)), int(seen.get("most_norm_eval", 0))
    never = int(seen.get("never_estimated", 0))
    bound = _bound(steps)
    dropout_only = not norm and dropout > 0 and model_eval >= bound and dropout_eval >= bound
    if not dropout_only and (not norm or norm_eval < bound):
        return None
    names = set(seen.get("eval_norms") or [])
    run = c.run
    layers = [info.name for info in run.layers if info.module in names and info.status == "trainable"]
    s = "s" * (norm > 1)
    if dropout_only:
        evidence = (
            f"the model was in eval mode (model.eval()) on {model_eval} of {steps} recorded optimizer steps: its "
            f"{dropout} dropout module{'s' * (dropout > 1)} off on {dropout_eval} of them, while the optimizer "
            "stepped (the gradients are right, the regularisation is gone)"
        )
        priority = "Medium"
    elif _whole(seen):
        what = (
            f"the model was in eval mode (model.eval()) on {model_eval} of {steps} recorded optimizer steps"
            if model_eval >= bound
            else f"every normalisation and dropout module was in eval mode on {norm_eval} of {steps} recorded "
            "optimizer steps"
        )
        evidence = (
            f"{what}: its normalisation modules ({most} of {norm} with running statistics) normalised with "
            "statistics that never update"
            + (
                f", with its {dropout} dropout module{'s' * (dropout > 1)} off on {dropout_eval} of them"
                if dropout
                else ""
            )
            + ", while the optimizer stepped"
        )
        priority = "High"
    elif never:
        evidence = (
            f"{most} of the model's {norm} normalisation module{s} with running statistics were in eval mode on "
            f"{norm_eval} of {steps} recorded optimizer steps while the model trained, {never} of them with "
            "statistics never estimated from data (num_batches_tracked 0): they normalise with their initial "
            "mean 0 and variance 1, which never update"
        )
        priority = "High"
    else:
        evidence = (
            f"{most} of the model's {norm} normalisation module{s} with running statistics were in eval mode on "
            f"{norm_eval} of {steps} recorded optimizer steps while the model trained"
            + (f" (its {dropout} dropout module{'s' * (dropout > 1)} on)" if dropout else "")
            + ": their statistics, estimated before, stay frozen (a fine-tuning recipe when meant)"
        )
        priority = "Low"
    first = seen.get("first_step")
    return Diagnosis(
        "eval_mode",
        priority,
        layers,
        int(first) if isinstance(first, int) else None,
        evidence,
        {"High": 1.0, "Medium": 0.6}.get(priority, 0.3),
    )


def action(d: Diagnosis, c: Context) -> str:
    if d.priority != "Low" and _whole(c.run.meta["train_mode"]):
        return (
            "call model.train() before the training loop and again after each evaluation (model.eval() "
            "only around the evaluation)"
        )
    if d.priority != "Low":
        return (
            "remove the .eval() calls on the normalisation layers (model.train() before the training loop), or "
            "freeze their statistics only once estimated (a pretrained model's)"
        )
    return (
        "nothing if the frozen statistics are meant; else call model.train() before the training loop and "
        "after each evaluation, with no .eval() on the normalisation layers"
    )


RULE = CauseRule(
    "eval_mode",
    "normalisation or dropout layers in eval mode while training",
    find,
    action,
    kind="observation",
    explains=("lr_too_high", "lr_too_low", "plateau", "exploding", "vanishing", "dead_units", "saturated_output"),
    # a recipe, or dropout off, explains nothing
    explains_when=lambda cause, symptom: cause.priority not in ("Medium", "Low"),
)
