"""Stack-starting verbs stop everything they started on SIGINT, SIGTERM and SIGHUP (a closed terminal).

``infrarsi trial`` starts an embedded nats-server, the launcher and telemetry, and a training job; the
signal arrives once the job runs. Afterwards no process of that tree may be alive (psutil). Before the
fix, SIGTERM killed the verb on the spot and its nats-server stayed running.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "workloads" / "gpt" / "contracts" / "dense-1node.yaml"

pytestmark = pytest.mark.integration


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _names(procs: list[psutil.Process]) -> set[str]:
    out = set()
    for proc in procs:
        try:
            out.add(" ".join(proc.cmdline()[:3]))
        except psutil.Error:
            continue
    return out


@pytest.mark.parametrize(
    "sig",
    [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow), pytest.param(signal.SIGHUP, marks=pytest.mark.slow)],
    ids=["SIGTERM", "SIGINT", "SIGHUP"],
)
def test_trial_stops_what_it_started(tmp_path: Path, sig: signal.Signals) -> None:
    verb = subprocess.Popen(
        [sys.executable, "-m", "infrarsi.cli", "trial", str(CONTRACT), "--data-dir", str(tmp_path / "data"),
         "--steps", "400"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        seen: list[psutil.Process] = []
        while time.monotonic() < deadline:  # until the server, the services and the training job all run
            seen = _tree(verb.pid)
            names = " ".join(_names(seen))
            if "nats-server" in names and "infrarsi_services.launcher" in names and "train.py" in names:
                break
            assert verb.poll() is None, verb.stdout.read().decode() if verb.stdout else ""
            time.sleep(0.5)
        else:
            pytest.fail(f"the trial never got its job running: {_names(seen)}")
        verb.send_signal(sig)
        verb.wait(60)
        gone, alive = psutil.wait_procs(seen[1:], timeout=30)
        assert not alive, f"left running after {sig.name}: {_names(alive)}"
        assert verb.returncode != 0
    finally:
        if verb.poll() is None:
            verb.kill()
            verb.wait()
