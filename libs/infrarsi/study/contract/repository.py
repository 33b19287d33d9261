"""The contract's view of the workload on disk: paths and globs inside the repository, tracked files, file
hashes, and the dotted keys of a launch file. Reads files and runs ``git ls-files``; never writes.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from infrarsi.study import userfiles

IGNORED_DIRS = frozenset({".git", "__pycache__"})


def inside_problem(repo: Path, rel: str, *, glob: bool = False) -> str | None:
    """Why a repo-relative path (or glob) escapes the repo, else ``None``."""
    pure = PurePosixPath(rel)
    if not rel or pure.is_absolute() or rel.startswith("~"):
        return f"{rel!r} must be relative to the workload repo"
    if ".." in pure.parts:
        return f"{rel!r} must not contain '..'"
    root = repo.resolve()
    # The literal prefix (before any glob character) must not lead out through a symlink…
    literal = []
    for part in pure.parts:
        if glob and any(c in part for c in "*?["):
            break
        literal.append(part)
    if literal and not (repo.joinpath(*literal)).resolve().is_relative_to(root):
        return f"{rel!r} resolves outside the workload repo (through a symlink)"
    # …and neither may anything the glob matches today.
    if glob:
        for match in glob_matches(repo, rel):
            if not match.resolve().is_relative_to(root):
                return f"{rel!r} matches {match.relative_to(repo)}, which resolves outside the workload repo"
    return None


def glob_matches(repo: Path, pattern: str) -> Iterator[Path]:
    regex = re.compile(glob_to_regex(pattern))
    for dirpath, dirnames, filenames in os.walk(repo):
        dirnames[:] = [d for d in dirnames if d not in IGNORED_DIRS]
        for name in filenames + dirnames:
            full = Path(dirpath) / name
            if regex.fullmatch(full.relative_to(repo).as_posix()):
                yield full


def glob_to_regex(pattern: str) -> str:
    """Repo glob → regex over posix paths: ``*`` and ``?`` stay in one directory, ``**`` crosses them,
    ``[...]`` is a character class, and a trailing ``/`` means everything under the directory."""
    if pattern.endswith("/"):
        pattern += "**"
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def normalise_rel(path: str | os.PathLike[str]) -> str | None:
    """A clean repo-relative posix path, or ``None`` if it is absolute or climbs with ``..``."""
    text = os.fspath(path).replace("\\", "/")
    pure = PurePosixPath(text)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        return None
    parts = [p for p in pure.parts if p != "."]
    return "/".join(parts) if parts else None


def get_dotted(tree: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """``get_dotted({"knobs": {"mbs": 4}}, "knobs.mbs")`` → ``(True, 4)``; ``(False, None)`` when absent.

    A key present literally (dots and all) at the top level wins over the nested reading."""
    if key in tree:
        return True, tree[key]
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted launch key in place, creating sections as needed (a literal top-level key wins)."""
    if key in tree or "." not in key:
        tree[key] = value
        return
    *parents, leaf = key.split(".")
    node = tree
    for part in parents:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ValueError(f"{key}: {part} is not a section of the launch file")
        node = child
    node[leaf] = value


def read_launch(path: Path) -> dict[str, Any]:
    data = userfiles.load_yaml(path, what="the launch file")
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping of launch keys")
    return data


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes; of ``symlink:<target>`` for a symlink (never followed)."""
    if path.is_symlink():
        return hashlib.sha256(b"symlink:" + os.readlink(path).encode()).hexdigest()
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tracked_files(root: Path) -> list[str]:
    """Repo-relative posix paths of the files of a workload (``git ls-files`` at a repo top, else a walk)."""
    root = Path(root)
    if (root / ".git").exists():
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached"],
            check=True,
            capture_output=True,
        ).stdout.decode()
        files = [f for f in out.split("\0") if f]
    else:
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in IGNORED_DIRS]
            files += [(Path(dirpath) / f).relative_to(root).as_posix() for f in filenames]
    keep = []
    for rel in files:
        if IGNORED_DIRS & set(PurePosixPath(rel).parts) or rel.endswith(".pyc"):
            continue
        full = root / rel
        if full.is_symlink() or full.is_file():
            keep.append(rel)
    return sorted(keep)
