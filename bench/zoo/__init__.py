"""The diagnosis zoo: real models (transformers GPT-2, Llama, Mixtral, T5, BERT, DistilBERT, ResNet,
ConvNeXt, ViT; LSTM, GRU and RNN language models; MLPs, a CNN) on synthetic tasks and on real data
shipped inside installed packages, trained healthy (in the ways people train) and with real mistakes
injected, each labelled with its cause and the parameters at fault, to score gradwidget's diagnoses
on (bench/diagnosis.py).

    from zoo import CASES, FAST, HELDOUT, Case, run_case, load_or_run, check

CASES is what diagnoses are calibrated and scored on; HELDOUT repeats every mistake and the healthy
styles on other seeds, architectures and magnitudes, to check that the calibration generalises
(never tune on it).
"""

from . import field, healthy  # noqa: F401 (they add their cases to CASES and HELDOUT)
from .cache import DEFAULT_CACHE, ZOO_VERSION
from .case import CAUSES, HEALTHY, Case
from .cases import CASES
from .fast import FAST, FAST_IDS
from .checks import TWIN_CAUSES, check_case, fall_t, loss_ratio
from .heldout import HELDOUT
from .runner import check, load_or_run, run_case
from .train import PendingCase

__all__ = [
    "CASES",
    "CAUSES",
    "DEFAULT_CACHE",
    "FAST",
    "FAST_IDS",
    "HEALTHY",
    "HELDOUT",
    "ZOO_VERSION",
    "Case",
    "PendingCase",
    "TWIN_CAUSES",
    "check",
    "check_case",
    "fall_t",
    "load_or_run",
    "loss_ratio",
    "run_case",
]
