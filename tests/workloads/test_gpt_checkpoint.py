"""The reference GPT job's checkpoints (torch.distributed.checkpoint) and downstream evaluation, run as the
launcher runs them at verify: a run that saves mid-way and goes on, a fresh process that resumes from it, and
``evaluate.py`` on the final weights. The planted patches each break one of them and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import TINY, WORKLOAD, Run, rel_diff, run_workload, workload_copy

STEPS = int(str(TINY["run.steps"]))
SAVE_AT = 8


def _saving(tmp: Path, launch: str = "dense-1node", **kwargs: Any) -> Run:
    env = {"INFRARSI_CHECKPOINT_DIR": str(tmp / "ckpt"), "INFRARSI_CHECKPOINT_STEP": str(SAVE_AT),
           "INFRARSI_FINAL_WEIGHTS_DIR": str(tmp / "final")}  # fmt: skip
    return run_workload(tmp, launch, env=env, **kwargs)


def _resumed(tmp: Path, checkpoint: Path, launch: str = "dense-1node", **kwargs: Any) -> Run:
    return run_workload(tmp, launch, env={"INFRARSI_RESUME_FROM": str(checkpoint)}, **kwargs)


def _perplexity(workdir: Path, launch: Path, weights: Path) -> float:
    args = [sys.executable, "evaluate.py", "--launch-file", str(launch), "--weights", str(weights)]
    done = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=120, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["perplexity"])


def _tiny_launch(tmp: Path) -> Path:
    """The dense-1node launch file with ``TINY``'s overrides, for ``evaluate.py`` (which takes no ``--set``)."""
    tree = yaml.safe_load((WORKLOAD / "launch" / "dense-1node.yaml").read_text())
    for dotted, value in TINY.items():
        section, key = dotted.split(".")
        tree.setdefault(section, {})[key] = value
    path = tmp / "tiny-launch.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    tmp = tmp_path_factory.mktemp("saved")
    return tmp, _saving(tmp)


def test_a_fresh_process_resumed_mid_run_continues_the_uninterrupted_curve_exactly(
    saved: tuple[Path, Run], tmp_path: Path
) -> None:
    tmp, uninterrupted = saved
    assert [r.step for r in uninterrupted.rank0] == list(range(STEPS)), "saving does not interrupt the run"
    assert json.loads((tmp / "ckpt" / "infrarsi-step.json").read_text()) == {"steps_done": SAVE_AT}
    resumed = _resumed(tmp_path, tmp / "ckpt")
    assert [r.step for r in resumed.rank0] == list(range(SAVE_AT, STEPS))
    assert rel_diff(resumed.losses(), uninterrupted.losses()[SAVE_AT:]) < 1e-6
    assert resumed.eval_losses() == [e for e in uninterrupted.eval_losses() if e[0] >= SAVE_AT]


def test_resuming_an_incomplete_checkpoint_fails_naming_it(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    run = _resumed(tmp_path, tmp_path / "empty", check=False)
    assert run.returncode != 0 and "is not a complete checkpoint" in run.output


def test_checkpoint_weights_only_leaves_the_curve_only_after_a_resume(saved: tuple[Path, Run], tmp_path: Path) -> None:
    tmp, uninterrupted = saved
    from_zero = run_workload(tmp_path / "zero", "dense-1node", patches=["checkpoint-weights-only"])
    assert from_zero.losses() == uninterrupted.losses()  # the patch is invisible without a resume
    resumed = _resumed(tmp_path, tmp / "ckpt", patches=["checkpoint-weights-only"])
    assert [r.step for r in resumed.rank0] == list(range(SAVE_AT, STEPS))
    assert rel_diff(resumed.losses(), uninterrupted.losses()[SAVE_AT:]) > 0.005  # beyond the contract's ε


def test_evaluate_scores_the_final_weights_and_eval_mode_early_exit_is_worse(
    saved: tuple[Path, Run], tmp_path: Path
) -> None:
    tmp, uninterrupted = saved
    launch = _tiny_launch(tmp_path)
    baseline = _perplexity(WORKLOAD, launch, tmp / "final")
    assert 1.0 < baseline < TINY["model.vocab_size"]  # learnt something, finite
    patched_dir = tmp_path / "patched"
    patched_dir.mkdir()
    patched = _saving(patched_dir, patches=["eval-mode-early-exit"])
    assert patched.losses() == uninterrupted.losses() and patched.eval_losses() == uninterrupted.eval_losses()
    worse = _perplexity(workload_copy(tmp_path / "copy", ["eval-mode-early-exit"]), launch, patched_dir / "final")
    assert worse > 1.01 * baseline, (worse, baseline)


@pytest.mark.slow
def test_fsdp2_on_two_ranks_resumes_its_sharded_checkpoint(tmp_path: Path) -> None:
    """torch.distributed.checkpoint under FSDP2: each rank writes its shards; two fresh ranks read them back."""
    uninterrupted = _saving(tmp_path / "a", "dense-2node", overrides={"knobs.sharding": "fsdp2"}, nproc=2)
    shards = sorted(p.name for p in (tmp_path / "a" / "ckpt").glob("*.distcp"))
    assert len(shards) == 2, shards
    resumed = _resumed(tmp_path / "b", tmp_path / "a" / "ckpt", "dense-2node", overrides={"knobs.sharding": "fsdp2"},
                       nproc=2)  # fmt: skip
    for rank in (0, 1):
        assert [r.step for r in resumed.records[rank]] == list(range(SAVE_AT, STEPS))
    assert rel_diff(resumed.losses(), uninterrupted.losses()[SAVE_AT:]) < 1e-6
    assert (tmp_path / "a" / "final" / "model.pt").is_file()
