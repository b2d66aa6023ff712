"""Were the model's normalisation and dropout modules in training mode when the optimizer stepped?
``model.eval()`` left on after an evaluation (or called before the loop) makes BatchNorm normalise
with its frozen running statistics, which never update, and switches dropout off, while the
optimizer goes on stepping: nothing in the gradients says so, the modules' ``training`` flags do.

The modules are listed once, when the Recorder is built: those whose mode changes what they compute,
normalisation layers that keep running statistics (``BatchNorm*``, ``SyncBatchNorm``,
``InstanceNorm*`` with ``track_running_stats=True``; ``GroupNorm`` and ``LayerNorm`` compute the
same in both modes) and dropout with ``p > 0``. A model with none gets no probe. At each recorded
optimizer step their flags are read (one attribute per listed module, no hook), and counted: on how
many steps the model itself (its root module) was in eval mode, on how many some normalisation or
dropout module was, the most normalisation modules in eval mode at once and the first such step, with
the normalisation modules' names, and how many of them had never estimated their statistics
(``num_batches_tracked`` 0: they normalise with their initial mean 0 and variance 1; read when the
set of modules in eval mode changes, one small host read each). Modules added to the model later
are not watched. Kept in
``run.meta["train_mode"]`` (docs/run-format.md): written at once when eval mode is first seen, else
within one flush interval (``_meta``). A probe of the Recorder (``_probe``): it installs no hook.
"""

from __future__ import annotations

from operator import attrgetter

from torch import nn

from ._inputs import _clean_compiled
from ._probe import Probe, StepContext

#: dropout modules (their ``p`` > 0 makes the mode matter)
_DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
_training = attrgetter("training")


def keeps_running_stats(m: nn.Module) -> bool:
    """A normalisation module whose eval mode normalises with its running statistics (and stops
    updating them): BatchNorm, SyncBatchNorm, InstanceNorm with ``track_running_stats=True``, and
    any module that keeps a ``running_mean`` buffer and tracks it."""
    return bool(getattr(m, "track_running_stats", False)) and getattr(m, "running_mean", None) is not None


def _never_estimated(m: nn.Module) -> bool:
    """The module's running statistics were never updated from a batch (``num_batches_tracked`` 0)."""
    n = getattr(m, "num_batches_tracked", None)
    return n is not None and int(n) == 0


class TrainModeCheck(Probe):
    """Reads the training flags of ``model``'s normalisation and dropout modules at each recorded
    optimizer step (see the module docstring)."""

    def __init__(self, model: nn.Module, norms: list[tuple[str, nn.Module]], dropouts: list[nn.Module]) -> None:
        self.model: nn.Module | None = model
        self._norm_names = [_clean_compiled(n) for n, _ in norms]
        self._norms = [m for _, m in norms]
        self._dropouts = dropouts
        self._stepping = False  # an optimizer step is under way (``before_update``)
        self._last: tuple | None = None  # the normalisation flags of the last step with one in eval mode
        self.steps = 0  #: recorded optimizer steps checked
        self.model_eval = 0  #: ... with the model (its root module) in eval mode
        self.norm_eval = 0  #: ... with some normalisation module in eval mode
        self.dropout_eval = 0  #: ... with some dropout module in eval mode
        self.most_norm_eval = 0  #: the most normalisation modules in eval mode at one step
        self.first_step: int | None = None  #: the first step with some module in eval mode
        self.eval_norms: list[str] = []  #: the normalisation modules in eval mode at the last such step
        self.never_estimated = 0  #: ... of them, those whose statistics were never estimated

    @classmethod
    def of(cls, model: nn.Module) -> TrainModeCheck | None:
        """The check for ``model``, or None when it has no module whose mode matters."""
        norms: list[tuple[str, nn.Module]] = []
        dropouts: list[nn.Module] = []
        for name, m in model.named_modules():
            if keeps_running_stats(m):
                norms.append((name, m))
            elif isinstance(m, _DROPOUT) and m.p > 0:
                dropouts.append(m)
        return cls(model, norms, dropouts) if norms or dropouts else None

    def before_update(self) -> None:
        self._stepping = True

    def on_step(self, ctx: StepContext) -> None:
        """Count a recorded step the optimizer takes (not one AMP skipped, nor a backward without an
        optimizer); say so in the run at once when eval mode is first seen."""
        if not self._stepping:
            return
        self._stepping = False
        self.steps += 1
        flags = tuple(map(_training, self._norms))
        n_eval = len(flags) - sum(flags)
        dropout_eval = not all(map(_training, self._dropouts))
        model_eval = self.model is not None and not self.model.training
        self.model_eval += model_eval
        self.dropout_eval += dropout_eval
        first = False
        if n_eval or dropout_eval or model_eval:
            first = self.first_step is None
            if first:
                self.first_step = ctx.step
        if n_eval:
            self.norm_eval += 1
            self.most_norm_eval = max(self.most_norm_eval, n_eval)
            if flags != self._last:
                self._last = flags
                self.eval_norms = [n for n, on in zip(self._norm_names, flags) if not on]
                self.never_estimated = sum(_never_estimated(m) for m, on in zip(self._norms, flags) if not on)
        ctx.note_meta({"train_mode": self.to_dict()}, first)

    def to_dict(self) -> dict:
        return {
            "norm": len(self._norms),
            "dropout": len(self._dropouts),
            "steps": self.steps,
            "model_eval": self.model_eval,
            "norm_eval": self.norm_eval,
            "dropout_eval": self.dropout_eval,
            "most_norm_eval": self.most_norm_eval,
            "first_step": self.first_step,
            "eval_norms": list(self.eval_norms),
            "never_estimated": self.never_estimated,
        }

    def close(self) -> None:
        self.model, self._norms, self._dropouts = None, [], []
