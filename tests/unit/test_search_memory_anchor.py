"""``SearchConfig.memory_anchor_spread``: without a workload shape, the memory std of a candidate is set by
how far it sits from the nearest measured peak (knob changes) and how much the fit says its peak moves."""

from __future__ import annotations

import numpy as np
import pytest
from infrarsi.modeling.memory_model import TransformerMeta
from infrarsi.modeling.observations import Observation
from infrarsi.modeling.priors import default_knowledge_base
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import Candidate
from support.sum_of_terms import ALL, CAP, SPACE, peak

MEASURED = [(1, 1, "a"), (2, 2, "b"), (1, 4, "c"), (4, 4, "a"), (2, 8, "b")]
SPREAD = (0.7, 0.6, 0.5)


def measured(config: SearchConfig, meta: TransformerMeta | None = None) -> Searcher:
    s = Searcher(SPACE, CAP, seed=0, kb=default_knowledge_base(), config=config, meta=meta)
    for b, w, m in MEASURED:
        c = Candidate.of({"rows_per_slice": b, "split_ways": w, "mode": m})
        s.observe(Observation(c, "ok", 1.0 / b**0.3 + 0.1 * w, peak(c), 100.0))
    return s


def distances(c: Candidate) -> int:
    """Knob changes from ``c`` to the nearest measured candidate."""
    return min(sum(c[k] != v for k, v in zip(("rows_per_slice", "split_ways", "mode"), m, strict=True))
               for m in MEASURED)


def test_off_is_the_mixture_and_before_any_peak_nothing_changes() -> None:
    off, on = measured(SearchConfig(memory_anchor_spread=None)), measured(SearchConfig(memory_anchor_spread=SPREAD))
    p_off, p_on = off.predict(ALL), on.predict(ALL)
    assert SearchConfig().memory_anchor_spread == SPREAD  # on by default
    assert [p.log_peak_bytes for p in p_off] == [p.log_peak_bytes for p in p_on]  # the mean is the mixture's
    assert [p.log_peak_std for p in p_off] != [p.log_peak_std for p in p_on]
    fresh_off = Searcher(SPACE, CAP, seed=0, config=SearchConfig(memory_anchor_spread=None))
    fresh_on = Searcher(SPACE, CAP, seed=0, config=SearchConfig(memory_anchor_spread=SPREAD))
    assert [p.p_oom for p in fresh_off.predict(ALL)] == [p.p_oom for p in fresh_on.predict(ALL)]
    assert fresh_off.suggest(4) == fresh_on.suggest(4)


def test_the_std_follows_the_distance_and_the_predicted_move_from_the_nearest_peak() -> None:
    a, b, g = SPREAD
    off, on = measured(SearchConfig(memory_anchor_spread=None)), measured(SearchConfig(memory_anchor_spread=SPREAD))
    p_off, p_on = off.predict(ALL), on.predict(ALL)
    anchors = [Candidate.of({"rows_per_slice": r, "split_ways": w, "mode": m}) for r, w, m in MEASURED]
    mu_a = {c.key: p.log_peak_bytes for c, p in zip(anchors, off.predict(anchors), strict=True)}
    for c, po, pn in zip(ALL, p_off, p_on, strict=True):
        d = distances(c)
        near = [m for m in anchors if distances(m) == 0 and sum(c[k] != m[k] for k in m.knobs) == d]
        delta = min(abs(po.log_peak_bytes - mu_a[m.key]) for m in near)
        scale = a if d <= 1 else 1 + g * (d - 1)
        assert pn.log_peak_std == pytest.approx(float(np.hypot(scale * po.log_peak_std, b * delta)), rel=1e-9, abs=1e-9)
    # a measured peak and a one-knob step the fit sees as (almost) free are surer than the mixture says; a
    # one-knob step the fit predicts to move the peak far is less sure
    measured_row = ALL.index(anchors[0])
    assert p_on[measured_row].log_peak_std < p_off[measured_row].log_peak_std
    step = Candidate.of({"rows_per_slice": 1, "split_ways": 2, "mode": "b"})  # (2, 2, b) with half the rows
    far = Candidate.of({"rows_per_slice": 1, "split_ways": 8, "mode": "a"})  # (1, 1, a) split 8 ways
    (s_off, f_off), (s_on, f_on) = off.predict([step, far]), on.predict([step, far])
    assert s_on.log_peak_std < s_off.log_peak_std
    assert f_on.log_peak_std > 1.5 * f_off.log_peak_std


def test_with_a_workload_shape_the_formula_keeps_its_own_spread() -> None:
    meta = TransformerMeta(layers=4, hidden=256, heads=4, seq_len=128, vocab=1000, dense_params=4_000_000,
                           global_batch=16, capacity_bytes=CAP)
    off = measured(SearchConfig(memory_anchor_spread=None), meta).predict(ALL)
    on = measured(SearchConfig(memory_anchor_spread=SPREAD), meta).predict(ALL)
    assert [p.log_peak_std for p in off] == [p.log_peak_std for p in on]


def test_a_replayed_searcher_suggests_what_the_live_one_did() -> None:
    config = SearchConfig(memory_anchor_spread=SPREAD)
    live = measured(config)
    replayed = Searcher.replay(SPACE, CAP, live.observations, seed=0, kb=default_knowledge_base(), config=config)
    assert replayed.suggest(3) == live.suggest(3)
