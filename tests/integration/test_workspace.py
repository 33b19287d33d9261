"""The study workload repo with real git: golden baseline, worktrees, patches and every refused escape."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from infrarsi.study.contract import Contract, contract_from_dict
from infrarsi.trial.workspace import (
    WorkspaceError,
    apply_patches,
    git,
    golden_tag,
    materialise,
    parse_patch,
    prepare_workspace,
    remove,
    scope_problem,
)
from support.small_workload import WORKLOAD_SECTION, numbered_lines, write_workload

MODEL = numbered_lines(20)


def write_tree(wl: Path) -> None:
    write_workload(wl, MODEL, [], {"data.py": "DATA = 1\n"})
    (wl / "__pycache__").mkdir()
    (wl / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (wl / "stray.pyc").write_bytes(b"\0")


def contract_for(wl: Path, files: list[str] | None = None) -> Contract:
    return contract_from_dict(
        {
            "name": "t",
            "goal": "g",
            "workload": {"repo": str(wl), **WORKLOAD_SECTION},
            "cluster": {"id": "local", "accelerator": "cpu", "memory_capacity_bytes": 10**9},
            "scope": {
                "files": files if files is not None else ["model.py", "train.py", "kernels/**"],
                "launch_keys": ["knobs.micro_batch_size"],
            },
            "search_space": {"knobs": {"knobs.micro_batch_size": {"type": "int", "choices": [1, 2, 4, 8]}}},
            "invariants": {"loss": {"tolerance": 0.02}},
            "budget": {"trials": 4, "accelerator_hours": 1},
        }
    )


def commit_all(repo: Path, message: str = "work") -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--no-verify", "-m", message, commit=True)
    return git(repo, "rev-parse", "HEAD").stdout.strip()


def make_git_workload(path: Path) -> Path:
    write_tree(path)
    (path / ".gitignore").write_text("__pycache__/\n*.pyc\nout/\n")
    git(path, "init", "-q", "--initial-branch=main")
    commit_all(path, "initial")
    return path


@pytest.fixture
def snapshot(tmp_path: Path):
    """A study snapshot (non-git workload) and its contract."""
    wl = tmp_path / "wl"
    write_tree(wl)
    contract = contract_for(wl)
    ws = prepare_workspace(contract, "s1", tmp_path / "data")
    return contract, ws


def diff_of(worktree: Path, path: str, new_text: str | None) -> str:
    """A git patch turning ``path`` into ``new_text`` (``None`` deletes it), made with real git."""
    full = worktree / path
    old = full.read_text() if full.exists() else None
    full.parent.mkdir(parents=True, exist_ok=True)
    if new_text is None:
        full.unlink()
    else:
        full.write_text(new_text)
    git(worktree, "add", "-A", "-N", ".")
    patch = git(worktree, "diff", "--binary", "HEAD").stdout
    git(worktree, "reset", "-q")
    if old is None:
        full.unlink()
    else:
        full.write_text(old)
    return patch


def save(tmp: Path, name: str, text: str) -> Path:
    path = tmp / f"{name}.patch"
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------ baseline


def test_snapshot_of_plain_directory(tmp_path: Path, snapshot) -> None:
    contract, ws = snapshot
    assert ws.snapshot
    assert ws.repo == (tmp_path / "data" / "studies" / "s1" / "workload").resolve()
    assert ws.tag == golden_tag("s1") == "infrarsi/s1/golden"
    assert git(ws.repo, "rev-parse", f"{ws.tag}^{{commit}}").stdout.strip() == ws.baseline_ref
    assert git(ws.repo, "log", "--format=%s").stdout.strip() == "golden baseline"
    files = git(ws.repo, "ls-files").stdout.split()
    assert "model.py" in files and "launch/dense.yaml" in files
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    # locked hashes of the snapshot equal those of the original directory
    assert contract.locked_files(ws.repo) == contract.locked_files()
    assert set(contract.locked_files(ws.repo)) == {"data.py", "launch/dense.yaml", "patches/index.yaml"}


def test_snapshot_skips_data_dir_inside_workload(tmp_path: Path) -> None:
    wl = tmp_path / "wl"
    write_tree(wl)
    ws = prepare_workspace(contract_for(wl), "s2", wl / ".state")
    assert not [f for f in git(ws.repo, "ls-files").stdout.split() if f.startswith(".state")]


def test_subdirectory_of_a_git_repo_is_snapshotted(tmp_path: Path) -> None:
    outer = tmp_path / "mono"
    write_tree(outer / "wl")
    git(outer, "init", "-q")
    commit_all(outer, "monorepo")
    ws = prepare_workspace(contract_for(outer / "wl"), "s3", tmp_path / "data")
    assert ws.snapshot


def test_git_repo_top_is_used_and_tagged(tmp_path: Path) -> None:
    wl = make_git_workload(tmp_path / "wl")
    head = git(wl, "rev-parse", "HEAD").stdout.strip()
    (wl / "notes.txt").write_text("untracked, not something the study depends on\n")
    ws = prepare_workspace(contract_for(wl), "s4", tmp_path / "data")
    assert not ws.snapshot and ws.repo == wl.resolve() and ws.baseline_ref == head
    assert git(wl, "rev-parse", "infrarsi/s4/golden^{commit}").stdout.strip() == head
    assert git(wl, "symbolic-ref", "--short", "HEAD").stdout.strip() == "main"
    assert not (tmp_path / "data" / "studies").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda wl: (wl / "data.py").write_text("DATA = 2\n"),
            "uncommitted changes to tracked files: data.py",
        ),
        (lambda wl: (wl / "model.py").write_text("x\n"), "uncommitted changes to tracked files: model.py"),
        (
            lambda wl: (wl / "kernels").mkdir() or (wl / "kernels" / "k.py").write_text(""),
            "untracked files the study depends on: kernels/k.py",
        ),
        (
            lambda wl: (wl / "patches" / "new.patch").write_text(""),
            "untracked files the study depends on: patches/new.patch",
        ),
    ],
)
def test_dirty_git_repo_refused(tmp_path: Path, change, message: str) -> None:
    wl = make_git_workload(tmp_path / "wl")
    change(wl)
    with pytest.raises(WorkspaceError, match=message):
        prepare_workspace(contract_for(wl), "s5", tmp_path / "data")
    assert git(wl, "tag", "--list").stdout == ""


def test_git_repo_without_commits_refused(tmp_path: Path) -> None:
    wl = tmp_path / "wl"
    write_tree(wl)
    git(wl, "init", "-q")
    (wl / ".gitignore").write_text("*\n")  # nothing untracked to complain about, and no commit either
    with pytest.raises(WorkspaceError, match="has no commits"):
        prepare_workspace(contract_for(wl), "s6", tmp_path / "data")


# ------------------------------------------------------------------------------------------ worktrees


def test_materialise_and_remove(tmp_path: Path, snapshot) -> None:
    _, ws = snapshot
    a = materialise(ws.repo, ws.baseline_ref, tmp_path / "trials" / "a")
    b = materialise(ws.repo, ws.tag, tmp_path / "trials" / "b")
    assert (a / "model.py").read_text() == MODEL
    (a / "model.py").write_text("changed\n")
    assert (b / "model.py").read_text() == MODEL  # independent copies
    assert git(a, "rev-parse", "HEAD").stdout.strip() == ws.baseline_ref
    assert git(a, "symbolic-ref", "-q", "HEAD", check=False).returncode != 0  # detached
    remove(a)
    remove(b)
    remove(b)  # idempotent
    assert not a.exists() and not b.exists()
    assert git(ws.repo, "worktree", "list", "--porcelain").stdout.count("worktree ") == 1
    with pytest.raises(WorkspaceError, match="not a worktree"):
        os.makedirs(tmp_path / "plain")
        remove(tmp_path / "plain")


# ------------------------------------------------------------------------------------------ patches


@pytest.fixture
def trial(tmp_path: Path, snapshot):
    contract, ws = snapshot
    worktree = materialise(ws.repo, ws.baseline_ref, tmp_path / "trial")
    yield contract, ws, worktree
    remove(worktree)


def test_patches_apply_in_order(tmp_path: Path, trial) -> None:
    contract, ws, wt = trial
    step1 = MODEL.replace("line 3\n", "line three\n")
    step2 = step1.replace("line three\nline 4\n", "line three\nline four\n")
    first = save(tmp_path, "first", diff_of(wt, "model.py", step1))
    # the second patch is made against the result of the first: they apply as a sequence
    (wt / "model.py").write_text(step1)
    commit_all(wt, "tmp")
    second = save(tmp_path, "second", diff_of(wt, "model.py", step2))
    git(wt, "reset", "-q", "--hard", ws.baseline_ref)
    new_file = save(tmp_path, "new-kernel", diff_of(wt, "kernels/fast.py", "FAST = True\n"))
    result = apply_patches(wt, [first, second, new_file], contract.editable, contract.locked_files(ws.repo))
    assert result.ok, result
    assert result.files_changed == ["kernels/fast.py", "model.py"]
    assert (wt / "model.py").read_text() == step2
    assert (wt / "kernels" / "fast.py").read_text() == "FAST = True\n"


def test_patch_conflict_names_the_patch(tmp_path: Path, trial) -> None:
    contract, _, wt = trial
    a = save(tmp_path, "edit-a", diff_of(wt, "model.py", MODEL.replace("line 10\n", "line A\n")))
    b = save(tmp_path, "edit-b", diff_of(wt, "model.py", MODEL.replace("line 10\n", "line B\n")))
    ok = save(tmp_path, "train", diff_of(wt, "train.py", "print('fast')\n"))
    result = apply_patches(wt, [ok, a, b], contract.editable)
    assert (result.ok, result.kind, result.patch) == (False, "patch_conflict", "edit-b")
    assert result.reason.startswith("does not apply after train, edit-a:")
    assert (wt / "model.py").read_text() == MODEL  # nothing applied
    assert (wt / "train.py").read_text() == "print('train')\n"


ESCAPES = {
    "dotdot": (
        "diff --git a/../outside.py b/../outside.py\n--- a/../outside.py\n+++ b/../outside.py\n@@ -1 +1 @@\n-a\n+b\n",
        "path ../outside.py climbs out with '..'",
    ),
    "absolute": (
        "--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-root\n+mallory\n",
        "absolute path /etc/passwd",
    ),
    "locked": (
        "diff --git a/data.py b/data.py\n--- a/data.py\n+++ b/data.py\n@@ -1 +1 @@\n-DATA = 1\n+DATA = 2\n",
        "data.py is not editable",
    ),
    "rename-out-of-scope": (
        "diff --git a/model.py b/data2.py\nsimilarity index 100%\nrename from model.py\nrename to data2.py\n",
        "data2.py is not editable",
    ),
    "git-dir": (
        "diff --git a/.git/hooks/post-checkout b/.git/hooks/post-checkout\nnew file mode 100755\n--- /dev/null\n+++ b/.git/hooks/post-checkout\n@@ -0,0 +1 @@\n+rm -rf /\n",
        "path .git/hooks/post-checkout is inside .git",
    ),
    "binary": (
        "diff --git a/model.py b/model.py\nindex 1234567..89abcde 100644\nGIT binary patch\nliteral 3\nKcmZ?wbN~PV0RR91\n\nliteral 0\nHcmV?d00001\n\n",
        "binary patch for model.py",
    ),
    "symlink-create": (
        "diff --git a/kernels/evil.py b/kernels/evil.py\nnew file mode 120000\nindex 0000000..1111111\n--- /dev/null\n+++ b/kernels/evil.py\n@@ -0,0 +1 @@\n+../data.py\n\\ No newline at end of file\n",
        "symlink (mode 120000) in the patch for kernels/evil.py",
    ),
    "mode-to-symlink": (
        "diff --git a/model.py b/model.py\nold mode 100644\nnew mode 120000\n",
        "symlink (mode 120000) in the patch for model.py",
    ),
    "quoted-dotdot": (
        'diff --git "a/../x\\tq.py" "b/../x\\tq.py"\n--- "a/../x\\tq.py"\n+++ "b/../x\\tq.py"\n@@ -1 +1 @@\n-a\n+b\n',
        "path ../x\tq.py climbs out with '..'",
    ),
    "not-a-patch": ("just some text\n", "not a patch: no file headers found"),
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_scope_escapes_refused(tmp_path: Path, trial, name: str) -> None:
    contract, _, wt = trial
    text, reason = ESCAPES[name]
    good = save(tmp_path, "good", diff_of(wt, "train.py", "print('fast')\n"))
    evil = save(tmp_path, name, text)
    result = apply_patches(wt, [good, evil], contract.editable)
    assert (result.ok, result.kind, result.patch, result.reason) == (False, "scope_violation", name, reason)
    assert (wt / "train.py").read_text() == "print('train')\n"  # refused before anything applied


def test_symlink_in_tree_leading_outside(tmp_path: Path) -> None:
    """A tracked symlink inside an editable directory: patching through it must not reach outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text("safe\n")
    wl = make_git_workload(tmp_path / "wl")
    (wl / "kernels").mkdir()
    os.symlink(outside, wl / "kernels" / "vendor")
    os.symlink("../data.py", wl / "kernels" / "data_link.py")
    commit_all(wl, "links")
    wt = materialise(wl, "HEAD", tmp_path / "wt")
    editable = lambda p: p.startswith("kernels/") or p == "model.py"  # noqa: E731 — a deliberately wide scope
    refusals = [  # (patch, diff, why it is refused)
        (
            "through-dir",
            "--- a/kernels/vendor/victim.py\n+++ b/kernels/vendor/victim.py\n@@ -1 +1 @@\n-safe\n+owned\n",
            f"kernels/vendor/victim.py resolves through a symlink to {(outside / 'victim.py').resolve()}, outside the worktree",
        ),
        (
            "through-file",
            "--- a/kernels/data_link.py\n+++ b/kernels/data_link.py\n@@ -1 +1 @@\n-DATA = 1\n+DATA = 2\n",
            "kernels/data_link.py resolves through a symlink to data.py, which is not editable",
        ),
    ]
    for name, diff, reason in refusals:
        result = apply_patches(wt, [save(tmp_path, name, diff)], editable)
        assert (result.kind, result.reason) == ("scope_violation", reason), name
    assert (outside / "victim.py").read_text() == "safe\n"
    remove(wt)


def test_locked_hash_mismatch_is_a_violation(tmp_path: Path, trial) -> None:
    contract, ws, wt = trial
    locked = contract.locked_files(ws.repo)
    assert apply_patches(wt, [], contract.editable, locked).ok
    tampered = {**locked, "data.py": "0" * 64}
    result = apply_patches(wt, [], contract.editable, tampered)
    assert (result.ok, result.kind, result.reason) == (
        False,
        "scope_violation",
        "locked file data.py changed (sha256 differs)",
    )


def test_post_apply_check_catches_what_the_parser_missed(tmp_path: Path, trial) -> None:
    """Defence in depth: whatever git changed is compared with the scope after applying."""
    contract, _, wt = trial
    patch = save(tmp_path, "ok", diff_of(wt, "model.py", "changed\n"))
    result = apply_patches(wt, [patch], lambda p: p == "model.py" and (wt / "model.py").read_text() == MODEL)
    assert (result.ok, result.kind) == (False, "scope_violation")
    assert result.reason == "non-editable files changed: model.py"


def test_plain_unified_diff_with_tricky_hunk_body(tmp_path: Path, trial) -> None:
    """A removed line that starts with '-- ' looks like a header; hunk counting keeps it in the body."""
    contract, _, wt = trial
    (wt / "train.py").write_text("-- not a header\nkeep\n")
    commit_all(wt, "t")
    text = (
        "--- a/train.py\t2026-01-01 00:00:00\n+++ b/train.py\t2026-01-01 00:00:01\n"
        "@@ -1,2 +1,2 @@\n--- not a header\n+++ /etc/passwd\n keep\n"
    )
    assert [sorted(f.paths) for f in parse_patch(text)] == [["train.py"]]
    result = apply_patches(wt, [save(tmp_path, "tricky", text)], contract.editable)
    assert result.ok, result
    assert (wt / "train.py").read_text() == "++ /etc/passwd\nkeep\n"


def test_plain_diff_p1_paths(tmp_path: Path, trial) -> None:
    contract, _, wt = trial
    text = "--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-print('train')\n+print('fast')\n--- a/data.py\n+++ b/data.py\n@@ -1 +1 @@\n-DATA = 1\n+DATA = 2\n"
    files = parse_patch(text)
    assert [sorted(f.paths) for f in files] == [["train.py"], ["data.py"]]
    assert scope_problem(text, wt, contract.editable) == "data.py is not editable"
    result = apply_patches(wt, [save(tmp_path, "two", text)], contract.editable)
    assert result.kind == "scope_violation"


def test_git_is_never_run_through_a_shell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = []
    real = subprocess.run

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(subprocess, "run", spy)
    wl = tmp_path / "wl"
    write_tree(wl)
    prepare_workspace(contract_for(wl), "s7", tmp_path / "data")
    assert calls and all(isinstance(a[0], list) and not k.get("shell") for a, k in calls)


async def test_a_study_whose_publish_fails_leaves_no_golden_tag_and_no_snapshot(tmp_path: Path,
                                                                                fresh_nats_server: str) -> None:
    """Issue 16's probe: a contract whose ``StudyCreated`` could not be published (30 MB, over the server's max
    payload) left ``infrarsi/<study>/golden`` in the user's repo. ``init`` tags the repo before it publishes; a
    study that was never published must leave neither its tag nor its snapshot (``publish_study`` removes them
    again). Here the publish fails as it does against a server without InfraRSI's streams."""
    from infrarsi.bus.client import Bus, BusError
    from infrarsi.commands.init import prepare_study, publish_study

    tagged = make_git_workload(tmp_path / "wl")
    untracked = tmp_path / "plain"  # a directory that is no git repo: init snapshots it under the data dir
    write_tree(untracked)
    bus = await Bus.connect(fresh_nats_server, service="cli.init", ensure=False)  # no stream takes the publish
    try:
        for repo in (tagged, untracked):
            contract = tmp_path / f"{repo.name}.yaml"
            contract.write_text(yaml.safe_dump(contract_for(repo).to_dict()))
            prepared = prepare_study(contract, tmp_path / "data")
            golden = git(prepared.workspace.repo, "tag", "--list").stdout.split()
            assert golden == [prepared.workspace.tag] and prepared.workspace.snapshot == (repo is untracked)
            with pytest.raises(BusError):
                await publish_study(bus, prepared)
            assert git(tagged, "tag", "--list").stdout == ""
            assert not prepared.workspace.snapshot or not prepared.workspace.repo.exists()
    finally:
        await bus.close()
