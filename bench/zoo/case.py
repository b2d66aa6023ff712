"""A zoo case: one training run, healthy or with one injected mistake, and its labels."""

from __future__ import annotations

from dataclasses import dataclass

#: the causes a diagnosis can name (docs/diagnoses.md's vocabulary, less ``plateau`` which the zoo does not inject)
CAUSES: tuple[str, ...] = (
    "lr_too_high",
    "lr_too_low",
    "missing_zero_grad",
    "not_in_optimizer",
    "no_gradient",
    "frozen",
    "vanishing",
    "exploding",
    "dead_units",
    "nonfinite",
    "saturated_output",
    "input_scale",
    "loss_scale",
    "cleared_before_step",
    "half_weights",
    "learns_nothing",
    "eval_mode",
)
HEALTHY = "healthy"


@dataclass(frozen=True)
class Case:
    """One labelled run. ``fault_layers`` are parameter names as in ``run.layer_names``; an empty
    tuple means the mistake is global (no layer is at fault). ``intended_frozen`` are parameters
    frozen on purpose (fine-tuning, LoRA's base): no gradient there is by design, not a finding.
    ``slow_onset`` marks mistakes whose symptom can only show after many steps. ``style`` names the
    data and training style when they are not the arch's defaults (it ends the id)."""

    id: str
    arch: str
    optimizer: str
    seed: int
    mistake: str  #: the injection; "healthy" for healthy runs
    cause: str | None  #: the label (one of CAUSES); None for healthy runs
    fault_layers: tuple[str, ...] = ()
    origin_module: str | None = None  #: nonfinite cases: the dotted module path where it starts
    slow_onset: bool = False
    steps: int = 120
    style: str = ""
    intended_frozen: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.mistake == HEALTHY) != (self.cause is None):
            raise ValueError(f"{self.id}: a healthy case has no cause and a mistake has one")
        if self.cause is not None and self.cause not in CAUSES:
            raise ValueError(f"{self.id}: unknown cause {self.cause!r}; causes are {CAUSES}")

    @property
    def healthy(self) -> bool:
        return self.cause is None
