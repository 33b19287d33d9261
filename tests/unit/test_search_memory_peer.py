"""Without a workload shape the searcher mixes two memory models of different forms
(``SearchConfig.memory_peer_weight``): the knob-pair log-linear model and the two-term model."""

from __future__ import annotations

import math

import numpy as np
import pytest
from infrarsi.modeling.memory_model import TransformerMeta, mix_normals
from infrarsi.modeling.observations import Observation
from infrarsi.modeling.priors import default_knowledge_base
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import Candidate
from support.sum_of_terms import ALL, CAP, SPACE, peak

MEASURED = [(1, 1, "a"), (2, 2, "b"), (1, 4, "c"), (4, 4, "a"), (2, 8, "b"), (8, 8, "c"), (4, 2, "a")]


def measured(config: SearchConfig) -> Searcher:
    s = Searcher(SPACE, CAP, seed=0, kb=default_knowledge_base(), config=config)
    for b, w, m in MEASURED:
        c = Candidate.of({"rows_per_slice": b, "split_ways": w, "mode": m})
        p = peak(c)
        fits = p <= CAP
        s.observe(Observation(c, "ok" if fits else "oom", 1.0 / b**0.3 + 0.1 * w, p if fits else 0.97 * CAP, 100.0))
    return s


def test_mix_normals_widens_where_the_models_disagree() -> None:
    mu, sd = mix_normals([0.5, 0.5], [np.array([1.0, 1.0])] * 2, [np.array([0.1, 0.2])] * 2)
    assert np.allclose(mu, [1.0, 1.0]) and np.allclose(sd, [0.1, 0.2])  # agreement: as sure as either
    mu, sd = mix_normals([0.25, 0.75], [np.array([0.0]), np.array([0.4])], [np.array([0.1]), np.array([0.2])])
    assert mu[0] == pytest.approx(0.3)
    assert sd[0] == pytest.approx(math.sqrt(0.25 * 0.01 + 0.75 * 0.04 + 0.25 * 0.75 * 0.16))
    mu, sd = mix_normals([1.0, 0.0], [np.array([2.0]), np.array([9.0])], [np.array([0.3]), np.array([5.0])])
    assert mu[0] == pytest.approx(2.0) and sd[0] == pytest.approx(0.3)


def test_the_peer_is_the_other_form_and_only_without_a_shape() -> None:
    s = Searcher(SPACE, CAP, seed=0)
    assert s.memory_peer is not None and s.memory_peer.two_terms and not s.memory_model.two_terms
    flipped = Searcher(SPACE, CAP, seed=0, config=SearchConfig(memory_two_terms=True))
    assert flipped.memory_model.two_terms and flipped.memory_peer is not None
    assert not flipped.memory_peer.two_terms and flipped.memory_peer.encoder.dim > flipped.memory_peer.encoder.n_main
    assert Searcher(SPACE, CAP, seed=0, config=SearchConfig(memory_peer_weight=None)).memory_peer is None
    meta = TransformerMeta(layers=4, hidden=256, heads=4, seq_len=128, vocab=1000, dense_params=4_000_000,
                           global_batch=16, capacity_bytes=CAP)
    assert Searcher(SPACE, CAP, seed=0, meta=meta).memory_peer is None  # the structural formula stands alone


def test_before_any_peak_the_first_model_alone_then_the_mixture_of_both_fits() -> None:
    with_peer, alone = Searcher(SPACE, CAP, seed=0), Searcher(SPACE, CAP, seed=0, config=SearchConfig(
        memory_peer_weight=None))
    assert [p.p_oom for p in with_peer.predict(ALL)] == [p.p_oom for p in alone.predict(ALL)]
    assert with_peer.suggest(4) == alone.suggest(4)  # the initial design is the first model's
    s = measured(SearchConfig(memory_peer_weight=0.3, memory_anchor_spread=None))  # the mixture alone
    assert s.memory_peer is not None and s.memory_peer.n == s.memory_model.n == len(MEASURED)
    pred = s.predict(ALL)  # refits both
    first, peer = s.memory_model.predict_log(ALL), s.memory_peer.predict_log(ALL)
    mu, sd = mix_normals([0.7, 0.3], [first[0], peer[0]], [first[1], peer[1]])
    assert np.allclose([p.log_peak_bytes for p in pred], mu) and np.allclose([p.log_peak_std for p in pred], sd)


def test_on_a_peak_that_is_a_sum_of_terms_the_mixture_prices_oom_better_than_the_first_model_alone() -> None:
    truth = np.log([peak(c) for c in ALL])
    ooms = np.array([peak(c) > CAP for c in ALL])
    scores = {}
    for weight in (0.5, None):
        pred = measured(SearchConfig(memory_peer_weight=weight)).predict(ALL)
        err = truth - np.array([p.log_peak_bytes for p in pred])
        p_oom = np.array([p.p_oom for p in pred])
        scores[weight] = (float(np.sqrt(np.mean(err**2))), float(np.mean((p_oom - ooms) ** 2)))
    (rms_mix, brier_mix), (rms_one, brier_one) = scores[0.5], scores[None]
    assert rms_mix < 0.85 * rms_one, scores
    assert brier_mix < 0.85 * brier_one, scores


def test_a_replayed_searcher_with_a_peer_suggests_what_the_live_one_did() -> None:
    live = measured(SearchConfig())
    replayed = Searcher.replay(SPACE, CAP, live.observations, seed=0, kb=default_knowledge_base())
    assert replayed.suggest(3) == live.suggest(3)
