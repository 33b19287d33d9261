"""``infrarsi trial`` says what it is doing, as a user running it without a stack and without a terminal
sees it: the study, the host peak measurement (native dtypes only, within ``--peak-budget``), then for the
baseline and the candidate their launch, their steps as they come, their end and their measurement.

The job is a small plain-PyTorch loop with the probe's ``track`` decorator, its knobs as command-line flags
(``knobs_via: argv``), one OpenMP thread (two spinning threads crawl on a host shared by many jobs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from infrarsi.trial import procs
from support.toy_job import TRACK_IMPORT, TRACKED_LOOP, toy_job_script

TRAIN = toy_job_script(flags={"hidden": 64}, imports=TRACK_IMPORT, body=TRACKED_LOOP)

STEPS = 8


def test_trial_says_what_it_is_doing_without_a_terminal(tmp_path: Path) -> None:
    repo = tmp_path / "job"
    repo.mkdir()
    (repo / "train.py").write_text(TRAIN)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "job"], check=True)
    contract = {
        "name": "progress",
        "goal": "show what infrarsi trial does",
        "workload": {"repo": "job", "command": ["{python}", "train.py", "--batch_size", "16", "--hidden", "64"],
                     "knobs_via": "argv", "env": {"OMP_NUM_THREADS": "1"}, "steps": STEPS, "steps_key": "max_steps",
                     "verify_steps": STEPS},
        "cluster": {"id": "cpu", "accelerator": "cpu", "memory_capacity_bytes": 4 << 30, "peak_flops": None},
        "backend": {"kind": "local", "timeout_s": 600},
        "scope": {"files": [], "launch_keys": ["hidden"]},
        "search_space": {"knobs": {"hidden": {"type": "int", "choices": [64, 128]}}},
        "invariants": {"loss": {"tolerance": 0.5}, "eval": False, "timing_tolerance": 1.0},
        "budget": {"trials": 2, "accelerator_hours": 1.0},
    }  # fmt: skip
    path = tmp_path / "contract.yaml"
    path.write_text(yaml.safe_dump(contract, sort_keys=False))
    data_dir = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k != "INFRARSI_NATS_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "trial", str(path), "--data-dir", str(data_dir), "--json",
         "--set", "hidden=128", "--peak-budget", "2"],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert procs.tagged_processes(f"{data_dir.absolute() / 'launcher' / 'trials'}|") == []
    assert report["candidate"][0]["measured"]["steps"] == STEPS, report
    stderr = proc.stderr
    lines = [line for line in stderr.splitlines() if line.startswith("[trial] ")]
    assert "\r" not in stderr
    assert lines[0].startswith("[trial] study: locking the contract"), lines
    assert lines[1].startswith("[trial] host: measuring the matmul peak in float32") and "at most 2 s" in lines[1], lines
    assert lines[2].startswith("[trial] host: peak ") and "GFLOP/s in" in lines[2], lines
    for label in ("baseline", "candidate 1/1"):
        mine = [line.removeprefix(f"[trial] {label}: ") for line in lines if line.startswith(f"[trial] {label}: ")]
        running = next(i for i, m in enumerate(mine) if m.startswith("running trial"))
        assert mine[running + 1].startswith(f"step 1/{STEPS}"), mine
        assert any(m.startswith(f"step {STEPS}/{STEPS}") for m in mine[running + 1 :]), mine
        assert mine[-2].startswith("finished ok") and mine[-1].startswith("measured ok"), mine
