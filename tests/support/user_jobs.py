"""A user's own training job as the end-to-end tests meet it, and the ``infrarsi`` CLI run on it as the user runs
it (a subprocess of this interpreter with none of the caller's ``INFRARSI_*`` settings).

``make_job_repo`` writes the job's files into a committed repository and prepares its data (``prepare.py``),
ignored by the job's own ``.gitignore``; ``scaffold`` drafts a contract from the job's command; ``five_stages``
runs ``infrarsi demo`` on a contract and reads back the JSON summary it ends with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

CLI = [sys.executable, "-m", "infrarsi.cli"]


def make_job_repo(path: Path, files: dict[str, str], message: str) -> Path:
    """The repository at ``path`` (created): ``files`` (relative path → text, ``prepare.py`` among them) committed
    with ``message``, then ``prepare.py`` run there; its ``data/`` is ignored, so never committed."""
    path.mkdir(parents=True)
    for name, text in {**files, ".gitignore": "data/\n__pycache__/\n"}.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", message], check=True)
    subprocess.run([sys.executable, "prepare.py"], cwd=path, check=True)
    return path


def user_env() -> dict[str, str]:
    """This process's environment without ``INFRARSI_*`` (a test runner's settings are not the user's)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("INFRARSI_")}


def scaffold(repo: Path, out: Path, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """``infrarsi scaffold --repo REPO --out OUT -- COMMAND``: the contract drafted from the command a README gives."""
    return subprocess.run([*CLI, "scaffold", "--repo", str(repo), "--out", str(out), "--", *command],
                          capture_output=True, text=True, timeout=120, env=user_env())  # fmt: skip


def trial_json(contract: Path, data_dir: Path, steps: int, knob: str, *, timeout_s: float) -> tuple[int, dict]:
    """``infrarsi trial CONTRACT --steps N --peak-budget 5 --json --set KNOB``: the baseline and one candidate,
    (the verb's exit status, the JSON report it prints last)."""
    proc = subprocess.run(
        [*CLI, "trial", str(contract), "--data-dir", str(data_dir), "--steps", str(steps), "--peak-budget", "5",
         "--json", "--set", knob],
        capture_output=True, text=True, timeout=timeout_s, env=user_env(),
    )  # fmt: skip
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report: dict = json.loads(proc.stdout.strip().splitlines()[-1])
    return proc.returncode, report


def five_stages(contract: Path, data_dir: Path, *, trials: int = 4) -> tuple[subprocess.CompletedProcess[str], dict]:
    """``infrarsi --data-dir DATA_DIR demo --contract CONTRACT --trials N --skip-hacks --json``: the process and its
    summary (``{}`` when it printed none). The output is printed: ``pytest -rA`` shows the verdict, the speed-up
    and the invariants."""
    proc = subprocess.run(
        [*CLI, "--data-dir", str(data_dir), "demo", "--contract", str(contract), "--trials", str(trials),
         "--skip-hacks", "--json"],
        env=user_env(), capture_output=True, text=True, timeout=3500,
    )  # fmt: skip
    out = proc.stdout
    summary = json.loads(out[out.index("{\n"):]) if "{\n" in out else {}
    print(out)
    return proc, summary
