"""The report's agent rows on a synthetic study whose winning patch is the agent's diff: who proposed each patch,
the model's words and expected effect beside the measured one, each diff's verdict, the exchanges' cost and
failures, and every refused part — in the model and in both renderers."""

from __future__ import annotations

import duckdb
import pytest
from infrarsi import events as ev
from infrarsi.report import build_report, render_html, render_markdown
from infrarsi.report.source import load_events
from support.synthetic_study import PATCH_DIFF, synthetic_study, write_workload

SPEEDUP = "llm-5eed0f5eed0f"
HACK = "llm-4ac44ac44ac4"
UNTRIED = "llm-0dd00dd00dd0"


def agent_log() -> list[tuple[object, str | None]]:
    asked = [ev.AgentAsked(ask_id=f"a{i}", purpose="proposals", model="scripted-coder", endpoint="http://m/v1",
                           messages=[ev.AgentMessage(role="user", content="…")], max_tokens=1000) for i in (1, 2)]
    patches = [
        ev.AgentPatch(patch_id=SPEEDUP, diff=PATCH_DIFF, description="Fuse the Q/K/V projections", files=["model.py"],
                      reason="one GEMM instead of three", expected_time_log_ratio=-0.2),
        ev.AgentPatch(patch_id=HACK, diff=PATCH_DIFF, description="Amortise the optimiser", files=["train.py"],
                      reason="the loop is slow", expected_time_log_ratio=-0.3),
        ev.AgentPatch(patch_id=UNTRIED, diff=PATCH_DIFF, description="Chunk the loss", files=["model.py"]),
    ]
    answered = [
        ev.AgentAnswered(ask_id="a1", ok=True, text="{…}", prompt_tokens=900, completion_tokens=300, cost_usd=0.012,
                         patches=patches,
                         candidates=[ev.AgentKnobProposal(candidate=ev.Candidate(knobs={"micro_batch_size": 8},
                                                                                 patches=[SPEEDUP]),
                                                          reason="bigger GEMMs with the fused projection")],
                         refused=[ev.AgentRefusal(kind="locked_file_changed", item="patch 3",
                                                  detail="data.py is locked")]),
        ev.AgentAnswered(ask_id="a2", ok=False, error="timeout", detail="no answer within 60 s", attempts=3),
    ]
    hack = ev.Candidate(patches=[HACK])
    hack_trial: list[tuple[object, str | None]] = [
        (ev.TrialProposed(candidate=hack, candidate_key=hack.key(), kind="search", origin="llm",
                          reason="Amortise the optimiser — the loop is slow"), "hack0"),
        (ev.TrialFinished(status="ok", ranks=1, accelerator_s=20.0, wall_s=20.0, peak_memory_bytes=1 << 30), "hack0"),
        (ev.TrialMeasured(candidate_key=hack.key(), kind="search", status="ok", steps=60, warmup_steps=3,
                          step_time_s=0.1, step_time_mad_s=0.001, step_time_with_warmup_s=0.11, tokens_per_s=1.0,
                          mfu=None, flops_per_step=None, phases={}, peak_memory_bytes=[1 << 30], per_rank_step_s=[0.1],
                          stragglers=[], loss_curve=[], eval_curve=[], optimizer_steps=30, tokens=60 * 8192,
                          invariants=[ev.InvariantResult(name="work.optimizer_steps", ok=False, detail="30 of 60")],
                          invariants_ok=False), "hack0"),
    ]
    return [(asked[0], None), (answered[0], None), *hack_trial, (asked[1], None), (answered[1], None)]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report-agent")
    workload = write_workload(root / "workload")
    con = duckdb.connect(str(root / "analyst.duckdb"))
    events = synthetic_study("s1", workload, seed=3, patch=SPEEDUP, before_search=agent_log())
    load_events(con, list(enumerate(events, start=1)))
    yield build_report(con, "s1")
    con.close()


def test_the_winners_patch_says_the_agent_proposed_it_in_its_words(report) -> None:
    [winner] = report.winners
    [audit] = winner.patches
    assert audit.patch_id == SPEEDUP and audit.proposed_by == "agent"
    assert audit.reason == "Fuse the Q/K/V projections — one GEMM instead of three"
    assert audit.expected_time_log_ratio == pytest.approx(-0.2)  # the model's number, beside the measured one
    assert audit.measured_time_log_ratio == pytest.approx(-0.11)  # the posterior's (last ModelUpdated)
    assert audit.diff == PATCH_DIFF and audit.files == ["model.py"]


def test_each_diff_has_its_verdict_and_measurements(report) -> None:
    a = report.agent
    rows = {r.patch_id: r for r in a.patches}
    assert rows[SPEEDUP].verdict == "promoted" and rows[SPEEDUP].trials == 4
    assert rows[SPEEDUP].failed_invariants == ["loss"]  # one of its trials broke the loss; the verified one did not
    assert rows[SPEEDUP].best_step_ratio == pytest.approx(0.78, abs=0.03)
    assert rows[HACK].verdict == "rejected by invariant" and rows[HACK].failed_invariants == ["work.optimizer_steps"]
    assert rows[HACK].best_step_ratio is None  # no invariant-keeping trial held it
    assert rows[UNTRIED].verdict == "not tried" and rows[UNTRIED].trials == 0


def test_exchanges_cost_failures_candidates_and_refusals(report) -> None:
    a = report.agent
    assert (a.model, a.exchanges, a.tokens, a.failed) == ("scripted-coder", 2, 1200, {"timeout": 1})
    assert a.cost_usd == pytest.approx(0.012)
    assert a.candidates == [(ev.Candidate(knobs={"micro_batch_size": 8}, patches=[SPEEDUP]).key(),
                             "bigger GEMMs with the fused projection")]
    assert a.refusals == [("locked_file_changed", "patch 3", "data.py is locked")]


def test_both_renderers_show_the_models_words_and_verdicts(report, tmp_path) -> None:
    html = render_html(report, tmp_path / "r.html").read_text()
    md = render_markdown(report, tmp_path / "r.md")[0].read_text()
    for text in (html, md):
        assert "The agent" in text and "scripted-coder" in text and "timeout 1" in text
        for words in ("Fuse the Q/K/V projections — one GEMM instead of three", "Amortise the optimiser",
                      "rejected by invariant", "work.optimizer_steps", "promoted", "not tried",
                      "bigger GEMMs with the fused projection", "data.py is locked"):
            assert words in text, words
