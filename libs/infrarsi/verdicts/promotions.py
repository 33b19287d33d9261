"""Promoted branches followed to the main line: merged (by which commit), reverted, still open, or gone.

Owns ``follow``: where the change of one ``PatchPromoted`` commit stands in its repository's main line, read with
git alone (no forge API), and ``default_mainline``. How each state is recognised, in this order:

- **merged**, when the promoted commit is an ancestor of the main line: by the first main-line commit (first
  parent chain) whose history holds it — the merge commit, or the commit itself after a fast-forward; or, when it
  is not an ancestor, by a main-line commit with the same ``git patch-id --stable`` (a cherry-pick, or a squash
  merge of the one commit ``apply`` writes; a squash that folds in other changes is not recognised: ``open``);
- **reverted**, when merged and a later main-line commit carries the reverse change's patch id, or says
  ``This reverts commit <promoted or merge commit>`` (``git revert``, ``git revert -m 1`` of the merge);
- **gone**, when neither the branch nor the commit exists any more and the change is not on the main line;
- **open** otherwise.

Must not: change the repository (read-only git commands), or publish anything (``infrarsi follow`` does).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from infrarsi.trial.workspace import WorkspaceError, git

State = Literal["open", "merged", "reverted", "gone"]


class FollowError(Exception):
    """The repository or its main line cannot be read (moved, deleted, no such branch)."""


@dataclass(frozen=True)
class Followed:
    """Where one promoted commit stands."""

    state: State
    mainline: str
    mainline_head: str
    merge_commit: str | None = None
    revert_commit: str | None = None
    detail: str = ""


def default_mainline(repo: Path) -> str:
    """The repository's main line: ``origin/HEAD``'s branch if there is a remote, else ``main``, else ``master``."""
    remote_head = git(repo, "symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD", check=False)
    if remote_head.returncode == 0 and remote_head.stdout.strip():
        return remote_head.stdout.strip()
    for name in ("main", "master"):
        if _resolve(repo, f"refs/heads/{name}") is not None:
            return name
    raise FollowError(f"{repo} has no main or master branch: name the main line with --mainline")


def follow(repo: Path, branch: str, commit: str, mainline: str) -> Followed:
    """Where ``commit`` (promoted on ``branch``) stands against ``mainline`` of ``repo``."""
    if not (Path(repo) / ".git").exists() and _resolve(repo, "HEAD") is None:
        raise FollowError(f"{repo} is not a git repository any more")
    head = _resolve(repo, mainline)
    if head is None:
        raise FollowError(f"{repo} has no {mainline!r} to follow the promoted branch against")
    exists = _resolve(repo, commit) is not None
    merge = None
    how = ""
    if exists and git(repo, "merge-base", "--is-ancestor", commit, head, check=False).returncode == 0:
        merge, how = _merging_commit(repo, commit, head), "in the main line's history"
    elif exists:
        merge = _same_change(repo, _patch_id(repo, commit), head, since=_merge_base(repo, commit, head))
        how = "as the same change (cherry-picked or squashed)"
    if merge is None:
        if not exists and _resolve(repo, f"refs/heads/{branch}") is None:
            return Followed("gone", mainline, head, detail=f"neither {branch} nor {commit[:12]} exists any more")
        return Followed("open", mainline, head, detail=f"{commit[:12]} is not on {mainline}")
    revert = _revert_of(repo, commit, merge, head)
    if revert is not None:
        return Followed("reverted", mainline, head, merge, revert,
                        detail=f"merged by {merge[:12]}, reverted by {revert[:12]}")
    return Followed("merged", mainline, head, merge, detail=f"merged by {merge[:12]} {how}")


def _resolve(repo: Path, ref: str) -> str | None:
    out = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    return out.stdout.strip() or None if out.returncode == 0 else None


def _merge_base(repo: Path, a: str, b: str) -> str | None:
    out = git(repo, "merge-base", a, b, check=False)
    return out.stdout.strip() or None if out.returncode == 0 else None


def _merging_commit(repo: Path, commit: str, head: str) -> str:
    """The first commit of the main line's first-parent chain whose history holds ``commit``."""
    chain = git(repo, "rev-list", "--first-parent", head).stdout.split()
    if commit in chain:
        return commit  # fast-forwarded (or committed on the main line itself)
    after = git(repo, "rev-list", "--first-parent", "--ancestry-path", "--reverse", f"{commit}..{head}").stdout.split()
    return after[0] if after else head


def _patch_id(repo: Path, commit: str, *, reverse: bool = False) -> str | None:
    """``git patch-id --stable`` of the commit's change (``reverse``: of its undoing)."""
    a, b = (commit, f"{commit}^") if reverse else (f"{commit}^", commit)
    diff = git(repo, "diff", "--no-color", "--full-index", a, b, check=False)
    if diff.returncode != 0 or not diff.stdout:
        return None
    out = subprocess.run(["git", "-C", str(repo), "patch-id", "--stable"], input=diff.stdout, capture_output=True,
                         text=True, check=False)
    return out.stdout.split()[0] if out.stdout.split() else None


def _main_line_patch_ids(repo: Path, head: str, since: str | None) -> list[tuple[str, str]]:
    """(commit, patch id) of the main line's commits after ``since``, oldest first (merges left out)."""
    span = [head] if since is None else [head, f"^{since}"]
    log = git(repo, "log", "--no-merges", "--reverse", "-p", "--no-color", "--full-index", "--format=commit %H", *span,
              check=False)
    if log.returncode != 0:
        raise WorkspaceError(f"git log failed in {repo}: {log.stderr.strip()}")
    out = subprocess.run(["git", "-C", str(repo), "patch-id", "--stable"], input=log.stdout, capture_output=True,
                         text=True, check=False)
    pairs = [line.split() for line in out.stdout.splitlines() if len(line.split()) == 2]
    return [(sha, pid) for pid, sha in pairs]


def _same_change(repo: Path, patch_id: str | None, head: str, since: str | None) -> str | None:
    if patch_id is None:
        return None
    return next((sha for sha, pid in _main_line_patch_ids(repo, head, since) if pid == patch_id), None)


_REVERTS = re.compile(r"This reverts commit ([0-9a-f]{7,40})")


def _revert_of(repo: Path, commit: str, merge: str, head: str) -> str | None:
    """The main-line commit after ``merge`` that undid the change, or ``None``."""
    after = git(repo, "log", "--format=%H%x00%B%x01", f"{merge}..{head}", check=False).stdout
    for record in after.split("\x01"):
        if "\x00" not in record:
            continue
        sha, body = record.strip("\n").split("\x00", 1)
        if any(commit.startswith(m) or merge.startswith(m) for m in _REVERTS.findall(body)):
            return sha.strip()
    undo = _patch_id(repo, commit, reverse=True)
    return _same_change(repo, undo, head, since=merge)
