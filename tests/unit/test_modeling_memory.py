"""Censored (Tobit) memory model: recovers parameters where dropping OOMs is biased; P(OOM)."""

import math

import numpy as np
from infrarsi.modeling.memory_model import MemoryModel
from infrarsi.modeling.priors import KnowledgeBase
from infrarsi.modeling.space import BoolKnob, Candidate, IntChoice, SearchSpace

SPACE = SearchSpace(knobs=(IntChoice("micro_batch", (1, 2, 4, 8, 16, 32)), BoolKnob("checkpointing")))
WIDE = KnowledgeBase(time={}, memory={}, default_memory=(0.0, 3.0), default_level=(0.0, 0.01))
GIB = 2**30
TRUE_SLOPE, TRUE_CKPT, TRUE_BASE = 0.5, -0.7, math.log(20 * GIB)


def synthetic(n: int, rng: np.random.Generator, capacity: float):
    rows = []
    for _ in range(n):
        mb = int(rng.choice([1, 2, 4, 8, 16, 32]))
        ck = bool(rng.integers(2))
        logp = TRUE_BASE + TRUE_SLOPE * math.log2(mb) + TRUE_CKPT * ck + 0.3 * rng.standard_normal()
        peak = math.exp(logp)
        oom = peak > capacity
        rows.append((Candidate.of({"micro_batch": mb, "checkpointing": ck}), capacity * 0.97 if oom else peak, oom))
    return rows


def fit(censored: bool, rows, capacity: float) -> MemoryModel:
    mm = MemoryModel(SPACE, capacity, kb=WIDE, censored=censored)
    for c, p, oom in rows:
        mm.observe(c, p, oom)
    mm.fit()
    return mm


def test_censored_fit_recovers_slope_where_dropping_ooms_is_biased():
    capacity = 60 * GIB
    rows = synthetic(400, np.random.default_rng(0), capacity)
    n_oom = sum(r[2] for r in rows)
    assert 80 < n_oom < 240
    cens = fit(True, rows, capacity)
    drop = fit(False, rows, capacity)
    i = cens.encoder.index["micro_batch:log2"]
    j = cens.encoder.index["checkpointing"]
    assert abs(cens.theta[i] - TRUE_SLOPE) < 0.05, cens.theta[i]
    assert abs(cens.theta[j] - TRUE_CKPT) < 0.08, cens.theta[j]
    assert abs(math.exp(cens.log_sigma) - 0.3) < 0.05
    # dropping OOMs keeps only the small peaks at large micro-batch: the slope flattens
    assert TRUE_SLOPE - drop.theta[i] > 0.05, drop.theta[i]
    assert TRUE_SLOPE - drop.theta[i] > 2 * abs(cens.theta[i] - TRUE_SLOPE)


def test_p_oom_ranks_and_gauss_newton_matches_lbfgs():
    capacity = 60 * GIB
    rows = [r for r in synthetic(400, np.random.default_rng(1), capacity)][:80]
    mm = fit(True, rows, capacity)
    big = Candidate.of({"micro_batch": 32, "checkpointing": False})  # true peak 640 GiB
    small = Candidate.of({"micro_batch": 1, "checkpointing": True})  # true peak 10 GiB
    p = mm.p_oom([big, small])
    assert p[0] > 0.99 and p[1] < 0.01
    ref = MemoryModel(SPACE, capacity, kb=WIDE)
    for c, pk, oom in rows:
        ref.observe(c, pk, oom)
    ref.fit_lbfgs()
    np.testing.assert_allclose(mm.theta, ref.theta, atol=0.02)
    prices = dict(((k, v), d) for k, v, d in mm.prices(Candidate.of({"micro_batch": 4, "checkpointing": False})))
    assert abs(prices[("micro_batch", 8)] - TRUE_SLOPE) < 0.1
    assert abs(prices[("checkpointing", True)] - TRUE_CKPT) < 0.1
