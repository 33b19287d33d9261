"""Stack-starting verbs stop everything they started on SIGINT, SIGTERM and SIGHUP (a closed terminal).

``infrarsi trial`` starts an embedded nats-server, the launcher and telemetry, and a training job; the
signal arrives once the job runs. ``infrarsi demo`` (on a simulator contract, so that it is quick) starts the
server and all six services; the signal arrives once they run. Afterwards no process of that tree may be
alive (psutil). Before the fix, SIGTERM killed the verb on the spot and its nats-server stayed running; then a
signal while the stack was still starting left the server the start thread went on to launch (demo, every
signal: ``stack.ensure_stack_for_verb``).
(``infrarsi up``: tests/e2e/test_up.py.)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from infrarsi.backends.sim import write_sim_workload
from infrarsi.runtime.stack import SERVICES

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


def _stops_what_it_started(argv: list[str], running: tuple[str, ...], sig: signal.Signals) -> None:
    """Start the verb, wait until every name in ``running`` shows in its process tree, signal it: nothing of
    that tree may be left, and the verb exits non-zero (interrupted)."""
    verb = subprocess.Popen([sys.executable, "-m", "infrarsi.cli", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        seen: list[psutil.Process] = []
        while time.monotonic() < deadline:
            seen = _tree(verb.pid)
            names = " ".join(_names(seen))
            if all(name in names for name in running):
                break
            assert verb.poll() is None, verb.stdout.read().decode() if verb.stdout else ""
            time.sleep(0.5)
        else:
            pytest.fail(f"never saw {running} running: {_names(seen)}")
        verb.send_signal(sig)
        verb.wait(60)
        gone, alive = psutil.wait_procs(seen[1:], timeout=30)
        assert not alive, f"left running after {sig.name}: {_names(alive)}"
        assert verb.returncode != 0
    finally:
        if verb.poll() is None:
            verb.kill()
            verb.wait()


SIGNALS = ["SIGTERM", "SIGINT", "SIGHUP"]


@pytest.mark.parametrize(
    "sig",
    [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow), pytest.param(signal.SIGHUP, marks=pytest.mark.slow)],
    ids=SIGNALS,
)
def test_trial_stops_what_it_started(tmp_path: Path, sig: signal.Signals) -> None:
    argv = ["trial", str(CONTRACT), "--data-dir", str(tmp_path / "data"), "--steps", "400"]
    _stops_what_it_started(argv, ("nats-server", "infrarsi_services.launcher", "train.py"), sig)


@pytest.mark.parametrize(
    "sig",
    [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow), pytest.param(signal.SIGHUP, marks=pytest.mark.slow)],
    ids=SIGNALS,
)
def test_demo_stops_what_it_started(tmp_path: Path, sig: signal.Signals) -> None:
    contract = write_sim_workload(tmp_path / "workload", "dense7b_h100x64", steps=400, trials=4, parallel=1,
                                  accelerator_hours=100.0)  # fmt: skip
    path = tmp_path / "contract.yaml"
    path.write_text(yaml.safe_dump(contract, sort_keys=False))
    argv = ["demo", "--contract", str(path), "--data-dir", str(tmp_path / "data")]
    _stops_what_it_started(argv, ("nats-server", *(f"infrarsi_services.{name}" for name in SERVICES)), sig)
