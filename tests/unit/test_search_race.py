"""Racing on a noisy host (``SearchConfig.race``): a challenger within noise of the incumbent is re-run,
interleaved with it, until the difference is resolved or both reach the cap; ``top_candidates`` chooses by the
repeated runs; the budget's last trials go to the open race (``Searcher.suggest``'s ``left``)."""

from __future__ import annotations

import math

from infrarsi.modeling.observations import Observation
from infrarsi.modeling.priors import default_knowledge_base
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import Candidate, IntChoice, SearchSpace

CAP = 80e9
CV10 = math.log1p(0.10)
"""The time model's noise floor from a doctor's run-to-run CV of 10% (``study.model.noise_floor``)."""
SMALL = SearchSpace(knobs=(IntChoice("micro_batch", (1, 2, 4, 8)),))
WIDE = SearchSpace(knobs=(IntChoice("micro_batch", (1, 2, 4, 8)), IntChoice("opaque", tuple(range(8)))))
TRUE_S = {1: 2.0, 2: 1.4, 4: 1.00, 8: 0.92}
"""Micro-batch 8 is truly the fastest; 4 is 9% slower and had a lucky first draw (0.85 s)."""
LATER_DRAWS = {4: [1.04, 0.97, 1.02, 0.99, 1.01], 8: [0.90, 0.95, 0.91, 0.93, 0.92]}
"""The runs after the first, each within the 10% noise of its true time."""


def _mb(v: int) -> Candidate:
    return Candidate.of({"micro_batch": v})


def _ok(c: Candidate, t: float) -> Observation:
    return Observation(c, "ok", t, CAP * 0.5, 100 * t)


def _measured_once(race: bool) -> Searcher:
    s = Searcher(SMALL, CAP, seed=0, kb=default_knowledge_base(), noise_floor=CV10,
                 config=SearchConfig(race=race))
    for mb, t in ((1, 2.0), (2, 1.4), (4, 0.85), (8, 0.93)):
        s.observe(_ok(_mb(mb), t))
    return s


def test_a_lucky_single_run_loses_the_race_to_a_truly_faster_candidate() -> None:
    assert _measured_once(race=False).top_candidates(1)[0][0] == _mb(4)  # one run each: the lucky draw is chosen
    s = _measured_once(race=True)
    draws = {mb: iter(ts) for mb, ts in LATER_DRAWS.items()}
    runs = []
    while True:
        stop, why = s.should_stop()
        if stop:
            break
        (sug,) = s.suggest(1)
        assert sug.origin == "confirm" and sug.reason.startswith("race: "), sug
        mb = int(sug.candidate["micro_batch"])
        runs.append(mb)
        s.observe(_ok(sug.candidate, next(draws[mb])))
    assert runs[0] == 4  # the pair has one run each: the one measured faster (the likelier lucky draw) goes first
    # interleaved: at every point the pair's run counts differ by at most one
    assert all(abs(runs[:i].count(4) - runs[:i].count(8)) <= 1 for i in range(len(runs) + 1)), runs
    assert runs.count(4) == runs.count(8) == s.race_cap() - 1  # interleaved to the cap: 8% is unresolved at 10%
    assert s.top_candidates(1)[0][0] == _mb(8)
    assert s.suggest(1) == []


def test_a_single_run_never_outranks_a_re_measured_candidate_within_its_noise() -> None:
    s = Searcher(SMALL, CAP, seed=0, kb=default_knowledge_base(), noise_floor=CV10, config=SearchConfig(race=True))
    for mb, t in ((1, 2.0), (2, 1.4), (8, 0.93), (8, 0.90), (8, 0.93), (4, 0.85)):
        s.observe(_ok(_mb(mb), t))
    assert s.top_candidates(1)[0][0] == _mb(8)
    (sug,) = s.suggest(1)
    assert sug.origin == "confirm" and sug.candidate == _mb(4)  # the single run is raced, not trusted
    # one resolved well ahead (0.60 s: 35% under, more than 1.5 standard errors) is chosen on one run
    s.observe(_ok(Candidate.of({"micro_batch": 4}), 0.60))
    s2 = Searcher(SMALL, CAP, seed=0, kb=default_knowledge_base(), noise_floor=CV10, config=SearchConfig(race=True))
    for mb, t in ((1, 2.0), (2, 1.4), (8, 0.93), (8, 0.90), (8, 0.93), (4, 0.60)):
        s2.observe(_ok(_mb(mb), t))
    assert s2.top_candidates(1)[0][0] == _mb(4)


def _wide(race_share: float, race: bool = True) -> Searcher:
    s = Searcher(WIDE, CAP, seed=0, kb=default_knowledge_base(), noise_floor=CV10,
                 config=SearchConfig(race=race, race_share=race_share))
    for (mb, o), t in (((1, 0), 2.0), ((2, 3), 1.4), ((4, 5), 0.85), ((8, 1), 0.93)):
        s.observe(_ok(Candidate.of({"micro_batch": mb, "opaque": o}), t))
    return s


def test_the_budget_end_re_measures_the_leaders_instead_of_a_new_candidate() -> None:
    s = _wide(race_share=0.0)  # races never take a turn of their own: only the budget's end makes room
    assert not s.should_stop()[0]  # 28 candidates unmeasured: gain is expected
    lucky = Candidate.of({"micro_batch": 4, "opaque": 5})
    need = 2 * (s.race_cap() - 1)  # both of the pair from one run to the cap
    assert s.suggest(1)[0].origin != "confirm"
    assert s.suggest(1, left=need + 1)[0].origin != "confirm"
    (last,) = s.suggest(1, left=need)
    assert last.origin == "confirm" and last.candidate == lucky and "budget has" in last.reason
    assert s.suggest(1, left=1)[0].origin == "confirm"
    # the race's runs pending count: the incumbent's turn next
    assert s.suggest(1, pending=[lucky], left=1)[0].candidate != lucky
    # racing off: the study as it was, new candidates to the last trial
    assert _wide(race_share=0.0, race=False).suggest(1, left=1)[0].origin != "confirm"


def test_races_and_new_candidates_alternate_after_the_design() -> None:
    s = _wide(race_share=0.5)
    origins = []
    for _ in range(6):
        (sug,) = s.suggest(1)
        origins.append(sug.origin == "confirm")
        c = sug.candidate
        s.observe(_ok(c, 3.0 if not origins[-1] else (1.0 if c["micro_batch"] == 4 else 0.92)))
    assert origins == [True, False, True, False, True, False], origins
