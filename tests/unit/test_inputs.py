"""A workload's inputs outside git (issue 35): found in a real repository, locked by hash or by size and time,
linked into a real trial worktree without copying, and a change named."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from infrarsi import events as ev
from infrarsi.commands.doctor import inconsistent_work
from infrarsi.study import inputs
from infrarsi.trial import workspace


def repo_with_data(tmp_path: Path) -> Path:
    repo = tmp_path / "job"
    (repo / "data" / "shards").mkdir(parents=True)
    (repo / "train.py").write_text("print('train')\n")
    (repo / ".gitignore").write_text("data/shards/\n*.log\n")
    (repo / "data" / "prepare.py").write_text("# tracked beside the data it writes\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "job"], check=True)
    (repo / "data" / "shards" / "a.bin").write_bytes(b"a" * 100)
    (repo / "data" / "shards" / "b.bin").write_bytes(b"b" * 5000)
    (repo / "tokenizer.json").write_text("{}")  # untracked, not ignored
    (repo / "run.log").write_text("noise")
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__" / "m.pyc").write_text("")
    return repo


def test_find_inputs_lists_untracked_and_ignored_data_but_not_caches_or_outputs(tmp_path: Path) -> None:
    repo = repo_with_data(tmp_path)
    (repo / "out").mkdir()
    (repo / "out" / "ckpt.pt").write_text("x")
    assert inputs.find_inputs(repo, outputs=["out"]) == ["data/shards", "tokenizer.json"]
    assert inputs.find_inputs(repo / "data") == []  # not the top of a repository


def test_fingerprint_hashes_small_files_and_dates_large_ones(tmp_path: Path) -> None:
    repo = repo_with_data(tmp_path)
    prints = inputs.fingerprint(repo, ["data/shards", "tokenizer.json"], hash_limit_bytes=1000)
    assert set(prints) == {"data/shards/a.bin", "data/shards/b.bin", "tokenizer.json"}
    assert prints["data/shards/a.bin"].startswith("sha256:")
    stat = (repo / "data/shards/b.bin").stat()
    assert prints["data/shards/b.bin"] == f"size:5000,mtime_ns:{stat.st_mtime_ns}"
    with pytest.raises(inputs.InputError, match="does not exist"):
        inputs.fingerprint(repo, ["data/missing"])


def test_inputs_are_linked_into_a_worktree_and_a_change_is_named(tmp_path: Path) -> None:
    repo = repo_with_data(tmp_path)
    locked = inputs.fingerprint(repo, ["data/shards", "tokenizer.json"], hash_limit_bytes=1000)
    head = workspace.git(repo, "rev-parse", "HEAD").stdout.strip()
    tree = workspace.materialise(repo, head, tmp_path / "trial")
    assert not (tree / "data" / "shards").exists()  # a worktree of the commit has no untracked data
    made = inputs.link_inputs(repo, tree, ["data/shards", "tokenizer.json"])
    assert {p.relative_to(tree).as_posix() for p in made} == {"data/shards", "tokenizer.json"}
    assert os.path.islink(tree / "data" / "shards") and (tree / "data" / "shards" / "a.bin").read_bytes() == b"a" * 100
    assert (tree / "data" / "prepare.py").is_file()  # the tracked file beside it is the worktree's own
    # nothing was copied: the worktree holds two links and git's own files
    assert sorted(p.name for p in tree.iterdir() if p.is_symlink()) == ["tokenizer.json"]
    assert sum(f.stat().st_size for f in tree.rglob("*") if f.is_file() and not f.is_symlink()
               and ".git" not in f.parts and "shards" not in f.parts) < 1000  # fmt: skip
    assert inputs.changed(repo, ["data/shards", "tokenizer.json"], locked, hash_limit_bytes=1000) == []
    # the data changes (same size: the hash sees it), a large file is touched, a file appears
    (repo / "data" / "shards" / "a.bin").write_bytes(b"c" * 100)
    os.utime(repo / "data" / "shards" / "b.bin", ns=(1, 1))
    (repo / "data" / "shards" / "c.bin").write_bytes(b"new")
    drift = inputs.changed(repo, ["data/shards", "tokenizer.json"], locked, hash_limit_bytes=1000)
    assert [line.split(" ")[0] for line in drift] == ["data/shards/a.bin", "data/shards/b.bin", "data/shards/c.bin"]
    assert drift[2] == "data/shards/c.bin added"
    workspace.remove(tree)
    assert (repo / "data" / "shards" / "a.bin").exists()  # removing the worktree leaves the user's data alone


def test_inputs_in_the_contract_are_checked(tmp_path: Path) -> None:
    from infrarsi.study.contract import check_contract, contract_from_dict

    repo = repo_with_data(tmp_path)
    base = {"name": "x", "goal": "g", "workload": {"repo": str(repo), "command": ["{python}", "train.py"],
            "knobs_via": "argv", "steps": 5, "steps_key": "max_steps", "verify_steps": 5,
            "inputs": ["data/shards", "../etc", "data/none"]},
            "cluster": {"id": "c", "accelerator": "cpu", "memory_capacity_bytes": 1 << 30},
            "scope": {"files": ["data/shards/*"]}, "search_space": {"knobs": {}}, "invariants": {"loss": {"tolerance": 0.1}},
            "budget": {"trials": 1, "accelerator_hours": 1.0}}  # fmt: skip
    problems = {p.path: p.reason for p in check_contract(contract_from_dict(base, check=False))}
    assert "editable" in problems["workload.inputs[0]"]
    assert "without '..'" in problems["workload.inputs[1]"]
    assert "not found" in problems["workload.inputs[2]"]


def _measured(steps: int, tokens: int = 0) -> ev.TrialMeasured:
    return ev.TrialMeasured(candidate_key="k", kind="doctor", status="ok", steps=steps, warmup_steps=0, step_time_s=0.1,
                            step_time_mad_s=0.0, step_time_with_warmup_s=0.1, tokens_per_s=0.0, mfu=None,
                            flops_per_step=None, phases={}, peak_memory_bytes=[], per_rank_step_s=[], stragglers=[],
                            loss_curve=[], eval_curve=[], optimizer_steps=steps, tokens=tokens, invariants=[],
                            invariants_ok=True)  # fmt: skip


def test_the_doctor_says_plainly_when_the_baseline_does_different_work_run_to_run() -> None:
    assert inconsistent_work({"a": _measured(31), "b": _measured(31)}) is None
    said = inconsistent_work({"a": _measured(31), "b": _measured(30), "c": _measured(31)})
    assert said is not None and "inconsistent across runs: optimiser steps 31 (a), 30 (b), 31 (c)" in said
