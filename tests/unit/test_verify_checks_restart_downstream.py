"""Verify's checkpoint restart (``checkpoint.restart``, ``checkpoint.across_change``) and downstream evaluation
(``downstream``): the pure checks, the state machine that plans restart trials, the launcher's metric
parsing and the contract's validation. The real jobs are in tests/e2e/test_verify_restart_downstream.py."""

from __future__ import annotations

import math

import msgspec
import pytest
from infrarsi import events as ev
from infrarsi.study.contract import Contract, ContractError, DownstreamSpec
from infrarsi.verdicts import verification as vf
from infrarsi_services.launcher.downstream import parse_metric
from infrarsi_services.verifier.logic import VerifierLogic
from support.verified_study import locked_contract

CAND = ev.Candidate(patches=["fused-qkv"])
RULE = vf.LossRule(tolerance=0.01, mode="relative", trend=None)
PPL = DownstreamSpec(command=["{python}", "evaluate.py", "--weights", "{weights}"], metric="perplexity",
                     tolerance=0.01)  # fmt: skip


def _curve(first: int = 0, last: int = 20, *, bump_from: int | None = None, bump: float = 0.0) -> list[ev.LossPoint]:
    return [ev.LossPoint(s, 5.0 * math.exp(-0.05 * s) * (1 + (bump if bump_from is not None and s >= bump_from else 0)))
            for s in range(first, last)]  # fmt: skip


def _run(arm: vf.Arm, *, first: int = 0, status: ev.TrialStatus = "ok", downstream: float | None = None,
         bump_from: int | None = None, bump: float = 0.0, error: str = "") -> vf.RunMeasurement:  # fmt: skip
    result = None if downstream is None and not error else ev.DownstreamResult(metric="perplexity", value=downstream,
                                                                               error=error)  # fmt: skip
    return vf.RunMeasurement(
        trial_id=f"{arm}{first}", arm=arm, pair=0, status=status, step_time_s=1.0 if arm == "baseline" else 0.8,
        optimizer_steps=20 - first, tokens=(20 - first) * 64, loss_curve=tuple(_curve(first, bump_from=bump_from, bump=bump)),
        eval_curve=tuple(p for p in _curve(first) if p.step % 5 == 4), downstream=result,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# checkpoint.restart
# --------------------------------------------------------------------------------------------------


def test_a_resumed_run_that_continues_the_uninterrupted_one_holds():
    result = vf.restart_check("candidate", _run("candidate"), _run("candidate", first=10), RULE, 10)
    assert result.ok and result.name == "checkpoint.restart"
    assert result.observed == 0.0 and "12 steps compared" in result.detail  # train 10..19, eval 14 and 19
    assert "after 10 steps" in result.detail


def test_telemetry_s_work_verdicts_on_a_restart_trial_are_not_its_restart_verdict():
    # half the steps, so telemetry calls it invariant_violation; the restart check reads its curve instead
    resumed = vf.RunMeasurement(**{**_run("candidate", first=10).__dict__, "status": "invariant_violation"})
    assert vf.restart_check("candidate", _run("candidate"), resumed, RULE, 10).ok


def test_a_resumed_run_off_the_curve_fails_with_the_step_and_the_gap():
    resumed = _run("candidate", first=10, bump_from=12, bump=0.02)  # 2 % off from step 12, ε is 1 %
    result = vf.restart_check("candidate", _run("candidate"), resumed, RULE, 10)
    assert not result.ok and result.observed == pytest.approx(2.0, rel=1e-6)
    assert "step 12" in result.detail and "2 ε" in result.detail


def test_a_run_that_restarted_from_step_zero_or_crashed_or_lost_steps_fails_by_name():
    uninterrupted = _run("candidate")
    from_zero = vf.restart_check("candidate", uninterrupted, _run("candidate"), RULE, 10)
    assert not from_zero.ok and "first step is 0, not 10" in from_zero.detail
    crashed = vf.restart_check("baseline", uninterrupted, _run("candidate", first=10, status="crash"), RULE, 10)
    assert not crashed.ok and crashed.name == "checkpoint.across_change" and "ended crash" in crashed.detail
    short = _run("candidate", first=10)
    short = vf.RunMeasurement(**{**short.__dict__, "loss_curve": short.loss_curve[:-3]})
    lost = vf.restart_check("candidate", uninterrupted, short, RULE, 10)
    assert not lost.ok and "lacks steps" in lost.detail and "train 17" in lost.detail
    assert not vf.restart_check("candidate", uninterrupted, None, RULE, 10).ok


def test_decide_runs_the_restart_check_only_when_asked_and_names_it():
    round_ = vf.Round("v1", CAND, 1, 1)
    round_.runs = {"a": _run("baseline"), "b": _run("candidate")}
    assert "checkpoint.restart" not in {i.name for i in vf.decide(round_, passes_before=0, passes_required=1,
                                                                  loss_rule=RULE).invariants}  # fmt: skip
    round_.restarts_expected = 1
    assert not round_.complete()
    round_.restarts["candidate"] = _run("candidate", first=10, bump_from=10, bump=0.05)
    assert round_.complete()
    done = vf.decide(round_, passes_before=0, passes_required=1, loss_rule=RULE, checks=vf.ExtraChecks(restart_at=10))
    assert done.failed_invariants == ["checkpoint.restart"] and not done.promotable
    round_.restarts["candidate"] = _run("candidate", first=10)
    done = vf.decide(round_, passes_before=0, passes_required=1, loss_rule=RULE, checks=vf.ExtraChecks(restart_at=10))
    assert done.failed_invariants == [] and done.promotable
    row = next(i for i in done.invariants if i.name == "checkpoint.restart")
    assert row.ok and "closest: pair 1" in row.detail


# --------------------------------------------------------------------------------------------------
# downstream
# --------------------------------------------------------------------------------------------------


def test_downstream_fails_a_worse_metric_beyond_the_tolerance_and_passes_a_better_one():
    worse = vf.downstream_check(_run("baseline", downstream=100.0), _run("candidate", downstream=105.0), PPL)
    assert not worse.ok and worse.observed == pytest.approx(5.0) and worse.tolerance == pytest.approx(1.0)
    assert "perplexity 105 vs baseline 100" in worse.detail and "+5.00%" in worse.detail
    assert vf.downstream_check(_run("baseline", downstream=100.0), _run("candidate", downstream=100.9), PPL).ok
    assert vf.downstream_check(_run("baseline", downstream=100.0), _run("candidate", downstream=90.0), PPL).ok
    accuracy = DownstreamSpec(command=["x"], metric="accuracy", higher_is_better=True, tolerance=0.02, mode="absolute")
    assert not vf.downstream_check(_run("baseline", downstream=0.80), _run("candidate", downstream=0.77), accuracy).ok
    assert vf.downstream_check(_run("baseline", downstream=0.80), _run("candidate", downstream=0.79), accuracy).ok


def test_downstream_without_a_value_fails_naming_the_arm_and_the_error():
    missing = vf.downstream_check(_run("baseline", downstream=100.0), _run("candidate"), PPL)
    assert not missing.ok and "candidate run's final weights were not evaluated" in missing.detail
    broken = vf.downstream_check(_run("baseline", error="exit code 2: no final weights"), _run("candidate", downstream=1.0), PPL)
    assert not broken.ok and "baseline run's evaluation gave no perplexity: exit code 2" in broken.detail


def test_parse_metric_reads_the_last_json_line_and_names_what_is_wrong():
    assert parse_metric('loading\n{"perplexity": 5.5}\n{"perplexity": 4.5, "x": 1}\ndone\n', "perplexity") == (4.5, "")
    assert parse_metric("no json here", "perplexity")[0] is None
    assert "has no 'perplexity'" in parse_metric('{"ppl": 3}', "perplexity")[1]
    assert "not a finite number" in parse_metric('{"perplexity": NaN}', "perplexity")[1]
    assert "not a finite number" in parse_metric('{"perplexity": "low"}', "perplexity")[1]


# --------------------------------------------------------------------------------------------------
# The state machine: restart trials after the first pair; downstream from TrialFinished
# --------------------------------------------------------------------------------------------------


def _contract(verify: dict[str, object]) -> dict[str, object]:
    return locked_contract(steps=20, verify_steps=20, verify={"repeats": 1, "passes_required": 1, "top_k": 1, **verify},
                           loss={"tolerance": 0.01, "mode": "relative", "trend": None})


def _env(payload: ev.Payload, trial_id: str | None = None) -> ev.Event:
    return ev.make_event(payload, study_id="s1", source="test", trial_id=trial_id)


def _measured(curve: list[ev.LossPoint]) -> ev.TrialMeasured:
    return ev.TrialMeasured(
        candidate_key="k", kind="verify", status="ok", steps=len(curve), warmup_steps=1, step_time_s=1.0,
        step_time_mad_s=0.0, step_time_with_warmup_s=1.0, tokens_per_s=1.0, mfu=None, flops_per_step=None,
        phases={}, peak_memory_bytes=[1], per_rank_step_s=[1.0], stragglers=[], loss_curve=curve, eval_curve=[],
        optimizer_steps=len(curve), tokens=len(curve), invariants=[], invariants_ok=True,
    )  # fmt: skip


def test_the_verifier_plans_restarts_after_the_first_pair_and_waits_for_them():
    verify = {"checkpoint_restart": {"across_change": True},
              "downstream": {"command": ["{python}", "evaluate.py", "{weights}"], "metric": "perplexity"}}  # fmt: skip
    created = ev.StudyCreated(name="s", goal="g", contract=_contract(verify), contract_sha256="x", workload_dir="/w",
                              baseline_ref="abc", locked_files={}, cluster=ev.ClusterInfo(cluster_id="local", accelerator="cpu"))  # fmt: skip
    logic = VerifierLogic()
    logic.apply(_env(created))
    base, cand = logic.apply(_env(ev.VerifyRequested(candidates=[CAND], repeats=1)))
    for planned, ppl in ((base, 100.0), (cand, 150.0)):
        finished = ev.TrialFinished(status="ok", downstream=ev.DownstreamResult(metric="perplexity", value=ppl))
        assert logic.apply(_env(finished, planned.trial_id)) == []
    assert logic.apply(_env(_measured(_curve()), base.trial_id)) == []
    restarts = logic.apply(_env(_measured(_curve()), cand.trial_id))
    assert [r.payload.resume_from for r in restarts] == [cand.trial_id, base.trial_id]
    assert all(r.payload.kind == "verify" and r.payload.candidate == CAND and r.payload.steps == 20 for r in restarts)
    assert logic.apply(_env(_measured(_curve(10)), restarts[0].trial_id)) == []  # still waiting for the other
    failed = ev.TrialFinished(status="crash", reason="size mismatch for blocks.0.attn.c_attn.weight")
    (done_emission,) = logic.apply(_env(failed, restarts[1].trial_id))
    done = done_emission.payload
    assert isinstance(done, ev.VerifyCompleted) and not done.promotable
    done = msgspec.json.decode(msgspec.json.encode(done), type=ev.VerifyCompleted)  # as the bus carries it
    assert done.failed_invariants == ["checkpoint.across_change", "downstream"]
    rows = {i.name: i for i in done.invariants}
    assert rows["checkpoint.restart"].ok and "size mismatch" in rows["checkpoint.across_change"].detail
    assert "perplexity 150 vs baseline 100" in rows["downstream"].detail
    assert done.trial_ids == sorted([base.trial_id, cand.trial_id], key=[base.trial_id, cand.trial_id].index)


def test_contract_refuses_a_checkpoint_past_the_horizon_and_unknown_placeholders():
    with pytest.raises(ValueError, match="at_step 20 leaves nothing to resume: it must be below workload.verify_steps 20"):
        Contract.model_validate(_contract({"checkpoint_restart": {"at_step": 20}}))
    with pytest.raises((ContractError, ValueError), match=r"unknown placeholder \{model\}"):
        Contract.model_validate(_contract({"downstream": {"command": ["{python}", "{model}"], "metric": "m"}}))
    assert Contract.model_validate(_contract({"checkpoint_restart": {}})).verify.checkpoint_restart.step_for(20) == 10


def test_the_predicted_verify_cost_counts_the_restart_runs():
    from infrarsi.study.contract import Contract

    plain = vf.predicted_verify_cost(Contract.model_validate(_contract({})), 0.5)
    assert plain.accelerator_s == pytest.approx(1 * 1 * 1 * 2 * 20 * 0.5) and "restart" not in plain.line()
    both = vf.predicted_verify_cost(Contract.model_validate(_contract({"checkpoint_restart": {"at_step": 5,
                                                                                             "across_change": True}})), 0.5)  # fmt: skip
    assert both.accelerator_s == pytest.approx((2 * 20 + 2 * 15) * 0.5)
    assert "2 restart run(s) × 15 steps" in both.line() and "= 35 accelerator-s" in both.line()


# --------------------------------------------------------------------------------------------------
# The launcher's side: the downstream command (a real subprocess) and what a verify run is told
# --------------------------------------------------------------------------------------------------


def test_run_downstream_reads_the_metric_and_names_a_failure_or_a_timeout(tmp_path):
    import sys

    from infrarsi_services.launcher.downstream import downstream_argv, run_downstream

    spec = DownstreamSpec(command=["{python}", "-c", "import sys; print('x'); print('{{\"perplexity\": 4.5}}')",  # {{ }}: literal braces
                                   "{weights}"], metric="perplexity", timeout_s=30)  # fmt: skip
    argv = downstream_argv(spec, python=sys.executable, launch_file="l.yaml", weights=tmp_path / "final")
    assert argv[-1] == str(tmp_path / "final")
    ok = run_downstream(spec, argv, cwd=tmp_path, env={})
    assert ok.value == 4.5 and ok.error == "" and ok.wall_s > 0
    failing = DownstreamSpec(command=["{python}", "-c", "import sys; sys.exit('no final weights')"], metric="perplexity")
    bad = run_downstream(failing, downstream_argv(failing, python=sys.executable, launch_file="", weights=tmp_path),
                         cwd=tmp_path, env={})  # fmt: skip
    assert bad.value is None and bad.error.startswith("exit code 1: no final weights")
    slow = DownstreamSpec(command=["{python}", "-c", "import time; time.sleep(5)"], metric="m", timeout_s=0.5)
    late = run_downstream(slow, downstream_argv(slow, python=sys.executable, launch_file="", weights=tmp_path),
                          cwd=tmp_path, env={})  # fmt: skip
    assert late.value is None and late.error == "timed out after 0.5s"


def test_the_launcher_tells_verify_runs_where_to_save_and_refuses_a_resume_without_a_checkpoint(tmp_path):
    from infrarsi_services.launcher.service import LauncherService, Refused

    contract = Contract.model_validate(_contract({"checkpoint_restart": {"at_step": 4},
                                                  "downstream": {"command": ["x"], "metric": "m"}}))  # fmt: skip
    launcher = LauncherService(data_dir=tmp_path)
    tdir = launcher.state_root / "t1"

    def proposed(**kwargs: object) -> ev.TrialProposed:
        return ev.TrialProposed(candidate=CAND, candidate_key=CAND.key(), origin="verify", **kwargs)  # type: ignore[arg-type]

    told = launcher._verify_checkpoints(proposed(kind="verify", steps=20), contract, tdir)
    assert (told.save_dir, told.save_after_steps, told.final_weights_dir) == (tdir / "checkpoint", 4, tdir / "final")
    assert launcher._verify_checkpoints(proposed(kind="search"), contract, tdir).save_dir is None
    with pytest.raises(Refused, match="trial t0 left no checkpoint to resume from"):
        launcher._verify_checkpoints(proposed(kind="verify", resume_from="t0"), contract, tdir)
    (launcher.state_root / "t0" / "checkpoint").mkdir(parents=True)
    resume = launcher._verify_checkpoints(proposed(kind="verify", resume_from="t0"), contract, tdir)
    assert resume.resume_from == launcher.state_root / "t0" / "checkpoint" and resume.final_weights_dir is None


# --------------------------------------------------------------------------------------------------
# The report: the contract's settings and each verdict's row with its evidence
# --------------------------------------------------------------------------------------------------


def test_the_report_shows_the_settings_and_a_row_per_new_invariant(tmp_path):
    import duckdb
    from infrarsi.report import build_report, render_markdown
    from infrarsi.report.source import load_events
    from support.synthetic_study import synthetic_study, write_workload

    restart_row = ev.InvariantResult(name="checkpoint.restart", ok=False, detail="resumed from its own run's "
                                     "checkpoint after 60 steps: 61 steps compared, largest gap 5.58 ε", observed=5.58,
                                     tolerance=1.0)  # fmt: skip
    downstream_row = ev.InvariantResult(name="downstream", ok=True, detail="perplexity 76.63 vs baseline 76.63",
                                        observed=0.0, tolerance=0.77)  # fmt: skip
    events = []
    for event in synthetic_study("s1", write_workload(tmp_path / "workload"), seed=3):
        match event.payload:
            case ev.StudyCreated() as created:
                contract = {**created.contract, "verify": {**created.contract["verify"],
                            "checkpoint_restart": {"at_step": 60}, "downstream": PPL.model_dump()}}  # fmt: skip
                event = msgspec.structs.replace(event, payload=msgspec.structs.replace(created, contract=contract))
            case ev.VerifyCompleted() as done:
                rows = [*done.invariants, restart_row, downstream_row]
                event = msgspec.structs.replace(event, payload=msgspec.structs.replace(done, invariants=rows))
        events.append(event)
    con = duckdb.connect(str(tmp_path / "analyst.duckdb"))
    load_events(con, list(enumerate(events, start=1)))
    md = render_markdown(build_report(con, "s1"), tmp_path / "r.md")[0].read_text()
    con.close()
    assert "checkpoint restart (verify)" in md and "after 60 steps" in md
    assert "downstream (verify)" in md and "perplexity (lower is better), at most 1.00% worse" in md
    assert "| checkpoint.restart | FAIL | resumed from its own run's checkpoint after 60 steps" in md
    assert "| downstream | ok | perplexity 76.63 vs baseline 76.63" in md
