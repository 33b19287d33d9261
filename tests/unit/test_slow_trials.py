"""Stopping a search trial early as ``stopped_slow`` (issue 13): the verdict, the ledger, the search."""

from __future__ import annotations

import math

import numpy as np
import pytest
from infrarsi import events as ev
from infrarsi.modeling.observations import Observation
from infrarsi.modeling.priors import default_knowledge_base
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.space import BoolKnob, Categorical, IntChoice, SearchSpace
from infrarsi.study.ledger import TrialLedger
from infrarsi.trial.slow import MIN_STEADY_STEPS, may_stop, slow_threshold, slow_verdict

GIB = 2**30


def verdict(times, incumbent=1.0, factor=2.0, cv=None):
    return slow_verdict(times, incumbent_s=incumbent, incumbent_trial="best", factor=factor, noise_cv=cv)


def test_steady_steps_far_slower_than_the_incumbent_are_stopped_after_the_warmup() -> None:
    times = [40.0, 14.0, 14.1, 13.9, 14.0]  # a compile-like first step, then 14 s steps against 0.8 s
    assert verdict(times[:4], incumbent=0.8) is None  # too few steps to tell the warm-up from the steady state
    stop = verdict(times, incumbent=0.8)
    assert stop is not None
    assert stop.warmup_steps == 1 and stop.steady_steps == 4 >= MIN_STEADY_STEPS
    assert stop.steady_step_s == pytest.approx(14.0)
    assert stop.incumbent_trial == "best" and stop.threshold_step_s == pytest.approx(1.6)
    assert "17.5x" in stop.reason


def test_a_long_warmup_alone_is_not_slow() -> None:
    # a torch.compile trial: slow first steps, then faster than the incumbent
    assert verdict([30.0, 20.0, 0.5, 0.5]) is None
    assert verdict([30.0, 20.0, 0.5, 0.5, 0.5]) is None
    assert verdict([4.0, 4.0, 2.0, 2.0, 2.0], incumbent=0.5).steady_step_s == 2.0  # the kept figure is the steady one
    assert verdict([30.0, 20.0, 0.5, 0.5, 0.5, 0.5]) is None
    # a warm-up still decaying towards a fast step: the last steps are under the bar
    assert verdict([5.0, 4.0, 3.0, 2.5, 1.9, 1.2, 1.0, 1.0]) is None


def test_only_beyond_the_factor_and_the_doctors_noise_floor() -> None:
    assert verdict([1.9] * 8) is None  # 1.9x: slower, but not ruled out at factor 2
    assert verdict([2.2] * 8) is not None
    assert verdict([2.2] * 8, factor=3.0) is None
    # a host the doctor measured at 20% run-to-run noise: 6σ is exp(6·log 1.2) ≈ 3x
    assert slow_threshold(1.0, 2.0, 0.2) == pytest.approx(1.2**6)
    assert verdict([2.2] * 8, cv=0.2) is None
    assert verdict([3.5] * 8, cv=0.2) is not None


def test_one_fast_step_among_the_last_keeps_the_trial() -> None:
    assert verdict([3.0, 3.0, 3.0, 3.0, 3.0, 1.5]) is None
    assert verdict([3.0, 3.0, 3.0, 3.0, 3.0, 3.0]) is not None


def test_no_incumbent_no_verdict() -> None:
    assert verdict([50.0] * 8, incumbent=0.0) is None


def test_only_trials_the_search_chose_may_be_stopped() -> None:
    candidate = ev.Candidate(knobs={"x": 1})

    def proposed(kind: str, origin: str) -> ev.TrialProposed:
        return ev.TrialProposed(candidate=candidate, candidate_key=candidate.key(), kind=kind, origin=origin)  # type: ignore[arg-type]

    assert may_stop(proposed("search", "ei"))
    assert may_stop(proposed("search", "pairing"))
    # `infrarsi trial --set ...`: the person named the candidate; it runs to the end whatever its speed.
    assert not may_stop(proposed("search", "manual"))
    assert not may_stop(proposed("baseline", "baseline"))
    assert not may_stop(proposed("verify", "verify"))


def _finished(status: str, **kw) -> ev.TrialFinished:
    return ev.TrialFinished(status=status, accelerator_s=7.0, steps_completed=5, **kw)  # type: ignore[arg-type]


def _measured(status: str, step_time_s: float) -> ev.TrialMeasured:
    return ev.TrialMeasured(
        candidate_key="k", kind="search", status=status, steps=5, warmup_steps=2, step_time_s=step_time_s,  # type: ignore[arg-type]
        step_time_mad_s=0.01, step_time_with_warmup_s=step_time_s, tokens_per_s=1.0, mfu=None, flops_per_step=None,
        phases={}, peak_memory_bytes=[3 << 30], per_rank_step_s=[step_time_s], stragglers=[], loss_curve=[],
        eval_curve=[], optimizer_steps=5, tokens=5, invariants=[], invariants_ok=False,
    )  # fmt: skip


def test_the_ledger_keeps_a_stopped_trials_steps_as_a_measurement() -> None:
    ledger = TrialLedger()
    candidate = ev.Candidate(knobs={"bf16": True})
    ledger.proposed("t1", ev.TrialProposed(candidate=candidate, candidate_key=candidate.key(), kind="search", origin="ei"))
    reason = "stopped_slow: steady steps 14 s, 17.5x the incumbent's 0.8 s"
    assert ledger.finished("t1", _finished("stopped_slow", reason=reason)) is None  # waits for the measurement
    outcome = ledger.measured("t1", _measured("stopped_slow", 14.0))
    assert outcome is not None
    assert outcome.status == "stopped_slow" and outcome.step_time_s == 14.0 and outcome.peak_bytes == 3 << 30
    assert outcome.accelerator_s == 7.0 and outcome.detail == reason and not outcome.infrastructure
    assert ledger.accelerator_s == 7.0


def test_the_search_learns_the_stopped_step_time_but_never_makes_it_the_incumbent() -> None:
    space = SearchSpace(knobs=(IntChoice("micro_batch", (1, 2, 4, 8)), BoolKnob("bf16")))
    s = Searcher(space, 80 * GIB, seed=0, kb=default_knowledge_base())
    base = space.default_candidate()
    s.observe(Observation(base, "ok", 1.0, 10 * GIB, 20.0))
    slow = base.replace(bf16=True)
    before = s.predict([slow])[0].log_time
    s.observe(Observation(slow, "stopped_slow", 10.0, 10 * GIB, 7.0))
    assert s.predict([slow])[0].log_time - before > math.log(3.0)
    assert s.time_model.n_censored == 0  # an uncensored measurement, unlike a timeout
    assert [c.key for c, *_ in s.top_candidates(3)] == [base.key]


TRAP_SPACE = SearchSpace(knobs=(IntChoice("micro_batch", (1, 2, 4, 8)), BoolKnob("bf16"),
                                Categorical("recompute", ("none", "full"), default="none")))
STEPS, WARMUP, FACTOR = 20, 2, 2.0


def _stopping_study(bf16_factor: float, trials: int = 10) -> tuple[list[Observation], float]:
    """The simulated trap of ``test_modeling_search`` without a timeout, with the stop-as-slow rule: a trial
    whose steps exceed ``FACTOR`` × the incumbent is stopped after its warm-up and ``MIN_STEADY_STEPS``; the
    study ends when ``should_stop`` says so, as the proposer's does."""
    s = Searcher(TRAP_SPACE, 80 * GIB, seed=0, kb=default_knowledge_base())
    rng = np.random.default_rng(0)
    log: list[Observation] = []
    c = TRAP_SPACE.default_candidate()  # the doctor's baseline first
    for i in range(trials + 1):
        if i > 1 + s.config.n_seeds and s.should_stop()[0]:
            break  # as the proposer does once the initial design is measured
        if i:
            c = s.suggest(1)[0].candidate
        t = 1.0 / (1 - 0.5 / (c["micro_batch"] + 1)) * (1.3 if c["recompute"] == "full" else 1.0)
        t *= (bf16_factor if c["bf16"] else 1.0) * math.exp(0.02 * rng.standard_normal())
        times = [3 * t] * WARMUP + [t] * STEPS
        incumbent = min((o.step_time_s for o in log if o.status == "ok"), default=None)
        stop = None
        for n in range(1, len(times) + 1):
            if incumbent is not None and i and verdict(times[:n], incumbent=incumbent, factor=FACTOR) is not None:
                stop = n
                break
        if stop is not None:
            o = Observation(c, "stopped_slow", t, 10 * GIB, sum(times[:stop]))
        else:
            o = Observation(c, "ok", t, 10 * GIB, sum(times))
        s.observe(o)
        log.append(o)
    return log, sum(o.cost_seconds or 0.0 for o in log)


def test_a_knob_value_10x_slower_than_its_prior_is_dropped_after_its_first_early_stop() -> None:
    log, cost = _stopping_study(10.0)
    first = next(i for i, o in enumerate(log) if o.status == "stopped_slow")
    assert log[first].candidate["bf16"]
    for i in range(first + 1, len(log)):
        plain_tried = {o.candidate.key for o in log[:i] if not o.candidate["bf16"]}
        assert not log[i].candidate["bf16"] or len(plain_tried) == 8, [str(o.candidate) for o in log]
    assert all(o.candidate["bf16"] for o in log if o.status == "stopped_slow")
    assert all(o.status == "stopped_slow" for o in log if o.candidate["bf16"])  # never run to the horizon
    _, cost_without_trap = _stopping_study(1.0)
    assert cost <= 1.5 * cost_without_trap, (cost, cost_without_trap)
