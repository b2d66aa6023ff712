"""The diagnosis zoo: real models (transformers GPT-2, BERT, ResNet, ViT; an LSTM, an MLP, a CNN)
trained healthy and with real mistakes injected, each labelled with its cause and the parameters at
fault, to score gradwidget's diagnoses on (bench/diagnosis.py).

    from zoo import CASES, FAST, HELDOUT, Case, run_case, load_or_run, check_case

CASES is what diagnoses are calibrated and scored on; HELDOUT repeats every mistake on other seeds,
architectures and magnitudes, to check that the calibration generalises (never tune on it).
"""

from .case import CAUSES, HEALTHY, Case
from .cases import CASES, FAST_IDS
from .heldout import HELDOUT
from .runner import (
    DEFAULT_CACHE,
    ZOO_VERSION,
    check_case,
    load_or_run,
    loss_ratio,
    run_case,
)

#: each mistake once and each healthy architecture once, on the cheapest cases that show them
FAST: list[Case] = [c for c in CASES if c.id in FAST_IDS]

__all__ = [
    "CASES",
    "CAUSES",
    "DEFAULT_CACHE",
    "FAST",
    "HEALTHY",
    "HELDOUT",
    "ZOO_VERSION",
    "Case",
    "check_case",
    "load_or_run",
    "loss_ratio",
    "run_case",
]
