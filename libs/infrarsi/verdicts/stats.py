"""Telemetry statistics: from a trial's step samples to a ``TrialMeasured``, and the invariant verdicts.

Owns the pure math of the telemetry service and of the launcher's cost split: warm-up detection, robust
centre and spread, stragglers, MFU, and the evaluation of the contract's invariants (ARCHITECTURE.md §7)
against a baseline. Inputs are ``TrialStep`` samples (deduplicated here by (rank, step), so late, repeated
or reordered deliveries give the same answer), the launcher's ``TrialFinished`` and plain numbers.

This module must not do I/O, talk to the bus or import torch.

Definitions (also in docs/trials.md):

- **warm-up**: the leading steps whose time stays above ``median_steady + max(k · σ̂, 5 % · median_steady)``,
  where the steady reference (median, σ̂ = 1.4826 · MAD) comes from the second half of the series. The
  first step at or below the threshold whose next few steps are (in median) also below ends the warm-up.
  A spike later in the run (an eval, a GC pause) does not extend it.
- **step time**: median of the steady steps of the slowest rank; **spread**: their MAD (unscaled).
- **step time with warm-up**: mean over all steps of that rank (total time / steps, what a user pays).
- **straggler**: a rank whose steady median exceeds the median of the other ranks' medians by more than
  ``max(k · σ̂_pooled, 5 %)``.
- **timing invariant**: over the steady steps, the launcher's own clock (``TrialFinished.step_seen_s``,
  when each rank-0 step became visible in the probe's file) must agree with the reported step times.
  Each steady interval gives a ratio reported / launcher-seen; their **median** must be within
  ``tolerance + 3 · doctor noise CV + 3 · standard error of that median`` of 1. Intervals next to an eval
  step are left out: eval is not part of a training step. Why the median and the allowance: a reward hack
  that slows the probe's clock moves *every* interval by the same factor (median far from 1, little
  spread), while a loaded host stretches some intervals (descheduled between two records, the launcher
  late to see one) and leaves the median near 1 with a wide spread, which widens the allowance. A trial
  that still fails while the host's CPU pressure during it was ``≥ INTERFERENCE_RERUN`` is marked
  ``interfered``: its verdict is not about the candidate, and it is re-run instead of rejected. Fewer than
  ``MIN_TIMING_RATIOS`` comparable intervals (a short horizon, mostly warm-up) leave the invariant
  **unchecked** (``TrialMeasured.unchecked_invariants``), as does a loss check with no checkpoint in both
  runs: named as such in the trial, the verify verdict and the report, never counted as held.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from infrarsi import events as ev

MAD_TO_SIGMA = 1.4826
"""σ of a normal distribution = 1.4826 × MAD."""

WARMUP_K = 5.0
STRAGGLER_K = 3.0
RELATIVE_FLOOR = 0.05
"""Differences below 5 % of the median never count as warm-up or straggling (timer noise on a busy host)."""


# --------------------------------------------------------------------------------------------------
# Robust statistics
# --------------------------------------------------------------------------------------------------


FloatSeries = Sequence[float] | np.ndarray
"""A series of numbers: a list or a 1-D numpy array (the robust statistics take either)."""


def median(values: FloatSeries) -> float:
    return float(np.median(np.asarray(values, dtype=float))) if len(values) else math.nan


def mad(values: FloatSeries) -> float:
    """Median absolute deviation from the median (unscaled)."""
    if not len(values):
        return math.nan
    x = np.asarray(values, dtype=float)
    return float(np.median(np.abs(x - np.median(x))))


def robust_sigma(values: FloatSeries) -> float:
    """1.4826 · MAD: a normal σ that one GC pause or one slow step does not move (0 for no values)."""
    return MAD_TO_SIGMA * mad(values) if len(values) else 0.0


def detect_warmup(times: FloatSeries, *, k: float = WARMUP_K, max_fraction: float = 0.6, confirm: int = 3) -> int:
    """Number of leading warm-up steps of a step-time series (0 when none is detected).

    The steady reference is the second half of the series; at most ``max_fraction`` of the steps are
    counted as warm-up, so a trial that never settles still has steady steps to measure.
    """
    x = np.asarray(times, dtype=float)
    n = len(x)
    if n < 3:
        return 1 if n == 2 and x[0] > x[1] * (1 + RELATIVE_FLOOR) else 0
    tail = x[n // 2 :]
    centre = float(np.median(tail))
    sigma = robust_sigma(tail)
    threshold = centre + max(k * sigma, RELATIVE_FLOOR * centre)
    limit = max(1, int(max_fraction * n))
    for i in range(limit + 1):
        if x[i] <= threshold and float(np.median(x[i : i + confirm])) <= threshold:
            return i
    return limit


def two_segment_split(times: FloatSeries) -> int:
    """Least-squares change point: the split ``w`` minimising the squared error of two constant segments.

    A second, independent estimate of the warm-up boundary (used in tests and diagnostics); a decaying
    warm-up is where the step-function fit is weakest, which is why ``detect_warmup`` is the default.
    """
    x = np.asarray(times, dtype=float)
    n = len(x)
    if n < 3:
        return 0
    csum = np.cumsum(x)
    csq = np.cumsum(x * x)
    best, best_w = math.inf, 0
    for w in range(1, n - 1):
        left_sse = csq[w - 1] - csum[w - 1] ** 2 / w
        right_n = n - w
        right_sum = csum[-1] - csum[w - 1]
        right_sse = (csq[-1] - csq[w - 1]) - right_sum**2 / right_n
        if left_sse + right_sse < best:
            best, best_w = left_sse + right_sse, w
    return best_w


def stragglers(rank_medians: Sequence[float], rank_mads: Sequence[float], *, k: float = STRAGGLER_K) -> list[int]:
    """Ranks whose median exceeds the median of the other ranks' medians by > max(k·σ̂, 5 %)."""
    m = np.asarray(rank_medians, dtype=float)
    if len(m) < 2:
        return []
    pooled_sigma = MAD_TO_SIGMA * float(np.median(np.asarray(rank_mads, dtype=float)))
    out = []
    for r in range(len(m)):
        others = float(np.median(np.delete(m, r)))
        if m[r] - others > max(k * pooled_sigma, RELATIVE_FLOOR * others):
            out.append(r)
    return out


# --------------------------------------------------------------------------------------------------
# One trial's series
# --------------------------------------------------------------------------------------------------


def dedup_steps(samples: Iterable[ev.TrialStep]) -> dict[int, list[ev.TrialStep]]:
    """Per rank, the steps in step order; the first sample of a (rank, step) wins, later copies are ignored."""
    seen: dict[tuple[int, int], ev.TrialStep] = {}
    for s in samples:
        seen.setdefault((s.rank, s.step), s)
    by_rank: dict[int, list[ev.TrialStep]] = {}
    for (rank, _step), s in sorted(seen.items()):
        by_rank.setdefault(rank, []).append(s)
    return by_rank


@dataclass(frozen=True)
class Series:
    """What telemetry knows of one trial's steps (also kept for a study's baseline)."""

    world_size: int
    steps: int
    """Steps of rank 0."""
    warmup_steps: int
    step_time_s: float
    step_time_mad_s: float
    step_time_with_warmup_s: float
    per_rank_step_s: list[float]
    stragglers: list[int]
    phases: dict[str, float]
    peak_memory_bytes: list[int]
    tokens_per_step: list[int]
    optimizer_steps: int
    loss_curve: list[ev.LossPoint]
    eval_curve: list[ev.LossPoint]
    eval_tokens: list[int]
    flops_per_step: float | None
    probe_mfu: float | None
    rank0_steps: list[int] = field(default_factory=list)
    rank0_times: list[float] = field(default_factory=list)
    shape: ev.WorkloadShape | None = None
    """The model's shape from rank 0's first record that carries one."""
    deterministic: bool | None = None
    """Deterministic algorithms on at every step of every rank that said (``None``: no step said)."""

    @property
    def tokens(self) -> int:
        return int(sum(self.tokens_per_step))

    @property
    def eval_steps(self) -> list[int]:
        return [p.step for p in self.eval_curve]


def _all_deterministic(by_rank: dict[int, list[ev.TrialStep]]) -> bool | None:
    said = [s.deterministic for steps in by_rank.values() for s in steps if s.deterministic is not None]
    return all(said) if said else None


def summarise(samples: Iterable[ev.TrialStep]) -> Series:
    """Robust statistics of a trial's steps (any order, duplicates allowed)."""
    by_rank = dedup_steps(samples)
    if not by_rank:
        return Series(
            world_size=0, steps=0, warmup_steps=0, step_time_s=math.nan, step_time_mad_s=math.nan,
            step_time_with_warmup_s=math.nan, per_rank_step_s=[], stragglers=[], phases={},
            peak_memory_bytes=[], tokens_per_step=[], optimizer_steps=0, loss_curve=[], eval_curve=[],
            eval_tokens=[], flops_per_step=None, probe_mfu=None,
        )  # fmt: skip
    world = max(max(s.world_size for s in steps) for steps in by_rank.values())
    world = max(world, max(by_rank) + 1)
    rank0 = by_rank.get(0) or by_rank[min(by_rank)]
    times0 = [float(s.step_time_s) for s in rank0]
    warmup = detect_warmup(times0)

    per_rank_median, per_rank_mad = [], []
    for r in range(world):
        steady = [s.step_time_s for s in by_rank.get(r, [])][warmup:] or [s.step_time_s for s in by_rank.get(r, [])]
        per_rank_median.append(median(steady) if steady else math.nan)
        per_rank_mad.append(mad(steady) if steady else math.nan)
    finite = [i for i, m in enumerate(per_rank_median) if not math.isnan(m)]
    slowest = max(finite, key=lambda i: per_rank_median[i])
    slow_steps = by_rank[slowest]
    steady_slow = slow_steps[warmup:] or slow_steps

    phase_names = sorted({p for s in steady_slow for p in s.phases})
    phases = {p: median([s.phases.get(p, 0.0) for s in steady_slow]) for p in phase_names}
    flops = [s.flops for s in steady_slow if s.flops]
    mfus = [s.mfu for s in steady_slow if s.mfu]
    return Series(
        world_size=world,
        steps=len(rank0),
        warmup_steps=warmup,
        step_time_s=per_rank_median[slowest],
        step_time_mad_s=per_rank_mad[slowest],
        step_time_with_warmup_s=float(np.mean([s.step_time_s for s in slow_steps])),
        per_rank_step_s=per_rank_median,
        stragglers=stragglers([per_rank_median[i] for i in finite], [per_rank_mad[i] for i in finite]),
        phases=phases,
        peak_memory_bytes=[max((s.peak_memory_bytes for s in by_rank.get(r, [])), default=0) for r in range(world)],
        tokens_per_step=[s.tokens for s in rank0],
        optimizer_steps=max(s.optimizer_steps for s in rank0),
        loss_curve=[ev.LossPoint(s.step, s.loss) for s in rank0 if s.loss is not None],
        eval_curve=[ev.LossPoint(s.step, s.eval_loss) for s in rank0 if s.eval_loss is not None],
        eval_tokens=[s.eval_tokens or 0 for s in rank0 if s.eval_loss is not None],
        flops_per_step=median(flops) if flops else None,
        probe_mfu=median(mfus) if mfus else None,
        rank0_steps=[s.step for s in rank0],
        rank0_times=times0,
        deterministic=_all_deterministic(by_rank),
        shape=next((s.shape for s in rank0 if s.shape is not None), None),
    )


def mfu(flops_per_step: float | None, step_time_s: float, peak_flops_per_device: float | None, devices: int) -> float | None:
    """Model FLOPs utilisation: the step's FLOPs (all ranks) / (step time × peak per device × devices)."""
    if not flops_per_step or not peak_flops_per_device or not step_time_s or math.isnan(step_time_s) or devices < 1:
        return None
    return flops_per_step / (step_time_s * peak_flops_per_device * devices)


# --------------------------------------------------------------------------------------------------
# Invariants
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InvariantSpec:
    """The contract's invariants, as plain values (see ``infrarsi.study.contract.Invariants``)."""

    loss_tolerance: float
    loss_mode: str = "relative"
    loss_at: Literal["every_eval", "every_step"] | list[int] = "every_eval"
    steps: bool = True
    tokens: bool = True
    eval: bool = True
    timing_tolerance: float = 0.10
    noise_cv: float = 0.0
    """The doctor's run-to-run CV of the baseline on this host (0 before the doctor ran): widens the timing
    allowance on a host whose timings vary."""
    global_batch: int | None = None
    """Sequences per optimiser step, when the contract fixes it (tokens per step must be a multiple)."""


INTERFERENCE_RERUN = 0.25
"""Host CPU pressure (share of a trial's wall time in which some task waited for a CPU, ``TrialFinished.
cpu_pressure``) at or above which a failed timing check says more about the host than about the candidate."""
MAX_TIMING_ALLOWANCE = 0.35
"""The timing allowance never exceeds this, however noisy the doctor found the host: the doctor's noise is
between runs, while the probe/launcher ratio is within one run and stays near 1 under load (0.997–1.000 at a
load average of 14 on 2 cores, issue 15's agent study) — uncapped, a doctor CV of 20 % allowed 70 % and a probe
clock slowed to half speed was verified as a ×3.1 speed-up."""
MIN_TIMING_RATIOS = 3
"""Comparable steady intervals below which the timing invariant is reported unchecked (a median of fewer
says nothing about a clock)."""
MEDIAN_SE = 1.2533
"""Standard error of a median = 1.2533 · σ / √n (normal samples)."""


def timing_ratios(series: Series, step_seen_s: Sequence[float]) -> list[float]:
    """Reported step time / launcher-seen interval, for each steady interval not next to an eval."""
    n = min(len(step_seen_s), len(series.rank0_times))
    eval_steps = set(series.eval_steps)
    ratios = []
    for i in range(max(series.warmup_steps, 1), n):
        if series.rank0_steps[i - 1] in eval_steps or series.rank0_steps[i] in eval_steps:
            continue  # an eval ran next to this interval (before or after its record was written)
        wall = float(step_seen_s[i] - step_seen_s[i - 1])
        if wall > 0:
            ratios.append(float(series.rank0_times[i]) / wall)
    return ratios


def timing_check(
    series: Series,
    step_seen_s: Sequence[float],
    tolerance: float,
    *,
    noise_cv: float = 0.0,
    cpu_pressure: float | None = None,
) -> ev.InvariantResult | ev.UncheckedInvariant:
    """The probe's step times vs the launcher's own clock (see the module doc for the rule and why); too few
    comparable steady steps leave it unchecked — named, never a pass."""
    ratios = timing_ratios(series, step_seen_s)
    if len(ratios) < MIN_TIMING_RATIOS:
        return ev.UncheckedInvariant(
            name="timing", reason=f"{len(ratios)} comparable steady steps (fewer than {MIN_TIMING_RATIOS})")
    observed = median(ratios)
    standard_error = MEDIAN_SE * robust_sigma(ratios) / math.sqrt(len(ratios))
    allowed = min(tolerance + 3.0 * max(noise_cv, 0.0) + 3.0 * standard_error, max(tolerance, MAX_TIMING_ALLOWANCE))
    error = abs(observed - 1.0)
    ok = bool(error <= allowed)
    detail = (f"reported / launcher-seen step time {observed:.3f} (median of {len(ratios)} steady steps), "
              f"{error:.1%} off; allowed {allowed:.1%} = tolerance {tolerance:.0%} + 3 × noise {max(noise_cv, 0):.1%} "
              f"+ 3 × s.e. {standard_error:.1%}")
    if cpu_pressure is not None:
        detail += f"; host CPU pressure {cpu_pressure:.0%}"
        if not ok and cpu_pressure >= INTERFERENCE_RERUN:
            detail += " (measured under interference: re-run, not a verdict)"
    return ev.InvariantResult(name="timing", ok=ok, detail=detail, observed=observed, expected=1.0, tolerance=allowed)


def interfered(result: ev.InvariantResult, cpu_pressure: float | None) -> bool:
    """A failed timing verdict taken while the host was too loaded to tell a hack from noise."""
    return result.name == "timing" and not result.ok and cpu_pressure is not None and cpu_pressure >= INTERFERENCE_RERUN


@dataclass(frozen=True)
class LossCurves:
    """One run's loss as the loss invariant reads it: train and eval curves, and its last step."""

    loss_curve: Sequence[ev.LossPoint]
    eval_curve: Sequence[ev.LossPoint]
    last_step: int

    @classmethod
    def of(cls, series: Series) -> LossCurves:
        return cls(series.loss_curve, series.eval_curve, series.steps and series.rank0_steps[-1])


def _loss_checkpoints(spec: InvariantSpec, trial: LossCurves, base: LossCurves) -> tuple[str, list[tuple[int, float, float]]]:
    """(what, [(step, trial loss, baseline loss)]) at the contract's checkpoints present in both runs."""
    horizon = min(trial.last_step, base.last_step)
    if spec.loss_at == "every_eval":
        t, b, what = dict((p.step, p.loss) for p in trial.eval_curve), dict((p.step, p.loss) for p in base.eval_curve), "eval loss"
        wanted = sorted(s for s in b if s <= horizon)
    else:
        t, b, what = dict((p.step, p.loss) for p in trial.loss_curve), dict((p.step, p.loss) for p in base.loss_curve), "train loss"
        wanted = sorted(b) if isinstance(spec.loss_at, str) else sorted(spec.loss_at)  # str: "every_step"
        wanted = [s for s in wanted if s <= horizon]
    return what, [(s, t.get(s, math.nan), b.get(s, math.nan)) for s in wanted]


def loss_check(spec: InvariantSpec, trial: Series, base: Series) -> ev.InvariantResult | ev.UncheckedInvariant:
    return curves_loss_check(spec, LossCurves.of(trial), LossCurves.of(base))


def curves_loss_check(spec: InvariantSpec, trial: LossCurves, base: LossCurves, *, source: str = ""
                      ) -> ev.InvariantResult | ev.UncheckedInvariant:  # fmt: skip
    """The loss invariant over two runs' curves (``source``: where the curves came from, for the detail)."""
    what, points = _loss_checkpoints(spec, trial, base)
    if not points:
        return ev.UncheckedInvariant(name="loss", reason=f"no {what} checkpoint in both runs{source}")
    worst_step, worst, worst_allowed, missing = None, -1.0, spec.loss_tolerance, []
    ok = True
    for step, lt, lb in points:
        if math.isnan(lt) or math.isnan(lb) or math.isinf(lt):
            missing.append(step)
            ok = False
            continue
        dev = abs(lt - lb) / abs(lb) if spec.loss_mode == "relative" else abs(lt - lb)
        if dev > spec.loss_tolerance:
            ok = False
        if dev > worst:
            worst, worst_step = dev, step
    unit = "" if spec.loss_mode == "absolute" else " (relative)"
    detail = f"{what}{source} at {len(points)} checkpoints: largest deviation {max(worst, 0):.4g}{unit} at step {worst_step}"
    if missing:
        detail += f"; missing or non-finite at steps {missing}"
    return ev.InvariantResult(name="loss", ok=ok, detail=detail, observed=max(worst, 0.0), expected=0.0, tolerance=worst_allowed)


def check_invariants(
    spec: InvariantSpec,
    trial: Series,
    finished: ev.TrialFinished,
    *,
    horizon: int,
    baseline: Series | None,
    is_baseline: bool = False,
) -> tuple[list[ev.InvariantResult], list[ev.UncheckedInvariant]]:
    """(every checked invariant's verdict, the invariants this trial could not check and why). ``baseline`` is
    the study's golden baseline at this horizon (``None`` for a baseline trial, ``is_baseline``: internal
    checks only, its own counts define the work)."""
    results: list[ev.InvariantResult | ev.UncheckedInvariant] = [scope_check(finished)]
    if spec.steps:
        results.append(steps_check(trial.optimizer_steps, horizon, "optimiser steps counted by the probe",
                                   baseline_count=baseline.optimizer_steps if baseline is not None else None,
                                   is_baseline=is_baseline))  # fmt: skip
    if spec.tokens:
        results.append(_tokens_check(spec, trial, baseline))
    if spec.eval:
        results.append(_eval_check(trial, baseline))
    if baseline is not None:
        results.append(loss_check(spec, trial, baseline))
    results.append(timing_check(trial, finished.step_seen_s, spec.timing_tolerance, noise_cv=spec.noise_cv,
                                cpu_pressure=finished.cpu_pressure))
    return ([r for r in results if isinstance(r, ev.InvariantResult)],
            [r for r in results if isinstance(r, ev.UncheckedInvariant)])


def scope_check(finished: ev.TrialFinished) -> ev.InvariantResult:
    """The launcher's verdict on scope: a trial it refused as ``scope_violation`` fails, any other held."""
    violated = finished.status == "scope_violation"
    return ev.InvariantResult(
        name="scope", ok=not violated, detail=finished.reason if violated else "launcher applied only in-scope changes"
    )


def steps_check(counted: int, horizon: int, how: str, *, baseline_count: int | None = None,
                is_baseline: bool = False) -> ev.InvariantResult:  # fmt: skip
    """The optimiser steps ``counted`` (``how``) against the work the golden baseline does.

    The contract's horizon is a request, not the truth (a loop may run ``max_iters + 1`` iterations): an
    untouched baseline (``is_baseline``) defines the work with its own count and is never rejected on it
    (the doctor compares its runs with each other); a candidate must count what the golden baseline counted
    at the same horizon (``baseline_count``), or the horizon when no baseline was measured there yet."""
    if is_baseline:
        return ev.InvariantResult(
            name="work.optimizer_steps",
            ok=counted > 0,
            detail=(f"{counted} {how}, horizon {horizon} requested: the untouched baseline's count defines the work"
                    if counted > 0 else f"no steps {how}: nothing to define the work with"),
            observed=float(counted),
            expected=float(counted),
        )  # fmt: skip
    expected = baseline_count if baseline_count is not None else horizon
    against = (f"the golden baseline counted {baseline_count} at horizon {horizon}" if baseline_count is not None
               else f"horizon {horizon} (no golden baseline measured at this horizon)")  # fmt: skip
    return ev.InvariantResult(
        name="work.optimizer_steps",
        ok=counted == expected,
        detail=f"{counted} {how}; {against}",
        observed=float(counted),
        expected=float(expected),
    )


def _tokens_check(spec: InvariantSpec, trial: Series, baseline: Series | None) -> ev.InvariantResult:
    per_step = sorted(set(trial.tokens_per_step))
    if not per_step:
        return ev.InvariantResult(name="work.tokens", ok=False, detail="no steps reported")
    if baseline is not None and baseline.tokens_per_step:
        expected = baseline.tokens_per_step[0]
        ok = per_step == [expected]
        return ev.InvariantResult(
            name="work.tokens",
            ok=ok,
            detail=f"tokens per step {per_step} vs baseline {expected}",
            observed=float(per_step[0] if ok else next(t for t in per_step if t != expected)),
            expected=float(expected),
        )
    ok = len(per_step) == 1 and (spec.global_batch is None or per_step[0] % spec.global_batch == 0)
    return ev.InvariantResult(
        name="work.tokens",
        ok=ok,
        detail=f"tokens per step {per_step}" + (f", global batch {spec.global_batch}" if spec.global_batch else ""),
        observed=float(per_step[0]),
    )


def _eval_check(trial: Series, baseline: Series | None) -> ev.InvariantResult:
    steps = trial.eval_steps
    tokens = sorted(set(trial.eval_tokens))
    if baseline is None:
        first = trial.rank0_steps[0] if trial.rank0_steps else 0
        counts = [s - first + 1 for s in steps]  # steps are indices; evals come after every k-th step
        gaps = sorted({b - a for a, b in zip([0, *counts[:-1]], counts, strict=True)}) if counts else []
        # evals every k steps, plus one after the last step when the horizon is not a multiple of k
        regular = len(gaps) <= 1 or (len(gaps) == 2 and steps[-1] == trial.rank0_steps[-1])
        ok = bool(steps) and regular and len(tokens) == 1
        return ev.InvariantResult(name="work.eval", ok=ok, detail=f"eval at steps {steps}, eval tokens {tokens}")
    horizon = min(trial.rank0_steps[-1] if trial.rank0_steps else 0, baseline.rank0_steps[-1] if baseline.rank0_steps else 0)
    base_steps = [s for s in baseline.eval_steps if s <= horizon]
    mine = [s for s in steps if s <= horizon]
    base_tokens = sorted(set(baseline.eval_tokens))
    ok = mine == base_steps and tokens == base_tokens
    return ev.InvariantResult(
        name="work.eval",
        ok=ok,
        detail=f"eval at steps {mine} with tokens {tokens}; baseline {base_steps} with {base_tokens}",
        observed=float(tokens[0]) if tokens else None,
        expected=float(base_tokens[0]) if base_tokens else None,
    )


# --------------------------------------------------------------------------------------------------
# The measurement
# --------------------------------------------------------------------------------------------------


def measure(
    samples: Iterable[ev.TrialStep],
    finished: ev.TrialFinished,
    *,
    candidate_key: str,
    kind: ev.TrialKind,
    horizon: int,
    spec: InvariantSpec,
    baseline: Series | None,
    peak_flops_per_device: float | None,
    is_baseline: bool = False,
) -> tuple[ev.TrialMeasured, Series]:
    """The ``TrialMeasured`` of one trial (and its series, kept by telemetry if it becomes the baseline)."""
    series = summarise(samples)

    def nan_to_zero(v: float | None) -> float:
        return 0.0 if v is None or math.isnan(v) else float(v)

    invariants, unchecked = (check_invariants(spec, series, finished, horizon=horizon, baseline=baseline,
                                              is_baseline=is_baseline)
                             if series.steps else ([], []))  # fmt: skip
    invariants_ok = series.steps > 0 and finished.status == "ok" and all(r.ok for r in invariants)
    status: ev.TrialStatus = finished.status
    if status == "ok" and not invariants_ok:
        status = "invariant_violation"
    failed = [r for r in invariants if not r.ok]
    under_interference = bool(failed) and all(interfered(r, finished.cpu_pressure) for r in failed)
    tokens_per_step = median(series.tokens_per_step[series.warmup_steps :] or series.tokens_per_step) if series.steps else 0.0
    devices = series.world_size or finished.ranks
    utilisation = mfu(series.flops_per_step, series.step_time_s, peak_flops_per_device, devices)
    if utilisation is None:
        utilisation = series.probe_mfu
    measured = ev.TrialMeasured(
        candidate_key=candidate_key,
        kind=kind,
        status=status,
        steps=series.steps,
        warmup_steps=series.warmup_steps,
        step_time_s=nan_to_zero(series.step_time_s),
        step_time_mad_s=nan_to_zero(series.step_time_mad_s),
        step_time_with_warmup_s=nan_to_zero(series.step_time_with_warmup_s),
        tokens_per_s=tokens_per_step / series.step_time_s if series.steps and series.step_time_s > 0 else 0.0,
        mfu=utilisation,
        flops_per_step=series.flops_per_step,
        phases=series.phases,
        peak_memory_bytes=series.peak_memory_bytes,
        per_rank_step_s=[nan_to_zero(v) for v in series.per_rank_step_s],
        stragglers=series.stragglers,
        loss_curve=series.loss_curve,
        eval_curve=series.eval_curve,
        optimizer_steps=series.optimizer_steps,
        tokens=series.tokens,
        invariants=invariants,
        invariants_ok=invariants_ok,
        accelerator_s=finished.accelerator_s,
        shape=series.shape,
        interfered=under_interference and finished.status == "ok",
        unchecked_invariants=unchecked,
        deterministic=series.deterministic,
    )
    return measured, series


# --------------------------------------------------------------------------------------------------
# Coarse measurement (a job without a probe)
# --------------------------------------------------------------------------------------------------


def coarse_step_time(finished: ev.TrialFinished, horizon: int) -> tuple[float, float, int]:
    """(steady step time, step time with warm-up, warm-up steps) of a trial measured from outside.

    With step counts seen at two or more times, the steady step time is the time between the first and
    the last count over the steps between them (the start-up before the first count — imports, model
    build, compile — is the warm-up); otherwise the wall time over the steps done (or the horizon)."""
    timed = [s for s in finished.output_steps if s.seen_s >= 0]
    steps = finished.steps_completed or horizon
    with_warmup = finished.wall_s / steps if steps else 0.0
    if len(timed) >= 2 and timed[-1].steps_done > timed[0].steps_done and timed[-1].seen_s > timed[0].seen_s:
        steady = (timed[-1].seen_s - timed[0].seen_s) / (timed[-1].steps_done - timed[0].steps_done)
        return steady, with_warmup, timed[0].steps_done
    return with_warmup, with_warmup, 0


@dataclass(frozen=True)
class StatedWork:
    """What the contract states of one coarse trial's work, to turn what its output says into tokens."""

    tokens_per_step: int | None = None
    """Tokens of one optimiser step (``workload.steps_key_tokens``, or the global batch × ``shape.seq_len``)."""
    tokens_per_micro_batch: int | None = None
    """This trial's micro-batch × sequence length × data-parallel ranks (for a printed micro-batch count)."""
    how: str = ""
    """Where the tokens per step came from, for the verdict's detail (``global batch 8 × sequence 64``)."""
    micro_batch_how: str = ""
    """Where the tokens per micro-batch came from (``micro-batch 2 × sequence 64 × 1 data-parallel``)."""
    missing: str = "workload.measurement.tokens_regex (the tokens or micro-batches the job prints), or " \
        "workload.shape.seq_len with constraints.global_batch"
    """What the contract lacks for tokens (said when nothing gives them)."""


def coarse_tokens(finished: ev.TrialFinished, stated: StatedWork) -> tuple[int, str] | None:
    """(tokens trained, how they are known) of a trial measured from outside, best source first: the tokens
    the job printed; the micro-batches it printed × the tokens of its micro-batch; the steps counted × the
    tokens per step the contract states. ``None`` when none of them is known."""
    if finished.output_tokens is not None:
        return finished.output_tokens, "tokens read from the job's log"
    if finished.output_micro_batches is not None and stated.tokens_per_micro_batch:
        return (finished.output_micro_batches * stated.tokens_per_micro_batch,
                f"{finished.output_micro_batches} micro-batches read from the job's log × {stated.tokens_per_micro_batch} "
                f"tokens ({stated.micro_batch_how})")  # fmt: skip
    if finished.steps_completed and stated.tokens_per_step:
        return (finished.steps_completed * stated.tokens_per_step,
                f"derived: {finished.steps_completed} steps counted × {stated.tokens_per_step} tokens per step the "
                f"contract states ({stated.how})")  # fmt: skip
    return None


def coarse_tokens_check(
    tokens: tuple[int, str] | None, stated: StatedWork, horizon: int, *, baseline_tokens: int | None, is_baseline: bool
) -> ev.InvariantResult | ev.UncheckedInvariant:
    """``work.tokens`` of a coarse trial: the untouched baseline's tokens define the work; a candidate must have
    trained what the golden baseline trained at this horizon (or, before one was measured, the horizon × the
    stated tokens per step)."""
    if tokens is None:
        return ev.UncheckedInvariant(name="work.tokens", reason=f"tokens unknown: the job printed none and the "
                                     f"contract does not state them; give {stated.missing}")  # fmt: skip
    count, how = tokens
    if is_baseline:
        return ev.InvariantResult(name="work.tokens", ok=count > 0, observed=float(count), expected=float(count),
                                  detail=f"{count} tokens, {how}: the untouched baseline's tokens define the work")  # fmt: skip
    if baseline_tokens:
        expected, against = baseline_tokens, f"the golden baseline trained {baseline_tokens} at horizon {horizon}"
    elif stated.tokens_per_step:
        expected = horizon * stated.tokens_per_step
        against = f"horizon {horizon} × {stated.tokens_per_step} (no golden baseline measured at this horizon)"
    else:
        return ev.UncheckedInvariant(name="work.tokens", reason=f"{count} tokens ({how}), but no golden baseline "
                                     "measured at this horizon to compare with")  # fmt: skip
    return ev.InvariantResult(name="work.tokens", ok=count == expected, detail=f"{count} tokens, {how}; {against}",
                              observed=float(count), expected=float(expected))  # fmt: skip


def coarse_eval_check(finished: ev.TrialFinished, *, baseline: ev.TrialMeasured | None, is_baseline: bool
                      ) -> ev.InvariantResult | ev.UncheckedInvariant:  # fmt: skip
    """``work.eval`` of a coarse trial: the steps after which the job printed an eval loss, against the golden
    baseline's (the eval's own tokens are not printed: its cadence is what the log shows)."""
    mine = [p.step for p in finished.output_eval_losses]
    if not mine and (is_baseline or baseline is None or not baseline.eval_curve):
        return ev.UncheckedInvariant(name="work.eval", reason="no eval loss read from the job's output (the default "
                                     "patterns and workload.measurement.eval_loss_regex matched nothing)")  # fmt: skip
    if is_baseline:
        return ev.InvariantResult(name="work.eval", ok=True, observed=float(len(mine)), expected=float(len(mine)),
                                  detail=f"evals after steps {mine} read from the job's log: the untouched "
                                  "baseline's evals define the work")  # fmt: skip
    if baseline is None:
        return ev.UncheckedInvariant(name="work.eval", reason=f"evals after steps {mine} read from the job's log; "
                                     "no golden baseline measured at this horizon to compare with")  # fmt: skip
    base = [p.step for p in baseline.eval_curve]
    return ev.InvariantResult(name="work.eval", ok=mine == base, observed=float(len(mine)), expected=float(len(base)),
                              detail=f"evals after steps {mine} read from the job's log; the golden baseline's "
                              f"after {base} (the eval's tokens are not printed)")  # fmt: skip


def measure_coarse(
    finished: ev.TrialFinished,
    *,
    candidate_key: str,
    kind: ev.TrialKind,
    horizon: int,
    spec: InvariantSpec,
    counts_steps: bool,
    is_baseline: bool,
    baseline: ev.TrialMeasured | None = None,
    stated: StatedWork = StatedWork(),
) -> ev.TrialMeasured:
    """The ``TrialMeasured`` of a trial measured from outside: what can be checked is, the rest is named.

    Checked: scope (the launcher's); the optimiser-step count when the output is counted (``counts_steps``:
    the contract gives a step pattern; the count is the job's own claim) against the golden ``baseline``'s
    count at this horizon; the tokens (``coarse_tokens``: printed, or micro-batches printed, or derived from
    the steps and what the contract ``stated``) against the baseline's; the evals the job printed against the
    baseline's; the loss, when the job printed one the patterns read, against the baseline's printed loss;
    timing, when the job printed its step times, against the launcher's clock. Unchecked, with why: whatever
    the output did not say and the contract does not state."""
    invariants: list[ev.InvariantResult] = [scope_check(finished)]
    unchecked: list[ev.UncheckedInvariant] = []
    if spec.steps and counts_steps:
        invariants.append(steps_check(
            finished.steps_completed, horizon, "steps counted in the job's output (coarse)",
            baseline_count=baseline.optimizer_steps if baseline is not None else None, is_baseline=is_baseline,
        ))  # fmt: skip
    elif spec.steps:
        unchecked.append(ev.UncheckedInvariant(name="work.optimizer_steps", reason="no step_regex: steps not counted"))
    tokens = coarse_tokens(finished, stated)
    work: list[ev.InvariantResult | ev.UncheckedInvariant] = []
    if spec.tokens:
        work.append(coarse_tokens_check(tokens, stated, horizon, is_baseline=is_baseline,
                                        baseline_tokens=baseline.tokens if baseline is not None else None))  # fmt: skip
    if spec.eval:
        work.append(coarse_eval_check(finished, baseline=baseline, is_baseline=is_baseline))
    for result in work:
        if isinstance(result, ev.InvariantResult):
            invariants.append(result)
        else:
            unchecked.append(result)
    logged = bool(finished.output_losses or finished.output_eval_losses)
    if not is_baseline:
        if baseline is None:
            unchecked.append(ev.UncheckedInvariant(name="loss", reason="no golden baseline measured at this horizon"))
        elif not logged or not (baseline.loss_curve or baseline.eval_curve):
            unchecked.append(ev.UncheckedInvariant(
                name="loss", reason="no loss read from the job's output (the default patterns and "
                "workload.measurement.loss_regex matched nothing)" if not logged else "the baseline printed no loss"))  # fmt: skip
        else:
            mine = LossCurves(finished.output_losses, finished.output_eval_losses, finished.steps_completed)
            base = LossCurves(baseline.loss_curve, baseline.eval_curve, baseline.optimizer_steps)
            result = curves_loss_check(spec, mine, base, source=" read from the job's log")
            if isinstance(result, ev.InvariantResult):
                invariants.append(result)
            else:
                unchecked.append(result)
    ran = finished.status == "ok"
    steady, with_warmup, warmup = coarse_step_time(finished, horizon) if ran else (0.0, 0.0, 0)
    timing = printed_timing_check(finished, spec.timing_tolerance, noise_cv=spec.noise_cv) if ran else None
    if isinstance(timing, ev.InvariantResult):
        invariants.append(timing)
    else:
        unchecked.append(timing or ev.UncheckedInvariant(name="timing", reason="the job did not run to the end"))
    invariants_ok = ran and all(r.ok for r in invariants)
    status: ev.TrialStatus = "invariant_violation" if ran and not invariants_ok else finished.status
    failed = [r for r in invariants if not r.ok]
    under_interference = bool(failed) and all(interfered(r, finished.cpu_pressure) for r in failed)
    return ev.TrialMeasured(
        candidate_key=candidate_key,
        kind=kind,
        status=status,
        steps=finished.steps_completed,
        warmup_steps=warmup,
        step_time_s=steady,
        step_time_mad_s=0.0,
        step_time_with_warmup_s=with_warmup,
        tokens_per_s=(tokens[0] / finished.steps_completed / steady
                      if tokens is not None and finished.steps_completed and steady > 0 else 0.0),
        mfu=None,
        flops_per_step=None,
        phases={},
        peak_memory_bytes=[finished.peak_memory_bytes] if finished.peak_memory_bytes else [],
        per_rank_step_s=[],
        stragglers=[],
        loss_curve=list(finished.output_losses),
        eval_curve=list(finished.output_eval_losses),
        optimizer_steps=finished.steps_completed,
        tokens=tokens[0] if tokens is not None else 0,
        invariants=invariants,
        invariants_ok=invariants_ok,
        accelerator_s=finished.accelerator_s,
        coarse=True,
        unchecked_invariants=unchecked,
        loss_from_log=logged,
        interfered=under_interference and ran,
    )


LINE_LATENCY_S = 0.02
"""How late the launcher may see a line of a coarse job's output after the job printed it (an inotify wake-up
and a read on a loaded host); the printed-times check allows twice this over the span it compares."""


def printed_timing_check(finished: ev.TrialFinished, tolerance: float, *, noise_cv: float = 0.0
                         ) -> ev.InvariantResult | ev.UncheckedInvariant:  # fmt: skip
    """The step times a coarse job printed against the launcher's clock.

    Each printed time covers the job's time since its previous step line, so the printed times of the step
    lines after the first must add up to the launcher's time between the first and the last of those lines
    (when each became visible in the output, unbuffered). Allowed: the contract's tolerance plus three times
    the doctor's run-to-run noise, capped like the probe's timing check. Fewer than ``MIN_TIMING_RATIOS``
    timed lines after the first leave it unchecked."""
    timed = [t for t in finished.output_step_times if t.seen_s >= 0]
    if len(timed) - 1 < MIN_TIMING_RATIOS or timed[-1].seen_s <= timed[0].seen_s:
        return ev.UncheckedInvariant(
            name="timing", reason=f"{max(len(timed) - 1, 0)} step times printed by the job after its first (fewer "
            f"than {MIN_TIMING_RATIOS}) to hold against the launcher's clock")  # fmt: skip
    printed = sum(t.step_time_s for t in timed[1:])
    seen = timed[-1].seen_s - timed[0].seen_s
    observed = printed / seen
    # the launcher sees each line within LINE_LATENCY_S of its print: the span's own error, relative to it
    latency = 2.0 * LINE_LATENCY_S / seen
    allowed = min(tolerance + 3.0 * max(noise_cv, 0.0) + latency, max(tolerance, MAX_TIMING_ALLOWANCE))
    error = abs(observed - 1.0)
    ok = bool(error <= allowed)
    detail = (f"printed / launcher-seen time {observed:.3f} over {len(timed) - 1} printed steps ({printed:.3f} s "
              f"printed, {seen:.3f} s between their lines), {error:.1%} off; allowed {allowed:.1%} = tolerance "
              f"{tolerance:.0%} + 3 × noise {max(noise_cv, 0):.1%} + line latency {latency:.1%}")  # fmt: skip
    if finished.cpu_pressure is not None:
        detail += f"; host CPU pressure {finished.cpu_pressure:.0%}"
        if not ok and finished.cpu_pressure >= INTERFERENCE_RERUN:
            detail += " (measured under interference: re-run, not a verdict)"
    return ev.InvariantResult(name="timing", ok=ok, detail=detail, observed=observed, expected=1.0, tolerance=allowed)
