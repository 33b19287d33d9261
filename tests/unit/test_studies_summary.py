"""``infrarsi.study.lifecycle``: a study's stage, trials, cost, best verified speed-up and running verification, folded
from its log (a synthetic study's events, built by the real verifier logic)."""

from __future__ import annotations

from pathlib import Path

import pytest
from infrarsi import events as ev
from infrarsi.commands.studies import resume_problem
from infrarsi.study.lifecycle import summarize, summary_of
from infrarsi.verdicts import verification as vf
from support.synthetic_study import synthetic_study, write_workload


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> list[ev.Event]:
    return synthetic_study("s1", write_workload(tmp_path_factory.mktemp("wl")))


def cut(log: list[ev.Event], event_type: type, *, after: bool = False) -> list[ev.Event]:
    i = next(i for i, e in enumerate(log) if isinstance(e.payload, event_type))
    return log[: i + 1] if after else log[:i]


def test_the_whole_log_gives_trials_outcomes_cost_and_the_best_promotable_speedup(log) -> None:
    [s] = summarize(log)
    finished = [e.payload for e in log if isinstance(e.payload, ev.TrialFinished)]
    assert s.trials == sum(1 for e in log if isinstance(e.payload, ev.TrialProposed))
    assert s.outcomes == {"ok": sum(f.status == "ok" for f in finished), "oom": 1, "crash": 1, "timeout": 1,
                          "scope_violation": 1}
    assert s.accelerator_s == pytest.approx(sum(f.accelerator_s for f in finished))
    assert s.failed_accelerator_s == pytest.approx(8.0 + 4.0 + 120.0)
    promotable = [e.payload for e in log if isinstance(e.payload, ev.VerifyCompleted) and e.payload.promotable]
    assert promotable and s.best_speedup == max(p.speedup for p in promotable)
    assert s.best_ci == (promotable[0].ci_low, promotable[0].ci_high)
    assert s.verification is None and s.in_flight == 0 and s.stage == "verifying"


def test_a_verification_is_open_until_each_candidate_has_its_final_verdict(log) -> None:
    upto = cut(log, ev.VerifyRequested, after=True)
    s = summary_of(upto, "s1")
    assert s is not None and s.stage == "verifying" and s.verification is not None
    assert s.verification.candidates == 2 and len(s.verification.pending) == 2
    first_final = next(i for i, e in enumerate(log) if isinstance(e.payload, ev.VerifyCompleted)
                       and vf.is_final(e.payload))
    s = summary_of(log[: first_final + 1], "s1")
    assert s is not None and s.verification is not None and len(s.verification.pending) == 1
    assert summary_of(log, "s1").verification is None  # type: ignore[union-attr]


def test_cancel_closes_the_verification_and_resume_goes_back_to_the_stage_it_left(log) -> None:
    upto = cut(log, ev.VerifyRequested, after=True)
    cancel = ev.make_event(ev.StudyCancelled(reason="cost", by="a@b"), study_id="s1", source="cli.cancel")
    s = summary_of([*upto, cancel], "s1")
    assert s is not None and s.stage == "cancelled" and s.verification is None
    assert s.cancelled_reason == "cost" and s.cancelled_by == "a@b"
    assert resume_problem(s) is None
    resumed = ev.make_event(ev.StudyResumed(), study_id="s1", source="cli.resume")
    s = summary_of([*upto, cancel, resumed], "s1")
    assert s is not None and s.stage == "verifying" and s.cancelled_reason is None and s.resumed == 1


def test_resume_is_refused_for_a_finished_study_or_one_still_running(log) -> None:
    done = ev.make_event(ev.StudyFinished(reason="all verified", trials=10, accelerator_s=1.0), study_id="s1",
                         source="proposer")
    s = summary_of([*log, done], "s1")
    assert s is not None and s.stage == "finished"
    assert "finished (all verified)" in (resume_problem(s) or "")
    s = summary_of(cut(log, ev.TrialFinished), "s1")  # the first trial proposed, not finished
    assert s is not None and s.in_flight >= 1
    assert "in flight" in (resume_problem(s) or "") or "has not started" in (resume_problem(s) or "")


def test_studies_are_listed_newest_first_and_a_study_without_its_creation_is_left_out(tmp_path: Path, log) -> None:
    other = synthetic_study("s2", write_workload(tmp_path / "wl2"))
    orphan = ev.make_event(ev.RunRequested(), study_id="s3", source="cli.run")
    listed = summarize([*log, *other, orphan])
    assert [s.study_id for s in listed] == ["s2", "s1"]


def test_the_human_listing_says_stage_best_verified_and_why_cancelled(log) -> None:
    from infrarsi.commands.studies import table

    cancel = ev.make_event(ev.StudyCancelled(reason="cost review", by="ana@h"), study_id="s1", source="cli.cancel")
    [s] = summarize([*log, cancel])
    header, rule, line = table([s])
    assert header.split()[:6] == ["study", "name", "stage", "trials", "running", "failed"]
    assert line.startswith("s1") and " cancelled " in line and f"×{s.best_speedup:.3f}" in line
    assert line.endswith("cancelled by ana@h: cost review")
    assert table([]) == ["no studies on the bus"]
