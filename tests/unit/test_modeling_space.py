"""Search space, candidates, encoder (pure math; numbers, not mocks)."""

import numpy as np
from infrarsi.modeling.space import (
    BoolKnob,
    Candidate,
    Categorical,
    Constraint,
    FeatureEncoder,
    IntChoice,
    Patch,
    SearchSpace,
)


def small_space() -> SearchSpace:
    return SearchSpace(
        knobs=(IntChoice("tp", (1, 2, 4)), IntChoice("dp", (1, 2, 4)), IntChoice("micro_batch", (1, 2, 4, 8)),
               Categorical("recompute", ("none", "full")), BoolKnob("flash_attention")),
        patches=(Patch("a", conflicts=frozenset({"b"})), Patch("b", conflicts=frozenset({"a"}))),
        constraints=(Constraint("tp*dp == 4", lambda kv, _p: kv["tp"] * kv["dp"] == 4),
                     Constraint("mb*dp divides 16", lambda kv, _p: 16 % (kv["micro_batch"] * kv["dp"]) == 0)),
    )


def test_candidate_key_is_canonical_and_dedups():
    c1 = Candidate.of({"tp": np.int64(2), "dp": 2, "flash_attention": np.bool_(True)}, ["b", "a"])
    c2 = Candidate.of({"flash_attention": True, "dp": 2, "tp": 2}, ("a", "b"))
    assert c1 == c2 and c1.key == c2.key and hash(c1) == hash(c2)
    assert len({c1.key, c2.key, c1.replace(tp=4).key}) == 2


def test_enumeration_respects_constraints_and_conflicts():
    sp = small_space()
    cands = sp.enumerate()
    # (tp,dp) in {(1,4),(2,2),(4,1)}; mb*dp | 16 -> dp=4: mb in {1,2,4}; dp=2: 4 values; dp=1: 4 values
    n_knobs = (3 + 4 + 4) * 2 * 2
    assert len(cands) == n_knobs * 3  # patch sets {}, {a}, {b}; {a,b} conflicts
    assert all(sp.is_feasible(c) for c in cands)
    assert len({c.key for c in cands}) == len(cands)


def test_sobol_sampling_is_feasible_distinct_and_seeded():
    sp = small_space()
    a = sp.sample(20, np.random.default_rng(3))
    b = sp.sample(20, np.random.default_rng(3))
    assert [c.key for c in a] == [c.key for c in b]
    assert len({c.key for c in a}) == len(a) == 20
    assert all(sp.is_feasible(c) for c in a)


def test_encoder_log2_levels_and_interactions():
    sp = small_space()
    enc = FeatureEncoder(sp)
    c = Candidate.of({"tp": 4, "dp": 1, "micro_batch": 8, "recompute": "full", "flash_attention": True}, ["a"])
    x = enc.encode(c)
    assert x[enc.index["intercept"]] == 1.0
    assert x[enc.index["micro_batch:log2"]] == 3.0
    assert x[enc.index["micro_batch=8"]] == 1.0 and x[enc.index["micro_batch=4"]] == 0.0
    assert x[enc.index["recompute=full"]] == 1.0 and x[enc.index["recompute=none"]] == 0.0
    assert x[enc.index["patch:a"]] == 1.0 and x[enc.index["patch:b"]] == 0.0
    assert x[enc.index["tp:log2*micro_batch:log2"]] == 2.0 * 3.0
    assert x[enc.index["flash_attention*patch:a"]] == 1.0


def test_neighbours_keep_equality_constraint_with_two_changes():
    sp = small_space()
    c = Candidate.of({"tp": 2, "dp": 2, "micro_batch": 2, "recompute": "none", "flash_attention": False})
    nb = sp.neighbours(c)
    assert c.key not in {n.key for n in nb}
    assert any(n["tp"] == 4 and n["dp"] == 1 for n in nb)  # needs two changes at once
    assert all(sp.is_feasible(n) for n in nb)


def test_trend_columns_are_zero_at_the_smallest_value():
    # an interaction column is a product of two trends; with log2(bucket_mb) in 4.6..7.6 the product with a bool
    # was mostly a second copy of the bool's main effect
    sp = SearchSpace(knobs=(IntChoice("bucket_mb", (25, 50, 200)), IntChoice("micro_batch", (1, 2, 4)),
                            BoolKnob("overlap_comm")))
    enc = FeatureEncoder(sp)
    lo = enc.encode(Candidate.of({"bucket_mb": 25, "micro_batch": 1, "overlap_comm": True}))
    hi = enc.encode(Candidate.of({"bucket_mb": 200, "micro_batch": 4, "overlap_comm": True}))
    trend = enc.index["bucket_mb:log2"]
    assert lo[trend] == 0.0 and abs(hi[trend] - 3.0) < 1e-12
    assert lo[enc.index["bucket_mb:log2*overlap_comm"]] == 0.0
    assert abs(hi[enc.index["micro_batch:log2"]] - 2.0) < 1e-12
    assert abs(enc.trend_span("bucket_mb") - 3.0) < 1e-12 and enc.trend_span("overlap_comm") == 1.0
