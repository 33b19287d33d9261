"""Censored (Tobit) memory model: recovers parameters where dropping OOMs is biased; P(OOM)."""

import math

import numpy as np
from infrarsi.modeling.memory_model import MemoryModel
from infrarsi.modeling.observations import Observation, Prediction
from infrarsi.modeling.priors import KnowledgeBase
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import BoolKnob, Candidate, Categorical, IntChoice, SearchSpace

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


def _meta():
    from infrarsi.modeling.memory_model import TransformerMeta

    # a 7B-class dense model: 32 layers, hidden 4096, 2 x 32000 x 4096 embedding/head parameters
    return TransformerMeta(layers=32, hidden=4096, heads=32, seq_len=4096, vocab=32000, dense_params=6_738_000_000,
                           global_batch=512, capacity_bytes=80 * GIB)


def test_structural_formula_counts_bucket_buffers_and_zero3_prefetch():
    from infrarsi.modeling.memory_model import structural_components

    meta = _meta()
    base = {"tp": 1, "pp": 1, "dp": 64, "micro_batch": 1, "recompute": "full", "zero_stage": 2,
            "bucket_mb": 200, "overlap_comm": False}
    s_one, a_one = structural_components(meta, base)
    s_two, a_two = structural_components(meta, base | {"overlap_comm": True})
    assert abs((s_two - s_one) - 200 * 2**20) < 1.0  # a second bucket while overlapping
    assert a_one == a_two
    s3, _ = structural_components(meta, base | {"zero_stage": 3})
    per_param_z2, per_param_z3 = 2 + 14 / 64, 16 / 64
    layer_params = (meta.dense_params - 2 * meta.vocab * meta.hidden) / meta.layers
    expected = (s_one - meta.dense_params * per_param_z2) + meta.dense_params * per_param_z3 + 2 * layer_params * 2
    assert abs(s3 - expected) / expected < 1e-9


def test_structured_priors_trust_the_exact_scalings():
    # micro-batch scales every activation tensor exactly: only a small correction, bounded over its whole range;
    # recompute is a weak spot of the formula and keeps a wide one
    sp = SearchSpace(knobs=(IntChoice("dp", (1, 2, 4, 8, 16, 32, 64)), IntChoice("micro_batch", (1, 2, 4, 8)),
                            Categorical("recompute", ("none", "selective", "full"))))
    mm = MemoryModel(sp, 80 * GIB, meta=_meta())
    p = mm.encoder.dim
    act = mm.prior_std[p:2 * p]
    assert abs(act[mm.encoder.index["dp:log2"]] - 0.02 / 6) < 1e-12
    assert abs(act[mm.encoder.index["micro_batch:log2"]] - 0.02 / 3) < 1e-12
    assert act[mm.encoder.index["micro_batch=4"]] == 0.02
    assert act[mm.encoder.index["recompute=selective"]] == 0.12
    assert mm.prior_std[-1] == 0.2


def _meta(**kwargs):
    from infrarsi.modeling.memory_model import TransformerMeta

    return TransformerMeta(layers=40, hidden=5120, heads=40, seq_len=4096, vocab=32000, dense_params=13_000_000_000,
                           global_batch=512, capacity_bytes=80 * GIB, **kwargs)


def test_without_a_dp_knob_data_parallel_is_devices_over_tp_pp_not_one():
    # issue 13: with no dp knob the formula assumed dp = 1, so ZeRO sharding saved nothing on paper
    from infrarsi.modeling.memory_model import structural_components

    no_dp = {"tp": 2, "pp": 2, "zero_stage": 1, "micro_batch": 1}
    explicit = structural_components(_meta(devices=32), {**no_dp, "dp": 8})
    assert structural_components(_meta(devices=32), no_dp) == explicit
    assert structural_components(_meta(), no_dp)[0] > 1.5 * explicit[0]  # devices unknown: the old dp = 1


def test_a_string_knob_in_an_on_off_role_is_not_read_as_bool_of_the_string():
    # issue 13: attn=eager mapped to flash_attention was bool("eager") = True
    import pytest
    from infrarsi.modeling.memory_model import structural_components

    meta = _meta(devices=8, roles={"flash_attention": "attn"})
    eager = structural_components(meta, {"attn": "eager", "micro_batch": 1})
    flash = structural_components(meta, {"attn": "flash", "micro_batch": 1})
    assert eager[1] > 2 * flash[1]  # no flash attention: the s² attention scores are kept
    custom = _meta(devices=8, roles={"flash_attention": "attn"}, role_values={"flash_attention": {"fa_v3": True}})
    assert structural_components(custom, {"attn": "fa_v3", "micro_batch": 1}) == flash
    with pytest.raises(ValueError, match="attn"):
        structural_components(meta, {"attn": "fa_v3", "micro_batch": 1})


def sum_of_terms_peak(c: Candidate) -> float:
    """States split by a sharding knob beside activations growing with a batch knob: a sum, not a product."""
    return (40 / c["ways"] + 2.5 * c["rows"]) * 1e9  # type: ignore[operator]


SUM_SPACE = SearchSpace(knobs=(IntChoice("rows", (1, 2, 4, 8, 16)), IntChoice("ways", (1, 2, 4, 8))))


def test_knob_pair_columns_fit_a_peak_that_is_a_sum_of_terms():
    cands = SUM_SPACE.enumerate()
    edges = [c for c in cands if c["rows"] in (1, 16) or c["ways"] in (1, 8)]  # measured: the space's rim
    inner = [c for c in cands if c not in edges]
    flat = KnowledgeBase(time={}, memory={})
    errors = {}
    for std in (None, 0.1):
        mm = MemoryModel(SUM_SPACE, 80e9, kb=flat, interaction_std=std)
        for c in edges:
            mm.observe(c, sum_of_terms_peak(c), oom=False)
        mm.fit()
        mu, _ = mm.predict_log(inner)
        errors[std] = float(np.mean(np.abs(mu - np.log([sum_of_terms_peak(c) for c in inner]))))
    assert errors[0.1] < 0.06 < errors[None]  # 3% against 13% off inside the rim


def observe_every_third(s: Searcher) -> tuple[list[Candidate], list[Prediction]]:
    """``s`` told every third candidate of ``SUM_SPACE`` as run on 60 GB (above it an OOM, censored at 57 GB);
    the space's candidates and ``s``'s predictions of them."""
    rows = SUM_SPACE.enumerate()
    for c in rows[::3]:
        peak = sum_of_terms_peak(c)
        oom = peak > 60e9
        s.observe(Observation(c, "oom" if oom else "ok", None if oom else 1.0 / float(c["rows"]),  # type: ignore[arg-type]
                              57e9 if oom else peak))
    return rows, s.predict(rows)


def test_the_searcher_gives_a_memory_model_without_a_shape_the_knob_pair_columns():
    s = Searcher(SUM_SPACE, 60e9, kb=KnowledgeBase(time={}, memory={}))
    enc = s.memory_model.encoder
    assert enc.dim > enc.n_main
    rows, preds = observe_every_third(s)
    assert len(preds) == len(rows)
    assert max(p.p_oom for c, p in zip(rows, preds, strict=True) if sum_of_terms_peak(c) < 30e9) < 0.05


def test_the_two_term_memory_model_fits_a_peak_that_is_a_sum_of_terms():
    """A sum of two log-linear terms is the shape of a real peak (states beside activations): measured on the
    space's rim it predicts the inside to a fraction of a per cent, where the knob-pair columns are 3% off."""
    cands = SUM_SPACE.enumerate()
    edges = [c for c in cands if c["rows"] in (1, 16) or c["ways"] in (1, 8)]
    inner = [c for c in cands if c not in edges]
    truth = np.log([sum_of_terms_peak(c) for c in inner])
    errors = {}
    for two_terms in (False, True):
        mm = MemoryModel(SUM_SPACE, 80e9, kb=KnowledgeBase(time={}, memory={}), interaction_std=0.1,
                         two_terms=two_terms)
        for c in edges:
            mm.observe(c, sum_of_terms_peak(c), oom=False)
        mm.fit()
        mu, _ = mm.predict_log(inner)
        errors[two_terms] = float(np.mean(np.abs(mu - truth)))
    assert errors[True] < 0.005 < 0.02 < errors[False]


def test_the_searcher_predicts_through_the_two_term_memory_model_and_its_misfit_floor():
    s = Searcher(SUM_SPACE, 60e9, kb=KnowledgeBase(time={}, memory={}),
                 config=SearchConfig(memory_two_terms=True, memory_misfit_floor=0.05, memory_anchor_spread=None))
    assert s.memory_model.two_terms and s.memory_model.encoder.dim == s.memory_model.encoder.n_main
    rows, preds = observe_every_third(s)
    assert math.exp(s.memory_model.log_sigma) >= 0.05 - 1e-9  # the fit's σ stays at the floor or above
    assert min(p.log_peak_std for p in preds) >= 0.05 - 1e-9
    # the pool-wide means (the shortlist's) are the per-candidate predictions' means
    _, pool_mem = s._pool_means()
    assert np.allclose([pool_mem[s.pool.index[c.key]] for c in rows], [p.log_peak_bytes for p in preds])
    assert max(p.p_oom for c, p in zip(rows, preds, strict=True) if sum_of_terms_peak(c) < 30e9) < 0.05
    assert min(p.p_oom for c, p in zip(rows, preds, strict=True) if sum_of_terms_peak(c) > 70e9) > 0.9


def test_the_spread_scale_widens_the_predictive_std_without_a_shape_only():
    rows = synthetic(40, np.random.default_rng(5), 40 * GIB)
    plain, wide = (MemoryModel(SPACE, 40 * GIB, kb=WIDE, spread_scale=k) for k in (1.0, 2.0))
    for mm in (plain, wide):
        for c, p, oom in rows:
            mm.observe(c, p, oom)
        mm.fit()
    cs = [Candidate.of({"micro_batch": mb, "checkpointing": False}) for mb in (1, 4, 32)]
    (mu1, sd1), (mu2, sd2) = plain.predict_log(cs), wide.predict_log(cs)
    np.testing.assert_allclose(mu2, mu1)
    np.testing.assert_allclose(sd2, 2.0 * sd1)
    # a candidate predicted under the capacity is less surely safe, one over it less surely an OOM
    p1, p2 = plain.p_oom(cs), wide.p_oom(cs)
    assert p2[0] > p1[0] and p2[2] < p1[2]
    # the structural formula keeps its own spread; the searcher passes its setting on
    assert MemoryModel(SPACE, 80 * GIB, meta=_meta(), spread_scale=2.0).spread_scale == 1.0
    s = Searcher(SPACE, 40 * GIB, kb=WIDE, config=SearchConfig(memory_spread_scale=3.0))
    assert s.memory_model.spread_scale == 3.0
