"""The search's OOM budget (``SearchConfig.oom_budget``): risky proposals only while budget remains, and a tiny
space whose fitting candidates have all run stops instead of burning its last trials on OOMs."""

import math

import numpy as np
from infrarsi.modeling.observations import Observation
from infrarsi.modeling.priors import default_knowledge_base
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import Candidate, IntChoice, SearchSpace

GIB = 2**30
CAP = 80 * GIB


class FixedRisk(Searcher):
    """P(OOM) set by hand: 0.6 for a micro-batch of 8 or more, 0 below, whatever the memory model says."""

    def _p_oom(self, idx: np.ndarray) -> np.ndarray:
        return np.array([0.6 if self.pool.candidates[i]["micro_batch"] >= 8 else 0.0 for i in idx])


def _ok(c: Candidate) -> Observation:
    t = 2.0 / math.sqrt(c["micro_batch"])  # a larger micro-batch is faster: the risky ones promise the most
    return Observation(c, "ok", t, CAP * 0.5, 100 * t)


def test_the_oom_budget_left_is_earned_by_trials_and_spent_by_ooms_and_pending_risk():
    space = SearchSpace(knobs=(IntChoice("micro_batch", (1, 2, 4, 8, 16)),))
    s = FixedRisk(space, CAP, seed=0, config=SearchConfig(oom_budget=0.1, oom_budget_credit=1.0))
    assert s.oom_allowance() == 0.1 * 1 + 1.0
    c = [Candidate.of({"micro_batch": mb}) for mb in (1, 2, 4, 8, 16)]
    s.observe(_ok(c[0]))
    s.observe(Observation(c[4], "oom", None, CAP, 10.0))
    assert math.isclose(s.oom_allowance(), 0.1 * 3 + 1.0 - 1)
    assert math.isclose(s.oom_allowance(pending=[c[3]]), 0.1 * 4 + 1.0 - 1 - 0.6)
    assert SearchConfig(oom_budget=None) and Searcher(space, CAP, config=SearchConfig(oom_budget=None)).oom_allowance() == math.inf


def test_tiny_space_stops_once_every_candidate_under_the_cut_off_has_run_and_the_budget_is_spent():
    space = SearchSpace(knobs=(IntChoice("micro_batch", (1, 2, 4, 8, 16)),))
    s = FixedRisk(space, CAP, seed=0, kb=default_knowledge_base(), config=SearchConfig(oom_budget=0.08, confirm_repeats=1))
    for mb in (1, 2, 4):
        s.observe(_ok(Candidate.of({"micro_batch": mb})))
    s.observe(Observation(Candidate.of({"micro_batch": 16}), "oom", None, CAP, 10.0))
    # left: micro-batch 8 at P(OOM) 0.6, above the cut-off, with a large expected gain; the budget left (0.08 x 5
    # + 1 - 1 OOM = 0.4) does not hold its risk: stop, and propose nothing
    assert s.oom_allowance() < 0.6
    stop, why = s.should_stop()
    assert stop and "OOM budget" in why, why
    assert s.suggest(1) == []
    # with budget left (a larger credit) the same study goes on and proposes it, the cut-off lifted
    s2 = FixedRisk(space, CAP, seed=0, kb=default_knowledge_base(), config=SearchConfig(oom_budget_credit=2.0))
    for o in s.observations:
        s2.observe(o)
    assert not s2.should_stop()[0]
    nxt = s2.suggest(1)
    assert [g.candidate["micro_batch"] for g in nxt] == [8] and "cut-off" in nxt[0].reason


LEAN = SearchSpace(knobs=(IntChoice("micro_batch", (1, 2, 4, 8)), IntChoice("lanes", (1, 2, 3, 4, 6, 8))))
"""A job whose activations are a small share of the peak: the built-in prior (x1.35 memory per doubling of the
micro-batch) overprices every larger micro-batch, which in truth all fit and run up to 2.8x faster."""


def _lean_reasons(config: SearchConfig, trials: int = 15) -> list[str]:
    s = Searcher(LEAN, CAP, seed=0, kb=default_knowledge_base(), config=config)
    rng = np.random.default_rng(0)
    reasons = []
    for _ in range(trials):
        sug = s.suggest(1)
        if not sug:
            break
        c = sug[0].candidate
        t = 2.0 / c["micro_batch"] ** 0.5 * (1 - 0.02 * math.log2(c["lanes"])) * math.exp(0.02 * rng.standard_normal())
        s.observe(Observation(c, "ok", t, CAP * (0.86 + 0.015 * c["micro_batch"]), 100 * t))
        reasons.append(sug[0].reason)
    return reasons


def test_a_memory_step_probe_is_proposed_only_while_the_oom_budget_holds_its_risk():
    def probes(config: SearchConfig) -> int:
        return sum(r.startswith("memory step probe") for r in _lean_reasons(config))

    assert probes(SearchConfig()) > 0
    assert probes(SearchConfig(oom_budget=0.0, oom_budget_credit=0.0)) == 0


def test_the_space_filling_seeds_are_predicted_to_need_no_more_memory_than_the_golden_baseline():
    space = SearchSpace(knobs=(IntChoice("micro_batch", (1, 2, 4, 8, 16)), IntChoice("lanes", (1, 2, 4, 8)),
                               IntChoice("tp", (1, 2, 4))), memory_direction={"micro_batch": 1, "tp": -1})
    baseline = Candidate.of({"micro_batch": 2, "lanes": 1, "tp": 4})  # among the leanest: it fits by construction

    def seeds(config: SearchConfig) -> list[float]:
        s = Searcher(space, CAP, seed=0, kb=default_knowledge_base(), baseline=baseline, config=config)
        out = []
        for _ in range(1 + config.n_seeds):
            sug = s.suggest(1)[0]
            c = sug.candidate
            if sug.origin == "seed":  # as the model saw it when it chose
                out.append(s.predict([c])[0].log_peak_bytes - s.predict([baseline])[0].log_peak_bytes)
            s.observe(Observation(c, "ok", 1.0 / c["micro_batch"], CAP * 0.2 * c["micro_batch"] / c["tp"], 100.0))
        return out

    assert len(seeds(SearchConfig())) == 4 and max(seeds(SearchConfig())) <= 1e-9  # no shape: the design is seeds
    assert max(seeds(SearchConfig(design_below_baseline=False))) > 0  # the same design without the rule
