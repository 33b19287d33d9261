"""The report model against SQL over the same analyst DB, and the renderers on a synthetic study."""

from __future__ import annotations

import duckdb
import pytest
from infrarsi.report import build_report, outline, render_html, render_markdown
from infrarsi.report.source import load_events
from support.synthetic_study import synthetic_study, write_workload


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    workload = write_workload(root / "workload")
    con = duckdb.connect(str(root / "analyst.duckdb"))
    load_events(con, list(enumerate(synthetic_study("s1", workload, seed=3), start=1)))
    yield con
    con.close()


def test_cost_by_outcome_matches_sql(db):
    report = build_report(db, "s1")
    rows = db.execute(
        """SELECT payload->>'status', sum(CAST(payload->>'accelerator_s' AS DOUBLE)) FROM events
           WHERE type = 'TrialFinished' AND study_id = 's1' GROUP BY 1"""
    ).fetchall()
    by_status = dict(rows)
    violation_ok_s = db.execute(
        """SELECT sum(CAST(f.payload->>'accelerator_s' AS DOUBLE)) FROM events f JOIN events m USING (trial_id)
           WHERE f.type = 'TrialFinished' AND m.type = 'TrialMeasured' AND f.payload->>'status' = 'ok'
             AND NOT CAST(m.payload->>'invariants_ok' AS BOOLEAN)"""
    ).fetchone()[0]
    assert report.cost_by_outcome["oom"] == pytest.approx(by_status["oom"] / 3600)
    assert report.cost_by_outcome["timeout"] == pytest.approx(by_status["timeout"] / 3600)
    assert report.cost_by_outcome["crash"] == pytest.approx(by_status["crash"] / 3600)
    assert report.cost_by_outcome["violation"] == pytest.approx((by_status["scope_violation"] + violation_ok_s) / 3600)
    assert report.cost_by_outcome["ok"] == pytest.approx((by_status["ok"] - violation_ok_s) / 3600)
    assert report.accelerator_hours == pytest.approx(sum(by_status.values()) / 3600)
    assert report.trials_by_outcome == {"ok": 28, "oom": 1, "crash": 1, "timeout": 1, "slow": 0, "violation": 2}


def test_winner_and_verdicts_match_the_last_verify_completed(db):
    report = build_report(db, "s1")
    rows = db.execute(
        """SELECT payload->>'candidate_key', CAST(payload->>'speedup' AS DOUBLE), CAST(payload->>'ci_low' AS DOUBLE),
                  CAST(payload->>'promotable' AS BOOLEAN), CAST(payload->'failed_invariants' AS VARCHAR[])
           FROM events WHERE type = 'VerifyCompleted' ORDER BY seq"""
    ).fetchall()
    last = {key: (s, lo, p, f) for key, s, lo, p, f in rows}
    assert len(report.verdicts) == 2 and len(report.winners) == 1
    for v in report.verdicts:
        s, lo, p, f = last[v.candidate_key]
        assert (v.speedup, v.ci_low, v.promotable, v.failed_invariants) == (pytest.approx(s), pytest.approx(lo), p, f)
    winner = report.winners[0]
    assert winner.passes == 2 and winner.rounds == 2 and winner.ci_low > 1
    assert winner.files_changed == ["model.py"] and "self.qkv(x)" in winner.patches[0].diff
    loser = next(v for v in report.verdicts if not v.promotable)
    assert loser.failed_invariants == ["loss"] and loser.rounds == 1


def test_baseline_and_best_speedup_curve(db):
    report = build_report(db, "s1")
    doctor_t = db.execute("SELECT CAST(payload->>'step_time_s' AS DOUBLE) FROM events WHERE type='DoctorCompleted'").fetchone()[0]
    assert report.baseline_step_s == pytest.approx(doctor_t)
    best_ok = db.execute(
        """SELECT min(CAST(payload->>'step_time_s' AS DOUBLE)) FROM events WHERE type = 'TrialMeasured'
           AND payload->>'kind' = 'search' AND CAST(payload->>'invariants_ok' AS BOOLEAN)"""
    ).fetchone()[0]
    n_search = db.execute("SELECT count(*) FROM events WHERE type='TrialMeasured' AND payload->>'kind'='search'").fetchone()[0]
    assert report.best_speedup_curve[-1] == (n_search, pytest.approx(doctor_t / best_ok))
    speedups = [s for _, s in report.best_speedup_curve]
    assert speedups == sorted(speedups)  # best-so-far never gets worse
    assert len(report.doctor_run_step_s) == 5
    oom = next(t for t in report.trials if t.outcome == "oom")
    assert oom.censored_peak_bytes and oom.step_time_s is None
    assert report.model is not None and report.model.best_candidate_key == report.winners[0].candidate_key


def test_renderers_carry_the_same_numbers(db, tmp_path):
    report = build_report(db, "s1")
    html = render_html(report, tmp_path / "r.html").read_text()
    md_files = render_markdown(report, tmp_path / "r.md")
    md = md_files[0].read_text()
    assert len(md_files) == 5 and all(f.stat().st_size > 1000 for f in md_files[1:])
    assert html.count("data:image/png;base64,") == 4
    winner = report.winners[0]
    for text in (html, md):
        assert f"×{winner.speedup:.3f}" in text and f"{winner.ci_low:.3f}–{winner.ci_high:.3f}" in text
        assert "fused-qkv.patch" in text and "model.py" in text
        assert f"{report.accelerator_hours:.4g}" in text
    headings = [b.text for b in outline(report) if type(b).__name__ == "Heading"]
    assert "Appendix: doctor" in headings and "Priors vs posteriors" in headings
    # Verification's cost, predicted from the doctor's step time, and the divergence rule, both in the contract table.
    from infrarsi.verdicts import verification as vf

    cost = vf.predicted_verify_cost(report.contract, report.doctor.step_time_s)
    for text in (html, md):
        assert f"= {cost.accelerator_s:,.0f} accelerator-s at most" in text
        assert "loss trend (verify)" in text
        assert "numeric parity (verify)" in text


def test_unknown_study_and_missing_table(tmp_path, db):
    with pytest.raises(LookupError):
        build_report(db, "nope")
    from infrarsi.report.source import ReportSourceError

    with pytest.raises(ReportSourceError):
        build_report(duckdb.connect(), "s1")


def test_the_view_reads_the_declared_event_columns_and_never_guesses(db):
    """report.source reads ``events`` by the event log's declared schema (``EVENT_COLUMNS``), one source of truth:
    the DB ``load_events`` builds has exactly those columns, and a table of another shape (here one whose
    payload sits in an envelope column, which the view used to dig out by guessing) is refused, naming what it
    lacks."""
    from infrarsi.eventlog.schema import EVENT_COLUMNS
    from infrarsi.report.source import ReportSourceError, ensure_view

    assert [row[0] for row in db.execute("DESCRIBE events").fetchall()] == list(EVENT_COLUMNS)
    other = duckdb.connect()
    other.execute("CREATE TABLE events (seq BIGINT, event_id VARCHAR, type VARCHAR, study_id VARCHAR, envelope JSON)")
    with pytest.raises(ReportSourceError, match=r"lacks the analyst schema's columns \['stream', 'subject', 'trial_id'"
                       r".*infrarsi replay --from-scratch"):
        ensure_view(other)


def test_a_coarse_study_says_so_and_names_what_went_unchecked(tmp_path):
    """A study of a job without a probe: every trial coarse, verdicts with unchecked invariants."""
    import msgspec
    from infrarsi import events as ev

    unchecked = [ev.UncheckedInvariant(name="loss", reason="no probe"), ev.UncheckedInvariant(name="work.tokens", reason="no probe")]
    events = []
    for event in synthetic_study("c1", write_workload(tmp_path / "workload"), seed=3):
        match event.payload:
            case ev.TrialMeasured() as m:
                event = msgspec.structs.replace(event, payload=msgspec.structs.replace(m, coarse=True, unchecked_invariants=unchecked))
            case ev.VerifyCompleted() as v:
                event = msgspec.structs.replace(event, payload=msgspec.structs.replace(v, unchecked_invariants=["loss", "work.tokens"]))
        events.append(event)
    con = duckdb.connect(str(tmp_path / "analyst.duckdb"))
    load_events(con, list(enumerate(events, start=1)))
    report = build_report(con, "c1")
    assert all(t.coarse and t.unchecked_invariants == ["loss", "work.tokens"] for t in report.trials if t.step_time_s)
    assert all(v.unchecked_invariants == ["loss", "work.tokens"] for v in report.verdicts)
    md = render_markdown(report, tmp_path / "r.md")[0].read_text()
    assert "COARSE MEASUREMENT" in md and "UNCHECKED invariants (never counted as held): loss, work.tokens" in md
    assert md.count("| UNCHECKED |") == 2 * len(report.verdicts)
    con.close()


def test_a_coarse_study_whose_loss_came_from_the_log_says_so(tmp_path):
    """Issue 35: a coarse job that prints its loss is checked on it, and the report says where it came from."""
    import msgspec
    from infrarsi import events as ev

    unchecked = [ev.UncheckedInvariant(name="work.tokens", reason="no probe")]
    events = []
    for event in synthetic_study("c2", write_workload(tmp_path / "workload"), seed=3):
        if isinstance(event.payload, ev.TrialMeasured):
            event = msgspec.structs.replace(event, payload=msgspec.structs.replace(
                event.payload, coarse=True, unchecked_invariants=unchecked, loss_from_log=True))  # fmt: skip
        events.append(event)
    con = duckdb.connect(str(tmp_path / "analyst.duckdb"))
    load_events(con, list(enumerate(events, start=1)))
    report = build_report(con, "c2")
    measured = [t for t in report.trials if t.step_time_s]
    assert measured and all(t.loss_from_log for t in measured)
    md = render_markdown(report, tmp_path / "r.md")[0].read_text()
    assert f"The LOSS of {len(measured)} of these trials was READ FROM THE JOB'S LOG" in md
    assert "UNCHECKED invariants (never counted as held): work.tokens." in md
    con.close()


def test_a_probed_trial_with_timing_unchecked_is_named_in_the_report(tmp_path):
    """A trial with a probe but too few steady steps for the timing check: the report names the invariant
    unchecked on that trial instead of counting it as held (and says nothing of coarse measurement)."""
    import msgspec
    from infrarsi import events as ev

    unchecked = [ev.UncheckedInvariant(name="timing", reason="2 comparable steady steps (fewer than 3)")]
    events, marked = [], 0
    for event in synthetic_study("p1", write_workload(tmp_path / "workload"), seed=3):
        if isinstance(event.payload, ev.TrialMeasured) and marked < 2:
            marked += 1
            event = msgspec.structs.replace(event, payload=msgspec.structs.replace(event.payload, unchecked_invariants=unchecked))
        events.append(event)
    con = duckdb.connect(str(tmp_path / "analyst.duckdb"))
    load_events(con, list(enumerate(events, start=1)))
    md = render_markdown(build_report(con, "p1"), tmp_path / "r.md")[0].read_text()
    assert "UNCHECKED invariants on probe-measured trials (never counted as held): timing on 2 trial(s)" in md
    assert "COARSE MEASUREMENT" not in md
    con.close()
