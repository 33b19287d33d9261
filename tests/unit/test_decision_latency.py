"""What made a decision at 5,000 trials fast must not change what it decides (issue 13, decision latency):
the time model's rank-k update, the refit schedule, the invariant model's incremental incidence."""

from __future__ import annotations

import numpy as np
import pytest
from infrarsi.modeling.acquisition import InvariantModel
from infrarsi.modeling.observations import Observation
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import BoolKnob, Candidate, Categorical, IntChoice, SearchSpace
from infrarsi.modeling.time_model import TimeModel

GIB = 2**30
SPACE = SearchSpace(knobs=(IntChoice("micro_batch", (1, 2, 4, 8, 16)), BoolKnob("bf16"),
                           Categorical("recompute", ("none", "selective", "full"), default="none"),
                           IntChoice("tp", (1, 2, 4))))


def _outcome(c: Candidate, rng: np.random.Generator) -> Observation:
    t = (1.0 / c["micro_batch"] ** 0.3) * (0.8 if c["bf16"] else 1.0) * {"none": 1.0, "selective": 1.1, "full": 1.3}[
        c["recompute"]] / c["tp"] ** 0.5 * np.exp(0.03 * rng.standard_normal())
    peak = 20 * GIB * c["micro_batch"] / c["tp"] * {"none": 1.0, "selective": 0.6, "full": 0.3}[c["recompute"]]
    if peak > 80 * GIB:
        return Observation(c, "oom", None, 79 * GIB, 10.0)
    return Observation(c, "ok", float(t), float(peak), 20 * float(t))


def test_the_rank_k_update_is_the_exact_posterior_at_the_fitted_noise_and_weights() -> None:
    rng = np.random.default_rng(0)
    tm = TimeModel(SPACE)
    cands = SPACE.enumerate()
    for i in range(40):
        tm.observe(cands[i % len(cands)], float(np.exp(rng.normal(0, 0.3))))
    tm.fit()
    noise = tm.noise_std
    for i in range(40, 55):
        tm.observe(cands[i % len(cands)], float(np.exp(rng.normal(0, 0.3))))
    assert tm.update()
    assert tm.noise_std == noise  # the hyperparameters stay those of the last full fit
    mean, _ = tm.posterior_direct()  # explicit inverse with the same noise and straggler weights
    np.testing.assert_allclose(tm.mean, mean, rtol=1e-8, atol=1e-10)
    tm.observe_censored_encoded(tm.encoder.encode(cands[0]), 5.0)
    assert not tm.update()  # a censored row needs the full fit (imputation)


def test_the_refit_schedule_changes_nothing_in_a_study_and_little_at_scale() -> None:
    rng = np.random.default_rng(1)
    cands = SPACE.enumerate()
    scheduled = Searcher(SPACE, 80 * GIB, seed=0, config=SearchConfig(refit_all_until=30, refit_every=0.2))
    always = Searcher(SPACE, 80 * GIB, seed=0, config=SearchConfig(refit_all_until=10**9))
    for i in range(120):
        o = _outcome(cands[int(rng.integers(len(cands)))], rng)
        for s in (scheduled, always):
            s.observe(o)
            s.refit()
        if i < 30:  # a study's scale: every observation refits in full, the same proposals
            assert scheduled.suggest(2) == always.suggest(2)
    assert scheduled.checkpoint(120) == 112  # 30, 36, 44, 53, 64, 77, 93, 112: the last 8 were rank-k updates
    a, b = scheduled.predict(cands), always.predict(cands)
    diff = np.array([x.log_time - y.log_time for x, y in zip(a, b, strict=True)])
    assert np.max(np.abs(diff)) < 0.02  # 2% in step time after 120 trials, 20% of them since the full fit


def test_the_invariant_model_solved_as_it_goes_equals_one_solved_at_the_end() -> None:
    rng = np.random.default_rng(2)
    cands = SPACE.enumerate()
    going, once = InvariantModel({}), InvariantModel({})
    for _ in range(300):
        c = cands[int(rng.integers(len(cands)))]
        violated = bool(c["recompute"] == "selective" and c["tp"] == 4) or rng.random() < 0.02
        for m in (going, once):
            m.observe(c, violated)
        going.fit()
    once.fit()
    for c in cands:
        assert going.p_hold(c) == pytest.approx(once.p_hold(c), rel=1e-9)


def test_a_searcher_rebuilt_by_replay_holds_the_models_of_the_live_one() -> None:
    # the schedule is a function of the observation count, not of when refit() ran: the proposer rebuilt after a
    # restart (one refit at the end) proposes what the live one (a refit per trial) would have
    rng = np.random.default_rng(3)
    cands = SPACE.enumerate()
    config = SearchConfig(refit_all_until=30, refit_every=0.2)
    live = Searcher(SPACE, 80 * GIB, seed=0, config=config)
    observations = [_outcome(cands[int(rng.integers(len(cands)))], rng) for _ in range(120)]
    for o in observations:
        live.observe(o)
        live.refit()
    replayed = Searcher.replay(SPACE, 80 * GIB, observations, seed=0, config=config)
    a, b = live.predict(cands), replayed.predict(cands)
    np.testing.assert_allclose([x.log_time for x in a], [y.log_time for y in b], rtol=0, atol=1e-9)
    np.testing.assert_allclose([x.p_oom for x in a], [y.p_oom for y in b], atol=1e-3)  # memory fits warm-start
    picks, again = live.suggest(2), replayed.suggest(2)
    assert [(x.candidate, x.origin) for x in picks] == [(y.candidate, y.origin) for y in again]
    np.testing.assert_allclose([x.p_oom or 0.0 for x in picks], [y.p_oom or 0.0 for y in again], atol=1e-3)


def test_pairing_over_value_codes_picks_what_the_loop_picked() -> None:
    rng = np.random.default_rng(4)
    cands = SPACE.enumerate()
    s = Searcher(SPACE, 80 * GIB, seed=0)
    for _ in range(12):
        s.observe(_outcome(cands[int(rng.integers(len(cands)))], rng))
    s.refit()
    idx = s._shortlist(np.random.default_rng(0))
    mu, sd = s.time_model.predict_encoded(s.pool.x_time[idx])
    p_oom, p_hold = s._p_oom(idx), s._p_hold(idx)
    usable = p_oom <= 0.9
    cost = s.cost_model.predict(np.exp(mu))
    best = s._incumbent()
    codes = s.pool.codes
    picks = []
    for r in range(idx.size):
        by_codes = s._pair(idx, r, mu, sd, p_oom, p_hold, usable, best, cost)
        s.pool.codes = None  # the loop
        try:
            by_loop = s._pair(idx, r, mu, sd, p_oom, p_hold, usable, best, cost)
        finally:
            s.pool.codes = codes
        assert by_codes == by_loop, r
        picks.append(by_codes)
    assert sum(p is not None for p in picks) > idx.size // 4  # pairs exist: the comparison is not vacuous
