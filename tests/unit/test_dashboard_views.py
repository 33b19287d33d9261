"""The dashboard's views over a real analyst DuckDB (a synthetic study's log applied by the eventlog's own code),
and its access rules. No server: the browser and bus tests are tests/e2e/test_dashboard_browser.py and
tests/integration/test_dashboard_server.py."""

from __future__ import annotations

import base64

import pytest
from infrarsi import eventlog
from infrarsi import events as ev
from infrarsi.dashboard import views
from infrarsi.dashboard.access import Access, AccessError, check_listen, is_loopback
from support.dashboard import apply_events
from support.synthetic_study import GIB, synthetic_study, write_workload

STUDY = "01DASHBOARDVIEWS"


def _agent_exchange() -> list[tuple[object, str | None]]:
    asked = ev.AgentAsked(ask_id="ask1", purpose="proposals", model="tiny-llm", endpoint="http://127.0.0.1:1/v1",
                          messages=[ev.AgentMessage(role="system", content="be brief"),
                                    ev.AgentMessage(role="user", content="propose faster settings")], max_tokens=512)
    answered = ev.AgentAnswered(ask_id="ask1", ok=True, text='{"candidates": []}', prompt_tokens=100, completion_tokens=20,
                                cost_usd=0.001, refused=[ev.AgentRefusal(kind="outside_space", item="candidate 1",
                                                                         detail="micro_batch_size=3")])
    return [(asked, None), (answered, None)]


@pytest.fixture
def db(tmp_path):
    events = synthetic_study(STUDY, write_workload(tmp_path / "workload"), seed=3, before_search=_agent_exchange())
    running = ev.Candidate(knobs={"micro_batch_size": 2})
    events += [
        ev.make_event(ev.TrialProposed(candidate=running, candidate_key=running.key(), kind="search", origin="ei",
                                       prediction=ev.Prediction(step_time_s=0.19, step_time_std_log=0.1,
                                                                peak_memory_bytes=2.5 * GIB, p_oom=0.02)),
                      study_id=STUDY, source="proposer", trial_id="live0", cluster_id="local"),
        ev.make_event(ev.TrialLaunched(backend="local", workdir="/tmp/w", command=["python"], nodes=1, ranks=2,
                                       host="localhost", job_id="1"),
                      study_id=STUDY, source="launcher", trial_id="live0", cluster_id="local"),
        *[ev.make_event(ev.TrialStep(rank=rank, world_size=2, step=step, loss=3.0, step_time_s=0.2, tokens=8192,
                                     optimizer_steps=step, peak_memory_bytes=2 * GIB),
                        study_id=STUDY, source="probe", trial_id="live0", cluster_id="local")
          for step in (1, 2, 3) for rank in (0, 1) if (rank, step) != (1, 3)],
    ]
    with eventlog.AnalystDB.open(tmp_path / "analyst.duckdb") as analyst:
        apply_events(analyst, events)
        yield analyst


def test_the_study_list_gives_stage_counts_and_cost_from_the_log(db):
    [study] = views.studies(db.con)
    assert study["study_id"] == STUDY
    # The last milestone is a VerifyCompleted; one trial launched and not finished.
    assert study["stage"] == "verify · 1 running"
    assert study["trials"] == db.query("SELECT count(*) FROM trials")[1][0][0]
    total_s = db.query("SELECT sum(accelerator_s) FROM trials")[1][0][0]
    assert study["accelerator_hours"] == pytest.approx(total_s / 3600)
    assert study["best_verified_speedup"] > 1.1


def test_the_study_page_holds_every_view(db):
    page = views.study(db.con, STUDY)
    trials = {t["trial_id"]: t for t in page["trials"]}
    assert trials["live0"]["outcome"] == "running" and trials["live0"]["steps_seen"] == 3
    assert trials["search0"]["steps_seen"] is None  # no telemetry in the synthetic log
    assert trials["live0"]["predicted_step_time_s"] == pytest.approx(0.19)
    assert trials["live0"]["predicted_peak_bytes"] == pytest.approx(2.5 * GIB)
    assert trials["search2"]["outcome"] == "oom" and trials["search2"]["censored_peak_bytes"] == int(7.9 * GIB)
    assert trials["search7"]["outcome"] == "invariant_violation" and trials["search7"]["failed_invariants"] == ["loss"]
    assert trials["search4"]["patches"] == ["fused-qkv"] and trials["search4"]["knobs"] == {"micro_batch_size": 8}
    assert page["memory_capacity_bytes"] == 8 * GIB

    # Best over trials: the fastest search trial, search7 (0.70×), broke the loss invariant: never the best.
    best = page["best_over_trials"]
    assert [p["trial_id"] for p in best if not p["counts"]] == ["search7"]
    fastest_ok = min(t["step_time_s"] for t in page["trials"] if t["kind"] == "search" and t["outcome"] == "ok")
    assert best[-1]["best"] == pytest.approx(page["baseline_step_time_s"] / fastest_ok)
    assert best[-1]["best"] < trials["search7"]["speedup"]
    assert all(a["best"] <= b["best"] for a, b in zip(best, best[1:], strict=False) if a["best"] is not None)
    assert page["best_search_speedup"] == pytest.approx(best[-1]["best"])  # the list and the plot agree

    cost = {(c["kind"], c["outcome"]): c["accelerator_hours"] for c in page["cost_by_outcome"]}
    assert cost[("search", "oom")] == pytest.approx(8.0 / 3600)
    assert cost[("search", "timeout")] == pytest.approx(120.0 / 3600)
    assert sum(cost.values()) == pytest.approx(page["accelerator_hours"])

    assert page["doctor"]["run_to_run_cv"] == pytest.approx(0.02)
    assert len(page["doctor"]["run_step_times_s"]) == 5

    rounds = page["verifications"]
    assert [r["round"] for r in rounds if r["promotable"]] == [2]
    assert all(r["ci_low"] <= r["speedup"] <= r["ci_high"] for r in rounds)

    loss = next(i for i in page["invariants"] if i["name"] == "loss")
    assert loss["failed"] >= 1 and "search7" in [f["trial_id"] for f in loss["failures"]]

    [exchange] = page["agent"]
    assert exchange["question"] == "propose faster settings" and exchange["tokens"] == 120
    assert exchange["refused"] == ["outside_space: candidate 1"]


def test_the_search_space_view_has_one_axis_per_knob_and_patch(db):
    page = views.study(db.con, STUDY)
    space = page["search_space"]
    axes = {d["label"]: d for d in space["dimensions"]}
    assert list(axes) == ["compile", "micro_batch_size", "patch fused-qkv"]
    measured = [t for t in page["trials"] if t["kind"] == "search" and t["speedup"] is not None]
    assert space["trial_ids"] == [t["trial_id"] for t in measured]
    assert axes["micro_batch_size"]["categorical"] is False
    assert axes["micro_batch_size"]["values"] == [t["knobs"].get("micro_batch_size", "golden") for t in measured]
    # compile is a bool, set by no measured trial (compile=true crashed or timed out): all at the golden value.
    assert axes["compile"]["categorical"] and set(axes["compile"]["values"]) == {"golden"}
    assert axes["patch fused-qkv"]["values"].count("on") == sum("fused-qkv" in t["patches"] for t in measured)
    assert space["counts"] == [t["outcome"] == "ok" for t in measured]


def test_the_history_has_every_finished_trial_and_the_best_search_step_so_far(db):
    """optuna-dashboard's optimisation history: one point per trial with a final outcome (live0 is running: none),
    failed trials without a step time, the best line the lowest step time of a search trial that ran ok with its
    invariants held (search7 is faster but broke the loss invariant)."""
    page = views.study(db.con, STUDY)
    points = page["history"]
    trials = {t["trial_id"]: t for t in page["trials"]}
    assert [p["trial_id"] for p in points] == [t["trial_id"] for t in page["trials"] if t["trial_id"] != "live0"]
    assert [p["n"] for p in points] == sorted(p["n"] for p in points)
    by_id = {p["trial_id"]: p for p in points}
    assert by_id["search2"]["outcome"] == "oom" and by_id["search2"]["step_time_s"] is None
    assert all(by_id[t]["step_time_s"] == trials[t]["step_time_s"] for t in by_id)
    best_ok = min(t["step_time_s"] for t in page["trials"] if t["kind"] == "search" and t["outcome"] == "ok")
    assert points[-1]["best_step_s"] == pytest.approx(best_ok)
    assert trials["search7"]["step_time_s"] < best_ok and not by_id["search7"]["counts"]
    assert all(p["best_step_s"] is None for p in points if p["n"] < by_id["search0"]["n"])  # the doctor's: not search
    bests = [p["best_step_s"] for p in points if p["best_step_s"] is not None]
    assert bests == sorted(bests, reverse=True)


def test_the_edf_is_each_kinds_ok_step_times_sorted_with_their_fractions(db):
    page = views.study(db.con, STUDY)
    edf = {e["kind"]: e for e in page["edf"]}
    assert set(edf) == {"doctor", "search", "verify"}
    ok_search = sorted(t["step_time_s"] for t in page["trials"] if t["kind"] == "search" and t["outcome"] == "ok")
    assert edf["search"]["step_time_s"] == ok_search  # search7 (invariant broken) and the failed ones left out
    assert edf["search"]["fraction"] == pytest.approx([(i + 1) / len(ok_search) for i in range(len(ok_search))])
    assert len(edf["doctor"]["step_time_s"]) == 5


def test_a_trial_page_holds_its_prediction_measurement_steps_and_verdicts(db):
    live = views.trial_detail(db.con, STUDY, "live0")
    assert live["trial"]["outcome"] == "running" and live["trial"]["steps_seen"] == 3
    assert live["proposal"]["prediction"]["step_time_s"] == pytest.approx(0.19)
    assert live["proposal"]["prediction"]["p_oom"] == pytest.approx(0.02)
    assert live["launch"]["host"] == "localhost" and live["launch"]["ranks"] == 2
    # The probe's records per rank (rank 1 reported steps 1 and 2 only).
    assert [(r["rank"], r["step"]) for r in live["steps"]] == [(0, [1, 2, 3]), (1, [1, 2])]
    assert live["steps"][0]["step_time_s"] == [0.2, 0.2, 0.2] and live["steps"][0]["loss"] == [3.0, 3.0, 3.0]

    measured = views.trial_detail(db.con, STUDY, "search7")
    assert measured["trial"]["knobs"] == {"micro_batch_size": 4} and measured["trial"]["patches"] == ["fused-qkv"]
    assert measured["measured"]["step_time_s"] == pytest.approx(measured["trial"]["step_time_s"])
    assert measured["measured"]["measured_steps"] == 60 and len(measured["measured"]["peak_memory_per_rank"]) == 2
    assert {v["name"]: v["ok"] for v in measured["trial"]["invariants"]} == {"timing": True, "loss": False}
    assert [step for step, _ in measured["loss_curve"]] == [10, 20, 30, 40, 50, 60]  # the measurement's curve
    assert measured["steps"] == []  # no telemetry for it in the synthetic log

    oom = views.trial_detail(db.con, STUDY, "search2")
    assert oom["trial"]["outcome"] == "oom" and oom["finish"]["finish_reason"] == "oom"
    assert oom["finish"]["censored_peak_bytes"] == int(7.9 * GIB) and oom["finish"]["accelerator_s"] == 8.0
    assert oom["measured"]["step_time_s"] is None

    with pytest.raises(views.UnknownTrial, match="nosuch"):
        views.trial_detail(db.con, STUDY, "nosuch")
    with pytest.raises(views.UnknownStudy):
        views.trial_detail(db.con, "nope", "live0")


def test_an_unknown_study_is_named(db):
    with pytest.raises(views.UnknownStudy, match="nope"):
        views.study(db.con, "nope")


def test_stage_follows_the_latest_milestone():
    assert views.stage_of([], 0) == "init"
    assert views.stage_of(["StudyCreated", "DoctorRequested"], 0) == "doctor"
    assert views.stage_of(["StudyCreated", "DoctorCompleted", "RunRequested"], 2) == "run · 2 running"
    assert views.stage_of(["RunRequested", "VerifyRequested", "StudyFinished"], 0) == "search done"


def test_loopback_needs_nothing_and_beyond_it_the_token():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.0.2.7")
    assert Access(None).allows(None, None, None)
    access = Access("s3cret")
    assert not access.allows(None, None, None)
    assert not access.allows("Bearer wrong", "nope", "nah")
    assert access.allows("Bearer s3cret", None, None)
    assert access.allows("Basic " + base64.b64encode(b"anyone:s3cret").decode(), None, None)
    assert not access.allows("Basic !!notbase64", None, None)
    assert access.allows(None, "s3cret", None) and access.allows(None, None, "s3cret")

    check_listen("127.0.0.1", tls=False, token=None)
    with pytest.raises(AccessError, match="--tls-cert and --tls-key"):
        check_listen("0.0.0.0", tls=False, token="t")
    check_listen("0.0.0.0", tls=True, token="t")
