"""A stack killed under a running study: ``infrarsi up`` (nats-server and the six services as processes), a study on
the simulator backend, and while a search trial runs every process of the stack is SIGKILLed — no service gets to
stop anything. The next ``infrarsi up`` over the same data directory carries the study to its end: the interrupted
trial is recorded once, ``cancelled`` as the harness's failure with the accelerator time it ran up, its candidate
is run again (``retry_of``) outside the budget, no trial is launched twice, and the study passes its stages to
``StudyFinished``. Nothing has to be resumed by hand: ``infrarsi resume`` then refuses the finished study. Then the
same during a verification (``infrarsi verify``): the lost run is run again in its place in the round, and the
verdict is decided by the runs, not by the crash."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from infrarsi import events as ev
from infrarsi.backends.sim import write_sim_workload
from infrarsi.bus.client import Bus
from infrarsi.commands.study_log import read_study
from infrarsi.verdicts import verification as vf

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

INFRARSI = str(Path(sys.executable).parent / "infrarsi")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("INFRARSI_")}


def _cli(data: Path, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([INFRARSI, "--data-dir", str(data), *args], capture_output=True, text=True, timeout=timeout,
                          env=ENV)


def _up(data: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        stack = subprocess.Popen([INFRARSI, "--data-dir", str(data), "up"], stdout=out, stderr=subprocess.STDOUT, env=ENV)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = _cli(data, "status", "--json", timeout=60)
        if status.returncode == 0 and all(s["alive"] for s in json.loads(status.stdout)["services"].values()):
            return stack
        assert stack.poll() is None, log.read_text()[-3000:]
        time.sleep(1.0)
    raise AssertionError(f"`infrarsi up` not ready in 120 s: {log.read_text()[-3000:]}")


def _kill_everything(stack: subprocess.Popen[bytes], data: Path) -> None:
    """SIGKILL ``up``, every process under it and the nats-server (in a session of its own) at once."""
    server = psutil.Process(json.loads((data / "nats-server.json").read_text())["pid"])
    victims = [psutil.Process(stack.pid), *psutil.Process(stack.pid).children(recursive=True), server]
    for proc in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    gone, alive = psutil.wait_procs(victims, timeout=20)
    assert not alive


async def _events(data: Path, study: str) -> list[ev.Event]:
    url = json.loads((data / "nats-server.json").read_text())["url"]
    bus = await Bus.connect(url, service="admin", data_dir=data)
    try:
        events, _ = await read_study(bus, study)
    finally:
        await bus.close()
    return events


async def _until(data: Path, study: str, check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check(await _events(data, study))
        if found:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _running_search_trial(events: list[ev.Event]) -> str | None:
    search = {e.trial_id for e in events if isinstance(e.payload, ev.TrialProposed) and e.payload.kind == "search"}
    launched = {e.trial_id for e in events if e.type == "TrialLaunched"}
    finished = {e.trial_id for e in events if e.type == "TrialFinished"}
    running = sorted((search & launched) - finished)
    return running[0] if running else None


async def test_a_study_goes_on_after_its_whole_stack_is_killed_mid_trial(tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "up.log"
    contract = write_sim_workload(tmp_path / "workload", "dense7b_h100x64", knobs=["tp", "micro_batch", "recompute"],
                                  restrict={"micro_batch": [1, 2, 4]}, steps=12, trials=3, parallel=1)
    contract["workload"]["env"]["INFRARSI_SIM_STEP_S"] = "0.4"  # a trial runs seconds: long enough to be killed in
    contract["verify"] = {"top_k": 1, "repeats": 1, "passes_required": 1}
    (tmp_path / "contract.yaml").write_text(yaml.safe_dump(contract))

    stack = _up(data, log)
    try:
        init = _cli(data, "init", str(tmp_path / "contract.yaml"), "--json")
        assert init.returncode == 0, init.stderr
        study = json.loads(init.stdout)["study_id"]
        doctor = _cli(data, "doctor", study, timeout=600)
        assert doctor.returncode == 0, doctor.stderr
        assert _cli(data, "run", study, "--no-wait").returncode == 0

        def stepping(events: list[ev.Event]) -> str | None:  # a search trial running, its steps under way
            trial = _running_search_trial(events)
            probe = data / "launcher" / "trials" / str(trial) / "probe" / "probe-rank0.jsonl"
            return trial if trial and probe.exists() and probe.read_text().strip() else None

        interrupted = await _until(data, study, stepping, 240, "a search trial to run its first steps")
        _kill_everything(stack, data)
        probe = (data / "launcher" / "trials" / interrupted / "probe" / "probe-rank0.jsonl").read_text()
        records = [json.loads(line) for line in probe.splitlines() if line.endswith("}")]  # none torn by the kill
        played_s = sum(r["payload"]["step_time_s"] for r in records)  # the steps it played, in real time

        stack = _up(data, log)
        events = await _until(data, study, lambda es: es if any(e.type == "StudyFinished" for e in es) else None,
                              300, "the study to finish after the restart")

        # the interrupted trial: one record, the harness's failure, its cost kept
        [cut] = [e.payload for e in events if e.trial_id == interrupted and isinstance(e.payload, ev.TrialFinished)]
        assert cut.status == "cancelled" and cut.infrastructure and "killed mid-trial" in cut.reason
        assert 1 <= cut.steps_completed == len(records) < 12  # cut short
        assert cut.wall_s >= 0.9 * played_s and cut.accelerator_s == pytest.approx(cut.wall_s)  # one rank

        # its candidate run again, once, to an outcome of its own
        [rerun] = [e for e in events if isinstance(e.payload, ev.TrialProposed) and e.payload.retry_of == interrupted]
        original = next(e.payload for e in events if e.trial_id == interrupted and isinstance(e.payload, ev.TrialProposed))
        assert rerun.payload.candidate.key() == original.candidate.key()
        [rerun_done] = [e.payload for e in events if e.trial_id == rerun.trial_id and isinstance(e.payload, ev.TrialFinished)]
        assert rerun_done.status != "cancelled"

        # no trial launched twice, none without its record
        proposed = [e.trial_id for e in events if e.type == "TrialProposed"]
        launched = [e.trial_id for e in events if e.type == "TrialLaunched"]
        finished = [e.trial_id for e in events if e.type == "TrialFinished"]
        assert len(launched) == len(set(launched)) and len(finished) == len(set(finished))
        assert set(proposed) == set(finished)
        searched = [e for e in events if isinstance(e.payload, ev.TrialProposed) and e.payload.kind == "search"]
        assert len([e for e in searched if e.payload.retry_of is None]) == 3  # the budget; the re-run is outside it

        # the study's stages, in order, to its end
        stages = [e.type for e in events if e.type in ("StudyCreated", "DoctorCompleted", "RunRequested", "StudyFinished")]
        assert stages == ["StudyCreated", "DoctorCompleted", "RunRequested", "StudyFinished"]

        listed = _cli(data, "studies", "--json")
        [row] = [json.loads(line) for line in listed.stdout.splitlines()]
        assert row["stage"] == "finished" and row["in_flight"] == 0
        assert row["accelerator_s"] == pytest.approx(sum(e.payload.accelerator_s for e in events
                                                         if isinstance(e.payload, ev.TrialFinished)), abs=1e-2)
        assert row["outcomes"].get("cancelled") == 1
        refused = _cli(data, "resume", study)
        assert refused.returncode == 2 and "it is finished" in refused.stderr

        # once more during a verification: the lost run is run again in its place, and the verdict is the runs'
        def verdicts(events: list[ev.Event]) -> list[ev.VerifyCompleted]:
            return [e.payload for e in events if isinstance(e.payload, ev.VerifyCompleted) and vf.is_final(e.payload)]

        earlier = len(verdicts(events))  # the search may have ended in a verification of its own
        assert _cli(data, "verify", study, "--top", "1", "--repeats", "1", "--no-wait").returncode == 0

        def verify_stepping(events: list[ev.Event]) -> str | None:
            verify = {e.trial_id for e in events if isinstance(e.payload, ev.TrialProposed) and e.payload.kind == "verify"}
            finished = {e.trial_id for e in events if e.type == "TrialFinished"}
            running = sorted(t for t in verify - finished if t is not None
                             and (data / "launcher" / "trials" / t / "probe" / "probe-rank0.jsonl").exists()
                             and (data / "launcher" / "trials" / t / "probe" / "probe-rank0.jsonl").read_text().strip())
            return running[0] if running else None

        lost = await _until(data, study, verify_stepping, 240, "a verification run to run its first steps")
        _kill_everything(stack, data)
        stack = _up(data, log)
        events = await _until(data, study, lambda es: es if len(verdicts(es)) > earlier else None,
                              300, "the verification's verdict after the restart")
        [lost_done] = [e.payload for e in events if e.trial_id == lost and isinstance(e.payload, ev.TrialFinished)]
        assert lost_done.status == "cancelled" and lost_done.infrastructure and lost_done.accelerator_s > 0
        [again] = [e for e in events if isinstance(e.payload, ev.TrialProposed) and e.payload.retry_of == lost]
        assert again.payload.kind == "verify"
        [verdict] = verdicts(events)[earlier:]
        assert "run.cancelled" not in verdict.failed_invariants, verdict
        assert again.trial_id in verdict.trial_ids and lost not in verdict.trial_ids
        launched = [e.trial_id for e in events if e.type == "TrialLaunched"]
        assert len(launched) == len(set(launched))
    finally:
        with contextlib.suppress(psutil.NoSuchProcess, subprocess.TimeoutExpired):
            stack.terminate()
            stack.wait(60)
