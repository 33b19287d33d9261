"""``infrarsi trial`` on examples/torchrun as a user runs it: a plain flag-driven ``torchrun train.py`` script
with no callback and nothing of InfraRSI, whose contract keeps the step pattern ``infrarsi scaffold`` wrote.
The trial is measured coarsely; the steps, the loss and the step time are read from the script's own
``step N | loss … | … ms`` line, and a loop that stops at half the steps is rejected by name. Short horizons keep it in the default suite; both
tests share one data directory, so the study and its baseline are made once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CONTRACT = Path(__file__).resolve().parents[2] / "examples" / "torchrun" / "contract.yaml"
STEPS = 6


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("torchrun-data")


def infrarsi_trial(data_dir: Path, *args: str) -> tuple[int, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFRARSI_")}
    proc = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "trial", str(CONTRACT), "--data-dir", str(data_dir),
         "--steps", str(STEPS), "--peak-budget", "5", "--json", *args],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(960)
def test_trial_counts_the_plain_scripts_steps_with_the_scaffolds_pattern(data_dir: Path) -> None:
    code, report = infrarsi_trial(data_dir, "--set", "batch_size=8", "--set", "attention=sdpa")
    for run in (report["baseline"], report["candidate"][0]):
        m, f = run["measured"], run["finished"]
        assert f["status"] == "ok" and m["status"] == "ok", (f.get("output_tail"), m["invariants"])
        assert m["coarse"] and f["steps_completed"] == STEPS  # "step 0 | loss …" … "step 5 | loss …"
        steps = {i["name"]: i for i in m["invariants"]}["work.optimizer_steps"]
        assert steps["ok"] and "counted in the job's output" in steps["detail"], steps
        assert m["peak_memory_bytes"][0] > 10 << 20  # torch's resident memory, the process tree's peak
        assert 0 < m["step_time_s"] < f["wall_s"]
    unchecked = {u["name"] for u in report["candidate"][0]["measured"]["unchecked_invariants"]}
    assert unchecked == {"work.tokens"}  # named, never passed
    # the loss and step times the script prints ("step 0 | loss 5.5452 | 812.3 ms") are read and checked
    checked = {i["name"]: i for i in report["candidate"][0]["measured"]["invariants"]}
    assert "read from the job's log" in checked["loss"]["detail"] and "printed" in checked["timing"]["detail"], checked
    assert code == 0, report


@pytest.mark.timeout(960)
def test_a_loop_that_stops_early_is_rejected_by_name(data_dir: Path) -> None:
    code, report = infrarsi_trial(data_dir, "--patch", "hack-stop-early")
    m = report["candidate"][0]["measured"]
    assert code == 3 and m["status"] == "invariant_violation"
    assert [i["name"] for i in m["invariants"] if not i["ok"]] == ["work.optimizer_steps"], m["invariants"]
    assert report["candidate"][0]["finished"]["steps_completed"] == STEPS // 2
