"""``infrarsi trial --patch ATTACK`` as a user runs it (its own stack, authorization on, every trial in the
sandbox), once per attack of the hostile patch library (``support.hostile_workload``) and once for the honest
patch: every run ends ``ok`` and measured, the attack got nothing the host can see (no seed and no analyst row in
the job's output, no file in the data directory, no connection to the test's listener), and nothing of the
harness is left running. The study (and its baseline) is shared by the module's runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from infrarsi.trial import procs
from support.hostile_workload import ATTACKS, HONEST, STEPS, write_hostile_workload

pytestmark = pytest.mark.slow

ANALYST_SECRET = "analyst-secret-e2e-51d0"


@pytest.fixture(scope="module")
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, listener, sandbox_ready) -> tuple[Path, Path]:
    if sandbox_ready is not None:
        pytest.skip(f"no sandbox: {sandbox_ready}")
    import duckdb

    root = tmp_path_factory.mktemp("hostile-cli")
    data_dir = root / "data"
    (data_dir / "reporter").mkdir(parents=True)
    with duckdb.connect(str(data_dir / "reporter" / "analyst.duckdb")) as db:
        db.execute("CREATE TABLE secret (marker VARCHAR)")
        db.execute("INSERT INTO secret VALUES (?)", [ANALYST_SECRET])
    return write_hostile_workload(root, listener_port=listener.getsockname()[1]), data_dir


@pytest.mark.parametrize("patch", [*ATTACKS, HONEST])
def test_infrarsi_trial_contains_the_attack_and_measures_the_trial(hostile, listener, patch) -> None:
    contract, data_dir = hostile
    env = {k: v for k, v in os.environ.items() if k != "INFRARSI_NATS_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "trial", str(contract), "--data-dir", str(data_dir), "--json",
         "--patch", patch, "--peak-budget", "1"],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert proc.stdout.strip(), proc.stderr[-3000:]
    run = json.loads(proc.stdout.strip().splitlines()[-1])["candidate"][0]
    assert run["finished"]["status"] == "ok", run["finished"]
    assert run["measured"]["status"] == "ok" and run["measured"]["steps"] == STEPS, run["measured"]
    assert procs.tagged_processes(f"{data_dir.absolute() / 'launcher' / 'trials'}|") == []
    logs = {p.parent.name: p.read_text(errors="replace") for p in (data_dir / "launcher" / "trials").glob("*/node0.log")}
    mine = [text for text in logs.values() if f"ATTACK {patch}: " in text]
    if patch == HONEST:
        assert proc.returncode == 0, proc.stderr[-2000:]
    else:
        assert len(mine) == 1, sorted(logs)  # the attack ran, once
    seeds = [p.read_text().strip() for p in (data_dir / "creds").glob("*.nk")]
    assert seeds
    for text in logs.values():
        assert not any(seed in text for seed in seeds)
        assert ANALYST_SECRET not in text
    assert not (data_dir / "PWNED").exists()
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody connected
