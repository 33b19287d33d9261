"""Doctor: the baseline's noise floor, phase profile and statistical power (pure numpy/scipy).

Owns the numbers behind ``DoctorCompleted``: given k repeats of the untouched baseline (each a per-step
step-time series per rank, optionally with phase times), it finds the warm-up length (with the telemetry
service's rule, `stats.detect_warmup`, so a trial and the baseline drop the same steps), each run's robust
steady step time, run-to-run and step-to-step noise, phase fractions, per-rank medians and stragglers, the
minimum detectable speed-up at r repeats per arm, and the repeats needed for given effects. It also
measures a CPU host's matmul peak FLOP/s for MFU (``measure_cpu_peak``: only the dtypes the CPU runs
natively, bounded in time; torch is imported there only).

Statistical model (documented in docs/stages.md): a trial's robust step time T is log-normal across runs,
log T ~ N(μ_arm, σ²), σ = the sample standard deviation of log(per-run median) over the doctor repeats.
Comparing two arms of r runs each with a two-sided z-test at level α and power 1-β detects a ratio of

    MDE(r) = exp((z_{1-α/2} + z_{1-β}) · σ · sqrt(2 / r)).

This module does no I/O and knows nothing about the bus; ``infrarsi.commands.doctor`` feeds it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats

from infrarsi import events as ev
from infrarsi.verdicts.stats import FloatSeries, detect_warmup, robust_sigma

if TYPE_CHECKING:
    import torch

ALPHA = 0.05
POWER = 0.8
DEFAULT_EFFECTS = (1.02, 1.05, 1.10, 1.20)


# --------------------------------------------------------------------------------------------------
# Input
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSeries:
    """One baseline run: per rank, the step time of every optimiser step (in step order), and phases.

    ``step_s[rank]`` is a 1-D array (steps,). ``phases[rank][name]`` has the same length when the probe
    reported that phase. Ranks may have different lengths (a rank that died early); steps are aligned
    from the first step.
    """

    trial_id: str
    step_s: Mapping[int, np.ndarray]
    phases: Mapping[int, Mapping[str, np.ndarray]] = field(default_factory=dict)

    @classmethod
    def from_lists(
        cls,
        trial_id: str,
        step_s: Mapping[int, Sequence[float]],
        phases: Mapping[int, Mapping[str, Sequence[float]]] | None = None,
    ) -> RunSeries:
        return cls(
            trial_id=trial_id,
            step_s={int(r): np.asarray(v, dtype=float) for r, v in step_s.items()},
            phases={
                int(r): {name: np.asarray(v, dtype=float) for name, v in by_name.items()}
                for r, by_name in (phases or {}).items()
            },
        )

    def slowest_rank_series(self) -> np.ndarray:
        """Per step, the slowest rank's time (steps,): a synchronous step ends when its last rank does."""
        ranks = sorted(self.step_s)
        n = min(len(self.step_s[r]) for r in ranks)
        slowest: np.ndarray = np.max(np.stack([self.step_s[r][:n] for r in ranks]), axis=0)  # (steps,)
        return slowest


# --------------------------------------------------------------------------------------------------
# Power analysis
# --------------------------------------------------------------------------------------------------


def _z_sum(alpha: float, power: float) -> float:
    return float(stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power))


def min_detectable_speedup(sigma_log: float, repeats: int, *, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest ratio baseline/candidate a two-sample test on log step time detects with r runs per arm."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    return float(math.exp(_z_sum(alpha, power) * sigma_log * math.sqrt(2.0 / repeats)))


def repeats_for_effect(
    sigma_log: float, speedup: float, *, alpha: float = ALPHA, power: float = POWER, max_repeats: int = 1000
) -> int:
    """Runs per arm needed so that ``min_detectable_speedup`` ≤ ``speedup`` (the inverse of the formula).

    r = ceil(2 · ((z_{1-α/2} + z_{1-β}) · σ / ln(speedup))²), at least 1, capped at ``max_repeats``.
    """
    if speedup <= 1.0:
        raise ValueError("speedup must be > 1")
    if sigma_log <= 0:
        return 1
    r = 2.0 * (_z_sum(alpha, power) * sigma_log / math.log(speedup)) ** 2
    # Guard against 2.0000000001 → 3 from floating point.
    return int(min(max_repeats, max(1, math.ceil(r - 1e-9))))


def recommended_repeats(
    sigma_log: float,
    *,
    target_speedup: float = 1.05,
    min_repeats: int = 1,
    max_repeats: int = 8,
    alpha: float = ALPHA,
    power: float = POWER,
) -> int:
    """Repeats per search trial: enough to see ``target_speedup``, within [min_repeats, max_repeats].

    Past ``max_repeats`` more repeats cost more than they tell: the search then relies on the models
    pooling many trials, and verify (longer horizon, interleaved) settles the rest.
    """
    need = repeats_for_effect(sigma_log, target_speedup, alpha=alpha, power=power, max_repeats=max_repeats)
    return int(min(max_repeats, max(min_repeats, need)))


# --------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    trial_id: str
    warmup_steps: int
    steady_steps: int
    step_time_s: float
    """Median of the steady steps of the slowest rank."""
    step_to_step_cv: float
    """Robust σ / median of the steady steps (slowest rank)."""
    per_rank_step_s: dict[int, float]


@dataclass(frozen=True)
class DoctorReport:
    """The published statistics (``events.DoctorCompleted``, without the loss curve, which is the caller's) and
    what only the command's printout uses."""

    completed: ev.DoctorCompleted
    runs: list[RunSummary]
    sigma_log: float
    """Sample std of log per-run medians (runs in ``completed.interfered_runs`` left out): the σ of the power
    analysis."""
    mde_by_repeats: dict[int, float]


def summarise_run(run: RunSeries, warmup: int | None = None) -> RunSummary:
    """One run's steady statistics; ``warmup`` defaults to this run's own change point."""
    slowest = run.slowest_rank_series()  # (steps,)
    w = detect_warmup(slowest) if warmup is None else min(warmup, max(0, slowest.size - 1))
    steady = slowest[w:]
    median = float(np.median(steady))
    per_rank = {r: float(np.median(s[w:] if s.size > w else s)) for r, s in sorted(run.step_s.items())}
    return RunSummary(
        trial_id=run.trial_id,
        warmup_steps=int(w),
        steady_steps=int(steady.size),
        step_time_s=median,
        step_to_step_cv=robust_sigma(steady) / median if median > 0 else 0.0,
        per_rank_step_s=per_rank,
    )


def phase_fractions(runs: Sequence[RunSeries], warmup: int) -> dict[str, float]:
    """Share of steady step time in each phase, pooled over runs and ranks; the rest is ``other``.

    Fractions are ratios of sums (Σ phase time / Σ step time), so long steps weigh in proportion.
    """
    totals: dict[str, float] = {}
    step_total = 0.0
    for run in runs:
        for rank, steps in run.step_s.items():
            by_name = run.phases.get(rank, {})
            n = steps.size
            step_total += float(np.sum(steps[warmup:n]))
            for name, values in by_name.items():
                totals[name] = totals.get(name, 0.0) + float(np.sum(values[warmup:n]))
    if step_total <= 0:
        return {}
    fractions = {name: value / step_total for name, value in sorted(totals.items())}
    rest = 1.0 - sum(fractions.values())
    if fractions and rest > 1e-3:
        fractions["other"] = rest
    return fractions


def find_stragglers(per_rank_step_s: Sequence[float], *, rel_tol: float = 0.05) -> list[int]:
    """Ranks whose median step time exceeds the median over ranks by more than ``rel_tol``."""
    if len(per_rank_step_s) < 2:
        return []
    values = np.asarray(per_rank_step_s, dtype=float)
    centre = float(np.median(values))
    return [int(i) for i in np.flatnonzero(values > centre * (1.0 + rel_tol))]


INTERFERENCE_RATIO = 1.5
"""A baseline run whose median step is this far (×, either way) from the median of all runs was slowed (or
sped up) by something outside the job — another job on the host, a throttled node — not by the job's own
noise: calibrating on it would inflate the noise and with it every repeat count (the case that set this:
docs/stages.md, "interfered runs")."""


def interfered_runs(medians: FloatSeries, ratio: float = INTERFERENCE_RATIO) -> list[int]:
    """Runs whose median is ``ratio``× off the median of all runs; never more than leaves two runs to compare
    (with two runs, or two halves disagreeing, nothing says which is the odd one: none is dropped)."""
    m = np.asarray(medians, dtype=float)
    if m.size < 3 or np.any(m <= 0):
        return []
    off = np.abs(np.log(m / np.median(m)))
    out = [int(i) for i in np.flatnonzero(off > np.log(ratio))]
    return out if m.size - len(out) >= 2 and len(out) < m.size / 2 else []


def analyse(
    runs: Sequence[RunSeries],
    *,
    repeats_per_trial: int | None = None,
    target_speedup: float = 1.05,
    max_repeats: int = 8,
    effects: Sequence[float] = DEFAULT_EFFECTS,
    flops_per_step: float | None = None,
    peak_flops: float | None = None,
    devices: int = 1,
    straggler_tol: float = 0.05,
    alpha: float = ALPHA,
    power: float = POWER,
) -> DoctorReport:
    """The doctor report of k ≥ 2 baseline runs.

    ``repeats_per_trial``: the repeats the MDE is quoted at; default = the recommended number.
    ``flops_per_step`` (all ranks) and ``peak_flops`` (per device) give MFU when both are known.
    """
    if len(runs) < 2:
        raise ValueError(f"doctor needs at least 2 baseline runs to measure run-to-run noise, got {len(runs)}")
    per_run_warmup = [detect_warmup(r.slowest_rank_series()) for r in runs]
    warmup = max(per_run_warmup)
    summaries = [summarise_run(r, warmup) for r in runs]
    all_medians = np.array([s.step_time_s for s in summaries])  # (k,)
    dropped = interfered_runs(all_medians)
    medians = np.delete(all_medians, dropped)
    sigma_log = float(np.std(np.log(medians), ddof=1))
    run_cv = float(np.std(medians, ddof=1) / np.mean(medians))
    step_cv = float(np.median([s.step_to_step_cv for s in summaries]))

    ranks = sorted({r for s in summaries for r in s.per_rank_step_s})
    per_rank = [float(np.median([s.per_rank_step_s[r] for s in summaries if r in s.per_rank_step_s])) for r in ranks]

    recommended = recommended_repeats(
        sigma_log, target_speedup=target_speedup, max_repeats=max_repeats, alpha=alpha, power=power
    )
    r_quote = repeats_per_trial or recommended
    step_time = float(np.median(medians))
    mfu = None
    if flops_per_step and peak_flops:
        mfu = float(flops_per_step / step_time / (peak_flops * devices))
    completed = ev.DoctorCompleted(
        repeats=len(runs),
        baseline_trial_ids=[s.trial_id for s in summaries],
        step_time_s=step_time,
        run_to_run_cv=run_cv,
        step_to_step_cv=step_cv,
        warmup_steps=int(warmup),
        phase_fractions=phase_fractions(runs, warmup),
        per_rank_step_s=per_rank,
        stragglers=find_stragglers(per_rank, rel_tol=straggler_tol),
        min_detectable_speedup=min_detectable_speedup(sigma_log, r_quote, alpha=alpha, power=power),
        repeats_per_trial=int(r_quote),
        repeats_for_effect={
            f"{e:.2f}": repeats_for_effect(sigma_log, e, alpha=alpha, power=power) for e in effects
        },
        peak_flops_measured=peak_flops,
        mfu=mfu,
        interfered_runs=dropped,
    )
    return DoctorReport(
        completed=completed,
        runs=summaries,
        sigma_log=sigma_log,
        mde_by_repeats={r: min_detectable_speedup(sigma_log, r, alpha=alpha, power=power) for r in (1, 2, 3, 5, 8, 13)},
    )


# --------------------------------------------------------------------------------------------------
# CPU peak FLOP/s
# --------------------------------------------------------------------------------------------------


NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
"""CPU flags (``/proc/cpuinfo``: x86 ``flags``, arm64 ``Features``) that mean bf16 matmuls run natively."""


@dataclass(frozen=True)
class PeakMeasurement:
    """What ``measure_cpu_peak`` measured: the peak, in which dtype, and what it left out and why."""

    flops: float
    """The best matmul FLOP/s over the dtypes measured."""
    dtype: str
    """The dtype that reached it."""
    per_dtype: dict[str, float]
    """FLOP/s of each dtype measured."""
    skipped: dict[str, str]
    """Dtypes not measured (or cut short) → why."""
    seconds: float

    def describe(self) -> str:
        """``755 GFLOP/s in bfloat16 (float32 86 GFLOP/s); not measured: …`` — for people."""
        others = ", ".join(f"{d} {f / 1e9:.0f} GFLOP/s" for d, f in self.per_dtype.items() if d != self.dtype)
        text = f"{self.flops / 1e9:.0f} GFLOP/s in {self.dtype}" + (f" ({others})" if others else "")
        if self.skipped:
            text += "; " + "; ".join(f"{d}: {why}" for d, why in self.skipped.items())
        return text


ONEDNN_BF16_ISAS = frozenset({
    "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512", "AVX512_CORE_AMX", "AVX10_1_512_AMX",
    "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16", "ALL", "DEFAULT",
})
"""Values of ``ONEDNN_MAX_CPU_ISA`` (oneDNN's ISA cap, which PyTorch's CPU matmuls go through) that still
allow bf16 dot products; a lower cap (``AVX2``, ``AVX512_CORE``…) makes torch emulate bf16 — on a host with
AMX, ``ONEDNN_MAX_CPU_ISA=AVX2`` took a dense-1node bf16 step from 0.17 s to 7.7 s."""


def native_matmul_dtypes(cpuinfo: str | None = None, env: Mapping[str, str] | None = None
                         ) -> tuple[tuple[str, ...], dict[str, str]]:
    """The dtypes this CPU multiplies natively (float32 always; bfloat16 with bf16 instructions that
    ``ONEDNN_MAX_CPU_ISA`` in ``env`` — default: this process's environment — does not cap away), and why the
    others are left out. Without a readable ``/proc/cpuinfo`` bfloat16 is kept (the time bound of
    ``measure_cpu_peak`` then caps what an emulated bf16 costs)."""
    env = os.environ if env is None else env
    cap = env.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if cap and cap not in ONEDNN_BF16_ISAS:
        return ("float32",), {"bfloat16": f"ONEDNN_MAX_CPU_ISA={cap} leaves oneDNN no bf16 instructions"}
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as fh:
                cpuinfo = fh.read()
        except OSError:
            return ("float32", "bfloat16"), {}
    flags = {word for line in cpuinfo.splitlines() if line.lower().startswith(("flags", "features"))
             for word in line.split(":", 1)[-1].split()}  # fmt: skip
    if flags & NATIVE_BF16_FLAGS:
        return ("float32", "bfloat16"), {}
    return ("float32",), {"bfloat16": "no native bf16 matmul on this CPU (no avx512_bf16/amx_bf16/bf16 flag)"}


def measure_cpu_peak(
    threads: int,
    *,
    size: int = 2048,
    repeats: int = 5,
    warmup: int = 1,
    dtypes: Sequence[str] | None = None,
    budget_s: float = 20.0,
) -> PeakMeasurement:
    """Measured matmul peak FLOP/s of this host with ``threads`` threads: the best over ``dtypes`` (default:
    those the CPU runs natively, ``native_matmul_dtypes``) of the best of ``repeats`` timed ``torch.mm`` of
    two size×size matrices (2·size³ FLOPs each).

    The best, not the mean: the peak is what the hardware can do; slower runs measure interference. The best
    over dtypes, as MFU is quoted against the fastest dense matmul the device offers (a GPU's bf16 peak): on a
    CPU with bf16 dot products (AVX512-BF16/AMX) an fp32 peak would put a bf16 run above 100%.
    Bounded in time: each dtype gets an equal share of ``budget_s``; the matrix grows from 256×256, doubling
    while the timed runs at the next size (8× the last product's time each) still fit the share (a dtype
    whose 256×256 runs do not fit is skipped; one measured below ``size`` is noted). When no dtype fits (a
    host so loaded that a 256×256 product takes a share of the bound) the fastest sizing product is the
    measurement, noted as a low bound, rather than no peak. The torch thread count is restored afterwards.
    """
    import torch  # heavy; only the CPU-host doctor path needs it

    started = time.perf_counter()
    skipped: dict[str, str] = {}
    if dtypes is None:
        dtypes, skipped = native_matmul_dtypes()
    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    per_dtype: dict[str, float] = {}
    sizing: dict[str, tuple[float, int]] = {}  # (FLOP/s, size) of the last sizing product of a dtype that did not fit
    try:
        for i, dtype_name in enumerate(dtypes):
            t_dtype = time.perf_counter()
            share = (budget_s - (t_dtype - started)) / (len(dtypes) - i)
            dtype = getattr(torch, dtype_name)
            # grow the matrix while the timed runs at the next size still fit this dtype's share
            n, last_s = 256, min(_time_mm(dtype, 256) for _ in range(2))
            while n < size and last_s * 8 * (warmup + repeats) <= share - (time.perf_counter() - t_dtype):
                n *= 2
                last_s = _time_mm(dtype, n)
            if last_s * (warmup + repeats) > share:
                sizing[dtype_name] = (2.0 * n**3 / last_s, n)
                skipped[dtype_name] = (f"not measured: {warmup + repeats} products of {n}×{n} ({last_s:.2f} s each) "
                                       f"do not fit the {budget_s:g} s bound")  # fmt: skip
                continue
            if n < size:
                skipped[dtype_name] = f"measured at {n}×{n} (not {size}) to stay within {budget_s:g} s"
            a = torch.randn(n, n).to(dtype)
            b = torch.randn(n, n).to(dtype)
            out = torch.empty(n, n, dtype=dtype)
            for _ in range(warmup):
                torch.mm(a, b, out=out)
            best = math.inf
            for _ in range(repeats):
                t0 = time.perf_counter()
                torch.mm(a, b, out=out)
                best = min(best, time.perf_counter() - t0)
            per_dtype[dtype_name] = 2.0 * n**3 / best
    finally:
        torch.set_num_threads(previous)
    if not per_dtype:
        # Nothing fitted (a host so loaded that one 256×256 product took a share of the bound): the sizing
        # products are the measurement, a low bound on the peak, said so, rather than no peak at all.
        best_sizing = max(sizing, key=lambda d: sizing[d][0])
        flops, n = sizing[best_sizing]
        per_dtype[best_sizing] = flops
        skipped[best_sizing] = (f"measured at {n}×{n} by its sizing product only (a low bound): {warmup + repeats} "
                                f"timed products did not fit the {budget_s:g} s bound")  # fmt: skip
    best_dtype = max(per_dtype, key=lambda d: per_dtype[d])
    return PeakMeasurement(per_dtype[best_dtype], best_dtype, per_dtype, skipped, time.perf_counter() - started)


def _time_mm(dtype: torch.dtype, n: int) -> float:
    import torch  # already loaded by the caller (measure_cpu_peak), which imports it lazily

    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    t0 = time.perf_counter()
    torch.mm(a, b)
    return time.perf_counter() - t0


def measure_cpu_peak_flops(threads: int, **kwargs: Any) -> float:
    """``measure_cpu_peak(...).flops`` (``kwargs``: ``measure_cpu_peak``'s keywords)."""
    return measure_cpu_peak(threads, **kwargs).flops
