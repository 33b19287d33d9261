"""Doctor statistics tested with numbers on synthetic baseline runs whose truth is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from infrarsi.verdicts import doctor, stats
from infrarsi.verdicts.doctor import RunSeries


def _run(rng, trial_id, *, level, warmup=0, steps=120, step_cv=0.02, ranks=1, straggler=None, phases=True):
    step_s, ph = {}, {}
    for rank in range(ranks):
        x = level * (1 + step_cv * rng.standard_normal(steps))
        if warmup:
            x[:warmup] = level * np.linspace(8.0, 1.6, warmup)  # compile, then decaying warm-up
        if straggler == rank:
            x = x * 1.25
        step_s[rank] = x
        if phases:
            ph[rank] = {"data": 0.1 * x, "forward": 0.3 * x, "backward": 0.45 * x, "optimizer": 0.1 * x}
    return RunSeries.from_lists(trial_id, step_s, ph)


def test_warmup_change_point_found_exactly():
    rng = np.random.default_rng(0)
    for w in (0, 1, 3, 10, 25):
        run = _run(rng, "t", level=0.1, warmup=w)
        assert stats.detect_warmup(run.slowest_rank_series()) == w


def test_warmup_ignores_a_lone_slow_step_later():
    rng = np.random.default_rng(1)
    x = 0.1 * (1 + 0.01 * rng.standard_normal(100))
    x[:2] = 1.0
    x[30] = 0.5  # a GC pause in the steady state
    assert stats.detect_warmup(x) == 2


def test_mde_formula_and_inverse():
    sigma = 0.03
    z = 1.959963984540054 + 0.8416212335729143
    assert doctor.min_detectable_speedup(sigma, 3) == pytest.approx(math.exp(z * sigma * math.sqrt(2 / 3)))
    # Repeats for an effect invert the MDE: enough repeats reach it, one fewer does not.
    for effect in (1.02, 1.05, 1.10, 1.20):
        r = doctor.repeats_for_effect(sigma, effect)
        assert doctor.min_detectable_speedup(sigma, r) <= effect + 1e-12
        if r > 1:
            assert doctor.min_detectable_speedup(sigma, r - 1) > effect
    # Known values: σ=0.03 → 1.05 needs ceil(2·(2.8016·0.03/ln1.05)²) = ceil(5.95) = 6.
    assert doctor.repeats_for_effect(0.03, 1.05) == 6
    assert doctor.repeats_for_effect(0.0, 1.02) == 1
    assert doctor.recommended_repeats(0.03, target_speedup=1.05, max_repeats=4) == 4
    assert doctor.recommended_repeats(0.005, target_speedup=1.05) == 1


def test_analyse_recovers_noise_and_structure():
    rng = np.random.default_rng(42)
    true_sigma = 0.04
    levels = 0.2 * np.exp(true_sigma * rng.standard_normal(8))
    runs = [
        _run(rng, f"t{i}", level=lv, warmup=5, ranks=4, straggler=2, step_cv=0.03, steps=200)
        for i, lv in enumerate(levels)
    ]
    report = doctor.analyse(runs, effects=(1.05, 1.2))

    # The run-to-run numbers are exactly those of the per-run medians.
    medians = np.array([r.step_time_s for r in report.runs])
    assert report.sigma_log == pytest.approx(np.std(np.log(medians), ddof=1))
    assert report.completed.run_to_run_cv == pytest.approx(np.std(medians, ddof=1) / medians.mean())
    assert report.completed.step_time_s == pytest.approx(np.median(medians))
    # ... and close to the truth (σ estimate from 8 runs: within ~50%).
    assert 0.5 * true_sigma < report.sigma_log < 1.6 * true_sigma
    # Straggler rank 2 is 25% slower; slowest-rank medians are ≈ 1.25 × level.
    assert report.completed.stragglers == [2]
    assert report.completed.per_rank_step_s[2] / report.completed.per_rank_step_s[0] == pytest.approx(1.25, rel=0.03)
    assert report.completed.warmup_steps == 5
    # Within-run CV of 3% (straggler rank scaled, CV unchanged), robust estimate.
    assert report.completed.step_to_step_cv == pytest.approx(0.03, rel=0.25)
    # Phases sum to 95% of the step; the rest is "other".
    assert report.completed.phase_fractions["backward"] == pytest.approx(0.45, abs=1e-9)
    assert report.completed.phase_fractions["other"] == pytest.approx(0.05, abs=1e-9)
    assert sum(report.completed.phase_fractions.values()) == pytest.approx(1.0)
    # Power: MDE quoted at the recommended repeats, and repeats-for-effect consistent with it.
    assert report.completed.min_detectable_speedup == pytest.approx(
        doctor.min_detectable_speedup(report.sigma_log, report.completed.repeats_per_trial)
    )
    assert report.completed.repeats_for_effect["1.05"] >= report.completed.repeats_for_effect["1.20"]
    assert report.completed.baseline_trial_ids == [f"t{i}" for i in range(8)]


def test_analyse_needs_two_runs_and_mfu():
    rng = np.random.default_rng(3)
    with pytest.raises(ValueError, match="at least 2"):
        doctor.analyse([_run(rng, "a", level=0.1)])
    runs = [_run(rng, "a", level=0.1, step_cv=0.0), _run(rng, "b", level=0.1, step_cv=0.0)]
    report = doctor.analyse(runs, flops_per_step=2e9, peak_flops=1e11, devices=2)
    assert report.completed.mfu == pytest.approx(2e9 / 0.1 / 2e11)
    assert report.sigma_log == pytest.approx(0.0, abs=1e-12)
    assert report.completed.repeats_per_trial == 1


def test_measure_cpu_peak_flops_is_plausible():
    flops = doctor.measure_cpu_peak_flops(1, size=256, repeats=3)
    assert 1e8 < flops < 1e13


def test_a_run_slowed_by_another_job_is_left_out_of_the_noise_estimate():
    """The case seen on a shared host: 0.55, 0.56 and 1.76 s/step. The odd run is named and left out;
    the σ, CV and baseline step time are those of the two undisturbed runs."""
    rng = np.random.default_rng(5)
    runs = [_run(rng, "a", level=0.55, step_cv=0.0), _run(rng, "b", level=0.56, step_cv=0.0),
            _run(rng, "c", level=1.76, step_cv=0.0)]
    report = doctor.analyse(runs)
    assert report.completed.interfered_runs == [2]
    assert report.sigma_log == pytest.approx(np.std(np.log([0.55, 0.56]), ddof=1))
    assert report.completed.step_time_s == pytest.approx(0.555)
    assert report.completed.min_detectable_speedup < 1.1  # with the odd run in, it was ×4
    # Ordinary spread is noise, not interference; two runs, or a split down the middle, drop nothing.
    assert doctor.interfered_runs([0.50, 0.56, 0.62]) == []
    assert doctor.interfered_runs([0.5, 1.8]) == []
    assert doctor.interfered_runs([0.5, 0.5, 1.8, 1.8]) == []
    assert doctor.interfered_runs([0.5, 0.52, 0.51, 0.2]) == [3]  # too fast counts too
