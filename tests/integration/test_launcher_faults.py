"""The launcher when a trial cannot be run at all (issue 16, item 5): every proposal gets a ``TrialFinished``.

Covers: a command item that is no executable (``"{launch_file}; touch x"``: no shell, one literal path) is a
``crash`` with the reason at once, nothing run and nothing retried; a valid proposal whose handling keeps
failing (a study the launcher never heard of) is retried with backoff, then finished as a ``crash`` naming
the error, and is never dead-lettered.
"""

from __future__ import annotations

import time

import pytest
import yaml
from infrarsi.bus.embedded import EmbeddedServer
from infrarsi.bus.subjects import LIFECYCLE_STREAM, deadletter_subject
from infrarsi.events import new_id
from infrarsi.runtime.service import MAX_DELIVER
from infrarsi_services.launcher.service import LauncherService
from test_launcher_helpers import Harness, make_workload

pytestmark = pytest.mark.integration


@pytest.fixture
async def harness(tmp_path):
    server = EmbeddedServer.start(tmp_path / "nats")
    h = Harness(server.url, tmp_path / "data")
    await h.open()
    launcher = LauncherService(h.data_dir, nats_url=server.url)
    launcher.retry_delay_s = 0.2  # 0.2, 0.4, 0.8, 1.6 s between the tries
    await h.serve(launcher)
    yield h
    await h.close()
    server.stop()


async def test_a_job_that_cannot_start_is_a_crash_with_the_reason(harness, tmp_path) -> None:
    contract_path = make_workload(tmp_path)
    contract = yaml.safe_load(contract_path.read_text())
    contract["workload"]["command"] = ["{launch_file}; touch x", "{probe_dir}"]
    contract_path.write_text(yaml.safe_dump(contract))
    study = await harness.create_study(contract_path)

    started = time.monotonic()
    trial = await harness.propose(study, kind="baseline")
    finished = await harness.wait_for(trial, "TrialFinished", timeout_s=30.0)
    assert finished.status == "crash"
    assert "could not be started" in finished.reason and "touch x" in finished.reason
    assert time.monotonic() - started < 15.0, "a job that cannot start is not retried"
    assert "TrialLaunched" not in harness.events[trial]
    worktree_root = harness.data_dir / "studies" / study / "workload"
    assert not (worktree_root / "x").exists() and not list(tmp_path.glob("**/x"))


async def test_a_failing_handler_is_retried_then_finished_as_a_crash_never_dead_lettered(harness) -> None:
    unknown_study = new_id()
    trial = await harness.propose(unknown_study, kind="baseline")
    finished = await harness.wait_for(trial, "TrialFinished", timeout_s=60.0)
    assert finished.status == "crash"
    assert f"failed {MAX_DELIVER}x" in finished.reason and "unknown to the launcher" in finished.reason
    assert finished.infrastructure
    info = await harness.bus.js.stream_info(LIFECYCLE_STREAM, subjects_filter=deadletter_subject("launcher"))
    assert not info.state.subjects, "a valid event is never dead-lettered"
