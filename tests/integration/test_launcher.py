"""The launcher and telemetry services against a real nats-server, on a synthetic workload (no torch).

Covers: every scope escape refused before anything runs; textual and run-time patch conflicts; crash,
timeout and emulated OOM told apart; cost accounting; a baseline and a candidate measured with their
invariants; no process or worktree outliving its trial.
"""

from __future__ import annotations

import pytest
from infrarsi.trial import procs
from test_launcher_helpers import Harness, git_worktrees, launcher, make_workload, serving, telemetry

pytestmark = pytest.mark.integration


@pytest.fixture
async def harness(tmp_path):
    async with serving(tmp_path, launcher, telemetry) as h:
        yield h


def assert_clean(h: Harness, study_repo) -> None:
    assert procs.tagged_processes(f"{h.data_dir.absolute() / 'launcher' / 'trials'}|") == []
    assert git_worktrees(study_repo) == []


@pytest.mark.parametrize(
    ("knobs", "patches", "fragment"),
    [
        ({"knobs.extra": 1}, [], "not a knob"),
        ({"run.steps": 3}, [], "not a knob"),
        ({"knobs.sleep": "fast"}, [], "expected a number"),
        ({"knobs.mode": "rm -rf /"}, [], "is not one of"),
        ({}, ["not-in-library"], "not in search_space.patches"),
        ({}, ["dotdot"], ".."),
        ({}, ["absolute"], "absolute"),
        ({}, ["locked"], "not editable"),
        ({}, ["new-symlink"], "symlink"),
        ({}, ["through-link"], "outside the worktree"),
        ({}, ["binary"], "binary"),
    ],
    ids=["unknown-key", "locked-key", "wrong-type", "bad-choice", "unknown-patch", "dotdot", "absolute",
         "locked-file", "new-symlink", "through-link", "binary"],
)  # fmt: skip
async def test_scope_escape_is_refused_before_anything_runs(harness, tmp_path, knobs, patches, fragment) -> None:
    study = await harness.create_study(make_workload(tmp_path))
    trial = await harness.propose(study, knobs=knobs, patches=patches)
    finished = await harness.wait_for(trial, "TrialFinished")
    assert finished.status == "scope_violation", finished
    assert fragment in finished.reason
    assert finished.accelerator_s == 0.0
    assert "TrialLaunched" not in harness.events[trial]
    tdir = harness.data_dir / "launcher" / "trials" / trial
    assert not (tdir / "job.json").exists() and not (tdir / "worktree").exists()


async def test_baseline_candidate_conflicts_crash_timeout_and_oom(harness, tmp_path) -> None:
    contract = make_workload(tmp_path, timeout_s=6.0, capacity=300 << 20)
    study = await harness.create_study(contract)
    study_repo = harness.data_dir / "studies" / study / "workload"

    base = await harness.propose(study, kind="baseline")
    measured = await harness.wait_for(base, "TrialMeasured")
    finished = harness.events[base]["TrialFinished"]
    assert finished.status == "ok" and measured.status == "ok", (finished.output_tail, measured)
    assert measured.invariants_ok, measured.invariants
    assert measured.steps == 12 and measured.optimizer_steps == 12 and measured.tokens == 12 * 4096
    assert measured.warmup_steps == 2
    assert measured.step_time_s == pytest.approx(0.1, abs=0.05)
    assert measured.mfu == pytest.approx(1e9 / (measured.step_time_s * 1e11), rel=1e-6)
    assert len(finished.step_seen_s) == 12
    assert finished.accelerator_s == pytest.approx(finished.wall_s)
    assert finished.warmup_accelerator_s + finished.steady_accelerator_s == pytest.approx(finished.accelerator_s)
    assert 0 < finished.warmup_accelerator_s < finished.accelerator_s
    launched = harness.events[base]["TrialLaunched"]
    assert launched.command[1:3] == ["job.py", str(harness.data_dir.absolute() / "launcher" / "trials" / base / "launch.yaml")]

    cand = await harness.propose(study, patches=["faster"], knobs={"knobs.sleep": 0.1})
    measured = await harness.wait_for(cand, "TrialMeasured")
    assert measured.status == "ok" and measured.invariants_ok, measured.invariants
    assert {r.name for r in measured.invariants} >= {"loss", "work.tokens", "work.eval", "timing"}

    textual = await harness.propose(study, patches=["slow-a", "slow-b"])
    finished = await harness.wait_for(textual, "TrialFinished")
    assert finished.status == "patch_conflict" and "slow-b" in finished.reason
    assert "TrialLaunched" not in harness.events[textual]

    runtime = await harness.propose(study, patches=["a-on", "b-on"])
    finished = await harness.wait_for(runtime, "TrialFinished")
    assert finished.status == "patch_conflict" and "run-time conflict" in finished.reason, finished
    assert "TypeError" in finished.reason and finished.accelerator_s > 0

    crash = await harness.propose(study, knobs={"knobs.mode": "crash"})
    finished = await harness.wait_for(crash, "TrialFinished")
    assert finished.status == "crash" and "boom at step 3" in finished.reason
    assert finished.steps_completed == 3 and finished.exit_code == 1
    measured = await harness.wait_for(crash, "TrialMeasured")
    assert measured.status == "crash" and measured.steps == 3 and not measured.invariants_ok

    timeout = await harness.propose(study, knobs={"knobs.mode": "sleep"})
    finished = await harness.wait_for(timeout, "TrialFinished")
    assert finished.status == "timeout" and finished.wall_s >= 6.0
    assert finished.accelerator_s == pytest.approx(finished.wall_s)

    oom = await harness.propose(study, knobs={"knobs.mode": "hog"})
    finished = await harness.wait_for(oom, "TrialFinished")
    assert finished.status == "oom", finished
    assert finished.censored_peak_bytes > 300 << 20
    assert finished.memory_capacity_bytes == 300 << 20
    assert "emulated capacity" in finished.reason
    measured = await harness.wait_for(oom, "TrialMeasured")
    assert measured.status == "oom"
    assert_clean(harness, study_repo)
