"""Where a run's first NaN/Inf was made (``NonfiniteOrigin``): kept in the Run's metadata, saved
with it, found by ``gradwidget.collect.nonfinite``."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .schema import _as_step


#: the passes a non-finite value can start in, in the order a training step runs them
NONFINITE_PHASES = ("input", "forward", "loss", "backward")


@dataclass
class NonfiniteOrigin:
    """Where a run's first NaN/Inf was made: the first module call, in execution order, that took
    finite values and gave non-finite ones (``gradwidget.collect.nonfinite`` finds it).

    ``phase``: ``"forward"`` (the module's output), ``"backward"`` (the gradient it passed on to its
    inputs), ``"loss"`` (the model's outputs were finite, the loss or the gradient coming back from
    it was not; ``module`` is then the model, ``""``) or ``"input"`` (the model was given
    non-finite inputs). ``inputs_finite`` / ``output_finite``: what the module took in and gave out
    in that pass (forward: activations; backward: the gradient it received / passed on).
    ``params_reached``: the layers whose gradients were non-finite at that step (None when that
    step was not recorded); ``call``: which call of the module in that step (0 = its first; a
    module called twice has calls 0 and 1); ``rank``: the process that saw it (distributed runs).
    """

    module: str
    step: int
    phase: str
    module_type: str = ""
    call: int = 0
    inputs_finite: bool | None = None
    output_finite: bool | None = None
    params_reached: list | None = None
    rank: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.module, str):
            raise ValueError(f"module must be a dotted module path (str), got {self.module!r:.40}")
        if self.phase not in NONFINITE_PHASES:
            raise ValueError(f"phase must be one of {NONFINITE_PHASES}, got {self.phase!r:.40}")
        self.step = _as_step(self.step)
        if self.params_reached is not None:
            if not isinstance(self.params_reached, (list, tuple)) or not all(
                isinstance(n, str) for n in self.params_reached
            ):
                raise ValueError(f"params_reached must be a list of layer names, got {self.params_reached!r:.60}")
            self.params_reached = list(self.params_reached)

    @property
    def where(self) -> str:
        """The module path as a person reads it (the root model is ``"the model"``)."""
        return self.module or "the model"

    def describe(self) -> str:
        """One sentence: which module, in which pass, at which step."""
        what = {
            "input": f"the inputs given to {self.where} were already non-finite",
            "forward": f"{self.where} ({self.module_type}) made it in the forward pass: finite inputs, "
            "non-finite output",
            "backward": f"{self.where} ({self.module_type}) made it in the backward pass: it received "
            "finite gradients and passed on non-finite ones",
            "loss": "the loss made it: the model's outputs were finite, the loss (or its gradient) was not",
        }
        call = f" (call {self.call + 1} of it in that step)" if self.call else ""
        reached = (
            f"; {len(self.params_reached)} parameter gradient(s) were non-finite at that step"
            if self.params_reached
            else ""
        )
        return f"The first non-finite value appeared at step {self.step}: {what[self.phase]}{call}{reached}."

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d) -> "NonfiniteOrigin":
        if not isinstance(d, dict):
            raise ValueError(f"a non-finite origin must be an object, got {d!r:.60}")
        try:
            return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})
        except TypeError as e:
            raise ValueError(f"a non-finite origin needs module, step and phase: {e}") from None
