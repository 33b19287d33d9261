"""The report's plots (matplotlib, Agg backend): each takes a ``Report`` and returns a ``Figure``.

Plots draw only numbers already in the ``Report``; a plot with nothing to show says so on its canvas
rather than disappearing, so the three formats always carry the same four figures.
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display, ever: reports render on servers and in CI

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from infrarsi.report.model import OUTCOMES, Report  # noqa: E402

OUTCOME_COLOURS = {"ok": "#2b8a3e", "oom": "#c92a2a", "crash": "#862e9c", "timeout": "#e67700", "slow": "#f59f00",
                   "violation": "#1864ab"}
GIB = 1024**3


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#868e96")
    ax.set_xticks([])
    ax.set_yticks([])


def _finish(fig: Figure, ax: Axes, title: str, axes: tuple[str, str] | None, empty: str, **legend: Any) -> Figure:
    """Title and lay out a plot; ``axes`` (x and y labels, and a legend) when it drew data, else ``empty`` on
    its canvas."""
    if axes is not None:
        ax.set_xlabel(axes[0])
        ax.set_ylabel(axes[1])
        ax.legend(fontsize=7, **legend)
    else:
        _empty(ax, empty)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def best_speedup(report: Report) -> Figure:
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    if report.best_speedup_curve:
        n, s = zip(*report.best_speedup_curve, strict=True)
        ax.step(n, s, where="post", color="#1864ab", label="best so far (search)")
        ax.axhline(1.0, color="#868e96", lw=0.8, ls="--", label="baseline")
        for v in report.winners:
            ax.axhline(v.speedup, color="#2b8a3e", lw=0.8, ls=":", label=f"verified {v.candidate_key[:8]} ×{v.speedup:.2f}")
    axes = ("search trials measured", "speed-up vs baseline (×)") if report.best_speedup_curve else None
    return _finish(fig, ax, "Best speed-up vs trials", axes, "no measured search trials", loc="lower right")


def time_vs_memory(report: Report) -> Figure:
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    # An OOM trial has no step time worth plotting: it is drawn once, as a censored cross at its bound.
    ok = [(t.outcome, t.peak_memory_bytes / GIB, t.step_time_s * 1e3) for t in report.trials
          if t.outcome != "oom" and t.step_time_s and t.peak_memory_bytes]  # (outcome, peak GiB, step ms)
    ooms = [t for t in report.trials if t.outcome == "oom"]
    if ok or ooms:
        for outcome in OUTCOMES:
            pts = [(gib, ms) for o, gib, ms in ok if o == outcome]
            if pts:
                ax.scatter([gib for gib, _ in pts], [ms for _, ms in pts],
                           s=18, color=OUTCOME_COLOURS[outcome], label=outcome, alpha=0.8)
        if ooms:
            top = max([ms for _, _, ms in ok], default=1.0)
            xs = [(t.censored_peak_bytes or t.peak_memory_bytes or 0) / GIB for t in ooms]
            # Censored: the true peak is above the bound; the arrow points where it lies.
            ax.scatter(xs, [top * 1.05] * len(xs), marker="x", s=40, color=OUTCOME_COLOURS["oom"], label="OOM (peak > ×)")
        if report.memory_capacity_bytes:
            ax.axvline(report.memory_capacity_bytes / GIB, color="#c92a2a", ls="--", lw=1, label="capacity")
    log_axis = step_axis_is_log([ms for _, _, ms in ok])
    if log_axis:
        ax.set_yscale("log")  # one trial that dwarfs the rest would flatten every other point at the bottom
    label = "step time (ms, log scale)" if log_axis else "step time (ms)"
    axes = ("peak memory (GiB, max over ranks)", label) if ok or ooms else None
    return _finish(fig, ax, "Step time vs peak memory", axes, "no trials with memory measurements")


LOG_AXIS_RATIO = 10.0
"""The slowest plotted step over the fastest above which the step-time axis is logarithmic."""


def step_axis_is_log(step_times: list[float]) -> bool:
    """Whether a step-time axis over these values should be logarithmic (one trial dwarfs the rest)."""
    positive = [t for t in step_times if t > 0]
    return len(positive) >= 2 and max(positive) / min(positive) > LOG_AXIS_RATIO


def noise(report: Report) -> Figure:
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    runs = np.asarray(report.doctor_run_step_s, dtype=float)
    if runs.size:
        rel = runs / np.median(runs)
        ax.hist(rel, bins=max(3, min(20, runs.size)), color="#1864ab", alpha=0.7, label="doctor runs / median")
        if report.doctor:
            mde = report.doctor.min_detectable_speedup
            ax.axvline(1 / mde, color="#c92a2a", ls="--", lw=1,
                       label=f"MDE ×{mde:.3f} at {report.doctor.repeats_per_trial} repeats")
    axes = ("run step time / median", "runs") if runs.size else None
    return _finish(fig, ax, "Baseline noise (doctor)", axes, "no doctor runs")


def cost(report: Report) -> Figure:
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    hours = [report.cost_by_outcome[o] for o in OUTCOMES]
    bars = ax.bar(OUTCOMES, hours, color=[OUTCOME_COLOURS[o] for o in OUTCOMES])
    for bar, o in zip(bars, OUTCOMES, strict=True):
        ax.annotate(f"{report.trials_by_outcome[o]} trials", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("accelerator-hours")
    ax.set_title(f"Cost by outcome (total {report.accelerator_hours:.3g} h)")
    fig.tight_layout()
    return fig


FIGURES = {
    "best_speedup": ("Best speed-up vs trials", best_speedup),
    "time_vs_memory": ("Step time vs peak memory (OOMs marked, capacity line)", time_vs_memory),
    "noise": ("Baseline noise distribution (doctor)", noise),
    "cost": ("Accelerator-hours by outcome", cost),
}
"""Name → (caption, builder), in report order."""
