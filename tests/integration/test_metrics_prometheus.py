"""Prometheus metrics (issue 36, item 2): a real Prometheus (Debian's package, installed when missing) scrapes a real
stack — NATS and the six services as processes, ``INFRARSI_METRICS_PORT=0`` — through the file-service-discovery
targets the services write, with the scrape config of ``deploy/prometheus/``; the values queried back equal the
event log's counts: trials by outcome, accelerator-seconds, dead letters, refits, and every consumer's lag at rest.

The study: the real ``slowed_workload`` PyTorch job searched for two trials through the CLI (``init``, ``run``),
its verification cancelled mid-run (``cancel``: the stopped trials count as ``cancelled``), and one undecodable
message published where five services read it (each dead-letters it)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.bus.reader import read_stream
from infrarsi.bus.subjects import LIFECYCLE_STREAM, is_deadletter, lifecycle_subject
from infrarsi.runtime.stack import SERVICES, Stack
from support.prometheus_server import PrometheusServer, install_reason
from support.slowed_workload import make_slowed_workload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

INFRARSI = str(Path(sys.executable).parent / "infrarsi")


def cli(data_dir: Path, *args: str, timeout: float = 600.0) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFRARSI_")}
    proc = subprocess.run([INFRARSI, "--data-dir", str(data_dir), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, f"infrarsi {' '.join(args)} → {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


async def log_counts(url: str, data_dir: Path, study: str) -> dict[str, object]:
    """What the event log says: trials by outcome, their accelerator-seconds, dead letters, model refits."""
    bus = await Bus.connect(url, service="admin", data_dir=data_dir)
    try:
        outcomes: Counter[str] = Counter()
        accelerator_s = 0.0
        refits = 0
        async for event in bus.events(LIFECYCLE_STREAM, lifecycle_subject(study, "*")):
            match event.payload:
                case ev.TrialFinished(status=status, accelerator_s=spent):
                    outcomes[status] += 1
                    accelerator_s += spent
                case ev.ModelUpdated():
                    refits += 1
                case _:
                    pass
        dead = 0
        async for msgs in read_stream(bus, LIFECYCLE_STREAM, 1):
            dead += sum(1 for _seq, subject, _data in msgs if is_deadletter(subject))
        return {"outcomes": dict(outcomes), "accelerator_s": accelerator_s, "dead_letters": dead, "refits": refits}
    finally:
        await bus.close()


async def second_trial_running(url: str, data_dir: Path, study: str, timeout_s: float = 400.0) -> None:
    """Until the first search trial finished and the second was launched (then cancelled by the test)."""
    bus = await Bus.connect(url, service="admin", data_dir=data_dir)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            finished, launched = set(), set()
            async for event in bus.events(LIFECYCLE_STREAM, lifecycle_subject(study, "*")):
                match event.payload:
                    case ev.TrialFinished():
                        finished.add(event.trial_id)
                    case ev.TrialLaunched():
                        launched.add(event.trial_id)
                    case _:
                        pass
            if finished and launched - finished:
                await asyncio.sleep(1.0)
                return
            await asyncio.sleep(0.5)
        raise AssertionError("the second trial never ran")
    finally:
        await bus.close()


async def publish_garbage(url: str, data_dir: Path, study: str) -> None:
    bus = await Bus.connect(url, service="admin", data_dir=data_dir)
    try:
        await bus.publish_raw(lifecycle_subject(study, "TrialProposed"), b"{not an event", stream=LIFECYCLE_STREAM)
    finally:
        await bus.close()


def by_label(result: list[dict], label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}


def eventually(check, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def test_prometheus_scrapes_the_stack_and_its_values_equal_the_event_log(tmp_path: Path) -> None:
    reason = install_reason()
    if reason is not None:
        pytest.skip(reason)
    data_dir = tmp_path / "data"
    contract = make_slowed_workload(tmp_path, bf16_factor=1.0, steps=30, step_s=0.1, trials=2, timeout_s=300.0)
    with Stack.start(data_dir, env={"INFRARSI_METRICS_PORT": "0"}, ready_timeout_s=180.0) as stack:
        prometheus = PrometheusServer(tmp_path / "prometheus", data_dir)
        try:
            prometheus.wait_ready()
            study = cli(data_dir, "init", str(contract)).strip().splitlines()[-1]
            cli(data_dir, "run", study, "--trials", "2", "--parallel", "1", "--no-wait")
            asyncio.run(second_trial_running(stack.url, data_dir, study))
            cli(data_dir, "cancel", study, "--reason", "metrics test over", "--timeout", "300")
            asyncio.run(publish_garbage(stack.url, data_dir, study))

            def up() -> None:
                targets = prometheus.targets()
                assert sorted(t["labels"]["service"] for t in targets if t["health"] == "up") == sorted(SERVICES)

            eventually(up)

            def matches() -> dict[str, object]:
                log = asyncio.run(log_counts(stack.url, data_dir, study))
                trials = by_label(prometheus.query("sum by (outcome) (infrarsi_trials_total)"), "outcome")
                assert trials == {k: float(v) for k, v in log["outcomes"].items()}, (trials, log)
                [spent] = prometheus.query("sum(infrarsi_accelerator_seconds_total)")
                assert float(spent["value"][1]) == pytest.approx(log["accelerator_s"], rel=1e-9, abs=1e-6)
                dead = by_label(prometheus.query("infrarsi_dead_letters_total"), "service")
                assert sum(dead.values()) == log["dead_letters"] == 5, (dead, log)  # proposer, launcher,
                assert set(dead) == set(SERVICES)  # telemetry, modeler and reporter read TrialProposed
                [refits] = prometheus.query('sum(infrarsi_refit_seconds_count{service="modeler"})')
                assert float(refits["value"][1]) == log["refits"] > 0
                lag = by_label(prometheus.query("sum by (service) (infrarsi_consumer_pending_messages)"), "service")
                assert set(lag) == set(SERVICES) and sum(lag.values()) == 0, lag
                return log

            log = eventually(matches)
            assert log["outcomes"] == {"ok": 1, "cancelled": 1}, log

            decisions = by_label(prometheus.query("sum by (service) (infrarsi_decision_seconds_count)"), "service")
            handled = by_label(prometheus.query("sum by (service) (infrarsi_events_handled_total)"), "service")
            for service in ("proposer", "modeler", "verifier"):  # the reactive services time every decision
                assert decisions[service] == handled[service] > 0, (decisions, handled)
            reconnects = by_label(prometheus.query("infrarsi_bus_reconnects_total"), "service")
            assert reconnects == {s: 0.0 for s in SERVICES}
            p95 = prometheus.query('histogram_quantile(0.95, sum by (le) (infrarsi_decision_seconds_bucket{service="proposer"}))')
            assert 0 < float(p95[0]["value"][1]) < 30
        finally:
            prometheus.stop()
