"""A layer-level risk (exploding, vanishing, dead, hot, ...) with its severity and evidence: what
``health.risk_factors`` finds and the layer table, the stability view, the advice and the causes read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RiskFactor:
    layer: str
    kind: str  #: nonfinite, exploding, vanishing, dead, weak, hot, unstable, oscillating, lr_high, lr_low
    severity: float  #: 0..1
    critical: bool
    evidence: str
