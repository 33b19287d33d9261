"""``infrarsi up`` as a user runs it: a foreground process with NATS and the six services; ``status``
sees them; events published reach ``events tail``; Ctrl-C leaves nothing behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.runtime.stack import SERVICES
from support.owned import owned_event

INFRARSI = str(Path(sys.executable).parent / "infrarsi")


def _cli(*args: str, data_dir: Path, timeout: float = 30.0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "INFRARSI_NATS_URL"}
    return subprocess.run(
        [INFRARSI, "--data-dir", str(data_dir), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


class Foreground:
    """``infrarsi up`` in the foreground of a (simulated) terminal, its stdout collected line by line."""

    def __init__(self, data_dir: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "INFRARSI_NATS_URL"}
        self.process = subprocess.Popen(
            [INFRARSI, "--data-dir", str(data_dir), "up"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def close(self) -> None:
        """After a failure: stop `up` as a user would (SIGTERM), and make sure nothing it started survives."""
        if self.process.poll() is not None:
            return
        descendants = psutil.Process(self.process.pid).children(recursive=True)
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        for proc in descendants:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()

    def wait_for_line(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            if self.process.poll() is not None or time.monotonic() > deadline:
                stderr = self.process.stderr.read() if self.process.poll() is not None else ""
                raise AssertionError(f"`infrarsi up` did not print {text!r}: {self.lines}\n{stderr}")
            time.sleep(0.1)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.integration
async def test_up_status_tail_and_clean_interrupt(tmp_path: Path) -> None:
    data_dir = tmp_path / "state"
    up = Foreground(data_dir)
    try:
        up.wait_for_line("services ready", timeout_s=60)
        server = json.loads((data_dir / "nats-server.json").read_text())

        second = _cli("up", data_dir=data_dir)
        assert second.returncode == 2
        assert second.stderr.startswith("error: a stack is already running under"), second.stderr

        status = _cli("status", "--json", data_dir=data_dir)
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        assert {name for name, svc in doc["services"].items() if svc["alive"]} == set(SERVICES)
        service_pids = {svc["pid"] for svc in doc["services"].values()}
        assert all(f"pid {pid}" in "\n".join(up.lines) for pid in service_pids), "up prints every pid"
        assert set(doc["streams"]) == {"IRSI", "IRSI_TELEMETRY", "IRSI_BANK"}

        # What is published is what `events tail` prints, filtered by study and type.
        study = ev.new_id()
        bus = await Bus.connect(server["url"], service="admin", data_dir=data_dir)  # `up` turned auth on
        try:
            sent = [owned_event(ev.DoctorRequested(repeats=r), study_id=study) for r in (2, 3)]
            sent.append(owned_event(ev.StudyFinished(reason="e2e", trials=0, accelerator_s=0.0), study_id=study))
            await bus.publish_many(sent)
        finally:
            await bus.close()
        tail = _cli("events", "tail", "--study", study, "--type", "DoctorRequested", data_dir=data_dir)
        assert tail.returncode == 0, tail.stderr
        printed = [ev.decode(line.encode()) for line in tail.stdout.splitlines()]
        assert printed == sent[:2]

        # A service that dies is restarted by `up` (its durable consumer resumes where it stopped).
        crashed = doc["services"]["verifier"]["pid"]
        os.kill(crashed, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:
            services = json.loads(_cli("status", "--json", data_dir=data_dir).stdout)["services"]
            if services["verifier"]["alive"] and services["verifier"]["pid"] != crashed:
                break
            assert time.monotonic() < deadline, "verifier was not restarted"
            time.sleep(0.3)
        service_pids = {svc["pid"] for svc in services.values()}

        processes = [psutil.Process(pid) for pid in (*service_pids, server["pid"])]
        up.process.send_signal(signal.SIGINT)
        assert up.process.wait(30) == 0
        gone, alive = psutil.wait_procs(processes, timeout=5)
        assert not alive, f"left behind: {alive}"
        assert _port_free(int(server["url"].rsplit(":", 1)[1]))
        assert not (data_dir / "nats-server.json").exists()

        after = _cli("status", data_dir=data_dir)
        assert after.returncode == 2
        assert after.stderr.startswith("error: no NATS server")
        assert "Traceback" not in after.stderr
    finally:
        up.close()


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_up_stops_everything_it_started_on(tmp_path: Path, sig: signal.Signals) -> None:
    """A supervisor's SIGTERM and a closed terminal's SIGHUP stop `up` as Ctrl-C does (SIGINT: the test above):
    every service and the server gone, the port free, no state file claiming a live server."""
    data_dir = tmp_path / "state"
    up = Foreground(data_dir)
    try:
        up.wait_for_line("services ready", timeout_s=60)
        server = json.loads((data_dir / "nats-server.json").read_text())
        started = psutil.Process(up.process.pid).children(recursive=True)
        assert server["pid"] in {p.pid for p in started} and len(started) >= len(SERVICES) + 1
        up.process.send_signal(sig)
        assert up.process.wait(60) == 0
        gone, alive = psutil.wait_procs(started, timeout=10)
        assert not alive, f"left running after {sig.name}: {[p.pid for p in alive]}"
        assert _port_free(int(server["url"].rsplit(":", 1)[1]))
        assert not (data_dir / "nats-server.json").exists() and not (data_dir / "stack.json").exists()
    finally:
        up.close()


@pytest.mark.integration
def test_services_stop_when_up_is_killed_and_the_next_up_recovers(tmp_path: Path) -> None:
    """SIGKILL gives `up` no chance to stop anything: the services notice their parent is gone and stop
    themselves (gracefully), instead of consuming and launching trials for nobody. The NATS server, in its
    own session and holding the log, is left running with nobody to stop it: the next `up` over the data dir
    stops that orphan cleanly and starts a whole stack on the same port (before, it refused: "a stack is
    already running")."""
    data_dir = tmp_path / "state"
    up = Foreground(data_dir)
    server_pid = None
    again = None
    try:
        up.wait_for_line("services ready", timeout_s=60)
        server = json.loads((data_dir / "nats-server.json").read_text())
        server_pid = server["pid"]
        services = [p for p in psutil.Process(up.process.pid).children() if p.pid != server_pid]
        assert len(services) == len(SERVICES)
        up.process.kill()
        up.process.wait(10)
        gone, alive = psutil.wait_procs(services, timeout=20)
        assert not alive, f"services outlived a killed `up`: {[p.pid for p in alive]}"
        for name in SERVICES:  # each stopped itself, through its graceful path
            log_text = (data_dir / "logs" / f"{name}.log").read_text()
            assert "the stack that started this service is gone" in log_text and "service stopped" in log_text, name
        assert psutil.pid_exists(server_pid), "the orphaned server is still running"

        again = Foreground(data_dir)
        again.wait_for_line("services ready", timeout_s=60)
        assert not psutil.pid_exists(server_pid), "the next `up` stopped the orphaned server"
        restarted = json.loads((data_dir / "nats-server.json").read_text())
        assert restarted["pid"] != server_pid and restarted["url"] == server["url"]
        status = _cli("status", "--json", data_dir=data_dir)
        assert status.returncode == 0, status.stderr
        assert all(svc["alive"] for svc in json.loads(status.stdout)["services"].values())
        again.process.send_signal(signal.SIGINT)
        assert again.process.wait(60) == 0
    finally:
        up.close()
        if again is not None:
            again.close()
        if server_pid is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(server_pid).kill()
