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

Second order (``pairwise``), only where the trials can carry it: each pair of dimensions gets the products of
their main-effect columns, with the part the main effects already span projected out (so an interaction never
takes a main effect's credit, as in fANOVA's decomposition); everything is fitted jointly, and each effect's
variance is reduced by what fitting that many columns to pure noise would capture (its column count times the
residual variance per trial), so that a model with many columns does not pass noise off as interactions.
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


def _fit_shares(blocks: Mapping[str, np.ndarray], y: np.ndarray, *, noise_adjusted: bool) -> tuple[dict[str, float], float]:
    """Fit centred ``y`` on every block's columns at once (ridge ``RIDGE``); each block's share of the variance and
    the residual's. ``noise_adjusted``: a block's variance less what its columns would fit of pure noise, that part
    counted as unexplained."""
    n = len(y)
    x = np.hstack([*blocks.values(), np.zeros((n, 0))])  # (n, p)
    p = x.shape[1]
    beta = np.linalg.solve(x.T @ x + RIDGE * n * np.eye(p), x.T @ y) if p else np.zeros(0)  # (p,)
    residual = y - x @ beta  # (n,)
    unexplained = float(residual @ residual) / n
    noise_per_column = float(residual @ residual) / max(1, n - p - 1) / n if noise_adjusted else 0.0
    variances: dict[str, float] = {}
    start = 0
    for label, block in blocks.items():
        effect = block @ beta[start:start + block.shape[1]]  # (n,): this block's fitted effect per trial
        start += block.shape[1]
        variance = float(effect @ effect) / n
        adjusted = max(0.0, variance - block.shape[1] * noise_per_column)
        unexplained += variance - adjusted
        variances[label] = adjusted
    parts = sum(variances.values()) + unexplained
    return {k: v / parts for k, v in variances.items()}, unexplained / parts


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
    shares, unexplained = _fit_shares(blocks, y, noise_adjusted=False)
    return Importance(target=name, trials=n, shares=shares, unexplained=unexplained)


INTERACTION_TRIALS_PER_COLUMN = 3
"""Pairwise interactions are fitted only with at least this many trials per fitted column (main effects and
interactions together): with fewer, the fit would be mostly noise (``pairwise`` then says so)."""
PAIR = " × "
"""Joins a pair's labels: ``"micro_batch_size × patch fused-qkv"``."""


def interaction_block(a: np.ndarray, b: np.ndarray, main: np.ndarray) -> np.ndarray:
    """The centred products of two dimensions' main-effect columns (shape (trials, columns a × columns b)), less
    their projection on every main-effect column ``main``: what the pair does beyond the sum of its parts."""
    n = a.shape[0]
    products = np.stack([a[:, i] * b[:, j] for i in range(a.shape[1]) for j in range(b.shape[1])], axis=1) \
        if a.shape[1] and b.shape[1] else np.zeros((n, 0))  # (n, ka*kb)
    products = products - products.mean(axis=0)
    if main.shape[1] and products.shape[1]:
        coef, *_ = np.linalg.lstsq(main, products, rcond=None)  # (p_main, ka*kb)
        products = products - main @ coef
    keep = np.linalg.norm(products, axis=0) > 1e-9 * np.sqrt(n)  # a product the main effects span entirely: gone
    kept: np.ndarray = products[:, keep]
    return kept


def pairwise(dimensions: Mapping[str, Sequence[Value]], target: Sequence[float], name: str) -> Importance | str:
    """``main_effects`` with an effect per pair of dimensions beside them (``interaction_block``), each effect's
    variance net of what its columns would fit of noise; shares keyed by a dimension's label and by
    ``"a × b"``. When the trials cannot carry it (too few per fitted column, a target that does not vary, fewer
    than two dimensions that vary), the reason instead."""
    y = np.asarray(target, dtype=float)  # (n,)
    n = len(y)
    if any(len(v) != n for v in dimensions.values()):
        raise ValueError(f"every dimension needs one value per trial ({n} for {name!r})")
    mains = {label: design_block(values) for label, values in dimensions.items()}
    varying = [label for label, block in mains.items() if block.shape[1]]
    if len(varying) < 2:
        return "fewer than two knobs or patches vary"
    main = np.hstack([mains[label] for label in varying])  # (n, p_main)
    pairs = {f"{a}{PAIR}{b}": interaction_block(mains[a], mains[b], main)
             for i, a in enumerate(varying) for b in varying[i + 1:]}
    columns = main.shape[1] + sum(block.shape[1] for block in pairs.values())
    if n < INTERACTION_TRIALS_PER_COLUMN * columns:
        return (f"{n} trials for {columns} columns: pairwise interactions need {INTERACTION_TRIALS_PER_COLUMN} "
                f"trials per column ({INTERACTION_TRIALS_PER_COLUMN * columns})")
    y = y - y.mean()
    if float(y @ y) <= 0.0:
        return f"the {name} does not vary"
    shares, unexplained = _fit_shares({**mains, **pairs}, y, noise_adjusted=True)
    return Importance(target=name, trials=n, shares=shares, unexplained=unexplained)
