"""The launcher delivers knob values as flags, environment variables and overrides to a real job (a real
nats-server, a real git workload, a real subprocess that records what it was given), and refuses a value
that would become an extra argument before anything runs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_launcher_helpers import Harness, commit_all, launcher, serving

pytestmark = pytest.mark.integration

JOB = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    seen = {"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items() if k.startswith("KNOB_")}}
    Path(os.environ["INFRARSI_PROBE_DIR"], "seen.json").write_text(json.dumps(seen))
    """
)


def workload(root: Path, via: str, command: list[str], knobs: dict[str, Any], **extra: Any) -> Path:
    repo = root / "workload"
    repo.mkdir()
    (repo / "job.py").write_text(JOB)
    commit_all(repo)
    contract = {
        "name": f"delivery-{via}",
        "goal": "deliver knobs",
        "workload": {"repo": "workload", "command": ["{python}", "job.py", *command], "knobs_via": via,
                     "steps": 3, "verify_steps": 3, **extra},  # fmt: skip
        "cluster": {"id": "test-cpu", "accelerator": "cpu", "memory_capacity_bytes": 1 << 30, "peak_flops": 1e11},
        "backend": {"kind": "local", "timeout_s": 30},
        "scope": {"files": [], "launch_keys": list(knobs)},
        "search_space": {"knobs": knobs},
        "invariants": {"loss": {"tolerance": 0.01}},
        "budget": {"trials": 3, "accelerator_hours": 1.0},
    }
    path = root / "contract.yaml"
    path.write_text(yaml.safe_dump(contract, sort_keys=False))
    return path


@pytest.fixture
async def harness(tmp_path):
    async with serving(tmp_path, launcher) as h:
        yield h


async def run_trial(h: Harness, contract: Path, knobs: dict[str, Any]) -> dict[str, Any]:
    study = await h.create_study(contract)
    trial = await h.propose(study, knobs=knobs)
    finished = await h.wait_for(trial, "TrialFinished")
    assert finished.status == "ok", (finished.reason, finished.output_tail)
    return json.loads((h.data_dir / "launcher" / "trials" / trial / "probe" / "seen.json").read_text())


async def test_argv_delivery(harness, tmp_path) -> None:
    contract = workload(
        tmp_path, "argv", ["--per_device_train_batch_size", "8", "--bf16", "0", "--max_steps", "100"],
        {"--per_device_train_batch_size": {"type": "int", "choices": [4, 8]}, "bf16": {"type": "bool"},
         "torch_compile": {"type": "bool"}, "optim": {"type": "choice", "choices": ["adamw_torch", "adamw_torch_fused"]}},
        steps_key="--max_steps",
    )  # fmt: skip
    seen = await run_trial(harness, contract, {"per_device_train_batch_size": 4, "bf16": True, "torch_compile": True,
                                                 "optim": "adamw_torch_fused"})  # fmt: skip
    assert seen["argv"] == ["--per_device_train_batch_size", "4", "--bf16", "1", "--max_steps", "3",
                            "--torch_compile", "--optim", "adamw_torch_fused"]  # fmt: skip


async def test_env_delivery(harness, tmp_path) -> None:
    contract = workload(
        tmp_path, "env", [], {"KNOB_MB": {"type": "int", "choices": [4, 8]}, "KNOB_BF16": {"type": "bool"}},
        steps_key="KNOB_STEPS", env={"KNOB_MB": "8", "KNOB_BF16": "false"},
    )  # fmt: skip
    seen = await run_trial(harness, contract, {"KNOB_MB": 4, "KNOB_BF16": True})
    assert seen == {"argv": [], "env": {"KNOB_MB": "4", "KNOB_BF16": "true", "KNOB_STEPS": "3"}}


async def test_overrides_delivery(harness, tmp_path) -> None:
    contract = workload(
        tmp_path, "overrides", ["trainer.precision=32-true", "+data.workers=0"],
        {"trainer.precision": {"type": "choice", "choices": ["32-true", "bf16-mixed"]},
         "data.workers": {"type": "int", "low": 0, "high": 2}},
        steps_key="trainer.max_steps",
    )  # fmt: skip
    seen = await run_trial(harness, contract, {"trainer.precision": "bf16-mixed", "data.workers": 2})
    assert seen["argv"] == ["trainer.precision=bf16-mixed", "+data.workers=2", "trainer.max_steps=3"]


@pytest.mark.parametrize("value", ["--output_dir=/etc", "adamw\n--lr=1", "-x"])
async def test_an_injecting_value_is_refused_before_anything_runs(harness, tmp_path, value) -> None:
    contract = workload(
        tmp_path, "argv", ["--optim", "adamw_torch"],
        {"optim": {"type": "choice", "choices": ["adamw_torch", "adamw_torch_fused"]}}, steps_key="max_steps",
    )  # fmt: skip
    study = await harness.create_study(contract)
    trial = await harness.propose(study, knobs={"optim": value})
    finished = await harness.wait_for(trial, "TrialFinished")
    assert finished.status == "scope_violation"
    assert finished.reason.startswith("optim: knob optim: value"), finished.reason
    assert "TrialLaunched" not in harness.events[trial]


async def test_a_json_config_file_is_copied_per_trial_as_json(harness, tmp_path) -> None:
    """Issue 35: a job that reads a JSON config the command names gets a JSON copy with the knobs set."""
    contract = workload(
        tmp_path, "launch_file", ["--config", "{launch_file}"],
        {"data.batch_size": {"type": "int", "choices": [4, 8]}}, steps_key="trainer.max_steps", launch_file="recipe.json",
    )  # fmt: skip
    repo = tmp_path / "workload"
    (repo / "recipe.json").write_text(json.dumps({"trainer": {"max_steps": 100}, "data": {"batch_size": 8, "path": "d"}}))
    commit_all(repo)
    seen = await run_trial(harness, contract, {"data.batch_size": 4})
    assert seen["argv"][0] == "--config" and seen["argv"][1].endswith("launch.json")
    copy = json.loads(Path(seen["argv"][1]).read_text())  # JSON, as the job's json.load needs
    assert copy == {"trainer": {"max_steps": 3}, "data": {"batch_size": 4, "path": "d"}}
