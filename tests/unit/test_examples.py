"""The own-job examples (examples/hf-trainer, examples/lightning, examples/torchrun) stay consistent: each contract passes the
validation ``infrarsi init`` runs, its knobs are flags of the golden command, every patch of its library
applies to the example as it is and leaves sources that compile, and the downstream evaluation its contract
ships (commented out) loads once uncommented. (Running them end to end is ``tests/e2e/test_own_jobs.py``; the
planted verify candidates, ``tests/e2e/test_verify_examples_planted.py`` and ``test_verify_restart_downstream.py``.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from infrarsi.study.contract import load_contract
from infrarsi.study.scaffold import default_step_regex
from support.tiny_verify import EXAMPLE_DOWNSTREAM

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


def test_the_reward_hack_breaks_the_optimiser_steps(example: Path) -> None:
    library = load_contract(example / "contract.yaml").patch_library()
    (hack,) = [p for p in library.values() if p.kind == "reward_hack"]
    assert hack.breaks == "work.optimizer_steps"


def test_every_patch_applies_to_the_example_and_compiles(example: Path, tmp_path: Path) -> None:
    library = load_contract(example / "contract.yaml").patch_library()
    for patch_id, info in library.items():
        work = tmp_path / patch_id
        work.mkdir()
        for name in info.files:
            shutil.copy(example / name, work / name)
        subprocess.run(["git", "init", "-q", str(work)], check=True)
        proc = subprocess.run(["git", "apply", str(example / "patches" / f"{patch_id}.diff")],
                              cwd=work, capture_output=True, text=True)  # fmt: skip
        assert proc.returncode == 0, (patch_id, proc.stderr)
        for name in info.files:
            proc = subprocess.run([sys.executable, "-m", "py_compile", str(work / name)], capture_output=True, text=True)
            assert proc.returncode == 0, (patch_id, proc.stderr)


@pytest.mark.parametrize("name", ["hf-trainer", "lightning"])
def test_the_commented_downstream_evaluation_loads_once_uncommented(name: str, tmp_path: Path) -> None:
    """The block a user uncomments is the one the planted-candidate tests run (``EXAMPLE_DOWNSTREAM``)."""
    example = EXAMPLES / name
    text = (example / "contract.yaml").read_text()
    assert "  # downstream:\n" in text
    uncommented = text.replace("  # downstream:", "  downstream:").replace("  #   ", "    ")
    path = tmp_path / "contract.yaml"
    path.write_text(uncommented.replace("repo: .", f"repo: {example}"))
    assert load_contract(example / "contract.yaml").verify.downstream is None, "off as shipped"
    downstream = load_contract(path).verify.downstream
    assert downstream is not None and (example / downstream.command[1]).is_file()
    assert downstream.model_dump(include={"command", "metric", "tolerance"}) == EXAMPLE_DOWNSTREAM
