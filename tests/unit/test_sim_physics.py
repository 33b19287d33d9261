"""SIMULATOR sanity: bubble and ZeRO formulas, Korthikanti activations, seeded noise, OOM bound, oracle."""

import numpy as np
import pytest
from infrarsi.sim.hardware import DENSE_7B, H100_80G
from infrarsi.sim.physics import (
    Hidden,
    Setting,
    activation_bytes_per_layer,
    model_state_bytes_per_param,
    peak_memory_bytes,
    pipeline_bubble_fraction,
    step_time,
)
from infrarsi.sim.scenarios import SCENARIOS, enumerate_scenario, get_scenario, oracle


def test_pipeline_bubble_formula():
    assert pipeline_bubble_fraction(1, 8) == 0.0
    assert pipeline_bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert pipeline_bubble_fraction(8, 64) == pytest.approx(7 / 71)


def test_pipeline_time_grows_with_bubble():
    base = dict(tp=1, dp=8, micro_batch=1, zero_stage=1, flash_attention=True, overlap_comm=True)
    few = step_time(DENSE_7B, H100_80G, Setting(pp=8, **base), 64, Hidden())  # m = 8 micro-batches
    assert few.bubble_fraction == pytest.approx(7 / 15)


def test_zero_model_state_bytes():
    assert model_state_bytes_per_param(0, 64, False) == 16
    assert model_state_bytes_per_param(1, 8, False) == pytest.approx(4 + 12 / 8)
    assert model_state_bytes_per_param(2, 8, False) == pytest.approx(2 + 14 / 8)
    assert model_state_bytes_per_param(3, 8, False) == pytest.approx(16 / 8)
    assert model_state_bytes_per_param(1, 8, True) == 4
    peaks = [peak_memory_bytes(DENSE_7B, Setting(dp=8, zero_stage=z), 64, Hidden())[0] for z in range(4)]
    assert all(a > b for a, b in zip(peaks, peaks[1:], strict=False))


def test_korthikanti_activations():
    s, b, h, a = DENSE_7B.seq_len, 1, DENSE_7B.hidden, DENSE_7B.heads
    no_rc = activation_bytes_per_layer(DENSE_7B, Setting(flash_attention=False), s)
    assert no_rc == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    sel = activation_bytes_per_layer(DENSE_7B, Setting(flash_attention=False, recompute="selective"), s)
    assert sel == pytest.approx(s * b * h * 34)
    full = activation_bytes_per_layer(DENSE_7B, Setting(recompute="full"), s)
    assert full == pytest.approx(2 * s * b * h)
    sp = activation_bytes_per_layer(DENSE_7B, Setting(tp=4, sequence_parallel=True, recompute="selective"), s)
    assert sp == pytest.approx(s * b * h * 34 / 4)


def test_noise_is_seeded_and_oom_reports_a_bound():
    sc = get_scenario("dense7b_h100x64")
    c = sc.space.default_candidate()
    c = next(x for x in sc.space.sample(200, np.random.default_rng(0)) if sc.fits(x) and sc.violates(x) is None)
    a = [sc.evaluate(c, np.random.default_rng(7)) for _ in range(2)]
    assert a[0] == a[1] and a[0].simulated
    many = [sc.evaluate(c, np.random.default_rng(i)).step_time_s for i in range(200)]
    many = [t for t in many if t is not None]
    assert np.median(many) == pytest.approx(sc.true_step_time(c), rel=0.01)
    big = next(x for x in sc.space.sample(400, np.random.default_rng(1)) if not sc.fits(x))
    o = sc.evaluate(big, np.random.default_rng(0))
    assert o.status == "oom" and o.step_time_s is None
    assert 0.9 * sc.capacity_bytes < o.peak_bytes <= sc.capacity_bytes < sc.true_peak_bytes(big)
    assert o.cost_seconds > 0


def test_oracle_is_the_enumerated_minimum():
    name = "dense13b_a100x32"
    cands, times, peaks, valid = enumerate_scenario(name)
    best, t = oracle(name)
    sc = get_scenario(name)
    assert len(cands) > 10_000 and valid.any() and (~valid).any()
    assert sc.valid(best) and t == pytest.approx(sc.true_step_time(best))
    assert t == pytest.approx(times[valid].min())


def test_every_scenario_builds_and_describes_itself_as_simulated():
    for name in SCENARIOS:
        sc = get_scenario(name)
        assert "SIMULATOR" in sc.description
        assert sc.memory_meta().capacity_bytes == sc.capacity_bytes
