"""``infrarsi scaffold`` on the examples' own launch commands (examples/hf-trainer, examples/lightning,
examples/torchrun), then ``infrarsi init`` on the draft as it stands, through the CLI against a real
nats-server."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from infrarsi.cli import main
from infrarsi.study.contract import load_contract

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

COMMANDS = {
    "hf-trainer": ["python", "train.py", "--output_dir", "out", "--max_steps", "20", "--per_device_train_batch_size", "2",
                   "--gradient_accumulation_steps", "8", "--use_cpu", "--logging_steps", "1", "--eval_strategy", "steps",
                   "--eval_steps", "10", "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
                   "--optim", "adamw_torch", "--attn_implementation", "eager"],
    "lightning": ["python", "train.py", "--max-steps", "20", "--batch-size", "2", "--accumulate-grad-batches", "8",
                  "--precision", "32-true", "--val-check-interval", "10", "--num-workers", "0"],
    "torchrun": ["OMP_NUM_THREADS=1", "torchrun", "--standalone", "--nproc-per-node", "1", "train.py", "--max_steps", "30",
                 "--batch_size", "4", "--grad_accum", "4"],
}  # fmt: skip
"""The launch commands the examples document (their contract.yaml headers)."""

EXPECTED_KNOBS = {
    "hf-trainer": {"per_device_train_batch_size", "bf16", "optim", "gradient_checkpointing", "torch_compile",
                   "dataloader_num_workers", "attn_implementation"},
    "lightning": {"batch-size", "precision", "num-workers"},
    "torchrun": {"batch_size", "bf16", "attention", "fused_adam", "num_workers"},
}  # fmt: skip


def pairs(args: list[str]) -> list[tuple[str, str | bool]]:
    out: list[tuple[str, str | bool]] = []
    for arg in args:
        if arg.startswith("--"):
            out.append((arg, True))
        else:
            out[-1] = (out[-1][0], arg)
    return out


def launch_value(text: str | bool):
    from infrarsi.trial.launch import scalar

    return text if isinstance(text, bool) else {"true": True, "false": False}.get(text, scalar(text))


def example_repo(tmp_path: Path, name: str) -> Path:
    """The example as a user has it: its own git repository, without the hand-narrowed contract."""
    repo = tmp_path / name
    shutil.copytree(EXAMPLES / name, repo, ignore=shutil.ignore_patterns("contract.yaml", "__pycache__", "out", "lightning_logs"))
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "example"], check=True)
    return repo


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_scaffold_then_init_accepts_the_draft(nats_server: str, tmp_path: Path, name: str, capsys) -> None:
    repo = example_repo(tmp_path, name)
    draft = tmp_path / f"{name}.yaml"  # outside the repo, as a user might keep it
    assert main(["scaffold", "--repo", str(repo), "--out", str(draft), "--", *COMMANDS[name]]) == 0
    contract = load_contract(draft)
    assert set(contract.search_space.knobs) == EXPECTED_KNOBS[name]
    with_callback = name != "torchrun"  # the plain script imports nothing of InfraRSI: measured coarsely
    assert contract.workload.knobs_via == "argv"
    assert contract.workload.measurement.kind == ("probe" if with_callback else "coarse")
    assert contract.search_space.constraints.global_batch.size == 16
    assert contract.invariants.eval == with_callback  # HF and Lightning evaluate at a fixed interval, seen by the probe
    # never searched: the learning rate, the seed, the eval cadence, the output directory
    searched = set(yaml.safe_load(draft.read_text())["search_space"]["knobs"])
    assert not searched & {"learning_rate", "lr", "seed", "eval_steps", "val-check-interval", "output_dir", "save_strategy"}
    # the baseline is the documented command, flag for flag, with every searched flag written out
    golden = contract.golden_values()
    script_args = COMMANDS[name][COMMANDS[name].index("train.py") + 1 :]
    assert all(golden[k.removeprefix("--")] == launch_value(v) for k, v in pairs(script_args))
    capsys.readouterr()
    assert main(["--nats-url", nats_server, "--data-dir", str(tmp_path / "data"), "init", str(draft)]) == 0
    study_id = capsys.readouterr().out.strip()
    golden = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", f"infrarsi/{study_id}/golden^{{commit}}"],
                            capture_output=True, text=True)  # fmt: skip
    assert golden.returncode == 0, golden.stderr  # the study exists, its golden baseline tagged in the repo
