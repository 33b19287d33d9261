"""Pairs of patches that do not apply together on the golden baseline (``workspace.conflicting_pairs``) are
never proposed together: before, each candidate holding such a pair cost a refused trial (a third of the real
search benchmark's trials on the GPT library)."""

import subprocess
from pathlib import Path

import yaml
from infrarsi.commands.init import prepare_study
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.space import Candidate
from infrarsi.study.space import load_study_space
from infrarsi.trial.workspace import conflicting_pairs
from support.agent_repo import GPT, commit, diff_of, git_copy_of_gpt


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def test_pairs_that_collide_are_found_without_touching_the_repository(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("x = 1\ny = 2\n")
    (repo / "b.py").write_text("z = 3\n")
    commit(repo)
    patches = {
        "x-to-10": diff_of(repo, {"a.py": ("x = 1", "x = 10")}),
        "x-to-20": diff_of(repo, {"a.py": ("x = 1", "x = 20")}),  # the same line: not after x-to-10
        "z-to-30": diff_of(repo, {"b.py": ("z = 3", "z = 30")}),  # elsewhere: applies with either
        "stale": diff_of(repo, {"b.py": ("z = 3", "z = 4")}).replace("z = 3", "w = 3"),  # applies to nothing
    }
    paths = {}
    for pid, text in patches.items():
        paths[pid] = tmp_path / f"{pid}.diff"
        paths[pid].write_text(text)
    head = _git(repo, "rev-parse", "HEAD").strip()
    assert conflicting_pairs(repo, head, paths) == [("x-to-10", "x-to-20")]
    # neither the index nor the files moved
    assert _git(repo, "status", "--porcelain") == ""
    assert (repo / "a.py").read_text() == "x = 1\ny = 2\n"


def test_a_gpt_study_never_proposes_patches_that_do_not_apply_together(tmp_path):
    repo = git_copy_of_gpt(tmp_path / "gpt")
    contract = yaml.safe_load((GPT / "contracts" / "dense-1node.yaml").read_text())
    contract["workload"]["repo"] = str(repo)
    path = tmp_path / "contract.yaml"
    path.write_text(yaml.safe_dump(contract))
    created = prepare_study(path, tmp_path / "data").created
    study = load_study_space(created)
    pair = ("attention-without-mask", "fused-qkv")  # both rewrite the attention block of model.py
    assert any(f"patches {pair[0]} and {pair[1]} do not apply together" in n for n in study.notes), study.notes
    both = Candidate.of(study.baseline.knobs, frozenset(pair))
    assert not study.space.is_feasible(both)
    assert study.space.is_feasible(Candidate.of(study.baseline.knobs, frozenset(pair[:1])))
    searcher = Searcher(study.space, study.capacity_bytes, kb=study.kb, baseline=study.baseline)
    assert not any(set(pair) <= c.patches for c in searcher.pool.candidates)
