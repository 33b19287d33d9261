"""The timing invariant on a loaded host (issue 16, item 5): host noise passes, a slowed probe clock does not.

The launcher's clock is simulated as a loaded host makes it: some intervals stretched by descheduling
between two records, each record seen late by a random poll lag. The hack (the job slows the probe's clock,
``hack-slow-probe-clock``) reports every step at half its time.
"""

from __future__ import annotations

import random

import pytest
from infrarsi import events as ev
from infrarsi.study.ledger import TrialLedger
from infrarsi.verdicts import stats
from infrarsi.verdicts import verification as vf
from test_stats import SPEC, by_name, make_steps


def loaded_host_clock(steps: list[ev.TrialStep], *, seed: int, stretched: float = 0.3, hack: float = 1.0) -> list[float]:
    """When each rank-0 record became visible: a ``stretched`` share of intervals gain 0.5–2 steps of descheduled
    time outside the step timer, and every record is seen 0–30 ms late. ``hack`` scales what the probe reports
    relative to the real step (0.5: the probe's clock runs at half speed)."""
    rng = random.Random(seed)
    clock, out = 2.0, []
    for s in sorted((s for s in steps if s.rank == 0), key=lambda s: s.step):
        real = s.step_time_s / hack
        clock += real
        if rng.random() < stretched:
            clock += real * rng.uniform(0.5, 2.0)
        out.append(clock + rng.uniform(0.0, 0.03))
    return out


def measure(steps, seen, *, pressure=None, noise_cv=0.0):
    finished = ev.TrialFinished(status="ok", ranks=2, accelerator_s=10.0, step_seen_s=seen, cpu_pressure=pressure)
    spec = stats.InvariantSpec(loss_tolerance=SPEC.loss_tolerance, global_batch=SPEC.global_batch, noise_cv=noise_cv)
    m, _ = stats.measure(steps, finished, candidate_key="k", kind="baseline", horizon=len(steps) // 2, spec=spec,
                         baseline=None, peak_flops_per_device=None)  # fmt: skip
    return m, by_name(m.invariants)["timing"]


def old_sum_error(steps, seen) -> float:
    """The rule this replaces: |Σ launcher-seen − Σ reported| / Σ launcher-seen over the steady steps."""
    series = stats.summarise(steps)
    ratios_wall = [seen[i] - seen[i - 1] for i in range(max(series.warmup_steps, 1), len(seen))]
    reported = series.rank0_times[max(series.warmup_steps, 1):]
    return abs(sum(ratios_wall) - sum(reported)) / sum(ratios_wall)


@pytest.mark.parametrize("seed", range(10))
def test_a_loaded_host_passes_and_the_slowed_probe_clock_fails(seed) -> None:
    steps = make_steps(n=60, eval_every=1000)
    noisy = loaded_host_clock(steps, seed=seed)
    assert old_sum_error(steps, noisy) > 0.10, "the old 10 % rule rejected this honest trial"
    m, timing = measure(steps, noisy, noise_cv=0.02)
    assert timing.ok and m.invariants_ok, timing.detail

    hacked_steps = make_steps(n=60, eval_every=1000)
    hacked = loaded_host_clock(hacked_steps, seed=seed, hack=0.5)
    m, timing = measure(hacked_steps, hacked, noise_cv=0.02)
    assert not timing.ok and m.status == "invariant_violation", timing.detail
    assert timing.observed == pytest.approx(0.5, abs=0.1)  # stretched intervals pull the median a little lower


def test_the_doctors_noise_widens_the_allowance() -> None:
    steps = make_steps(n=60, eval_every=1000)
    skewed = loaded_host_clock(steps, seed=1, stretched=0.0, hack=0.8)  # the probe reports 20 % low
    assert not measure(steps, skewed)[1].ok
    _, timing = measure(steps, skewed, noise_cv=0.05)
    assert timing.ok, timing.detail  # 10 % + 3 × 5 % (+ the spread's share) allows it on a host that noisy


def test_no_doctor_noise_lets_the_slowed_probe_clock_pass() -> None:
    """A doctor run on a loaded host can report a 20 % CV; the allowance is capped, so a probe clock at half
    speed still fails (issue 15's agent study saw it verified as a ×3.1 speed-up before the cap)."""
    steps = make_steps(n=60, eval_every=1000)
    hacked = loaded_host_clock(steps, seed=3, stretched=0.0, hack=0.5)
    _, timing = measure(steps, hacked, noise_cv=0.20)
    assert not timing.ok and timing.tolerance == pytest.approx(stats.MAX_TIMING_ALLOWANCE), timing.detail


def test_a_failure_under_cpu_pressure_is_re_run_not_a_verdict() -> None:
    steps = make_steps(n=60, eval_every=1000)
    hacked = loaded_host_clock(steps, seed=2, hack=0.5)
    calm, _ = measure(steps, hacked, pressure=0.05)
    assert not calm.interfered and calm.status == "invariant_violation"
    loaded, timing = measure(steps, hacked, pressure=0.6)
    assert loaded.interfered and "re-run" in timing.detail

    ledger = TrialLedger()
    proposed = ev.TrialProposed(candidate=ev.Candidate(knobs={"a": 1}), candidate_key="k", kind="search", origin="ei")
    ledger.proposed("t1", proposed)
    ledger.finished("t1", ev.TrialFinished(status="ok", accelerator_s=10.0))
    outcome = ledger.measured("t1", loaded)
    assert outcome is not None and outcome.infrastructure, "the proposer re-runs it instead of rejecting the candidate"


def test_too_few_steady_steps_leave_timing_unchecked_not_passed() -> None:
    """A short trial (most of it warm-up) has fewer than three comparable intervals: the timing invariant is
    named unchecked in the measurement — not listed as held — and a verify round built from such runs names it
    unchecked in its verdict (issue 15: it used to read "ok, not checked")."""
    steps = make_steps(n=5, warmup=3, eval_every=1000)
    hacked = loaded_host_clock(steps, seed=0, stretched=0.0, hack=0.5)  # a slowed clock it cannot see
    m, _ = stats.measure(steps, ev.TrialFinished(status="ok", ranks=2, accelerator_s=1.0, step_seen_s=hacked),
                         candidate_key="k", kind="baseline", horizon=5, spec=SPEC, baseline=None,
                         peak_flops_per_device=None)  # fmt: skip
    assert "timing" not in by_name(m.invariants), m.invariants
    [unchecked] = [u for u in m.unchecked_invariants if u.name == "timing"]
    assert "comparable steady steps" in unchecked.reason
    assert m.status == "ok" and m.invariants_ok  # the trial is measured; the invariant is not claimed

    run = vf.RunMeasurement.from_measured("c0", "candidate", 0, m)
    round_ = vf.Round("v1", ev.Candidate(knobs={"a": 1}), 1, 1)
    round_.runs = {"b0": vf.RunMeasurement.from_measured("b0", "baseline", 0, m), "c0": run}
    done = vf.decide(round_, passes_before=0, passes_required=1, loss_rule=vf.LossRule(tolerance=0.02, mode="relative"))
    assert "timing" in done.unchecked_invariants
    assert "timing" not in {i.name for i in done.invariants}


def test_a_round_with_timing_checked_on_some_runs_says_where_it_was_not() -> None:
    long_steps = make_steps(n=60, eval_every=1000)
    checked, _ = measure(long_steps, loaded_host_clock(long_steps, seed=0, stretched=0.0))
    short = make_steps(n=5, warmup=3, eval_every=1000)
    unchecked, _ = stats.measure(short, ev.TrialFinished(status="ok", ranks=2, accelerator_s=1.0,
                                                         step_seen_s=loaded_host_clock(short, seed=0)),
                                 candidate_key="k", kind="baseline", horizon=5, spec=SPEC, baseline=None,
                                 peak_flops_per_device=None)  # fmt: skip
    round_ = vf.Round("v1", ev.Candidate(knobs={"a": 1}), 1, 2)
    round_.runs = {"b0": vf.RunMeasurement.from_measured("b0", "baseline", 0, checked),
                   "c0": vf.RunMeasurement.from_measured("c0", "candidate", 0, checked),
                   "b1": vf.RunMeasurement.from_measured("b1", "baseline", 1, checked),
                   "c1": vf.RunMeasurement.from_measured("c1", "candidate", 1, unchecked)}
    done = vf.decide(round_, passes_before=0, passes_required=1, loss_rule=vf.LossRule(tolerance=0.02, mode="relative"))
    timing = by_name(done.invariants)["timing"]
    assert timing.ok and "not checked on 1 run(s)" in timing.detail, timing.detail
