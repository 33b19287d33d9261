"""Contract → modeling space, candidate conversion both ways, and the pairing of trial facts into outcomes."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
from infrarsi import events as ev
from infrarsi.backends.sim import write_sim_workload
from infrarsi.modeling.space import BoolKnob, Candidate, Categorical, IntChoice
from infrarsi.sim.scenarios import get_scenario
from infrarsi.study.contract import LogRatioPrior, PatchInfo, contract_from_dict
from infrarsi.study.ledger import TrialLedger
from infrarsi.study.model import noise_floor, observation
from infrarsi.study.space import CandidateOutsideSpace, StudySpace

GIB = 2**30

LAUNCH = {"train": {"micro_batch_size": 2, "compile": False}, "model": {"attention": "manual"}, "optim": {"lr_scale": 1.0}}
LIBRARY = {
    "fused-qkv": PatchInfo(id="fused-qkv", description="one matmul for q, k, v",
                           time_log_ratio=LogRatioPrior(mean=-0.05, std=0.05)),
    "slow-patch": PatchInfo(id="slow-patch", description="claims a speed-up, is slower",
                            time_log_ratio=LogRatioPrior(mean=-0.1, std=0.1)),
    "alt-qkv": PatchInfo(id="alt-qkv", description="another qkv fusion", conflicts_with=["fused-qkv"], risk="high"),
}


def synthetic_contract_dict(repo: Path, *, trials: int = 12, hours: float = 10.0, parallel: int = 3,
                            repeats: int = 1) -> dict[str, Any]:
    return {
        "name": "synthetic",
        "goal": "faster",
        "workload": {"repo": str(repo), "command": ["{python}", "train.py", "{launch_file}"],
                     "launch_file": "launch.yaml", "steps": 10, "verify_steps": 20},
        "cluster": {"id": "c1", "accelerator": "H100-80G", "memory_capacity_bytes": 10 * GIB},
        "backend": {"kind": "local", "parallel": parallel},
        "scope": {"files": ["model.py"],
                  "launch_keys": ["train.micro_batch_size", "train.compile", "model.attention", "optim.lr_scale"]},
        "search_space": {
            "knobs": {
                "train.micro_batch_size": {"type": "int", "choices": [1, 2, 3, 4, 8, 16]},
                "train.compile": {"type": "bool"},
                "model.attention": {"type": "choice", "choices": ["manual", "sdpa"]},
                "optim.lr_scale": {"type": "float", "choices": [0.5, 1.0]},
            },
            "constraints": {"global_batch": {"size": 16, "micro_batch_key": "train.micro_batch_size"}},
            "patches": ["fused-qkv", "slow-patch", "alt-qkv"],
        },
        "invariants": {"loss": {"tolerance": 0.05}},
        "budget": {"trials": trials, "accelerator_hours": hours, "repeats_per_trial": repeats},
        "verify": {"top_k": 2, "repeats": 2, "passes_required": 1},
    }


def synthetic_space(repo: Path, **kwargs: Any) -> StudySpace:
    contract = contract_from_dict(synthetic_contract_dict(repo, **kwargs), check=False)
    return StudySpace.from_contract(contract, baseline_launch=LAUNCH, library=LIBRARY)


def test_knobs_are_named_by_the_last_launch_key_component_and_typed(tmp_path: Path) -> None:
    study = synthetic_space(tmp_path)
    knobs = {k.name: k for k in study.space.knobs}
    assert set(knobs) == {"micro_batch_size", "compile", "attention", "lr_scale"}
    assert isinstance(knobs["micro_batch_size"], IntChoice)
    assert isinstance(knobs["compile"], BoolKnob)
    assert isinstance(knobs["attention"], Categorical)
    assert isinstance(knobs["lr_scale"], Categorical)  # float choices: a categorical of their str, mapped back
    assert study.baseline.knobs == {"micro_batch_size": 2, "compile": False, "attention": "manual", "lr_scale": "1.0"}
    assert study.capacity_bytes == 10 * GIB


def test_the_baseline_is_the_empty_event_candidate_and_conversion_round_trips(tmp_path: Path) -> None:
    study = synthetic_space(tmp_path)
    assert study.to_event(study.baseline) == ev.Candidate()
    every = study.space.enumerate()
    keys = set()
    for c in every:
        e = study.to_event(c)
        assert study.from_event(e) == c
        assert all(k in study.contract.scope.launch_keys for k in e.knobs)
        assert study.contract_problems(c) == []
        keys.add(e.key())
    assert len(keys) == len(every)  # the event key is a dedup key on the space
    faster = study.baseline.replace(lr_scale="0.5", attention="sdpa")
    assert study.to_event(faster).knobs == {"model.attention": "sdpa", "optim.lr_scale": 0.5}


def test_constraints_and_conflicts_come_from_the_contract_and_the_library(tmp_path: Path) -> None:
    study = synthetic_space(tmp_path)
    every = study.space.enumerate()
    assert {c["micro_batch_size"] for c in every} == {1, 2, 4, 8, 16}  # 3 does not divide the global batch
    assert not any({"fused-qkv", "alt-qkv"} <= c.patches for c in every)
    assert study.space.patch("fused-qkv").conflicts == {"alt-qkv"}  # declared on one side, kept on both
    assert study.space.patch("fused-qkv").time_prior == (-0.05, 0.05)
    assert study.space.patch("alt-qkv").invariant_prior[0] > study.space.patch("fused-qkv").invariant_prior[0]


def test_candidates_outside_the_space_are_refused(tmp_path: Path) -> None:
    study = synthetic_space(tmp_path)
    with pytest.raises(CandidateOutsideSpace):
        study.from_event(ev.Candidate(knobs={"train.unknown": 1}))
    with pytest.raises(CandidateOutsideSpace):
        study.from_event(ev.Candidate(knobs={"train.micro_batch_size": 32}))
    with pytest.raises(CandidateOutsideSpace):
        study.from_event(ev.Candidate(patches=["not-a-patch"]))
    # modeling names are accepted too (bank winners written by name)
    assert study.from_event(ev.Candidate(knobs={"compile": True}))["compile"] is True


def test_missing_launch_file_and_library_are_noted_not_fatal(tmp_path: Path) -> None:
    contract = contract_from_dict(synthetic_contract_dict(tmp_path), check=False)
    study = StudySpace.from_contract(contract, baseline_launch=None, library=None)
    assert study.notes
    assert study.baseline["micro_batch_size"] == 1
    assert study.space.patch("fused-qkv").time_prior is None


def test_sim_contract_carries_the_scenario_constraints_and_shape(tmp_path: Path) -> None:
    data = write_sim_workload(tmp_path / "w", "dense7b_h100x64", knobs=["tp", "pp", "dp", "micro_batch", "recompute"],
                              restrict={"dp": [16, 32, 64]}, git=False)
    contract = contract_from_dict(data, base_dir=tmp_path)
    study = StudySpace.from_contract(contract, baseline_launch=contract.baseline_launch(), library=contract.patch_library())
    scenario = get_scenario("dense7b_h100x64")
    assert study.scenario == "dense7b_h100x64" and study.meta is not None
    assert study.to_event(study.baseline) == ev.Candidate()
    defaults = scenario.space.default_candidate().knobs
    every = study.space.enumerate()
    assert every
    for c in every:  # what the proposer may propose, the simulator accepts
        assert scenario.space.is_feasible(Candidate.of({**defaults, **c.knobs}, c.patches))
    assert all(c["tp"] * c["pp"] * c["dp"] == 64 for c in every)


# --------------------------------------------------------------------------------------------------- ledger


def _measured(key: str, step_s: float, *, ok: bool = True, peak: int = GIB) -> ev.TrialMeasured:
    invariants = [ev.InvariantResult(name="loss", ok=ok, detail="")]
    return ev.TrialMeasured(
        candidate_key=key, kind="search", status="ok", steps=10, warmup_steps=1, step_time_s=step_s,
        step_time_mad_s=0.0, step_time_with_warmup_s=step_s, tokens_per_s=1.0, mfu=None, flops_per_step=None,
        phases={}, peak_memory_bytes=[peak // 2, peak], per_rank_step_s=[step_s], stragglers=[], loss_curve=[],
        eval_curve=[], optimizer_steps=10, tokens=100, invariants=invariants, invariants_ok=ok,
    )


def test_an_ok_trial_needs_both_facts_in_either_order() -> None:
    ledger = TrialLedger()
    cand = ev.Candidate(knobs={"train.compile": True})
    ledger.proposed("t1", ev.TrialProposed(candidate=cand, candidate_key=cand.key(), kind="search", origin="seed"))
    assert ledger.measured("t1", _measured(cand.key(), 0.5, peak=3 * GIB)) is None
    outcome = ledger.finished("t1", ev.TrialFinished(status="ok", accelerator_s=12.0))
    assert outcome is not None and outcome.status == "ok"
    assert outcome.step_time_s == 0.5 and outcome.peak_bytes == 3 * GIB and outcome.candidate == cand
    assert ledger.finished("t1", ev.TrialFinished(status="ok", accelerator_s=12.0)) is None  # repeated: nothing
    assert ledger.accelerator_s == 12.0

    assert ledger.finished("t2", ev.TrialFinished(status="ok", accelerator_s=1.0)) is None
    late = ledger.measured("t2", _measured(ev.Candidate().key(), 0.7, ok=False))
    assert late is not None and late.status == "invariant_violation" and late.candidate == ev.Candidate()
    assert "loss" in late.detail


def test_failures_resolve_on_finish_and_an_oom_carries_its_censoring_bound() -> None:
    ledger = TrialLedger()
    oom = ledger.finished("t1", ev.TrialFinished(status="oom", accelerator_s=3.0, peak_memory_bytes=5 * GIB,
                                                 censored_peak_bytes=9 * GIB))
    assert oom is not None and oom.status == "oom" and oom.peak_bytes == 9 * GIB and oom.step_time_s is None
    conflict = ledger.finished("t2", ev.TrialFinished(status="patch_conflict", accelerator_s=0.0))
    assert conflict is not None and conflict.status == "scope_violation"
    assert ledger.measured("t1", _measured("x", 0.1)) is None  # a measurement after a failure changes nothing
    assert ledger.outcome("t1") == oom


def test_outcomes_become_observations_only_inside_the_space(tmp_path: Path) -> None:
    study = synthetic_space(tmp_path)
    ledger = TrialLedger()
    inside = ev.Candidate(knobs={"model.attention": "sdpa"})
    outside = ev.Candidate(knobs={"train.unknown": 3})
    for tid, c in (("a", inside), ("b", outside)):
        ledger.proposed(tid, ev.TrialProposed(candidate=c, candidate_key=c.key(), kind="search", origin="seed"))
        ledger.finished(tid, ev.TrialFinished(status="crash", accelerator_s=1.0))
    obs = observation(study, ledger.outcome("a"))
    assert obs is not None and obs.candidate["attention"] == "sdpa" and obs.status == "crash"
    assert observation(study, ledger.outcome("b")) is None


def test_a_timeout_outcome_carries_its_step_time_lower_bound(tmp_path: Path) -> None:
    # steps seen at 10, 40, 70 s; killed at 600 s: the 3 steps begun after the first took 590 s at least
    ledger = TrialLedger()
    c = ev.Candidate(knobs={"model.attention": "sdpa"})
    ledger.proposed("t", ev.TrialProposed(candidate=c, candidate_key=c.key(), kind="search", origin="ei"))
    outcome = ledger.finished("t", ev.TrialFinished(status="timeout", wall_s=600.0, accelerator_s=600.0,
                                                    step_seen_s=[10.0, 40.0, 70.0]))
    assert outcome is not None and outcome.status == "timeout"
    assert outcome.step_time_s == pytest.approx(590.0 / 3)
    obs = observation(synthetic_space(tmp_path), outcome)
    assert obs is not None and obs.status == "timeout" and obs.step_time_s == pytest.approx(590.0 / 3)
    silent = ledger.finished("u", ev.TrialFinished(status="timeout", wall_s=600.0, accelerator_s=600.0))
    assert silent is not None and silent.step_time_s is None  # no step seen: nothing to bound


def test_noise_floor_follows_the_doctor() -> None:
    assert noise_floor(None) == 0.03
    doctor = ev.DoctorCompleted(repeats=3, baseline_trial_ids=[], step_time_s=1.0, run_to_run_cv=0.02,
                                step_to_step_cv=0.01, warmup_steps=2, phase_fractions={}, per_rank_step_s=[],
                                stragglers=[], min_detectable_speedup=1.05, repeats_per_trial=1)
    assert math.isclose(noise_floor(doctor), math.log1p(0.02))


def test_every_pair_of_distinct_candidates_has_distinct_event_keys(tmp_path: Path) -> None:
    study = synthetic_space(tmp_path)
    sample = study.space.enumerate()[:40]
    for a, b in itertools.combinations(sample, 2):
        assert (study.event_key(a) == study.event_key(b)) == (a == b)


def test_an_oom_at_one_zero_stage_does_not_exclude_a_higher_stage_untried(tmp_path: Path) -> None:
    # issue 13: the OOM-domination rule took "more sharding never raises memory" for ZeRO stages; a real stage 3
    # can need more than stage 2 (prefetch buffers, fragmentation), and settings that fit were excluded untried
    from infrarsi.modeling.observations import Observation
    from infrarsi.modeling.search import Searcher

    data = synthetic_contract_dict(tmp_path)
    data["scope"]["launch_keys"] = ["train.micro_batch_size", "train.zero_stage"]
    data["search_space"] = {"knobs": {"train.micro_batch_size": {"type": "int", "choices": [1, 2, 4, 8]},
                                      "train.zero_stage": {"type": "int", "choices": [0, 1, 2, 3]}}}
    study = StudySpace.from_contract(contract_from_dict(data, check=False),
                                     baseline_launch={"train": {"micro_batch_size": 1, "zero_stage": 0}})
    assert "zero_stage" not in study.space.memory_direction
    assert study.space.memory_direction["micro_batch_size"] == 1
    s = Searcher(study.space, study.capacity_bytes, kb=study.kb, baseline=study.baseline)
    oom = Candidate.of({"micro_batch_size": 4, "zero_stage": 2})
    s.observe(Observation(oom, "oom", None, study.capacity_bytes * 0.97))
    stage3, bigger = oom.replace(zero_stage=3), oom.replace(micro_batch_size=8)
    p3, p_bigger = s.predict([stage3, bigger])
    assert p_bigger.p_oom == 1.0  # a larger micro-batch at the same stage is still dominated
    assert p3.p_oom < 1.0


def _derived_dp_contract(repo: Path, **global_batch: Any) -> dict[str, Any]:
    data = synthetic_contract_dict(repo)
    data["scope"]["launch_keys"] = ["train.micro_batch_size", "par.tp", "par.pp"]
    data["search_space"] = {
        "knobs": {"train.micro_batch_size": {"type": "int", "choices": [1, 2, 4, 8]},
                  "par.tp": {"type": "int", "choices": [1, 2, 3, 4]}, "par.pp": {"type": "int", "choices": [1, 2]}},
        "constraints": {"global_batch": {"size": 32, "micro_batch_key": "train.micro_batch_size", **global_batch}}}
    return data


def test_global_batch_with_data_parallel_derived_from_devices_over_tp_pp(tmp_path: Path) -> None:
    # issue 13: dp = devices / (tp·pp) with micro_batch·dp dividing the global batch could not be written
    data = _derived_dp_contract(tmp_path, devices=16, parallel_keys=["par.tp", "par.pp"])
    contract = contract_from_dict(data, check=False)
    study = StudySpace.from_contract(contract, baseline_launch={"train": {"micro_batch_size": 1},
                                                                "par": {"tp": 1, "pp": 1}})
    feasible = {(c["micro_batch_size"], c["tp"], c["pp"]) for c in study.space.enumerate()}
    assert (2, 1, 1) in feasible and (4, 1, 1) not in feasible  # dp 16: 2·16 divides 32, 4·16 does not
    assert (8, 4, 1) in feasible and (8, 2, 2) in feasible  # dp 4: 8·4 = 32
    assert not any(tp == 3 for _, tp, _ in feasible)  # 3 does not divide 16 devices
    assert contract.candidate_problems({"train.micro_batch_size": 8, "par.tp": 4, "par.pp": 1}) == []
    assert "does not divide global batch" in contract.candidate_problems(
        {"train.micro_batch_size": 8, "par.tp": 1, "par.pp": 1})[0]
    assert "does not divide 16 devices" in contract.candidate_problems(
        {"train.micro_batch_size": 1, "par.tp": 3, "par.pp": 1})[0]
    gb = contract.search_space.constraints.global_batch
    assert gb is not None and gb.accumulation(8, gb.data_parallel_for({"par.tp": 4, "par.pp": 1})) == 1


def test_global_batch_takes_a_fixed_or_a_derived_data_parallel_not_both(tmp_path: Path) -> None:
    from infrarsi.study.contract import ContractError

    with pytest.raises((ContractError, ValueError), match="not both"):
        contract_from_dict(_derived_dp_contract(tmp_path, devices=16, data_parallel=2), check=False)
    with pytest.raises((ContractError, ValueError), match="needs devices"):
        contract_from_dict(_derived_dp_contract(tmp_path, parallel_keys=["par.tp"]), check=False)
    # the fixed form is unchanged
    fixed = contract_from_dict(_derived_dp_contract(tmp_path, data_parallel=4), check=False)
    assert fixed.candidate_problems({"train.micro_batch_size": 8}) == []
