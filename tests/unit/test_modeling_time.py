"""Bayesian linear time model: prior -> posterior, fast path equals slow path, robustness."""

import math

import numpy as np
from infrarsi.modeling.priors import KnowledgeBase
from infrarsi.modeling.space import BoolKnob, Candidate, IntChoice, SearchSpace
from infrarsi.modeling.time_model import TimeModel

SPACE = SearchSpace(knobs=(IntChoice("micro_batch", (1, 2, 4, 8)), BoolKnob("flash_attention")))
KB = KnowledgeBase(time={"flash_attention": (-0.3, 0.2), "micro_batch:log2": (0.0, 0.3)}, memory={})


def data(n: int, rng: np.random.Generator, effect: float = 0.1, noise: float = 0.02):
    out = []
    for _ in range(n):
        mb = int(rng.choice([1, 2, 4, 8]))
        fa = bool(rng.integers(2))
        y = 0.5 - 0.05 * math.log2(mb) + effect * fa + noise * rng.standard_normal()
        out.append((Candidate.of({"micro_batch": mb, "flash_attention": fa}), math.exp(y)))
    return out


def test_posterior_moves_from_prior_toward_data():
    tm = TimeModel(SPACE, KB, noise_floor=0.02)
    i = tm.encoder.index["flash_attention"]
    assert tm.prior_mean[i] == -0.3
    for c, t in data(40, np.random.default_rng(0)):
        tm.observe(c, t)
    tm.fit()
    eff = {e.name: e for e in tm.effects()}["flash_attention"]
    assert abs(eff.posterior_mean - 0.1) < 0.03, eff  # data say +0.1, prior said -0.3
    assert eff.posterior_std < 0.25 * eff.prior_std
    assert 0.01 < tm.noise_std < 0.04


def test_cholesky_path_matches_direct_inverse():
    tm = TimeModel(SPACE, KB)
    for c, t in data(25, np.random.default_rng(1)):
        tm.observe(c, t)
    tm.fit()
    mean, cov = tm.posterior_direct()
    np.testing.assert_allclose(tm.mean, mean, atol=1e-8)
    np.testing.assert_allclose(tm.covariance(), cov, atol=1e-8)
    x = tm.encoder.encode_many([c for c, _ in data(5, np.random.default_rng(2))])
    mu, sd = tm.predict_encoded(x)
    np.testing.assert_allclose(sd, np.sqrt(np.einsum("ij,jk,ik->i", x, cov, x)), rtol=1e-6)


def test_straggler_barely_moves_the_fit():
    obs = data(30, np.random.default_rng(4))
    clean = TimeModel(SPACE, KB)
    dirty = TimeModel(SPACE, KB)
    for c, t in obs:
        clean.observe(c, t)
        dirty.observe(c, t)
    dirty.observe(obs[0][0], obs[0][1] * 1.4)  # a 40% straggler
    clean.fit()
    dirty.fit()
    i = clean.encoder.index["flash_attention"]
    assert abs(clean.mean[i] - dirty.mean[i]) < 0.02
