"""``infrarsi report`` end to end against a real nats-server: publish a synthetic study's log, replay it into
a fresh analyst DB, render HTML/Markdown/PDF, publish ReportPublished — and every headline number of the
report equals a SQL query over that same DB."""

from __future__ import annotations

import argparse

import duckdb
import pytest
from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.bus.embedded import EmbeddedServer
from infrarsi.commands import report as report_cmd
from infrarsi.commands.study_log import read_study
from infrarsi.report import build_report
from infrarsi.report.source import VIEW, ensure_view
from support.synthetic_study import synthetic_study, write_workload

pytestmark = pytest.mark.integration


@pytest.fixture
def server(tmp_path):
    srv = EmbeddedServer.start(tmp_path / "nats")
    yield srv
    srv.stop()


async def test_report_from_replayed_log(server, tmp_path):
    study = ev.new_id()
    workload = write_workload(tmp_path / "workload")
    bus = await Bus.connect(server.url, service="test")
    try:
        await bus.publish_many(synthetic_study(study, workload, seed=5))
        # A second study on the same bus must not leak into this one's report.
        await bus.publish_many(synthetic_study(ev.new_id(), workload, seed=6)[:20])

        out = tmp_path / "out"
        args = argparse.Namespace(study=study, out=out, db=None, fresh=True, offline=False, format=None,
                                  nats_url=server.url, data_dir=tmp_path / "data")
        assert await report_cmd.run(args) == 0

        files = {p.name for p in out.iterdir()}
        assert {"report.html", "report.md", "report.pdf", "analyst.duckdb"} <= files
        assert len([f for f in files if f.endswith(".png")]) == 4
        assert (out / "report.pdf").read_bytes().startswith(b"%PDF")
        assert (out / "report.pdf").stat().st_size > 20_000

        events, _ = await read_study(bus, study)
        published = [e.payload for e in events if isinstance(e.payload, ev.ReportPublished)]
        assert len(published) == 1 and len(published[0].files) == 7

        con = duckdb.connect(str(out / "analyst.duckdb"))
        report = build_report(con, study)
        ensure_view(con)
        q = lambda sql: con.execute(sql, {"study": study}).fetchall()  # noqa: E731
        total_s = q(f"SELECT sum(CAST(payload->>'accelerator_s' AS DOUBLE)) FROM {VIEW} WHERE study_id=$study AND type='TrialFinished'")[0][0]
        assert report.accelerator_hours == pytest.approx(total_s / 3600)
        oom_s = q(f"SELECT sum(CAST(payload->>'accelerator_s' AS DOUBLE)) FROM {VIEW} WHERE study_id=$study AND type='TrialFinished' AND payload->>'status'='oom'")[0][0]
        assert report.cost_by_outcome["oom"] == pytest.approx(oom_s / 3600)
        finished = q(f"SELECT count(DISTINCT trial_id) FROM {VIEW} WHERE study_id=$study AND type='TrialFinished'")[0][0]
        assert sum(report.trials_by_outcome.values()) == finished
        promotable = q(f"""SELECT payload->>'candidate_key', CAST(payload->>'speedup' AS DOUBLE), CAST(payload->>'ci_low' AS DOUBLE),
                                  CAST(payload->>'mfu_before' AS DOUBLE), CAST(payload->>'mfu_after' AS DOUBLE)
                           FROM {VIEW} WHERE study_id=$study AND type='VerifyCompleted' AND CAST(payload->>'promotable' AS BOOLEAN)""")
        assert [(w.candidate_key, w.speedup, w.ci_low, w.mfu_before, w.mfu_after) for w in report.winners] == [
            (k, pytest.approx(s), pytest.approx(lo), pytest.approx(mb), pytest.approx(ma)) for k, s, lo, mb, ma in promotable
        ]
        assert published[0].winners == [w.candidate_key for w in report.winners]
        doctor_t = q(f"SELECT CAST(payload->>'step_time_s' AS DOUBLE) FROM {VIEW} WHERE study_id=$study AND type='DoctorCompleted'")[0][0]
        assert report.baseline_step_s == pytest.approx(doctor_t)
        con.close()

        html = (out / "report.html").read_text()
        w = report.winners[0]
        assert f"×{w.speedup:.3f}" in html and f"{report.accelerator_hours:.4g}" in html
        assert "+        q, k, v = self.qkv(x)" in html.replace("&#x27;", "'")
    finally:
        await bus.close()
