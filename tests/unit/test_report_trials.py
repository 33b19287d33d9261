"""The report (issue 36, item 5): a per-trial table, a log-scaled step-time axis when one trial dwarfs the rest, the
topology beside the numbers, and the promoted branches as ``infrarsi follow`` and ``smoke`` left them."""

from __future__ import annotations

import duckdb
import pytest
from infrarsi import events as ev
from infrarsi.report import build_report, outline, render_markdown
from infrarsi.report.figures import step_axis_is_log, time_vs_memory
from infrarsi.report.render import Table
from infrarsi.report.source import load_events
from support.synthetic_study import _measured, synthetic_study, write_workload


def report_of(tmp_path, extra: list[ev.Event] = ()):  # type: ignore[assignment]
    log = synthetic_study("s1", write_workload(tmp_path / "workload"), seed=3)
    con = duckdb.connect(str(tmp_path / "analyst.duckdb"))
    load_events(con, list(enumerate([*log, *extra], start=1)))
    try:
        return build_report(con, "s1")
    finally:
        con.close()


def slow_trial() -> list[ev.Event]:
    """A search trial 60× slower than the rest (a knob that falls off a cliff on this host)."""
    cand = ev.Candidate(knobs={"micro_batch_size": 1})
    proposed = ev.TrialProposed(candidate=cand, candidate_key=cand.key(), kind="search", origin="ei")
    finished = ev.TrialFinished(status="ok", ranks=2, accelerator_s=900.0, wall_s=450.0, peak_memory_bytes=1 << 30)
    measured = _measured(cand.key(), "search", 12.0, None, steps=60, peak=1 << 30)
    return [ev.make_event(p, study_id="s1", source=src, trial_id="slow1", cluster_id="local")
            for p, src in ((proposed, "proposer"), (finished, "launcher"), (measured, "telemetry"))]


def test_the_step_time_axis_goes_logarithmic_only_when_one_trial_dwarfs_the_rest(tmp_path) -> None:
    assert not step_axis_is_log([200.0, 180.0, 150.0]) and step_axis_is_log([200.0, 180.0, 12000.0])
    plain = time_vs_memory(report_of(tmp_path / "a"))
    assert plain.axes[0].get_yscale() == "linear" and plain.axes[0].get_ylabel() == "step time (ms)"
    dwarfed = time_vs_memory(report_of(tmp_path / "b", slow_trial()))
    assert dwarfed.axes[0].get_yscale() == "log" and dwarfed.axes[0].get_ylabel() == "step time (ms, log scale)"


def test_every_trial_has_a_row_and_the_topology_stands_beside_the_numbers(tmp_path) -> None:
    report = report_of(tmp_path, slow_trial())
    blocks = outline(report)
    [table] = [b for b in blocks if isinstance(b, Table) and b.header[:3] == ["#", "trial", "kind"]]
    assert len(table.rows) == len(report.trials)
    slow = next(r for r in table.rows if r[1] == "slow1")
    assert slow[2:8] == ["search", "ei", "micro_batch_size=1", "—", "ok", "12000.00 ms"]
    oom = next(r for r, t in zip(table.rows, report.trials, strict=True) if t.outcome == "oom")
    assert oom[6] == "oom" and oom[9] == "8.0"
    text = "\n".join(str(getattr(b, "text", "")) for b in blocks)
    assert "Topology: 1 node(s) × 1 cpu device(s) (loopback)" in text
    assert "each trial 1 node(s) × 1 rank(s) (python)" in text
    md = render_markdown(report, tmp_path / "report.md")[0].read_text()
    assert "| # | trial | kind | origin | knobs | patches | outcome | step | peak | accel-s | why |" in md
    assert "Topology:" in md


def test_promoted_branches_show_where_they_stand_and_the_smoke_verdict(tmp_path) -> None:
    key = ev.Candidate(knobs={"micro_batch_size": 8}, patches=["fused-qkv"]).key()
    branch = f"infrarsi/s1/{key}"
    extra = [
        ev.make_event(ev.PatchPromoted(candidate_key=key, repo="/r", branch=branch, commit="c" * 40,
                                       files_changed=["model.py"], launch_changes={}), study_id="s1",
                      source="cli.apply"),
        ev.make_event(ev.PromotionFollowed(candidate_key=key, branch=branch, commit="c" * 40, mainline="main",
                                           mainline_head="m" * 40, state="merged", merge_commit="m" * 40),
                      study_id="s1", source="cli.follow"),
        ev.make_event(ev.SmokeCompleted(candidate_key=key, commit="m" * 40, passed=True, verdict="PASS: 150.00 ms/step",
                                        steps=20, step_time_s=0.15, verified_step_s=0.156, tolerance=0.15),
                      study_id="s1", source="cli.smoke"),
    ]
    report = report_of(tmp_path, extra)
    [row] = report.promotions
    assert (row.state, row.merge_commit, row.smoke.passed if row.smoke else None) == ("merged", "m" * 40, True)
    md = render_markdown(report, tmp_path / "report.md")[0].read_text()
    assert f"| {branch} | cccccccccccc | merged (main) | mmmmmmmmmmmm | — | PASS: 150.00 ms/step |" in md


@pytest.mark.parametrize("times", [[], [1.0], [0.0, 5.0]])
def test_too_few_step_times_keep_the_axis_linear(times) -> None:
    assert not step_axis_is_log(times)
