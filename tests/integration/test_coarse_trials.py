"""Coarse measurement of a job with no probe: a real plain-PyTorch training script (argparse flags, a
``step N loss X`` log line, nothing of InfraRSI's) through the real launcher and telemetry services on a
real nats-server. The trial is measured from outside and labelled coarse; what cannot be checked is named
unchecked; the steps counted in the output are checked against the horizon."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support.toy_job import toy_job_script
from test_launcher_helpers import commit_all, launcher, serving, telemetry

pytestmark = pytest.mark.integration

TRAIN = toy_job_script(
    flags={"stop_early": 0},
    body="""
    steps = args.max_steps // 2 if args.stop_early else args.max_steps
    for step in range(steps):
        loss = sgd_step(step)
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    """,
)


def workload(root: Path, *, step_regex: str | None) -> Path:
    repo = root / "job"
    repo.mkdir()
    (repo / "train.py").write_text(TRAIN)
    commit_all(repo)
    contract: dict[str, Any] = {
        "name": "coarse",
        "goal": "measure a job without a probe",
        "workload": {
            "repo": "job", "command": ["{python}", "train.py", "--batch_size", "16", "--stop_early", "0"],
            "knobs_via": "argv", "steps": 20, "steps_key": "max_steps", "verify_steps": 20,
            "measurement": {"kind": "coarse", "step_regex": step_regex},
        },
        "cluster": {"id": "test-cpu", "accelerator": "cpu", "memory_capacity_bytes": 4 << 30, "peak_flops": 1e11},
        "backend": {"kind": "local", "timeout_s": 120},
        "scope": {"files": [], "launch_keys": ["stop_early"]},
        "search_space": {"knobs": {"stop_early": {"type": "bool"}}},
        "invariants": {"loss": {"tolerance": 0.05}, "eval": False},
        "budget": {"trials": 3, "accelerator_hours": 1.0},
    }  # fmt: skip
    path = root / "contract.yaml"
    path.write_text(yaml.safe_dump(contract, sort_keys=False))
    return path


@pytest.fixture
async def harness(tmp_path):
    async with serving(tmp_path, launcher, telemetry) as h:
        yield h


async def test_a_job_without_a_probe_gets_a_coarse_measured_trial(harness, tmp_path) -> None:
    study = await harness.create_study(workload(tmp_path, step_regex=r"^step (?P<index>\d+) loss"))
    base = await harness.propose(study, kind="baseline")
    measured = await harness.wait_for(base, "TrialMeasured", timeout_s=120)
    finished = harness.events[base]["TrialFinished"]
    assert finished.status == "ok", finished.output_tail
    assert finished.steps_completed == 20 and finished.output_steps[-1].steps_done == 20
    assert measured.coarse and measured.status == "ok" and measured.invariants_ok, measured
    assert measured.steps == 20 and measured.optimizer_steps == 20
    assert 0 < measured.step_time_s < finished.wall_s / 2
    assert measured.peak_memory_bytes and measured.peak_memory_bytes[0] > 10 << 20  # torch's RSS, process tree
    assert measured.mfu is None and measured.tokens_per_s == 0.0
    checked = {i.name: i for i in measured.invariants}
    assert set(checked) == {"scope", "work.optimizer_steps"} and "counted in the job's output" in checked["work.optimizer_steps"].detail
    assert {u.name for u in measured.unchecked_invariants} == {"work.tokens", "timing"}  # a baseline has no loss check

    # a candidate that quietly does half the steps is caught by the counted steps; loss is named unchecked
    hack = await harness.propose(study, knobs={"stop_early": True})
    measured = await harness.wait_for(hack, "TrialMeasured", timeout_s=120)
    assert measured.coarse and measured.status == "invariant_violation" and not measured.invariants_ok
    assert [i.name for i in measured.invariants if not i.ok] == ["work.optimizer_steps"]
    assert {u.name for u in measured.unchecked_invariants} == {"work.tokens", "loss", "timing"}


async def test_without_a_step_pattern_steps_are_unchecked_not_passed(harness, tmp_path) -> None:
    study = await harness.create_study(workload(tmp_path, step_regex=None))
    trial = await harness.propose(study, knobs={"stop_early": True})
    measured = await harness.wait_for(trial, "TrialMeasured", timeout_s=120)
    assert measured.coarse and measured.status == "ok"
    assert [i.name for i in measured.invariants] == ["scope"]
    assert {u.name for u in measured.unchecked_invariants} == {"work.optimizer_steps", "work.tokens", "loss", "timing"}
    assert measured.step_time_s == pytest.approx(harness.events[trial]["TrialFinished"].wall_s / 20)
