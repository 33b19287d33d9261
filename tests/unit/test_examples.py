"""The own-job examples (examples/hf-trainer, examples/lightning, examples/torchrun) stay consistent: each contract passes the
validation ``infrarsi init`` runs, its knobs are flags of the golden command, and its patch library's
reward hack applies to the example as it is. (Running them end to end is ``tests/e2e/test_own_jobs.py``.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from infrarsi.study.contract import load_contract
from infrarsi.study.scaffold import default_step_regex

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(params=["hf-trainer", "lightning", "torchrun"])
def example(request: pytest.FixtureRequest) -> Path:
    return EXAMPLES / request.param


def test_the_contract_passes_inits_validation(example: Path) -> None:
    contract = load_contract(example / "contract.yaml")
    assert contract.workload.knobs_via == "argv" and contract.workload.repo == example
    command = contract.workload.command
    for knob in contract.search_space.knobs:
        assert f"--{knob}" in command, knob  # the golden command line is the baseline of every knob
    gb = contract.search_space.constraints.global_batch
    assert gb is not None and f"--{gb.accumulation_key}" in command
    script = (example / "train.py").read_text()
    if example.name == "torchrun":  # nothing of InfraRSI: measured coarsely, steps counted in its output
        assert "infrarsi" not in script and contract.workload.measurement.kind == "coarse"
        assert contract.workload.measurement.step_regex == default_step_regex("plain")  # the scaffold's, as written
    else:
        assert "InfraRSICallback()" in script  # the one line


def test_the_reward_hack_applies_to_the_example(example: Path, tmp_path: Path) -> None:
    library = load_contract(example / "contract.yaml").patch_library()
    (hack,) = [p for p in library.values() if p.kind == "reward_hack"]
    assert hack.breaks == "work.optimizer_steps"
    shutil.copy(example / "train.py", tmp_path / "train.py")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    proc = subprocess.run(["git", "apply", "--check", str(example / "patches" / f"{hack.id}.diff")],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
