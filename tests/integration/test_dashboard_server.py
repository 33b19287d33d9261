"""``infrarsi dashboard`` as a user runs it, against a real nats-server with authorization on: its JSON follows a
study's events as they land, it is read-only, it serves plotly.js itself, and beyond loopback it needs TLS and
the token. The browser's view of the same page: tests/e2e/test_dashboard_browser.py."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from infrarsi import eventlog
from infrarsi import events as ev
from infrarsi.bus import credentials
from infrarsi.bus.client import Bus
from infrarsi.bus.embedded import EmbeddedServer
from support.dashboard import INFRARSI, apply_events, running_dashboard
from support.synthetic_study import synthetic_study, write_workload

pytestmark = pytest.mark.integration


def _get(url: str, *, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None,
         method: str = "GET") -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _json(url: str) -> object:
    status, body = _get(url)
    assert status == 200, body
    return json.loads(body)


def _wait_for(check, timeout_s: float = 30.0, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(interval_s)


@pytest.fixture
def authorized(tmp_path):
    data = tmp_path / "data"
    with EmbeddedServer.start(data, authorize=True) as server:
        yield server.url, data


async def test_the_dashboard_follows_a_study_on_an_authorized_bus(authorized, tmp_path):
    url, data = authorized
    study = ev.new_id()
    bus = await Bus.connect(url, service="admin", data_dir=data)
    try:
        await bus.publish_many(synthetic_study(study, write_workload(tmp_path / "workload"), seed=1))
        with running_dashboard("--nats-url", url, "dashboard", "--port", "0", "--poll", "30", data_dir=data) as page:
            assert page.startswith("http://127.0.0.1:")
            studies = _wait_for(lambda: _json(page + "api/studies"))
            assert [s["study_id"] for s in studies] == [study]
            before = _json(f"{page}api/studies/{study}")
            assert len(before["trials"]) == studies[0]["trials"] > 20

            # A new trial lands on the bus: the dashboard shows it within a catch-up, not a poll (--poll 30).
            late = ev.Candidate(knobs={"micro_batch_size": 2})
            published = time.monotonic()
            await bus.publish(ev.make_event(
                ev.TrialProposed(candidate=late, candidate_key=late.key(), kind="search", origin="ei"),
                study_id=study, source="proposer", trial_id="late1", cluster_id="local"))
            after = _wait_for(lambda: (d := _json(f"{page}api/studies/{study}"))["trials"][-1]["trial_id"] == "late1"
                              and d, timeout_s=15)
            shown_after_s = time.monotonic() - published
            assert after["trials"][-1]["outcome"] == "proposed"
            assert shown_after_s < 8.0, f"the new trial took {shown_after_s:.2f}s to show"
            print(f"new trial shown {shown_after_s:.2f}s after its publish")

            # The page, its script and plotly.js come from the dashboard itself.
            status, html = _get(page)
            assert status == 200 and b"/vendor/plotly.min.js" in html and b"https://" not in html
            status, plotly_js = _get(page + "vendor/plotly.min.js")
            assert status == 200 and len(plotly_js) > 1_000_000 and b"plotly.js" in plotly_js[:2000]
            assert _get(page + "static/dashboard.js")[0] == 200

            # Read-only: nothing but GET.
            assert _get(page + "api/studies", method="POST")[0] == 405
            assert _get(f"{page}api/studies/{study}", method="DELETE")[0] == 405
            status, body = _get(page + "api/studies/nope")
            assert status == 404 and b"no study 'nope'" in body
            # A trial's own page: its JSON, an unknown trial or study named, read-only too.
            trial = _json(f"{page}api/studies/{study}/trials/search2")
            assert trial["trial"]["outcome"] == "oom" and trial["finish"]["finish_reason"] == "oom"
            status, body = _get(f"{page}api/studies/{study}/trials/nosuch")
            assert status == 404 and b"no trial 'nosuch'" in body
            assert _get(f"{page}api/studies/nope/trials/search2")[0] == 404
            assert _get(f"{page}api/studies/{study}/trials/search2", method="DELETE")[0] == 405

            # Server-sent events: the first message says which version of the DB the page sees.
            with urllib.request.urlopen(page + "api/stream", timeout=10) as stream:
                assert stream.headers["Content-Type"].startswith("text/event-stream")
                first = b"".join(stream.readline() for _ in range(3))
            assert b"event: version" in first and b"data: " in first
    finally:
        await bus.close()


def test_beyond_loopback_without_tls_is_refused(tmp_path):
    proc = subprocess.run([*INFRARSI, "--data-dir", str(tmp_path), "dashboard", "--host", "0.0.0.0", "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--host 0.0.0.0 is beyond loopback" in proc.stderr and "--tls-cert and --tls-key" in proc.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--port", "70000"], "--port 70000: not a TCP port"),
    (["--db", "/nonexistent.duckdb"], "--db /nonexistent.duckdb: no such file"),
    (["--tls-cert", "/etc/hostname"], "--tls-cert and --tls-key go together"),
])
def test_bad_options_are_named(tmp_path, args, message):
    proc = subprocess.run([*INFRARSI, "--data-dir", str(tmp_path), "dashboard", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_beyond_loopback_every_request_needs_the_token_over_tls(tmp_path):
    data = tmp_path / "data"
    study = ev.new_id()
    with eventlog.AnalystDB.open(tmp_path / "analyst.duckdb") as db:
        apply_events(db, synthetic_study(study, write_workload(tmp_path / "workload"), seed=2))
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    with running_dashboard("dashboard", "--host", "0.0.0.0", "--port", "0", "--db", str(tmp_path / "analyst.duckdb"),
                           "--tls-cert", str(cert), "--tls-key", str(key), data_dir=data) as page:
        assert page.startswith("https://0.0.0.0:")
        token_file = credentials.creds_dir(data) / "dashboard.token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        local = page.replace("0.0.0.0", "127.0.0.1")
        tls = ssl.create_default_context(cafile=str(cert))
        tls.check_hostname = False

        for path in ("", "api/studies", "vendor/plotly.min.js", "api/stream"):
            status, body = _get(local + path, context=tls)
            assert status == 401 and b"token is required" in body, path
        assert _get(local + "api/studies", context=tls, headers={"Authorization": "Bearer wrong"})[0] == 401
        status, body = _get(local + "api/studies", context=tls, headers={"Authorization": f"Bearer {token}"})
        assert status == 200 and [s["study_id"] for s in json.loads(body)] == [study]
        # Plain HTTP to a TLS listener gets nothing.
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(local.replace("https://", "http://") + "api/studies", timeout=10)
    assert os.path.exists(token_file)
