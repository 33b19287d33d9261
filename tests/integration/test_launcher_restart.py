"""SIGKILL the launcher mid-trial, restart it: nothing of the trial survives, and the trial is recorded."""

from __future__ import annotations

import signal
import time

import pytest
from infrarsi.trial import procs
from test_launcher_helpers import git_worktrees, launcher_processes, make_workload, serving

pytestmark = pytest.mark.integration


async def test_killed_launcher_leaves_nothing_after_restart(tmp_path) -> None:
    data_dir = tmp_path / "data"
    owner = f"{data_dir.absolute() / 'launcher' / 'trials'}|"
    async with serving(tmp_path) as h:
        try:
            with launcher_processes(h, tmp_path / "launcher.log") as launchers:
                first = launchers.start()
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

                launchers.start()
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
            procs.kill_all(procs.tagged_processes(owner), grace_s=1.0)

