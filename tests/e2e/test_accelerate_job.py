"""A job started with Hugging Face Accelerate's launcher (``accelerate launch``, the project's pinned
``accelerate``), written as Accelerate's documentation writes one and never changed (issue 35, item 5):
drafted by ``infrarsi scaffold`` from the command its README gives, then a trial as drafted (default suite),
and (slow) the five stages with every work and loss invariant checked: the steps counted in its output, its
tokens (the steps × the global batch × the ``--seq_len`` the draft states), its loss and step times read from
its log.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.accelerate_job import GOLDEN_COMMAND, make_accelerate_repo
from support.user_jobs import five_stages, scaffold, trial_json

STEPS = 10


def drafted(root: Path) -> tuple[Path, Path]:
    """(repo, contract): the repo made and its contract drafted by the CLI, used as drafted."""
    repo = make_accelerate_repo(root / "acc")
    contract = root / "contract.yaml"
    proc = scaffold(repo, contract, GOLDEN_COMMAND)
    assert proc.returncode == 0, proc.stderr
    return repo, contract


@pytest.mark.timeout(960)
def test_an_accelerate_launch_job_goes_through_scaffold_and_trial_unchanged(tmp_path: Path) -> None:
    _repo, contract = drafted(tmp_path)
    workload = yaml.safe_load(contract.read_text())["workload"]
    assert workload["command"][:3] == ["{python}", "-m", "accelerate.commands.launch"] and workload["inputs"] == ["data"]
    returncode, report = trial_json(contract, tmp_path / "data", STEPS, "per_device_train_batch_size=8", timeout_s=900)
    for run in (report["baseline"], report["candidate"][0]):
        m, f = run["measured"], run["finished"]
        assert f["status"] == "ok" and m["status"] == "ok", (f.get("reason"), f.get("output_tail"), m["invariants"])
        assert f["steps_completed"] == STEPS and m["loss_from_log"]
    checks = {i["name"]: i for i in report["candidate"][0]["measured"]["invariants"]}
    assert checks["work.optimizer_steps"]["ok"] and checks["loss"]["ok"] and checks["timing"]["ok"], checks
    # the tokens: the steps counted × global batch 8 × the script's --seq_len 16, which the draft states
    tokens = checks["work.tokens"]
    assert tokens["ok"] and tokens["observed"] == STEPS * 8 * 16 and "derived" in tokens["detail"], tokens
    assert report["candidate"][0]["measured"]["unchecked_invariants"] == []
    assert returncode == 0, report


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_an_accelerate_launch_job_through_the_five_stages(tmp_path: Path) -> None:
    _repo, contract = drafted(tmp_path)
    proc, summary = five_stages(contract, tmp_path / "data")
    assert summary, (proc.stdout + proc.stderr)[-4000:]
    assert "verified" in summary  # the verdict is stated, whichever it is
    by_name = {i["name"]: i for i in summary["invariants"]}
    assert by_name["loss"]["ok"] and not by_name["loss"]["detail"].startswith("not checked"), by_name["loss"]
    assert by_name["work.optimizer_steps"]["ok"] and by_name["timing"]["ok"], by_name
    assert "not checked" not in by_name["loss"]["detail"], by_name["loss"]  # every run's loss compared
    assert by_name["loss.trend"]["ok"], by_name
    # the tokens derived from the steps counted and the sequence the draft states; nothing left unchecked
    assert by_name["work.tokens"]["ok"], by_name
    assert summary["unchecked_invariants"] == [], summary["unchecked_invariants"]
    assert Path(summary["report"]).is_file()
