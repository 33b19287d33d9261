"""The dashboard watching a real stack run real trials: ``infrarsi up`` (nats-server and the six services),
``infrarsi dashboard`` on the same data directory, then ``infrarsi trial`` on the reference GPT workload (its
baseline and one candidate, real PyTorch training with the probe). The dashboard's JSON shows the trials while
they run, then their measured numbers — the same as the trial command's own report."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from support.dashboard import INFRARSI, running_dashboard

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

CONTRACT = Path(__file__).resolve().parents[2] / "workloads" / "gpt" / "contracts" / "dense-1node.yaml"
STEPS = 8


def _json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def test_the_dashboard_follows_a_real_trial_on_a_running_stack(tmp_path):
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k != "INFRARSI_NATS_URL"}
    up_log = tmp_path / "up.log"
    with open(up_log, "w") as out:
        up = subprocess.Popen([*INFRARSI, "--data-dir", str(data), "up"], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 180
        while "services ready" not in up_log.read_text():
            assert up.poll() is None and time.monotonic() < deadline, up_log.read_text()
            time.sleep(0.2)
        with running_dashboard("dashboard", "--port", "0", data_dir=data) as page:
            trial = subprocess.Popen(
                [*INFRARSI, "--data-dir", str(data), "trial", str(CONTRACT), "--steps", str(STEPS), "--json",
                 "--set", "knobs.optimizer_impl=foreach"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            seen_running: set[str] = set()
            while trial.poll() is None:
                for study in _json(page + "api/studies"):
                    detail = _json(f"{page}api/studies/{study['study_id']}")
                    seen_running |= {t["trial_id"] for t in detail["trials"] if t["outcome"] == "running"}
                time.sleep(0.2)
            out, err = trial.communicate()
            assert trial.returncode == 0, err[-3000:]
            report = json.loads(out.strip().splitlines()[-1])

            # The dashboard catches up within seconds of the last event.
            deadline = time.monotonic() + 30
            while True:
                [study] = _json(page + "api/studies")
                detail = _json(f"{page}api/studies/{study['study_id']}")
                if all(t["outcome"] == "ok" and t["steps_seen"] for t in detail["trials"]) and len(detail["trials"]) == 2:
                    break
                assert time.monotonic() < deadline, detail["trials"]
                time.sleep(0.5)

            trials = detail["trials"]
            assert seen_running == {t["trial_id"] for t in trials}, "each trial was shown while it ran"
            by_kind = {t["kind"]: t for t in trials}
            for run, kind in ((report["baseline"], "baseline"), (report["candidate"][0], "search")):
                shown, measured = by_kind[kind], run["measured"]
                assert shown["trial_id"] == run["trial_id"]
                assert shown["step_time_s"] == pytest.approx(measured["step_time_s"])
                assert shown["peak_bytes"] == max(measured["peak_memory_bytes"])
                assert shown["accelerator_s"] == pytest.approx(run["finished"]["accelerator_s"])
                assert {i["name"] for i in shown["invariants"]} == {i["name"] for i in measured["invariants"]}
                assert shown["steps_seen"] >= STEPS - 1
            assert by_kind["search"]["knobs"] == {"knobs.optimizer_impl": "foreach"}  # as --set named it
            assert study["accelerator_hours"] == pytest.approx(sum(t["accelerator_s"] for t in trials) / 3600)
    finally:
        descendants = psutil.Process(up.pid).children(recursive=True)
        up.terminate()
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
        for proc in descendants:
            if proc.is_running():
                proc.kill()
