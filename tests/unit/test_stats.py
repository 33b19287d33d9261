"""Telemetry statistics, tested with numbers: warm-up, robust centre, stragglers, invariants, idempotence."""

from __future__ import annotations

import random

import numpy as np
import pytest
from infrarsi import events as ev
from infrarsi.verdicts import stats


def series_with_warmup(warmup: int, n: int, seed: int = 0, steady: float = 0.100, noise: float = 0.002) -> list[float]:
    rng = np.random.default_rng(seed)
    head = list(np.linspace(0.6, 0.16, warmup)) if warmup else []
    return head + list(steady + noise * rng.standard_normal(n - warmup))


@pytest.mark.parametrize("warmup", [0, 1, 3, 7, 12])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_warmup_detected_at_known_change_point(warmup: int, seed: int) -> None:
    times = series_with_warmup(warmup, 40, seed)
    assert stats.detect_warmup(times) == warmup


def test_a_late_spike_does_not_extend_the_warmup() -> None:
    times = series_with_warmup(4, 30)
    times[15] = 0.5  # an eval or a GC pause mid-run
    assert stats.detect_warmup(times) == 4


def test_two_segment_split_finds_a_step_change() -> None:
    times = [0.3] * 6 + [0.1] * 20
    assert stats.two_segment_split(times) == 6


def test_warmup_is_capped_so_steady_steps_remain() -> None:
    times = [2.0] * 5 + [0.1] * 15
    assert stats.detect_warmup(times) == 5
    assert stats.detect_warmup(times, max_fraction=0.2) == 4


def test_mad_and_median() -> None:
    assert stats.median([3, 1, 2, 100]) == 2.5
    assert stats.mad([1, 2, 3, 4, 100]) == 1.0


def test_stragglers() -> None:
    assert stats.stragglers([0.10, 0.101, 0.099, 0.13], [0.001] * 4) == [3]
    assert stats.stragglers([0.10, 0.102, 0.099, 0.103], [0.001] * 4) == []  # within 5 %
    assert stats.stragglers([0.10], [0.001]) == []


def make_steps(
    n: int = 20,
    world: int = 2,
    warmup: int = 3,
    tokens: int = 4096,
    eval_every: int = 5,
    loss_scale: float = 1.0,
    slow_rank: int | None = None,
) -> list[ev.TrialStep]:
    times = series_with_warmup(warmup, n)
    out = []
    for r in range(world):
        for i in range(n):
            step = i  # the probe counts steps from 0
            t = times[i] * (1.3 if r == slow_rank else 1.0)
            is_eval = (i + 1) % eval_every == 0 or i == n - 1
            out.append(
                ev.TrialStep(
                    rank=r, world_size=world, step=step, loss=loss_scale * (5.0 - 0.1 * step), step_time_s=t,
                    phases={"forward": 0.4 * t, "backward": 0.6 * t}, tokens=tokens, optimizer_steps=i + 1,
                    peak_memory_bytes=1000 * (r + 1) + step, flops=1e9,
                    eval_loss=loss_scale * (5.1 - 0.1 * step) if is_eval else None,
                    eval_tokens=2048 if is_eval else None,
                )
            )  # fmt: skip
    return out


def seen_from(steps: list[ev.TrialStep], eval_cost: float = 0.3, skew: float = 1.0) -> list[float]:
    """The launcher's clock: rank-0 records appear after their step time (× skew) plus eval pauses."""
    clock, out = 2.0, []
    for s in sorted((s for s in steps if s.rank == 0), key=lambda s: s.step):
        clock += s.step_time_s * skew
        out.append(clock)
        if s.eval_loss is not None:
            clock += eval_cost
    return out


SPEC = stats.InvariantSpec(loss_tolerance=0.02, global_batch=32)


def finished_for(steps: list[ev.TrialStep], **kw) -> ev.TrialFinished:
    return ev.TrialFinished(status="ok", ranks=2, accelerator_s=10.0, step_seen_s=seen_from(steps, **kw))


def test_summary_numbers() -> None:
    steps = make_steps(slow_rank=1)
    s = stats.summarise(steps)
    assert s.world_size == 2 and s.steps == 20 and s.warmup_steps == 3
    assert s.step_time_s == pytest.approx(0.13, rel=0.03)  # slowest rank
    assert s.per_rank_step_s[0] == pytest.approx(0.10, rel=0.03)
    assert s.stragglers == [1]
    assert s.optimizer_steps == 20 and s.tokens == 20 * 4096
    assert s.peak_memory_bytes == [1019, 2019]
    assert s.eval_steps == [4, 9, 14, 19]
    assert s.phases["forward"] == pytest.approx(0.4 * s.step_time_s, rel=0.01)
    assert s.step_time_with_warmup_s > s.step_time_s


def test_duplicated_and_reordered_samples_give_the_same_measurement() -> None:
    steps = make_steps()
    finished = finished_for(steps)
    kwargs = dict(candidate_key="k", kind="search", horizon=20, spec=SPEC, baseline=None, peak_flops_per_device=1e11)
    first, _ = stats.measure(steps, finished, **kwargs)
    shuffled = steps + random.Random(3).sample(steps, len(steps) // 2)
    random.Random(4).shuffle(shuffled)
    second, _ = stats.measure(shuffled, finished, **kwargs)
    ev.encode(ev.make_event(first, study_id="s", source="t", event_id="x"))  # only plain types on the wire
    assert first == second


def test_mfu_from_flops_and_peak() -> None:
    steps = make_steps()
    m, s = stats.measure(
        steps, finished_for(steps), candidate_key="k", kind="baseline", horizon=20, spec=SPEC, baseline=None,
        peak_flops_per_device=1e11,
    )  # fmt: skip
    assert m.mfu == pytest.approx(1e9 / (s.step_time_s * 1e11 * 2))
    assert m.tokens_per_s == pytest.approx(4096 / s.step_time_s)


def by_name(results: list[ev.InvariantResult]) -> dict[str, ev.InvariantResult]:
    return {r.name: r for r in results}


def test_baseline_checks_itself_only() -> None:
    steps = make_steps()
    m, _ = stats.measure(
        steps, finished_for(steps), candidate_key="k", kind="baseline", horizon=20, spec=SPEC, baseline=None,
        peak_flops_per_device=None,
    )  # fmt: skip
    results = by_name(m.invariants)
    assert "loss" not in results
    assert m.invariants_ok, m.invariants
    assert m.status == "ok"


def measure_against_baseline(candidate: list[ev.TrialStep], finished: ev.TrialFinished | None = None, horizon: int = 20):
    base = stats.summarise(make_steps())
    m, _ = stats.measure(
        candidate, finished or finished_for(candidate), candidate_key="k", kind="search", horizon=horizon, spec=SPEC,
        baseline=base, peak_flops_per_device=None,
    )  # fmt: skip
    return m, by_name(m.invariants)


def test_identical_candidate_passes_every_invariant() -> None:
    m, results = measure_against_baseline(make_steps())
    assert m.invariants_ok, m.invariants
    assert set(results) == {"scope", "work.optimizer_steps", "work.tokens", "work.eval", "loss", "timing"}


def test_loss_drift_beyond_tolerance_is_a_violation() -> None:
    m, results = measure_against_baseline(make_steps(loss_scale=1.05))
    assert not results["loss"].ok and m.status == "invariant_violation"
    assert results["loss"].observed == pytest.approx(0.05, rel=0.01)


def test_fewer_optimizer_steps_is_a_violation() -> None:
    m, results = measure_against_baseline(make_steps(n=15))
    assert not results["work.optimizer_steps"].ok


def test_fewer_tokens_per_step_is_a_violation() -> None:
    _, results = measure_against_baseline(make_steps(tokens=2048))
    assert not results["work.tokens"].ok


def test_changed_eval_interval_is_a_violation() -> None:
    _, results = measure_against_baseline(make_steps(eval_every=10))
    assert not results["work.eval"].ok


def test_under_reported_step_time_breaks_timing() -> None:
    steps = make_steps()
    # the job's real steps take 1.5× what the probe reports (e.g. the timer skips the optimiser)
    _, results = measure_against_baseline(steps, finished_for(steps, skew=1.5))
    assert not results["timing"].ok
    assert results["timing"].observed == pytest.approx(1 / 1.5, rel=0.01)


def test_eval_pauses_do_not_break_timing() -> None:
    steps = make_steps()
    _, results = measure_against_baseline(steps, finished_for(steps, eval_cost=2.0))
    assert results["timing"].ok, results["timing"]


def test_failed_trial_is_never_invariant_ok() -> None:
    steps = make_steps(n=8)
    finished = ev.TrialFinished(status="oom", censored_peak_bytes=123)
    m, _ = stats.measure(
        steps, finished, candidate_key="k", kind="search", horizon=20, spec=SPEC, baseline=None, peak_flops_per_device=None
    )
    assert m.status == "oom" and not m.invariants_ok and m.steps == 8


def test_no_steps_at_all() -> None:
    m, _ = stats.measure(
        [], ev.TrialFinished(status="crash"), candidate_key="k", kind="search", horizon=20, spec=SPEC, baseline=None,
        peak_flops_per_device=None,
    )  # fmt: skip
    assert m.status == "crash" and m.steps == 0 and m.step_time_s == 0.0 and m.invariants == []


def test_determinism_is_on_only_when_every_step_of_every_rank_said_so() -> None:
    import msgspec

    steps = make_steps()
    assert stats.summarise(steps).deterministic is None  # no probe said
    on = [msgspec.structs.replace(s, deterministic=True) for s in steps]
    assert stats.summarise(on).deterministic is True
    one_off = [msgspec.structs.replace(s, deterministic=not (s.rank == 1 and s.step == 7)) for s in steps]
    assert stats.summarise(one_off).deterministic is False
