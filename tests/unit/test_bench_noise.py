"""bench/noise.py: the noisy hosts, the doctor's noise floor, and a tiny run of the benchmark scored on the true
times of each tuner's choice."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from infrarsi.modeling.pool import CandidatePool
from support.bench_spaces import import_bench_module

noise = import_bench_module("noise")


def test_a_host_draws_its_cv_per_run_and_the_drift_host_slows_only_its_stretch() -> None:
    model = noise.draw_model(100)
    c = model.study.baseline
    host = noise.Measured(model, noise.HOSTS["cv10"], 400)
    rng = np.random.default_rng(0)
    logs = np.log([host.evaluate(c, rng).step_time_s for _ in range(400)])
    assert abs(float(logs.std()) - math.log1p(0.10)) < 0.015
    assert abs(float(logs.mean()) - math.log(model.true_time(c))) < 0.02
    drift = noise.Measured(model, noise.HOSTS["drift"], 100)
    times = [drift.evaluate(c, rng).step_time_s / model.true_time(c) for _ in range(100)]
    slow, calm = np.mean(times[30:65]), np.mean(times[:30] + times[65:])
    assert 1.10 < slow / calm < 1.20


def test_the_doctor_floor_is_the_noise_floor_of_the_cv_of_its_runs() -> None:
    assert noise.doctor_floor([1.0, 1.1, 0.9]) == pytest.approx(math.log1p(0.1))
    assert noise.doctor_floor([1.0, 1.0, 1.0]) == 0.03  # no spread measured: the study's default floor


def test_a_tiny_run_scores_every_tuner_on_the_true_time_of_its_choice(tmp_path, capsys) -> None:
    out = tmp_path / "n.json"
    assert noise.main(["--models", "1", "--first-model", "100", "--seeds", "1", "--budget", "8", "--hosts", "cv10",
                       "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    model = noise.draw_model(100)
    for tuner in ("race", "today", "tpe"):
        (record,) = [r for r in data["studies"] if r["tuner"] == tuner]
        assert 0.0 < record["chosen_over_oracle"] <= 1.0 and record["runs"] <= 8
        assert record["slower_than_baseline"] == (record["vs_baseline"] < 1.0)
        assert data["summary"]["cv10"][tuner]["studies"] == 1
    assert data["studies"][0]["doctor_noise_floor"] == noise.study(
        model, CandidatePool.build(model.study.space), noise.HOSTS["cv10"], "race", 0, 8, 3)["doctor_noise_floor"]
    assert "targets at cv10" in capsys.readouterr().out
