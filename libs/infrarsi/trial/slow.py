"""The rule for stopping a running search trial early as ``stopped_slow`` (docs/trials.md, "Stopped early as slow").

Owns ``slow_verdict``: given rank 0's step times so far, the study's incumbent step time, the contract's
``budget.stop_slow_factor`` and the doctor's run-to-run noise, whether the trial is already ruled out — its
steady steps (after the warm-up ``stats.detect_warmup`` finds) far slower than the incumbent — and the
``TrialStopRequested`` that says so. Pure (no I/O, no clock): telemetry calls it on each step it receives and
publishes what it returns; the launcher does the stopping. Must not: decide which kinds of trial may be
stopped beyond ``may_stop``, or publish.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from infrarsi import events as ev
from infrarsi.verdicts.stats import detect_warmup

STOPPABLE_KINDS: tuple[str, ...] = ("search",)
"""Only search trials: a baseline, a doctor repeat or a verify run is the reference or the proof, whatever its speed."""

UNSTOPPABLE_ORIGINS: tuple[str, ...] = ("manual",)
"""A candidate a person named (``infrarsi trial --set``, origin ``manual``) runs to the end: they asked what it
does, not whether it beats an incumbent (on a tiny job a loaded host made one 17x the baseline and it was stopped)."""


def may_stop(proposed: ev.TrialProposed) -> bool:
    """Whether a trial may be stopped as slow at all: a search trial the search chose, never a reference run."""
    return proposed.kind in STOPPABLE_KINDS and proposed.origin not in UNSTOPPABLE_ORIGINS

MIN_STEADY_STEPS = 3
"""Steady steps (after the warm-up) before a verdict: one slow step is a GC pause, three in a row are the candidate."""

MIN_STEPS = 5
"""Steps before a verdict: ``detect_warmup`` needs a tail to tell a warm-up from the steady state (on three
steps, two compile-slow ones and a fast one look alike), and the kept measurement should be of steady steps."""

NOISE_SIGMAS = 6.0
"""The bar is at least this many of the doctor's run-to-run σ above the incumbent: never stop on noise."""


def slow_threshold(incumbent_s: float, factor: float, noise_cv: float | None) -> float:
    """The step time a trial's steady steps must all exceed to be stopped: the incumbent × ``factor``, or
    wider where the doctor measured a noisy host (× exp(``NOISE_SIGMAS`` · log(1 + cv)))."""
    noise = NOISE_SIGMAS * math.log1p(noise_cv) if noise_cv and noise_cv > 0 else 0.0
    return incumbent_s * max(factor, math.exp(noise))


def slow_verdict(step_times: Sequence[float], *, incumbent_s: float, incumbent_trial: str, factor: float,
                 noise_cv: float | None = None) -> ev.TrialStopRequested | None:
    """A stop request when the trial is already ruled out, else ``None``.

    Ruled out: at least ``MIN_STEPS`` steps, ``MIN_STEADY_STEPS`` of them after the warm-up, their median above the threshold, and
    the last ``MIN_STEADY_STEPS`` of them each above it (a warm-up still decaying towards a fast step is not
    cut short). ``step_times`` are rank 0's, in step order.
    """
    if not incumbent_s > 0 or len(step_times) < max(MIN_STEPS, MIN_STEADY_STEPS):
        return None
    warmup = detect_warmup(step_times)
    steady = np.asarray(step_times[warmup:], dtype=float)
    if len(steady) < MIN_STEADY_STEPS:
        return None
    threshold = slow_threshold(incumbent_s, factor, noise_cv)
    median = float(np.median(steady))
    if median <= threshold or not bool(np.all(steady[-MIN_STEADY_STEPS:] > threshold)):
        return None
    ratio = median / incumbent_s
    return ev.TrialStopRequested(
        steady_step_s=median, steady_steps=len(steady), warmup_steps=warmup, incumbent_step_s=incumbent_s,
        incumbent_trial=incumbent_trial, threshold_step_s=threshold,
        reason=(f"steady steps {median:.3g} s over {len(steady)} steps after {warmup} warm-up, {ratio:.1f}x the "
                f"incumbent's {incumbent_s:.3g} s (stop above {threshold:.3g} s)"),
    )  # fmt: skip
