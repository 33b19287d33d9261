"""bench/search_vs_peers.py on a space without an oracle: the measured reference, the scores against it, and the
bench's JSON and table for such a space (the toy space of ``support.bench_spaces``; no real trial runs here)."""

from __future__ import annotations

import json
import math

import pytest
from infrarsi.modeling.space import Candidate
from support.bench_spaces import TOY_SPACE, load_bench, toy_space, valid_times

bench = load_bench()

A = Candidate.of({"mb": 1, "impl": "slow"})  # 1.0 s
B = Candidate.of({"mb": 4, "impl": "slow"})  # ~0.707 s
C = Candidate.of({"mb": 4, "impl": "fast"})  # ~0.566 s
HACK = Candidate.of({"mb": 4, "impl": "fast"}, {"hack"})  # fastest measured, breaks an invariant
BIG = Candidate.of({"mb": 8, "impl": "fast"})  # OOM


def trial(c: Candidate, status: str, t: float | None, chosen: Candidate | None, cost: float = 10.0):
    return bench.Trial(c, status, t, cost, chosen)


def no_oracle_space():
    return bench.BenchSpace("toy (toy)", TOY_SPACE, 1000.0, lambda c, rng: None, None, None, kind="toy")


# tuner 1 finds C at its third trial; tuner 2 wanders (a hack, an OOM) and ends on B
TUNER_1 = [trial(A, "ok", 1.0, A), trial(B, "ok", 0.7, B), trial(C, "ok", 0.56, C), trial(BIG, "oom", None, C)]
TUNER_2 = [trial(HACK, "invariant_violation", 0.28, None), trial(BIG, "oom", None, None),
           trial(A, "ok", 1.0, A), trial(B, "ok", 0.72, B)]


def test_the_reference_is_the_best_ok_measurement_of_any_tuner_never_a_violation() -> None:
    ref = bench.measured_reference([TUNER_1, TUNER_2])
    assert ref is not None
    assert ref.time_s == pytest.approx(0.56)
    assert ref.candidate == C
    assert ref.time_of[B.key] == pytest.approx(0.71)  # median of its two measurements (0.70, 0.72)
    assert HACK.key not in ref.time_of and BIG.key not in ref.time_of


def test_no_ok_trial_anywhere_gives_no_reference() -> None:
    assert bench.measured_reference([[trial(HACK, "invariant_violation", 0.28, None), trial(BIG, "oom", None, None)]]) is None


def test_scores_divide_the_reference_by_the_measured_time_of_the_chosen_best() -> None:
    bs = no_oracle_space()
    ref = bench.measured_reference([TUNER_1, TUNER_2])
    s1 = bench.score(bs, TUNER_1, 4, ref)
    s2 = bench.score(bs, TUNER_2, 4, ref)
    assert s1["best_over_oracle"] == {"4": pytest.approx(1.0)}  # the budget itself is reported
    assert s1["trials_to_95"] == 3 and s1["cost_to_95"] == pytest.approx(30.0)
    assert s1["oom_fraction"] == pytest.approx(0.25)
    assert s2["best_over_oracle"]["4"] == pytest.approx(0.56 / 0.71)
    assert s2["trials_to_95"] == 5  # never reached: budget + 1
    assert s2["cost_to_95"] == pytest.approx(40.0)  # never reached: everything it spent


def test_budget_checkpoints_stop_at_the_budget() -> None:
    bs = no_oracle_space()
    trials = [trial(A, "ok", 1.0, A)] * 12
    ref = bench.measured_reference([trials])
    assert sorted(bench.score(bs, trials, 12, ref)["best_over_oracle"], key=int) == ["10", "12"]


def test_a_chosen_best_that_never_ran_ok_scores_zero() -> None:
    bs = no_oracle_space()
    ref = bench.measured_reference([TUNER_1])
    assert bench.score(bs, [trial(HACK, "invariant_violation", 0.28, HACK)], 1, ref)["best_over_oracle"]["1"] == 0.0


def test_a_space_without_oracle_cannot_be_scored_without_a_reference() -> None:
    # the old behaviour: every ratio silently 0
    with pytest.raises(ValueError, match="no oracle"):
        bench.score(no_oracle_space(), TUNER_1, 4)


def test_the_bench_scores_a_no_oracle_space_against_the_best_measured(tmp_path, capsys) -> None:
    out = tmp_path / "out.json"
    rc = bench.main(["--spaces", "--no-real", "--tuners", "infrarsi", "random", "--real-budget", "6",
                     "--real-seeds", "2", "--extra-space", "support.bench_spaces:toy_space", "--json", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["simulated"] is False
    info = result["space_info"]["toy"]
    assert info["kind"] == "toy" and info["budget"] == 6 and info["seeds"] == 2
    assert info["oracle"] == "best measured by any tuner"
    assert any(math.isclose(info["oracle_step_time_s"], t) for t in valid_times())  # never the hack's 0.28
    assert "hack" not in info["oracle_candidate"] and "mb=8" not in info["oracle_candidate"]
    finals = {}
    for tuner in ("infrarsi", "random"):
        agg = result["spaces"]["toy"][tuner]
        assert len(agg["per_seed_best_over_oracle_at_budget"]) == 2
        finals[tuner] = agg["best_over_oracle_median"]["6"]
        assert 0.0 < finals[tuner] <= 1.0
    # whoever measured the reference candidate ends with it as its chosen best
    per_seed = [r for t in finals for r in result["spaces"]["toy"][t]["per_seed_best_over_oracle_at_budget"]]
    assert max(per_seed) == pytest.approx(1.0)
    table = capsys.readouterr().out
    assert "toy (toy)" in table and "@B" in table


def test_toy_space_is_what_the_bench_builds() -> None:
    bs = toy_space()
    assert bs.true_time is None and bs.kind == "toy" and bs.pool is not None and len(bs.pool.candidates) == 16


def test_an_explicit_space_list_without_the_real_space_runs_no_real_trial(tmp_path) -> None:
    from infrarsi.sim.scenarios import SCENARIOS

    out = tmp_path / "out.json"
    assert bench.main(["--spaces", SCENARIOS[0], "--budget", "2", "--seeds", "1", "--tuners", "random",
                       "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["space_info"]) == [SCENARIOS[0]] and result["simulated"] is True
    assert result["space_info"][SCENARIOS[0]]["oracle"].startswith("simulator optimum")
