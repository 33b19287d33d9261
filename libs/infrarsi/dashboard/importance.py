"""Which knobs and patches moved the outcome: a main-effects variance decomposition of the measured search trials.

optuna-dashboard's "hyperparameter importance" fits a random forest and reads its functional ANOVA (fANOVA). This
module does the first-order part of that decomposition on a model small enough to fit honestly on the tens of
trials a training-job study measures: an additive model (one effect per knob level, ridge-regularised least
squares) of the target over the trials' knob values. A knob's importance is the variance its fitted effect has
over the measured trials, as a share of the target's variance split into every effect and the residual; the
residual share (``unexplained``: interactions between knobs, noise, and what the additive model cannot say) is
reported beside them, never spread over the knobs. Fitting all effects jointly, rather than comparing per-level
means one knob at a time, keeps a knob the search happened to change together with a faster one from taking
that knob's credit.

Two targets, so that failed trials are counted rather than dropped: ``log step time`` over the trials that
measured one, and ``OOM`` (1 for a trial that ran out of memory, 0 for one that did not) over every search trial
with a final outcome. Pure numbers in, numbers out: no I/O, no view logic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Value = str | int | float | bool
"""A knob's value as a trial set it (``"golden"`` where it left the knob alone; ``"on"``/``"off"`` for a patch)."""

MAX_LEVELS = 8
"""A numeric knob with more distinct values than this is fitted as a smooth (quadratic) effect of its value,
not one effect per value (a float knob's every trial is a level of its own)."""
RIDGE = 1e-3
"""Shrinkage per trial on every effect: only enough to keep a knob with more levels than there are trials
solvable; the synthetic tests' effects come out within a percent of least squares."""
MIN_TRIALS = 4
"""Fewer trials than this give no importance: two effects fitted to three points say nothing."""


@dataclass(frozen=True)
class Importance:
    """The decomposition of one target."""

    target: str
    trials: int
    """Trials the target was fitted on."""
    shares: dict[str, float]
    """Dimension → the share of the target's variance its main effect carries (0 for a dimension all trials
    left at one value); with ``unexplained`` they sum to 1."""
    unexplained: float
    """The residual's share: interactions, noise, what an additive model misses."""

    def ranked(self) -> list[tuple[str, float]]:
        """Dimensions, most important first (ties by name)."""
        return sorted(self.shares.items(), key=lambda item: (-item[1], item[0]))


def _numeric(values: Sequence[Value]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def design_block(values: Sequence[Value]) -> np.ndarray:
    """The centred columns of one dimension's main effect, shape (trials, columns): one indicator per level but
    the first for a categorical (or few-valued) dimension, the standardised value and its square for a numeric one
    with many values; no column when every trial has the same value."""
    n = len(values)
    levels = sorted(set(values), key=lambda v: (str(type(v)), v))
    if len(levels) < 2:
        return np.zeros((n, 0))
    if _numeric(values) and len(levels) > MAX_LEVELS:
        x = np.asarray(values, dtype=float)  # (n,)
        z = (x - x.mean()) / x.std()
        block = np.column_stack([z, z * z])  # (n, 2)
    else:
        index = {level: i for i, level in enumerate(levels)}
        block = np.zeros((n, len(levels) - 1))  # (n, levels-1): the first level is the reference
        for row, value in enumerate(values):
            if index[value]:
                block[row, index[value] - 1] = 1.0
    centred: np.ndarray = block - block.mean(axis=0)
    return centred


def main_effects(dimensions: Mapping[str, Sequence[Value]], target: Sequence[float], name: str) -> Importance | None:
    """Decompose ``target`` (one number per trial) into the main effects of ``dimensions`` (one value per trial
    each) and a residual; ``None`` with fewer than ``MIN_TRIALS`` trials or a target that does not vary."""
    y = np.asarray(target, dtype=float)  # (n,)
    n = len(y)
    if any(len(v) != n for v in dimensions.values()):
        raise ValueError(f"every dimension needs one value per trial ({n} for {name!r})")
    if n < MIN_TRIALS:
        return None
    y = y - y.mean()
    total = float(y @ y) / n
    if total <= 0.0:
        return None
    blocks = {label: design_block(values) for label, values in dimensions.items()}
    x = np.hstack([*blocks.values(), np.zeros((n, 0))])  # (n, p)
    p = x.shape[1]
    beta = np.linalg.solve(x.T @ x + RIDGE * n * np.eye(p), x.T @ y) if p else np.zeros(0)  # (p,)
    residual = y - x @ beta  # (n,)
    variances: dict[str, float] = {}
    start = 0
    for label, block in blocks.items():
        effect = block @ beta[start:start + block.shape[1]]  # (n,): this dimension's fitted effect per trial
        start += block.shape[1]
        variances[label] = float(effect @ effect) / n
    unexplained = float(residual @ residual) / n
    parts = sum(variances.values()) + unexplained
    return Importance(target=name, trials=n, shares={k: v / parts for k, v in variances.items()},
                      unexplained=unexplained / parts)
