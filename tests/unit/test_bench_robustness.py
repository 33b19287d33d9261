"""bench/robustness.py and the InfraRSI harness it shares with bench/search_vs_peers.py: budgets under the
reported checkpoints, the stopping rule the proposer applies, and merging tuners run apart on the same models."""

from __future__ import annotations

import json

import numpy as np
import pytest
from infrarsi.modeling.observations import Observation
from infrarsi.modeling.pool import CandidatePool
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.search_config import SearchConfig
from support.bench_spaces import import_bench_module, load_bench

bench = load_bench()


robustness = import_bench_module("robustness")


def test_a_budget_under_twenty_reports_only_the_checkpoints_it_reached(tmp_path, capsys) -> None:
    out = tmp_path / "r.json"
    rc = robustness.main(["--models", "1", "--first-model", "100", "--seeds", "1", "--budget", "12",
                          "--tuners", "infrarsi", "random", "--arms", "default", "--json", str(out)])
    assert rc == 0
    summary = json.loads(out.read_text())["summary"]
    for tuner in ("infrarsi[default]", "random"):
        assert "best_over_oracle_at_10_median" in summary[tuner]
        assert "best_over_oracle_at_12_median" in summary[tuner]
        assert "best_over_oracle_at_20_median" not in summary[tuner]  # past the budget: not reported
    assert "random" in capsys.readouterr().out


def test_the_doctor_baseline_protocol_tells_every_tuner_the_baseline_runs_outside_the_budget(tmp_path, capsys
                                                                                           ) -> None:
    model = robustness.draw_model(100)
    bs = robustness.bench_space(model, CandidatePool.build(model.study.space), doctor_runs=3)
    told = bench.doctor_baseline(bs, 0)
    assert [c for c, _ in told] == [model.study.baseline] * 3 and all(o.status == "ok" for _, o in told)
    assert bench.doctor_baseline(bs, 0) == told  # the same runs for every tuner
    for tuner in ("infrarsi", "optuna_tpe"):
        trials = bench.TUNERS[tuner](bs, 0, 6)
        assert len(trials) == 6  # the budget's own trials; the runs told are not among them
    out = tmp_path / "d.json"
    assert robustness.main(["--models", "1", "--first-model", "100", "--seeds", "1", "--budget", "6", "--tuners",
                            "random", "--doctor-baseline", "3", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["doctor_runs"] == 3
    with pytest.raises(SystemExit, match="doctor runs 3 differ"):
        robustness.main(["--seeds", "1", "--budget", "6", "--merge", str(out)])
    capsys.readouterr()


def test_the_harness_stops_infrarsi_when_should_stop_says_so_as_the_proposer_does() -> None:
    # family model 16 (576 candidates): the expected gain runs out before 60 trials (the tiniest models, e.g.
    # 101, end on the OOM budget's rule instead: every candidate that fits has run; model 123, used until stop
    # 31's budget of 0.10, now runs its 60 trials with the largest EI just above the threshold)
    # racing off: with it, model 16 runs its 60 trials (the repeated runs pin the fitted noise, and the largest EI
    # stays above its fraction of it); the confirmation before the stop is the search as it was
    model = robustness.draw_model(16)
    bs = robustness.bench_space(model, CandidatePool.build(model.study.space), config=SearchConfig(race=False))
    trials = bench.run_infrarsi(bs, 0, 60)
    rng = np.random.default_rng(10_000)  # run_infrarsi's measurement draws, replayed
    observations = []
    for t in trials:
        o = bs.evaluate(t.candidate, rng)
        assert o.status == t.status
        observations.append(Observation(t.candidate, o.status, o.step_time_s, o.peak_bytes, o.cost_seconds))
    s = Searcher.replay(bs.space, bs.capacity_bytes, observations, kb=bs.kb, baseline=bs.baseline, seed=0,
                        pool=bs.pool, config=bs.search_config)
    assert 1 + s.config.n_seeds <= len(trials) < 60  # not before the initial design was measured
    assert trials[-1].origin == "confirm"  # the leaders tied within noise re-measured before it stopped
    stop, why = s.should_stop()
    assert stop and why.startswith("max EI"), why
    assert s.suggest(1), "the run ended on the stopping rule, not on an exhausted space"


def test_merge_joins_tuners_run_apart_on_the_same_models(tmp_path, capsys) -> None:
    parts = []
    for tuner in ("random", "infrarsi"):
        part = tmp_path / f"{tuner}.json"
        assert robustness.main(["--models", "1", "--first-model", "100", "--seeds", "1", "--budget", "8",
                                "--tuners", tuner, "--arms", "default", "--json", str(part)]) == 0
        parts.append(str(part))
    merged = tmp_path / "merged.json"
    assert robustness.main(["--seeds", "1", "--budget", "8", "--json", str(merged), "--merge", *parts]) == 0
    data = json.loads(merged.read_text())
    assert data["models"] == 1
    assert set(data["per_model"][0]["tuners"]) == {"random", "infrarsi[default]"}
    assert set(data["summary"]) == {"random", "infrarsi[default]"}
    capsys.readouterr()


def test_search_config_overrides_reach_the_searcher_and_the_json(tmp_path, capsys) -> None:
    out = tmp_path / "r.json"
    assert robustness.main(["--models", "1", "--first-model", "100", "--seeds", "1", "--budget", "6",
                            "--tuners", "infrarsi", "--arms", "default", "--json", str(out),
                            "--search-config", "oom_exclude=0.35", "memory_interaction_std=None"]) == 0
    recorded = json.loads(out.read_text())["search_config"]
    assert recorded["oom_exclude"] == 0.35 and recorded["memory_interaction_std"] is None
    config = robustness.search_config(["n_seeds=5"])
    assert config.n_seeds == 5
    model = robustness.draw_model(100)
    bs = robustness.bench_space(model, CandidatePool.build(model.study.space), config=config)
    trials = bench.run_infrarsi(bs, 0, 8)
    origins = [t.origin for t in trials]
    # a design of 1 + 5 (an escape probe after an OOM takes a seed's place; the default design is 1 + 3)
    assert set(origins[:6]) <= {"prior", "seed"} and origins[6] not in {"prior", "seed"}
    with pytest.raises(SystemExit, match="no_such_field"):
        robustness.search_config(["no_such_field=1"])
    capsys.readouterr()


def test_the_memory_oracle_reference_arm_knows_the_true_peaks() -> None:
    # model 101: with the true peaks (error 0) no trial runs out of memory; the same model with the learned
    # memory model does, and a 10% error per candidate brings OOMs back
    model = robustness.draw_model(101)
    m = robustness.run_model(model, ["infrarsi"], ["default"], 1, 30, memory_oracle=(0.0, 0.1))
    tuners = m["tuners"]
    assert tuners["infrarsi[memory_oracle=0]"]["oom_fraction"] == [0.0]
    assert tuners["infrarsi[default]"]["oom_fraction"][0] > 0.0
    assert tuners["infrarsi[memory_oracle=0.1]"]["oom_fraction"][0] > 0.0


def test_the_report_says_which_moves_spent_the_ooms_and_how_well_their_risk_was_predicted(tmp_path, capsys
                                                                                          ) -> None:
    out = tmp_path / "o.json"
    assert robustness.main(["--models", "2", "--first-model", "100", "--seeds", "2", "--budget", "16", "--tuners",
                            "infrarsi", "--arms", "default", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    for m in data["per_model"]:
        entry = m["tuners"]["infrarsi[default]"]
        sources, bins = entry["oom_sources"], entry["p_oom_bins"]
        runs = sum(entry["origins"].values())  # every trial of the model's runs, by origin
        assert sum(n for n, _, _ in sources.values()) == runs == sum(n for n, _, _ in bins)
        ooms = sum(o for _, o, _ in sources.values())
        assert ooms == sum(o for _, o, _ in bins) > 0  # these models spend OOMs in 16 trials
        assert set(sources) <= {"prior", "seed", "ei", "pairing", "confirm", "step_probe", "lifted", "escape"}
    summary = data["summary"]["infrarsi[default]"]
    assert sum(o for _, o, _ in summary["oom_sources"].values()) == sum(
        o for m in data["per_model"] for _, o, _ in m["tuners"]["infrarsi[default]"]["oom_sources"].values())
    assert "OOMs by move" in capsys.readouterr().out
