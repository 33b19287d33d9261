"""Consume loops against a real nats-server, fed what the fault probes fed them (issue 16, item 5).

Covers: a 7 MB malformed message and a 5,000-deep nested one are dead-lettered (a bounded copy and a digest)
and the next valid event is handled; a restarted service replays past them instead of crash-looping; a
consumer deleted under a running service is bound again, and so is a subscription that fetches nothing while
its consumer has pending messages (orphaned by a cluster leader change); a consume loop that stops pulling is reported
``stalled`` by the heartbeat and by ``infrarsi status``; a comma-separated server list connects.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json

import msgspec
import pytest
from infrarsi import events as ev
from infrarsi.bus import subjects
from infrarsi.bus.client import DEADLETTER_RAW_MAX, Bus
from infrarsi.bus.reader import read_stream
from infrarsi.commands.status import collect, render
from infrarsi.runtime import service as service_module
from infrarsi.runtime.service import Runner
from infrarsi_services.proposer.service import ProposerService
from support.proposer_faults import answering_proposer, service_status, study_created

pytestmark = pytest.mark.integration


def _study_created(study: str, payload_samples: dict[str, object]) -> ev.Event:
    return study_created(study, payload_samples, "faults")


def _deeply_nested(study: str, payload_samples: dict[str, object], depth: int = 5000) -> bytes:
    """A well-formed envelope with an unknown field nested ``depth`` levels deep (~10 KB)."""
    text = ev.encode(_study_created(study, payload_samples)).decode()
    return ('{"deep": ' + "[" * depth + "]" * depth + ", " + text[1:]).encode()


async def _letters(bus: Bus, service: str) -> list[ev.DeadLetter]:
    letters = []
    async for batch in read_stream(bus, subjects.LIFECYCLE_STREAM, subjects=subjects.deadletter_subject(service)):
        letters += [msgspec.json.decode(data, type=ev.DeadLetter) for _seq, _subject, data in batch]
    return letters


async def test_huge_and_deep_messages_are_dead_lettered_and_replay_skips_them(
    fresh_nats_server, spawn_service, wait_answering, wait_for, payload_samples
) -> None:
    async with answering_proposer(fresh_nats_server, spawn_service, wait_answering) as (bus, proposer):
        study = ev.new_id()
        huge = b"{" + b"x" * (7 << 20)  # 7 MB: a whole copy in a dead letter would exceed the 8 MB max payload
        deep = _deeply_nested(study, payload_samples)
        await bus.publish_raw(f"irsi.{study}.StudyCreated", huge)
        await bus.publish_raw(f"irsi.{study}.StudyCreated", deep)
        await bus.publish(_study_created(study, payload_samples))

        async def after_all_three():
            status = await service_status(bus, "proposer")
            return status if status and status["handled"] == 1 and status["dead_lettered"] == 2 else None

        status = await wait_for(after_all_three, timeout_s=30.0)
        assert status["stalled"] == [] and status["studies"][study]["name"] == "faults"
        letters = await _letters(bus, "proposer")
        assert [letter.raw_size for letter in letters] == [len(huge), len(deep)]
        assert letters[0].raw == huge[:DEADLETTER_RAW_MAX] and letters[0].raw_sha256 == hashlib.sha256(huge).hexdigest()
        assert "nested too deeply" in letters[1].error

        # A restart replays the stream, poison included: it must come up and rebuild the same view.
        proposer.kill()
        again = spawn_service("proposer", fresh_nats_server)
        replies = await wait_answering(bus, again)
        assert replies[again.pid]["studies"][study]["name"] == "faults"
        assert again.process.poll() is None
        assert again.terminate() == 0


async def test_a_deleted_consumer_is_bound_again_and_the_next_event_handled(
    fresh_nats_server, wait_for, payload_samples
) -> None:
    bus = await Bus.connect(fresh_nats_server, service="test")
    runner = Runner(ProposerService(), await Bus.connect(fresh_nats_server, service="proposer"), grace_s=2.0)
    task = asyncio.create_task(runner.run())
    try:
        first = ev.new_id()
        await bus.publish(_study_created(first, payload_samples))
        await wait_for(lambda: runner.stats.handled == 1)
        await bus.js.delete_consumer(subjects.LIFECYCLE_STREAM, "proposer")
        second = ev.new_id()
        await bus.publish(_study_created(second, payload_samples))
        await wait_for(lambda: second in runner.service.status()["studies"], timeout_s=40.0)
        health = runner.consumers["proposer"]
        assert health.rebinds >= 1 and not task.done()
        assert runner.status()["stalled"] == []
    finally:
        runner.stopping.set()
        await asyncio.wait_for(task, 20)
        await runner.bus.close()
        await bus.close()


@contextlib.asynccontextmanager
async def _proposer_running(url: str, service_bus: Bus):
    """A proposer ``Runner`` on ``service_bus`` and a test bus, yielded as (runner, its task, test bus); the runner
    is stopped and both buses closed on every path."""
    runner = Runner(ProposerService(), service_bus, grace_s=2.0)
    task = asyncio.create_task(runner.run())
    bus = await Bus.connect(url, service="test")
    try:
        yield runner, task, bus
    finally:
        runner.stopping.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)
        await service_bus.close()
        await bus.close()


async def test_a_subscription_that_fetches_nothing_while_its_consumer_has_pending_is_bound_again(
    fresh_nats_server, wait_for, payload_samples, monkeypatch
) -> None:
    """The 3-node finding: after the stream leader was killed, a pull subscription fetched nothing (no error)
    while its consumer's pending count grew, and the service went on "up". Here the first subscription is made
    to fetch nothing, as the orphaned one did; the loop must notice the pending messages and bind again.
    Without the re-check (``RECHECK_EMPTY_FETCHES``) the event is never handled."""
    service_bus = await Bus.connect(fresh_nats_server, service="proposer")
    real_fetch = service_bus.fetch
    orphaned: list[object] = []

    async def fetch(sub, batch=64, timeout_s=1.0):
        if not orphaned:
            orphaned.append(sub)  # the first binding goes deaf, as the orphaned subscription on the cluster
        if sub is orphaned[0]:
            await asyncio.sleep(timeout_s)
            return []
        return await real_fetch(sub, batch=batch, timeout_s=timeout_s)

    monkeypatch.setattr(service_bus, "fetch", fetch)
    async with _proposer_running(fresh_nats_server, service_bus) as (runner, task, bus):
        await wait_for(lambda: orphaned)
        study = ev.new_id()
        await bus.publish(_study_created(study, payload_samples))
        await wait_for(lambda: study in runner.service.status()["studies"], timeout_s=60.0)
        assert runner.consumers["proposer"].rebinds >= 1 and not task.done()


async def test_a_consumer_that_stops_pulling_is_reported_stalled(fresh_nats_server, wait_for, monkeypatch) -> None:
    monkeypatch.setattr(service_module, "STALL_S", 1.0)
    service_bus = await Bus.connect(fresh_nats_server, service="proposer")
    hung = asyncio.Event()

    async def hanging_fetch(sub, batch=64, timeout_s=1.0):  # a pull that never returns, as on the cluster
        hung.set()
        await asyncio.sleep(3600)

    async with _proposer_running(fresh_nats_server, service_bus) as (runner, _task, bus):
        await wait_for(lambda: runner.consumers)
        monkeypatch.setattr(service_bus, "fetch", hanging_fetch)
        await hung.wait()

        async def reported():
            doc = await collect(bus, 0.3)
            return doc if doc["services"]["proposer"].get("stalled") == ["proposer"] else None

        doc = await wait_for(reported, timeout_s=15.0)
        assert "STALL" in render(doc)
        heartbeat = await bus.nc.subscribe(subjects.heartbeat_subject("proposer"))
        beat = json.loads((await heartbeat.next_msg(timeout=5.0)).data)
        assert beat["stalled"] == ["proposer"]


async def test_a_comma_separated_server_list_connects(fresh_nats_server) -> None:
    port = fresh_nats_server.rsplit(":", 1)[1]
    bus = await Bus.connect(f"nats://127.0.0.1:1, nats://127.0.0.1:{port}", service="test")
    try:
        assert bus.nc.is_connected
    finally:
        await bus.close()
