"""Service processes against a real nats-server: dead letters, fan-out to every subscriber, replayed read
models, and crash safety between publishing an output and acking the input."""

from __future__ import annotations

from pathlib import Path

import msgspec
import psutil
import pytest
from infrarsi import events as ev
from infrarsi.bus import subjects
from infrarsi.bus.client import LIFECYCLE_STREAM, Bus
from infrarsi.commands.status import collect
from infrarsi.runtime.stack import Stack
from infrarsi_services.modeler.service import ModelerService
from infrarsi_services.proposer.service import ProposerService
from infrarsi_services.verifier.service import VerifierService
from support.owned import owned_event
from support.proposer_faults import answering_proposer, service_status, study_created

pytestmark = pytest.mark.integration

HELPERS = Path(__file__).parent / "helper_services.py"


def _study_created(study: str, payload_samples: dict[str, object]) -> ev.Event:
    return study_created(study, payload_samples, "fan-out")


async def test_malformed_message_is_dead_lettered_and_next_is_handled(
    fresh_nats_server, spawn_service, wait_answering, wait_for, payload_samples
) -> None:
    async with answering_proposer(fresh_nats_server, spawn_service, wait_answering) as (bus, proposer):
        study = ev.new_id()
        raw = b'{"event_id": "broken", "type": "StudyCreated", "payload": {'
        await bus.publish_raw(f"irsi.{study}.StudyCreated", raw)
        await bus.publish(_study_created(study, payload_samples))

        async def status_after_both():
            status = await service_status(bus, "proposer")
            return status if status and status["handled"] == 1 and status["dead_lettered"] == 1 else None

        status = await wait_for(status_after_both)
        assert status["failed"] == 0
        view = status["studies"][study]
        assert view["name"] == "fan-out" and view["phase"] == "idle"
        assert "cannot" not in view["stop_reason"]

        stored = await bus.js.get_last_msg(LIFECYCLE_STREAM, subjects.deadletter_subject("proposer"))
        letter = msgspec.json.decode(stored.data, type=ev.DeadLetter)
        assert letter.service == "proposer"
        assert letter.subject == f"irsi.{study}.StudyCreated"
        assert letter.raw == raw
        assert "DecodeError" in letter.error
        assert proposer.process.poll() is None, "the service must keep running after a bad message"
        assert "dead-lettered message" in proposer.log()
        assert proposer.terminate() == 0


async def test_every_event_reaches_every_subscriber_and_read_models_replay(
    fresh_nats_server, tmp_path, spawn_service, wait_answering, wait_for, payload_samples
) -> None:
    services = {s.name: s for s in (ProposerService, ModelerService, VerifierService)}
    study = ev.new_id()
    overrides = {
        "TrialMeasured": {"status": "ok", "kind": "verify"},
        "TrialFinished": {"status": "oom", "censored_peak_bytes": 1 << 30},
    }
    events = [_study_created(study, payload_samples)]
    for name, payload in payload_samples.items():
        if name != "StudyCreated":
            payload = msgspec.structs.replace(payload, **overrides.get(name, {}))  # type: ignore[arg-type]
            events.append(owned_event(payload, study_id=study, trial_id="trial-1"))

    with Stack.start(tmp_path / "stack", nats_url=fresh_nats_server, services=tuple(services)) as stack:
        bus = await Bus.connect(stack.url, service="test")
        try:
            await bus.publish_many(events)
            expected = {name: sum(e.type in {t.__name__ for t in svc.consumes} for e in events) for name, svc in services.items()}
            assert expected == {"proposer": 11, "modeler": 5, "verifier": 5}

            async def handled_counts():
                doc = await collect(bus, 0.2)
                # Reactions cascade (the verifier's TrialProposed reaches proposer and modeler), so each
                # service handled at least what we published, and every consumer has caught up.
                counts = {n: doc["services"][n].get("handled") or 0 for n in services}
                caught_up = all(
                    c["lag"] == 0 and c["num_ack_pending"] == 0 for c in doc["consumers"][LIFECYCLE_STREAM].values()
                )
                return doc if caught_up and all(counts[n] >= expected[n] for n in services) else None

            doc = await wait_for(handled_counts)
            for name in services:
                assert doc["services"][name]["dead_lettered"] == 0
                assert doc["consumers"][LIFECYCLE_STREAM][name]["lag"] == 0
            assert not doc["services"]["launcher"]["alive"]  # not started here

            # Each service folded the study into its own read model (the sample contract is not searchable,
            # so the proposer ends the study when asked to run it, and says why).
            proposer_view = doc["services"]["proposer"]["studies"][study]
            assert proposer_view["name"] == "fan-out" and proposer_view["phase"] == "finished"
            assert proposer_view["load_error"]
            assert study in doc["services"]["modeler"]["studies"]
            assert doc["services"]["verifier"]["verifications"] >= 1
            pids = list(stack.pids().values())
        finally:
            await bus.close()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)

    # A new life rebuilds its read model from the stream; nothing is redelivered (all was acked).
    bus = await Bus.connect(fresh_nats_server, service="test")
    try:
        proposer = spawn_service("proposer", fresh_nats_server)
        replies = await wait_answering(bus, proposer)
        status = replies[proposer.pid]
        assert status["handled"] == 0
        assert status["studies"][study]["phase"] == "finished"
        assert proposer.terminate() == 0
    finally:
        await bus.close()


async def test_crash_between_publish_and_ack_leaves_no_duplicate_and_no_gap(
    fresh_nats_server, tmp_path, spawn_service, wait_answering, wait_for
) -> None:
    hold = tmp_path / "hold"
    marker = tmp_path / "published"
    hold.touch()
    env = {"CRASHY_HOLD_FILE": str(hold), "CRASHY_MARKER": str(marker)}
    study = ev.new_id()
    output_subject = f"irsi.{study}.StudyFinished"

    async def outputs() -> int:
        info = await bus.js.stream_info(LIFECYCLE_STREAM, subjects_filter=output_subject)
        return (info.state.subjects or {}).get(output_subject, 0)

    bus = await Bus.connect(fresh_nats_server, service="test")
    try:
        first = spawn_service("crashy", fresh_nats_server, script=HELPERS, env=env)
        await wait_answering(bus, first)
        request = owned_event(ev.DoctorRequested(repeats=2), study_id=study)
        await bus.publish(request)

        await wait_for(lambda: marker.exists() and marker.read_text().count("\n") == 1)
        first.kill()  # published, not acked
        assert await outputs() == 1
        consumer = await bus.js.consumer_info(LIFECYCLE_STREAM, "crashy")
        assert consumer.num_ack_pending == 1, "the input must still be unacked after the crash"

        hold.unlink()
        second = spawn_service("crashy", fresh_nats_server, script=HELPERS, env=env)
        await wait_answering(bus, second)

        async def input_acked():
            info = await bus.js.consumer_info(LIFECYCLE_STREAM, "crashy")
            return info.num_ack_pending == 0 and info.num_pending == 0

        await wait_for(input_acked)
        lines = marker.read_text().split()
        assert len(lines) == 2 and lines[0] == lines[1], "the re-run must derive the same output id"
        assert await outputs() == 1, "the re-published output must be dropped as a duplicate"
        stored = ev.decode((await bus.js.get_last_msg(LIFECYCLE_STREAM, output_subject)).data)
        assert stored.event_id == lines[0]
        assert stored.payload == ev.StudyFinished(reason="crash-test", trials=2, accelerator_s=0.0)

        # And the pipeline goes on: the next input is handled once, by the second life.
        await bus.publish(owned_event(ev.DoctorRequested(repeats=3), study_id=study))
        await wait_for(lambda: marker.read_text().count("\n") == 3)
        await wait_for(input_acked)
        assert await outputs() == 2

        async def second_life_handled_both():
            status = await service_status(bus, "crashy")
            return status if status and status["handled"] == 2 else None

        status = await wait_for(second_life_handled_both)  # the runner counts just after its ack
        assert status["dead_lettered"] == 0 and status["failed"] == 0
        assert second.terminate() == 0
    finally:
        await bus.close()


def test_the_services_but_the_launcher_run_niced_so_a_trial_keeps_the_cores(fresh_nats_server, tmp_path) -> None:
    from infrarsi.runtime.stack import SERVICE_NICE

    with Stack.start(tmp_path / "stack", nats_url=fresh_nats_server, services=("launcher", "modeler")) as stack:
        nice = {name: psutil.Process(p.pid).nice() for name, p in stack.processes.items()}
        base = psutil.Process().nice()
        assert nice == {"launcher": base, "modeler": min(19, base + SERVICE_NICE)}
        # every thread of the niced service, not only its first one
        threads = [t.id for t in psutil.Process(stack.processes["modeler"].pid).threads()]
        assert all(psutil.Process(t).nice() == nice["modeler"] for t in threads if psutil.pid_exists(t))


def test_stack_stop_kills_a_service_that_ignores_sigterm(fresh_nats_server, tmp_path) -> None:
    import os
    import signal

    stack = Stack.start(tmp_path / "stack", nats_url=fresh_nats_server, services=("verifier",))
    try:
        pid = stack.processes["verifier"].pid
        os.kill(pid, signal.SIGSTOP)  # a stopped process never handles the SIGTERM
        stack.stop(timeout_s=1.0)
        assert stack.alive() == {"verifier": False}
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert not (tmp_path / "stack" / "stack.json").exists()
    finally:
        stack.stop()


def test_stack_start_reports_a_service_that_dies_and_leaves_nothing_running(fresh_nats_server, tmp_path) -> None:
    from infrarsi.runtime.stack import StackError

    with pytest.raises(StackError, match="unknown service"):
        Stack.start(tmp_path, nats_url=fresh_nats_server, services=("proposer", "planner"))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(StackError, match=r"(?s)service modeler exited with code 1 during start-up.*NONSENSE"):
        # An invalid log level makes the service fail in its first second, like a broken install would.
        Stack.start(tmp_path, nats_url=fresh_nats_server, services=("modeler",), env={"INFRARSI_LOG_LEVEL": "nonsense"})
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_ensure_stack_starts_one_only_when_none_runs(tmp_path, monkeypatch) -> None:
    from infrarsi.runtime.stack import ensure_stack

    monkeypatch.delenv("INFRARSI_NATS_URL", raising=False)
    assert ensure_stack("nats://example:4222", tmp_path) == ("nats://example:4222", None)
    url, stack = ensure_stack(None, tmp_path, services=("proposer",))
    assert stack is not None
    try:
        assert stack.alive() == {"proposer": True, "nats": True}
        assert ensure_stack(None, tmp_path) == (url, None), "a running stack under the data dir is reused"
    finally:
        stack.stop()
    assert stack.alive() == {"proposer": False, "nats": False}
