"""SIGKILL the launcher mid-trial, restart it: nothing of the trial survives, and the trial is recorded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from infrarsi import procs
from infrarsi.embedded import EmbeddedServer
from test_launcher_helpers import Harness, git_worktrees, make_workload

pytestmark = pytest.mark.integration


def start_launcher(url: str, data_dir, log) -> subprocess.Popen:
    env = {**os.environ, "INFRARSI_LAUNCHER_ACK_WAIT_S": "4"}
    return subprocess.Popen(
        [sys.executable, "-m", "infrarsi_services.launcher", "--nats-url", url, "--data-dir", str(data_dir)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


async def test_killed_launcher_leaves_nothing_after_restart(tmp_path) -> None:
    server = EmbeddedServer.start(tmp_path / "nats")
    data_dir = tmp_path / "data"
    h = Harness(server.url, data_dir)
    await h.open()
    log = open(tmp_path / "launcher.log", "ab")
    first = start_launcher(server.url, data_dir, log)
    second = None
    owner = f"{data_dir.absolute() / 'launcher' / 'trials'}|"
    try:
        study = await h.create_study(make_workload(tmp_path))
        study_repo = data_dir / "studies" / study / "workload"
        trial = await h.propose(study, knobs={"knobs.mode": "sleep"})
        await h.wait_for(trial, "TrialLaunched", timeout_s=60)
        deadline = time.monotonic() + 20
        while not procs.tagged_processes(owner) and time.monotonic() < deadline:
            time.sleep(0.05)
        orphans = procs.tagged_processes(owner)
        assert orphans and git_worktrees(study_repo)

        first.send_signal(signal.SIGKILL)
        first.wait()
        assert all(p.is_running() for p in orphans)  # the job outlived its launcher…

        second = start_launcher(server.url, data_dir, log)
        deadline = time.monotonic() + 30
        while (procs.tagged_processes(owner) or git_worktrees(study_repo)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert procs.tagged_processes(owner) == []  # …until the next life reaped it
        assert git_worktrees(study_repo) == []

        finished = await h.wait_for(trial, "TrialFinished", timeout_s=60)
        assert finished.status == "cancelled" and "killed mid-trial" in finished.reason
        assert finished.infrastructure, "the harness failed, not the candidate: the proposer re-runs it"
        assert finished.wall_s > 0 and finished.accelerator_s == pytest.approx(finished.wall_s)

        # the restarted launcher runs new trials normally
        again = await h.propose(study)
        assert (await h.wait_for(again, "TrialFinished", timeout_s=60)).status == "ok"
        assert procs.tagged_processes(owner) == [] and git_worktrees(study_repo) == []
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(20)
        procs.kill_all(procs.tagged_processes(owner), grace_s=1.0)
        await h.close()
        server.stop()
