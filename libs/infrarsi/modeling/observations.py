"""The search's vocabulary: a finished trial as the models see it (``Observation``), a proposal
(``Suggestion``) and what the models expect of a candidate (``Prediction``).
"""


from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infrarsi.modeling.space import (
    Candidate,
)

Status = Literal["ok", "oom", "crash", "invariant_violation", "timeout", "stopped_slow", "scope_violation"]
Origin = Literal["seed", "prior", "ei", "pairing", "bank", "llm", "confirm"]
Admission = Literal["cut_off", "step_probe", "lifted", "escape"]
"""What admitted a proposal: under the OOM cut-off (``cut_off``), or above it as a memory step probe, under a cut-off
lifted after a success (every candidate was above it), or as the escape before anything fitted (the golden baseline,
``SearchConfig.escape_baseline``, or else a probe of the least risky candidate far from the OOMs)."""


@dataclass(frozen=True)
class Observation:
    """One finished trial as the models see it (the modeler builds it from TrialFinished/TrialMeasured)."""

    candidate: Candidate
    status: Status
    step_time_s: float | None = None
    """Measured step time (``stopped_slow``: over the steady steps it ran before it was stopped); for a timeout
    the censoring bound (the step time is at least this)."""
    peak_bytes: float | None = None
    """Observed peak; for an OOM the censoring bound (last peak seen before the kill)."""
    cost_seconds: float | None = None


@dataclass(frozen=True)
class Suggestion:
    candidate: Candidate
    origin: Origin
    reason: str
    predicted_log_time: float | None = None
    p_oom: float | None = None
    admission: Admission = "cut_off"
    """Why it could be proposed at its P(OOM) (``Admission``): the OOMs a study spends, by the rule that took the
    risk (bench/robustness.py reports them so)."""


@dataclass(frozen=True)
class Prediction:
    """What the searcher's current models expect of one candidate."""

    log_time: float
    """Posterior mean of latent log step time (seconds)."""
    log_time_std: float
    log_peak_bytes: float
    """Predicted mean of log peak memory (bytes)."""
    log_peak_std: float
    p_oom: float
    """P(peak > capacity); 1 inside a known-OOM region."""
    p_invariants: float
    """P(every invariant holds)."""
    expected_improvement: float
    """Over the incumbent, in log units; 0 before the first success."""
