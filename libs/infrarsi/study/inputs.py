"""A workload's inputs outside git: datasets, tokenizers, prepared shards the job reads but the repository
does not track (untracked, or ignored by its own ``.gitignore``).

Owns three things, each a plain function over paths:

- ``find_inputs``: what ``infrarsi scaffold`` proposes as ``workload.inputs`` — the repository's untracked and
  ignored entries (whole untracked directories as one entry), less caches, virtual environments and the
  job's own output directories;
- ``fingerprint``: what ``init`` locks (``StudyCreated.locked_inputs``) — per file, ``sha256:<hex>``, or
  above ``workload.inputs_hash_limit_bytes`` ``size:<bytes>,mtime_ns:<ns>`` (hashing gigabytes per trial
  would cost more than the trial);
- ``link_inputs``: what the launcher does in each trial worktree — a symbolic link at the input's path to
  the user's copy, so nothing is copied; ``changed`` says which inputs differ from the locked fingerprints
  (before a trial: the data changed since ``init``; after it: the trial wrote to an input).

A link does not stop a job from writing through it; the launcher's check after the trial does (the
trial is refused, its input named). This module runs no job and knows nothing about the bus.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath

DEFAULT_HASH_LIMIT_BYTES = 64 << 20
"""Files larger than this are fingerprinted by size and modification time, not hashed."""

NOT_INPUTS = frozenset({
    "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".ipynb_checkpoints", ".venv", "venv", "env",
    ".env", ".infrarsi", ".git", "wandb", "mlruns", "lightning_logs", "runs", ".tox", "build", "dist", ".cache",
    ".idea", ".vscode", ".DS_Store",
})  # fmt: skip
"""Names of untracked entries that are a tool's caches, environments or logs, never a job's inputs."""
NOT_INPUT_SUFFIXES = (".pyc", ".egg-info", ".log", ".swp")


class InputError(ValueError):
    """An input that cannot be locked or placed in a trial; the message names it."""


def find_inputs(repo: Path, *, outputs: Iterable[str] = ()) -> list[str]:
    """Untracked and ignored entries of the git repository at ``repo`` that may be the job's inputs, sorted;
    ``[]`` when ``repo`` is not the top of a git repository (a snapshot copies everything). ``outputs``:
    repo-relative paths the job writes (its ``--out_dir`` …), left out."""
    top = subprocess.run(["git", "-C", str(repo), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL)  # fmt: skip
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != repo.resolve():
        return []
    # "traditional": a directory whose every file is untracked or ignored is one entry
    result = subprocess.run(
        ["git", "-C", str(repo), "status", "--porcelain=v1", "-z", "--ignored=traditional", "--untracked-files=normal",
         "--no-renames"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, env={**os.environ, "LC_ALL": "C"},
    )  # fmt: skip
    if result.returncode != 0:
        return []
    listed = {entry[3:].rstrip("/") for entry in result.stdout.split("\0") if entry[:3] in ("?? ", "!! ")}
    skipped = {PurePosixPath(os.path.normpath(o)).as_posix() for o in outputs}
    found = []
    for rel in sorted(listed):
        parts = PurePosixPath(rel).parts
        if any(part in NOT_INPUTS or part.endswith(NOT_INPUT_SUFFIXES) for part in parts):
            continue
        if rel in skipped or any(PurePosixPath(rel).is_relative_to(o) for o in skipped):
            continue
        found.append(rel)
    return found


def input_files(root: Path, rel: str) -> list[str]:
    """The files of one input (itself, or every file under it), relative to ``root``."""
    path = root / rel
    if path.is_symlink() or path.is_file():
        return [rel]
    if not path.is_dir():
        raise InputError(f"input {rel} does not exist in {root}")
    out = []
    for directory, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            out.append(Path(directory, name).relative_to(root).as_posix())
    return out


def fingerprint(root: Path, inputs: Sequence[str], *, hash_limit_bytes: int = DEFAULT_HASH_LIMIT_BYTES) -> dict[str, str]:
    """Each file of each input (a file or a directory, relative to ``root``) → its fingerprint."""
    prints: dict[str, str] = {}
    for rel in inputs:
        for file_rel in input_files(root, rel):
            prints[file_rel] = _print(root / file_rel, hash_limit_bytes)
    return prints


def _print(path: Path, hash_limit_bytes: int) -> str:
    stat = path.stat()  # a link's target: the job reads what it points to
    if stat.st_size > hash_limit_bytes:
        return f"size:{stat.st_size},mtime_ns:{stat.st_mtime_ns}"
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def changed(root: Path, inputs: Sequence[str], locked: Mapping[str, str], *,
            hash_limit_bytes: int = DEFAULT_HASH_LIMIT_BYTES) -> list[str]:  # fmt: skip
    """What differs between the inputs under ``root`` now and their ``locked`` fingerprints: one line per
    changed, added or missing file (empty: the same data)."""
    try:
        now = fingerprint(root, inputs, hash_limit_bytes=hash_limit_bytes)
    except (InputError, OSError) as exc:
        return [str(exc)]
    lines = [f"{rel} changed ({locked[rel]} → {now[rel]})" for rel in sorted(now) if rel in locked and now[rel] != locked[rel]]
    lines += [f"{rel} added" for rel in sorted(set(now) - set(locked))]
    lines += [f"{rel} missing" for rel in sorted(set(locked) - set(now))]
    return lines


def link_inputs(source: Path, worktree: Path, inputs: Sequence[str]) -> list[Path]:
    """A symbolic link in ``worktree`` at each input's path, to the input under ``source`` (absolute); the
    links made. An input already present in the worktree (committed in a snapshot) is left as it is."""
    made = []
    for rel in inputs:
        target = (source / rel).absolute()
        dest = worktree / rel
        if dest.exists() or dest.is_symlink():
            continue
        if not (target.exists()):
            raise InputError(f"input {rel} is not in {source} any more")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.symlink_to(target, target_is_directory=target.is_dir())
        made.append(dest)
    return made
