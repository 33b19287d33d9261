"""The study's workload git repository: the golden baseline, per-trial worktrees, patches, apply branches.

Owns every git operation InfraRSI performs on a workload:

- ``prepare_workspace`` (at ``init``): use the workload's own repo when ``workload.repo`` is the top of a
  clean git checkout, else snapshot the directory into ``<data_dir>/studies/<study>/workload`` as a fresh
  repo with one commit "golden baseline"; either way tag the baseline ``infrarsi/<study>/golden``.
- ``materialise`` / ``remove``: a detached worktree of the baseline per trial.
- ``apply_patches``: refuse scope escapes before git sees a patch (``scope_violation``), then
  ``git apply --check`` (``patch_conflict``, naming the patch), then ``git apply``, then prove that only
  editable files changed and every locked file still has its init-time hash.
- ``apply_candidate``: the winner on its own branch ``infrarsi/<study>/<candidate>`` from the golden tag,
  committed with its evidence. It never checks out, resets or merges anything in the user's checkout.

Every git call is an argv list (never a shell). Commits use a fixed identity and no hooks or signing, so
they behave the same on any machine. This module does not know about the bus or the policy.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal, NamedTuple

import yaml

from infrarsi.study.contract import Contract, file_sha256, get_dotted, set_dotted

GIT_COMMIT_CONFIG = (
    "-c", "user.name=infrarsi",
    "-c", "user.email=infrarsi@localhost",
    "-c", "commit.gpgsign=false",
    "-c", "tag.gpgsign=false",
    "-c", "core.hooksPath=/dev/null",
)  # fmt: skip
"""Where InfraRSI commits or tags: its own identity, no signing prompts, no user hooks."""

SNAPSHOT_EXCLUDE = (".git", "__pycache__", "*.pyc", ".infrarsi")

EditablePredicate = Callable[[str], bool]


class WorkspaceError(Exception):
    """A git operation on the workload failed or was refused."""


class BranchExists(WorkspaceError):
    """The branch a candidate would be written to exists already: a refusal (the user decides whether to
    review or delete it), not a failure of the candidate."""


def branch_exists_remedy(repo: Path, branch: str) -> str:
    """What to do about an existing promotion branch, for the message that names it."""
    return f"review it, or delete it to apply again: git -C {repo} branch -D {branch}"


def golden_tag(study_id: str) -> str:
    """The tag of a study's untouched baseline."""
    return f"infrarsi/{study_id}/golden"


def candidate_branch(study_id: str, candidate_key: str) -> str:
    """The branch ``infrarsi apply`` writes a candidate to."""
    return f"infrarsi/{study_id}/{candidate_key}"


def git(
    repo: Path | str,
    *args: str,
    commit: bool = False,
    check: bool = True,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``git -C repo args…``; ``commit=True`` adds InfraRSI's identity and disables hooks/signing."""
    argv = ["git", *(GIT_COMMIT_CONFIG if commit else ()), "-C", str(repo), *args]
    # LC_ALL=C: parsed output and error messages do not change with the user's locale.
    env = {**os.environ, "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0", **(env or {})}
    result = subprocess.run(argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise WorkspaceError(
            f"git {' '.join(args)} failed in {repo}: {result.stderr.strip() or result.stdout.strip()}"
        )
    return result


# --------------------------------------------------------------------------------------------------
# The study repo and its golden baseline
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workspace:
    """Where a study's trials are materialised from."""

    repo: Path
    """Top of the git repository holding the golden baseline (the user's repo, or InfraRSI's snapshot)."""
    baseline_ref: str
    """Commit id of the golden baseline."""
    tag: str
    """``infrarsi/<study>/golden``, pointing at ``baseline_ref``."""
    snapshot: bool
    """True when InfraRSI copied the workload into its own repo under the data directory."""


def is_repo_top(path: Path) -> bool:
    """Whether ``path`` is the top directory of a git work tree (not merely inside one)."""
    result = git(path, "rev-parse", "--show-toplevel", check=False)
    return result.returncode == 0 and Path(result.stdout.strip()).resolve() == path.resolve()


def prepare_workspace(contract: Contract, study_id: str, data_dir: Path | str) -> Workspace:
    """Fix the golden baseline of a study and tag it (see the module docstring)."""
    repo = contract.workload.repo
    tag = golden_tag(study_id)
    if is_repo_top(repo):
        _require_clean(repo, contract)
        head = git(repo, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", check=False)
        if head.returncode != 0:
            raise WorkspaceError(
                f"{repo} has no commits: commit the workload first (the golden baseline is HEAD)"
            )
        baseline = head.stdout.strip()
        git(
            repo,
            "tag",
            "-a",
            "-m",
            f"InfraRSI golden baseline of study {study_id}",
            tag,
            baseline,
            commit=True,
        )
        return Workspace(repo=repo, baseline_ref=baseline, tag=tag, snapshot=False)

    dest = Path(data_dir).resolve() / "studies" / study_id / "workload"
    if dest.exists():
        raise WorkspaceError(f"{dest} already exists")
    snapshot_directory(repo, dest, exclude_dir=Path(data_dir).resolve())
    git(dest, "init", "--quiet", "--initial-branch=golden")
    git(dest, "add", "--all", "--force", ".")
    git(dest, "commit", "--quiet", "--no-verify", "-m", "golden baseline", commit=True)
    baseline = git(dest, "rev-parse", "HEAD").stdout.strip()
    git(dest, "tag", "-a", "-m", f"InfraRSI golden baseline of study {study_id}", tag, baseline, commit=True)
    return Workspace(repo=dest, baseline_ref=baseline, tag=tag, snapshot=True)


def discard_workspace(workspace: Workspace) -> None:
    """Undo ``prepare_workspace`` for a study that was never created (its ``StudyCreated`` not published):
    the golden tag leaves the user's repo, a snapshot is removed. Best effort: it runs on an error path."""
    if workspace.snapshot:
        shutil.rmtree(workspace.repo.parent, ignore_errors=True)
    else:
        git(workspace.repo, "tag", "-d", workspace.tag, check=False)


def snapshot_directory(src: Path, dest: Path, *, exclude_dir: Path | None = None) -> None:
    """Copy a workload directory (symlinks kept as links) without VCS data, caches and InfraRSI's own data."""
    src = src.resolve()
    patterns = shutil.ignore_patterns(*SNAPSHOT_EXCLUDE)

    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = set(patterns(directory, names))
        if exclude_dir is not None:
            skipped |= {n for n in names if Path(directory, n).resolve() == exclude_dir}
        return skipped

    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dest, symlinks=True, ignore=ignore)


def _require_clean(repo: Path, contract: Contract) -> None:
    """The baseline is HEAD, so nothing a trial depends on may differ from HEAD."""
    status = git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames").stdout
    dirty, untracked = [], []
    for entry in filter(None, status.split("\0")):
        code, path = entry[:2], entry[3:]
        if code == "??":
            patch_dir = PurePosixPath(contract.workload.patch_dir)
            if (
                contract.editable(path)
                or path == contract.workload.launch_file
                or patch_dir in PurePosixPath(path).parents
            ):
                untracked.append(path)
        else:
            dirty.append(path)
    problems = []
    if dirty:
        problems.append(f"uncommitted changes to tracked files: {', '.join(sorted(dirty))}")
    if untracked:
        problems.append(f"untracked files the study depends on: {', '.join(sorted(untracked))}")
    if problems:
        raise WorkspaceError(
            f"workload repo {repo} is not clean ({'; '.join(problems)}); commit or stash them: the golden baseline is HEAD"
        )


# --------------------------------------------------------------------------------------------------
# Trial worktrees
# --------------------------------------------------------------------------------------------------


def materialise(study_repo: Path | str, baseline_ref: str, dest: Path | str) -> Path:
    """A detached worktree of ``baseline_ref`` at ``dest`` (which must not exist yet)."""
    dest = Path(dest).absolute()
    dest.parent.mkdir(parents=True, exist_ok=True)
    git(study_repo, "worktree", "add", "--quiet", "--detach", str(dest), baseline_ref)
    return dest


def remove(dest: Path | str) -> None:
    """Remove a worktree made by ``materialise`` (and its administrative files); a missing one is fine."""
    dest = Path(dest).absolute()
    if not dest.exists():
        return
    common = git(dest, "rev-parse", "--path-format=absolute", "--git-common-dir", check=False)
    top = git(dest, "rev-parse", "--show-toplevel", check=False)
    if common.returncode != 0 or Path(top.stdout.strip()).resolve() != dest.resolve():
        raise WorkspaceError(f"{dest} is not a worktree")
    git_dir = common.stdout.strip()
    result = subprocess.run(
        ["git", "--git-dir", git_dir, "worktree", "remove", "--force", "--force", str(dest)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)
        subprocess.run(
            ["git", "--git-dir", git_dir, "worktree", "prune"], capture_output=True, stdin=subprocess.DEVNULL
        )


# --------------------------------------------------------------------------------------------------
# Patches
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PatchResult:
    """The outcome of applying a patch set to a worktree."""

    ok: bool
    kind: Literal["scope_violation", "patch_conflict"] | None = None
    """The ``TrialFinished.status`` to report when not ok."""
    reason: str = ""
    patch: str | None = None
    """Id (file stem) of the patch that was refused or did not apply."""
    files_changed: list[str] = field(default_factory=list)


@dataclass
class _FileDiff:
    paths: set[str] = field(default_factory=set)
    modes: set[str] = field(default_factory=set)
    binary: bool = False
    has_headers: bool = False
    """Seen its ``---``/``+++`` pair: a further pair starts the next file (plain ``diff -u`` output)."""


def _unquote(text: str) -> tuple[str, str]:
    """Parse a git C-quoted path at the start of ``text``; returns (path, rest)."""
    assert text.startswith('"')
    out = bytearray()
    i = 1
    escapes = {
        "n": b"\n",
        "t": b"\t",
        '"': b'"',
        "\\": b"\\",
        "a": b"\a",
        "b": b"\b",
        "f": b"\f",
        "r": b"\r",
        "v": b"\v",
    }
    while i < len(text):
        c = text[i]
        if c == '"':
            return out.decode("utf-8", "surrogateescape"), text[i + 1 :]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in escapes:
                out += escapes[nxt]
                i += 2
                continue
            if re.match(r"[0-7]{3}", text[i + 1 : i + 4]):
                out.append(int(text[i + 1 : i + 4], 8))
                i += 4
                continue
        out += c.encode()
        i += 1
    raise ValueError(f"unterminated quoted path {text!r}")


def _strip_prefix(path: str) -> str | None:
    """``a/model.py`` → ``model.py``, as ``git apply -p1`` does; ``/dev/null`` → ``None``.

    An absolute path is kept whole so that the scope check refuses it (git would strip ``/`` + one name).
    """
    if path == "/dev/null":
        return None
    if path.startswith("/"):
        return path
    head, sep, tail = path.partition("/")
    return tail if sep else path


def _header_path(value: str) -> str:
    """The path of a ``---``/``+++``/``rename from`` value: C-unquoted, without a trailing timestamp."""
    if value.startswith('"'):
        return _unquote(value)[0]
    return value.split("\t", 1)[0].rstrip()


def _diff_git_paths(rest: str) -> list[str]:
    """Both names of a ``diff --git a/X b/Y`` line (git's own rule: unquoted names are split where equal)."""
    if rest.startswith('"'):
        first, tail = _unquote(rest)
        tail = tail.lstrip(" ")
        second = _unquote(tail)[0] if tail.startswith('"') else tail
        return [first, second]
    for match in re.finditer(" ", rest):
        left, right = rest[: match.start()], rest[match.end() :]
        if right.startswith('"'):
            return [left, _unquote(right)[0]]
        if left.split("/", 1)[-1] == right.split("/", 1)[-1]:
            return [left, right]
    return rest.split(" ", 1)


def parse_patch(text: str) -> list[_FileDiff]:
    """The files, modes and binary flags of a unified diff (git or plain), skipping hunk bodies by count."""
    files: list[_FileDiff] = []
    current: _FileDiff | None = None
    lines = text.splitlines()
    i = 0

    def start() -> _FileDiff:
        diff = _FileDiff()
        files.append(diff)
        return diff

    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            current = start()
            for name in _diff_git_paths(line[len("diff --git ") :]):
                if (path := _strip_prefix(name)) is not None:
                    current.paths.add(path)
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            if current is None or current.has_headers:
                current = start()
            current.has_headers = True
            for header in (line[4:], lines[i + 1][4:]):
                if (path := _strip_prefix(_header_path(header))) is not None:
                    current.paths.add(path)
            i += 1
        elif (
            line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")) and current is not None
        ):
            current.paths.add(_header_path(line.split(" ", 2)[2]))
        elif current is not None and (
            m := re.match(r"(?:old mode|new mode|new file mode|deleted file mode) (\d+)$", line)
        ):
            current.modes.add(m.group(1))
        elif current is not None and (m := re.match(r"index [0-9a-f]+\.\.[0-9a-f]+ (\d+)$", line)):
            current.modes.add(m.group(1))
        elif line.startswith("GIT binary patch") or (
            line.startswith("Binary files ") and line.endswith(" differ")
        ):
            (current or start()).binary = True
        elif m := re.match(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@", line):
            old = int(m.group(1)) if m.group(1) is not None else 1
            new = int(m.group(2)) if m.group(2) is not None else 1
            while (old > 0 or new > 0) and i + 1 < len(lines):
                body = lines[i + 1]
                if body.startswith("\\"):
                    pass
                elif body.startswith("-"):
                    old -= 1
                elif body.startswith("+"):
                    new -= 1
                else:  # context (" " or an empty line some tools write for a blank context line)
                    old -= 1
                    new -= 1
                i += 1
            if i + 1 < len(lines) and lines[i + 1].startswith("\\"):
                i += 1
        i += 1
    return files


def scope_problem(patch_text: str, worktree: Path | str, editable: EditablePredicate) -> str | None:
    """Why a patch would reach outside the editable scope of ``worktree``, or ``None``.

    Refused: absolute paths, ``..``, ``.git``, files outside ``editable``, binary patches, symlinks or
    submodules (modes 120000/160000), and paths that resolve through an existing symlink to a file that is
    outside the worktree or not editable.
    """
    worktree = Path(worktree).resolve()
    files = parse_patch(patch_text)
    if not files:
        return "not a patch: no file headers found"
    for diff in files:
        if diff.binary:
            return f"binary patch for {', '.join(sorted(diff.paths)) or 'a file'}"
        for mode in sorted(diff.modes):
            if mode in ("120000", "160000"):
                kind = "symlink" if mode == "120000" else "submodule"
                return f"{kind} (mode {mode}) in the patch for {', '.join(sorted(diff.paths))}"
        for path in sorted(diff.paths):
            pure = PurePosixPath(path)
            if pure.is_absolute():
                return f"absolute path {path}"
            if ".." in pure.parts:
                return f"path {path} climbs out with '..'"
            if ".git" in pure.parts:
                return f"path {path} is inside .git"
            if not editable(path):
                return f"{path} is not editable"
            resolved = (worktree / path).resolve()
            if not resolved.is_relative_to(worktree):
                return f"{path} resolves through a symlink to {resolved}, outside the worktree"
            real = resolved.relative_to(worktree).as_posix()
            if real != pure.as_posix() and not editable(real):
                return f"{path} resolves through a symlink to {real}, which is not editable"
    return None


def _changed_paths(worktree: Path) -> list[str]:
    out = git(
        worktree,
        "status",
        "--porcelain=v1",
        "-z",
        "--untracked-files=all",
        "--ignored=matching",
        "--no-renames",
    ).stdout
    return sorted({entry[3:] for entry in out.split("\0") if entry})


def _check_in_order(worktree: Path, patch_paths: Sequence[Path]) -> PatchResult | None:
    """``git apply --check`` of the whole sequence, each patch on top of the ones before it.

    ``git apply --check a b`` checks every patch against the untouched tree, so a patch made on top of
    another fails and two patches that collide both pass. Instead the sequence is applied to a scratch
    index (``GIT_INDEX_FILE``) holding the worktree's HEAD: the worktree itself is not touched.
    """
    with tempfile.TemporaryDirectory(prefix="infrarsi-check-") as scratch:
        env = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        git(worktree, "read-tree", "HEAD", env=env)
        for n, path in enumerate(patch_paths):
            result = git(worktree, "apply", "--cached", str(path), env=env, check=False)
            if result.returncode != 0:
                earlier = ", ".join(p.stem for p in patch_paths[:n])
                after = f" after {earlier}" if earlier else ""
                return PatchResult(
                    False, "patch_conflict", f"does not apply{after}: {result.stderr.strip()}", path.stem
                )
    return None


def conflicting_pairs(repo: Path | str, ref: str, patches: Mapping[str, Path]) -> list[tuple[str, str]]:
    """Pairs of patches (ids in the order a trial applies them, sorted) that each apply to ``ref`` of ``repo``
    alone but not one after the other: a candidate holding both would be refused at every trial.

    Checked as a trial's launcher checks a sequence (``_check_in_order``: ``git apply --cached`` on a scratch
    index holding ``ref``; neither the repository's index nor any worktree is touched). A patch that does not
    apply alone is the trial's to refuse, with its own reason. Three or more patches that collide only
    together are not looked for."""
    ids = sorted(patches)
    pairs: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="infrarsi-pairs-") as scratch:
        base, work = Path(scratch) / "base", Path(scratch) / "work"

        def applies(index: Path, patch: Path) -> bool:
            env = {"GIT_INDEX_FILE": str(index)}
            return git(repo, "apply", "--cached", str(patch), env=env, check=False).returncode == 0

        git(repo, "read-tree", ref, env={"GIT_INDEX_FILE": str(base)})
        after: dict[str, Path] = {}  # the index with each patch that applies alone applied
        for i, pid in enumerate(ids):
            index = Path(scratch) / f"after-{i}"
            shutil.copyfile(base, index)
            if applies(index, patches[pid]):
                after[pid] = index
        alone = [pid for pid in ids if pid in after]
        for i, first in enumerate(alone):
            for second in alone[i + 1:]:
                shutil.copyfile(after[first], work)
                if not applies(work, patches[second]):
                    pairs.append((first, second))
    return pairs


def apply_patches(
    worktree: Path | str,
    patch_paths: Sequence[Path | str],
    editable: EditablePredicate,
    locked: Mapping[str, str] | None = None,
) -> PatchResult:
    """Apply patches, in order, to a fresh worktree — or refuse them (see the module docstring).

    ``locked`` (path → sha256, from ``StudyCreated.locked_files``) is re-hashed after applying.
    A refused or conflicting set leaves the worktree untouched; a post-apply violation leaves it dirty
    (the caller discards it).
    """
    worktree = Path(worktree).resolve()
    paths = [Path(p).resolve() for p in patch_paths]
    for path in paths:
        try:
            text = path.read_text(errors="surrogateescape")
        except OSError as exc:
            return PatchResult(False, "patch_conflict", f"cannot read patch: {exc}", path.stem)
        try:
            reason = scope_problem(text, worktree, editable)
        except ValueError as exc:
            reason = f"unparseable patch: {exc}"
        if reason:
            return PatchResult(False, "scope_violation", reason, path.stem)

    if paths:
        conflict = _check_in_order(worktree, paths)
        if conflict is not None:
            return conflict
        for path in paths:
            result = git(worktree, "apply", str(path), check=False)
            if result.returncode != 0:  # only if the worktree was not a fresh copy of its HEAD
                return PatchResult(
                    False,
                    "patch_conflict",
                    f"does not apply to the worktree: {result.stderr.strip()}",
                    path.stem,
                )

    changed = _changed_paths(worktree)
    outside = [p for p in changed if not editable(p)]
    if outside:
        return PatchResult(
            False, "scope_violation", f"non-editable files changed: {', '.join(outside)}", None, changed
        )
    for rel, digest in sorted((locked or {}).items()):
        full = worktree / rel
        if not (full.exists() or full.is_symlink()):
            return PatchResult(False, "scope_violation", f"locked file {rel} is missing", None, changed)
        if file_sha256(full) != digest:
            return PatchResult(
                False, "scope_violation", f"locked file {rel} changed (sha256 differs)", None, changed
            )
    return PatchResult(True, files_changed=changed)


# --------------------------------------------------------------------------------------------------
# Apply: a candidate on its own branch
# --------------------------------------------------------------------------------------------------


class AppliedCandidate(NamedTuple):
    branch: str
    commit: str
    files_changed: list[str]


def launch_changes(baseline: Mapping[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs whose value differs from (or is absent in) the golden launch file."""
    changes = {}
    for key, value in sorted(knobs.items()):
        found, old = get_dotted(baseline, key)
        if not found or old != value or type(old) is not type(value):
            changes[key] = value
    return changes


def _flow_scalar(value: Any) -> str:
    return yaml.safe_dump([value], default_flow_style=True, width=1 << 20).strip()[1:-1]


_KEY_LINE = re.compile(
    r"^(?P<indent>[ ]*)(?P<key>[A-Za-z0-9_][A-Za-z0-9_.-]*):(?P<sep>[ \t]+)(?P<value>[^#\s][^#]*?)(?P<comment>[ \t]+#.*)?$"
)


def edit_launch_yaml(text: str, changes: Mapping[str, Any]) -> str:
    """Set (dotted) launch keys in YAML text, changing only their lines so comments and order survive.

    Falls back to re-dumping the whole document when a key is absent or written in a form this line
    editor does not handle (flow mappings, block scalars); the result always parses to the baseline
    with the changes applied.
    """
    expected = yaml.safe_load(text) or {}
    for key, value in changes.items():
        set_dotted(expected, key, value)
    lines = text.splitlines(keepends=True)
    remaining = dict(changes)
    stack: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        body = line.rstrip("\r\n")
        newline = line[len(body) :]
        bare = re.match(r"^([ ]*)([A-Za-z0-9_][A-Za-z0-9_.-]*):", body)
        if not bare:
            continue
        indent = len(bare.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, bare.group(2)))
        dotted = ".".join(k for _, k in stack)
        m = _KEY_LINE.match(body)
        if dotted in remaining and m and not m.group("value").startswith(("|", ">", "&", "*", "!", "{", "[")):
            value = _flow_scalar(remaining.pop(dotted))
            lines[i] = (
                f"{m.group('indent')}{m.group('key')}:{m.group('sep')}{value}{m.group('comment') or ''}{newline}"
            )
    edited = "".join(lines)
    if remaining or yaml.safe_load(edited) != expected:
        return yaml.safe_dump(expected, sort_keys=False)
    return edited


def apply_candidate(
    study_repo: Path | str,
    baseline_ref: str,
    candidate: Any,
    patch_paths: Sequence[Path | str],
    launch_file: str | None,
    evidence_text: str,
    branch_name: str,
    *,
    editable: EditablePredicate | None = None,
    locked: Mapping[str, str] | None = None,
    golden_values: Mapping[str, Any] | None = None,
    signing_key: Path | str | None = None,
) -> AppliedCandidate:
    """Write a candidate (``events.Candidate``: knobs + patches) to a new branch from ``baseline_ref``.

    Works in a temporary worktree, so the user's checkout (branch, index, files) is never touched; the
    branch must not exist yet; nothing is merged. ``editable``/``locked`` repeat the trial-time scope checks
    (default: every path editable, nothing locked — the patches were already checked at trial time).
    ``launch_file`` ``None``: the knobs reach the job as flags, overrides or variables (``golden_values``
    are their golden values); the commit then carries the changed values in its message and may change no
    file (an empty commit, for review all the same).
    ``signing_key`` (an OpenSSH private key) signs the commit as git does with ``gpg.format=ssh``
    (``git verify-commit`` checks it against an allowed-signers file).
    Returns the branch, the new commit and the files that differ from the baseline.
    """
    repo = Path(study_repo)
    git(repo, "check-ref-format", "--branch", branch_name)
    if (
        git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch_name}", check=False).returncode
        == 0
    ):
        raise BranchExists(f"branch {branch_name} already exists in {repo}; {branch_exists_remedy(repo, branch_name)}")
    tmp = Path(tempfile.mkdtemp(prefix="infrarsi-apply-"))
    worktree = tmp / "worktree"
    created = False
    try:
        git(repo, "worktree", "add", "--quiet", "-b", branch_name, str(worktree), baseline_ref)
        created = True
        result = apply_patches(worktree, patch_paths, editable or (lambda _path: True), locked)
        if not result.ok:
            raise WorkspaceError(f"{result.kind}: {result.patch or ''}: {result.reason}")
        knobs = dict(getattr(candidate, "knobs", {}) or {})
        if launch_file is not None:
            launch_path = worktree / launch_file
            original = launch_path.read_text()
            changes = launch_changes(yaml.safe_load(original) or {}, knobs)
            if changes:
                launch_path.write_text(edit_launch_yaml(original, changes))
        else:  # knobs delivered as flags/overrides/variables: no file holds them; the message says them
            changes = launch_changes(golden_values or {}, knobs)
        git(worktree, "add", "--all", ".")
        nothing_staged = git(worktree, "diff", "--cached", "--quiet", check=False).returncode == 0
        if nothing_staged and not (launch_file is None and changes):
            raise WorkspaceError("the candidate changes nothing relative to the golden baseline")
        patches = ", ".join(Path(p).stem for p in patch_paths) or "none"
        launch = ", ".join(f"{k}={v!r}" for k, v in changes.items()) or "none"
        key = candidate.key() if hasattr(candidate, "key") else ""
        message = (
            f"infrarsi: candidate {key}\n\n"
            f"Patches: {patches}\nLaunch changes ({launch_file or 'the command line or environment'}): {launch}\n\n"
            f"{evidence_text.strip()}\n"
        )
        sign = (
            ("-c", "gpg.format=ssh", "-c", f"user.signingkey={Path(signing_key).expanduser().resolve()}")
            if signing_key is not None
            else ()
        )
        signed = ("-S",) if signing_key is not None else ()
        git(worktree, *sign, "commit", *signed, "--quiet", "--no-verify", "--allow-empty", "-m", message, commit=True)
        commit = git(worktree, "rev-parse", "HEAD").stdout.strip()
        files = git(repo, "diff", "--name-only", "--no-renames", baseline_ref, commit).stdout.split()
        return AppliedCandidate(branch=branch_name, commit=commit, files_changed=sorted(files))
    except BaseException:
        if created:
            git(repo, "worktree", "remove", "--force", "--force", str(worktree), check=False)
            git(repo, "branch", "-D", branch_name, check=False)
        raise
    finally:
        if worktree.exists():
            git(repo, "worktree", "remove", "--force", "--force", str(worktree), check=False)
        shutil.rmtree(tmp, ignore_errors=True)
        git(repo, "worktree", "prune", check=False)


def hash_paths(root: Path, paths: Iterable[str]) -> dict[str, str]:
    """sha256 of the given repo-relative paths under ``root``."""
    return {p: file_sha256(root / p) for p in paths}
