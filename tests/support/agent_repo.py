"""Helpers for agent tests: a git copy of workloads/gpt, and real unified diffs of edits to it (what a model
would answer), made by git itself in a scratch copy."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPT = ROOT / "workloads" / "gpt"


def git_copy_of_gpt(dest: Path) -> Path:
    """workloads/gpt copied to ``dest`` as a fresh one-commit git repository (``apply`` writes branches there)."""
    shutil.copytree(GPT, dest, ignore=shutil.ignore_patterns("__pycache__"))
    commit(dest)
    return dest


def commit(repo: Path) -> None:
    if not (repo / ".git").exists():
        subprocess.run(["git", "-C", str(repo), "init", "-q"], check=True, capture_output=True)
    for args in (["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "w"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def diff_of(repo: Path, edits: dict[str, tuple[str, str]]) -> str:
    """A real unified diff of one textual edit per file (``{file: (old, new)}``), made by git in a scratch copy."""
    scratch = repo.parent / f"{repo.name}-scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(repo, scratch)
    try:
        for rel, (old, new) in edits.items():
            target = scratch / rel
            text = target.read_text()
            assert old in text, f"{old!r} not in {rel}"
            target.write_text(text.replace(old, new, 1))
        return subprocess.run(["git", "-C", str(scratch), "diff"], capture_output=True, text=True, check=True).stdout
    finally:
        shutil.rmtree(scratch)


def proposals(**doc: object) -> str:
    """A model's answer to a proposals question (the JSON object docs/agent.md specifies)."""
    return json.dumps(doc)
