"""Whether the measurements so far contradict the model's priors: the rule that lets them overrule it.

Owns ``log_bayes_factor``: the log marginal likelihood of the measured log step times under the study's
priors *without* the model's (the knowledge base, the library's metadata, flat priors for the agent's patches)
minus the same under the priors *with* the model's, both Gaussian linear models over the same features and
the same noise. ``judge`` decides once that factor leaves ±``DROP_LOG_BF`` (e : 1 odds): above, the search
drops the model's priors (its patches stay, with flat priors) for the rest of the study; below, the priors are
trusted and the search stops hedging against them (the proposer's probation, services/proposer/agent.py).

Widening every model prior (``agent.prior_weight``) bounds what one wrong number can do inside the posterior;
this check bounds what a consistently wrong model can do to the search: confident priors pointing the wrong way
are caught after a few trials instead of pulling the acquisition for the whole budget. The check needs
contrast to decide: trials chosen by the model's priors alone all look alike to it (its best guesses), so
while it is undecided the proposer alternates them with the knowledge base's own choices, where the two
disagree most. Pure math, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from infrarsi.modeling.space import Candidate
from infrarsi.modeling.time_model import TimeModel

DROP_LOG_BF = 1.0
"""log Bayes factor (without / with the model's priors) above which the model's priors are dropped, and below
minus which they are trusted."""
MIN_OBSERVATIONS = 2
"""Measured trials before the check may decide anything (one difference of two measurements: the intercept
is free, so a single step time says nothing about any effect)."""

Verdict = Literal["open", "dropped", "trusted"]

TIMED = frozenset({"ok", "invariant_violation"})
"""Outcomes whose step time measures the candidate's speed (what the time model learns from too): a run that
broke the loss or another invariant ran to the end at its real speed. Without them the check is blind exactly
where the model's picks and the hedge's break invariants or run out of memory — on moe8x7b the knowledge
base's capacity factor 1.0 breaks the loss, and the verdict on inverted priors came at trial 8, not 5."""


def log_evidence(model: TimeModel, x: np.ndarray, y: np.ndarray, noise_std: float) -> float:
    """log N(y; X m0, X S0 Xᵀ + σ² I) under ``model``'s prior (m0, S0) — x (n, p), y (n,)."""
    cov = (x * model.prior_std**2) @ x.T + noise_std**2 * np.eye(len(y))  # (n, n)
    r = y - x @ model.prior_mean  # (n,)
    sign, logdet = np.linalg.slogdet(cov)
    if sign <= 0:
        return -np.inf
    return float(-0.5 * (r @ np.linalg.solve(cov, r) + logdet + len(y) * np.log(2 * np.pi)))


def log_bayes_factor(with_model: TimeModel, without_model: TimeModel,
                     measured: Sequence[tuple[Candidate, float]], noise_std: float) -> float:
    """log p(y | without the model's priors) − log p(y | with them); positive = the data prefer without."""
    if not measured:
        return 0.0
    x = with_model.encoder.encode_many([c for c, _ in measured])  # (n, p)
    y = np.log([t for _, t in measured])  # (n,)
    return log_evidence(without_model, x, y, noise_std) - log_evidence(with_model, x, y, noise_std)


def judge(with_model: TimeModel, without_model: TimeModel, measured: Sequence[tuple[Candidate, float]],
          noise_std: float) -> tuple[Verdict, float]:
    """(what the measurements say of the model's priors, the log Bayes factor) — ``open`` before
    ``MIN_OBSERVATIONS`` measurements and while the factor stays within ±``DROP_LOG_BF``."""
    if len(measured) < MIN_OBSERVATIONS:
        return "open", 0.0
    bf = log_bayes_factor(with_model, without_model, measured, noise_std)
    if bf > DROP_LOG_BF:
        return "dropped", bf
    return ("trusted" if bf < -DROP_LOG_BF else "open"), bf
