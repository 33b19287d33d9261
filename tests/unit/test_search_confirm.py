"""With racing off (``SearchConfig.race``): before the search stops, the leaders tied within noise are re-measured
(``SearchConfig.confirm_repeats``)."""

from __future__ import annotations

from infrarsi.modeling.observations import Observation
from infrarsi.modeling.priors import default_knowledge_base
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import Candidate, IntChoice, SearchSpace

CAP = 80e9
SPACE = SearchSpace(knobs=(IntChoice("micro_batch", (1, 2, 4, 8)),))


def _mb(v: int) -> Candidate:
    return Candidate.of({"micro_batch": v})


def _ok(mb: int, t: float) -> Observation:
    return Observation(_mb(mb), "ok", t, CAP * 0.5, 100 * t)


def _searcher(**config: int) -> Searcher:
    # racing off (the default): the confirmation; with racing on the race replaces it (tests/unit/test_search_race.py)
    s = Searcher(SPACE, CAP, seed=0, kb=default_knowledge_base(), config=SearchConfig(race=False, **config))
    # the whole space measured: nothing new is worth a trial; micro-batch 4 had the luckiest draw
    for mb, t in ((1, 2.0), (2, 1.40), (4, 0.90), (8, 0.95)):
        s.observe(_ok(mb, t))
    return s


def test_a_lucky_leader_is_re_measured_before_the_search_stops_and_loses_its_lead() -> None:
    s = _searcher()
    stop, why = s.should_stop()
    assert not stop and "re-measured" in why, why
    (first,) = s.suggest(1)
    assert first.origin == "confirm" and first.candidate == _mb(4)
    assert s.suggest(1, pending=[_mb(4)])[0].candidate == _mb(8)  # the pending re-run counts
    s.observe(_ok(4, 1.06))  # its true time: the first draw was luck
    (second,) = s.suggest(1)
    assert second.origin == "confirm" and second.candidate == _mb(8)
    s.observe(_ok(8, 0.96))
    assert s.should_stop()[0]
    assert s.suggest(1) == []  # every candidate measured, every leader confirmed
    assert s.top_candidates(1)[0][0] == _mb(8)


def test_no_confirmation_while_the_search_has_gain_left_nor_when_switched_off() -> None:
    s = Searcher(SPACE, CAP, seed=0, kb=default_knowledge_base())
    s.observe(_ok(1, 2.0))
    assert all(g.origin != "confirm" for g in s.suggest(3))
    off = _searcher(confirm_repeats=1)
    assert off.should_stop()[0]
    assert off.suggest(1) == []
