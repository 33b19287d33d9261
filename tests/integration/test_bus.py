"""The bus against a real nats-server: every event type makes the round trip, ids dedup, acks are checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from infrarsi import events as ev
from infrarsi.bus.client import STREAMS, TELEMETRY_STREAM, AckJournal, Bus, BusError, stream_for_type
from infrarsi.bus.subjects import telemetry_subject
from support.owned import owned_event

pytestmark = pytest.mark.integration


async def test_every_event_type_round_trips(bus: Bus, payload_samples: dict[str, object]) -> None:
    study = ev.new_id()
    sent = {
        name: owned_event(payload, study_id=study, trial_id="trial-1")  # type: ignore[arg-type]
        for name, payload in payload_samples.items()
    }
    assert set(sent) == set(ev.EVENT_TYPES)
    for event in sent.values():
        ack = await bus.publish(event)
        assert ack.stream == stream_for_type(event.type)
        assert not ack.duplicate

    # Consume through durable consumers, as the services do: one per stream.
    received: dict[str, ev.Event] = {}
    by_stream: dict[str, list[str]] = {}
    for name in ev.EVENT_TYPES:
        by_stream.setdefault(stream_for_type(name), []).append(name)
    for stream, types in by_stream.items():
        durable = f"roundtrip-{study}-{stream.lower()}"
        sub = await bus.durable_consumer(durable, types)
        while True:
            deliveries = await Bus.fetch(sub, batch=64, timeout_s=0.5)
            if not deliveries:
                break
            for delivery in deliveries:
                if delivery.msg.subject.startswith("irsi.") and study not in delivery.msg.subject:
                    # The session's server also holds other tests' events (some deliberately forged).
                    await delivery.msg.ack_sync()
                    continue
                assert delivery.error is None, delivery.error
                assert delivery.event is not None
                await delivery.msg.ack_sync()
                if delivery.event.study_id == study:
                    received[delivery.event.type] = delivery.event
        await sub.unsubscribe()
        await bus.js.delete_consumer(stream, durable)

    assert set(received) == set(sent)
    for name, event in sent.items():
        assert received[name] == event, name
        assert received[name].payload == payload_samples[name]


async def test_same_event_id_is_stored_once(bus: Bus) -> None:
    study = ev.new_id()
    event = owned_event(ev.DoctorRequested(repeats=3), study_id=study)
    first = await bus.publish(event)
    second = await bus.publish(event)
    assert not first.duplicate
    assert second.duplicate
    assert second.seq == first.seq


async def test_publish_many_checks_every_ack(bus: Bus) -> None:
    study = ev.new_id()
    events = [owned_event(ev.DoctorRequested(repeats=i), study_id=study) for i in range(50)]
    acks = await bus.publish_many(events)
    assert len(acks) == 50
    assert len({a.seq for a in acks}) == 50


async def test_streams_exist_with_expected_subjects(bus: Bus) -> None:
    for spec in STREAMS:
        info = await bus.js.stream_info(spec.name)
        assert sorted(info.config.subjects) == sorted(spec.subjects)
    counts = await bus.stream_counts()
    assert set(counts) == {s.name for s in STREAMS}


async def test_unreachable_server_fails_fast() -> None:
    with pytest.raises(BusError, match="cannot reach NATS at nats://127.0.0.1:1"):
        await Bus.connect("nats://127.0.0.1:1", service="test", connect_timeout_s=1.0)


async def test_every_ack_received_is_journaled(nats_server: str, tmp_path: Path) -> None:
    """``ack_journal`` logs the ack of every publish, batch and raw publish, duplicates too (stream, sequence,
    msg id): what bench/chaos_cluster.py counts against the streams after its faults."""
    journal = tmp_path / "acks"
    bus = await Bus.connect(nats_server, service="test", ack_journal=journal)
    study = ev.new_id()
    try:
        one = owned_event(ev.DoctorRequested(repeats=1), study_id=study)
        many = [owned_event(ev.DoctorRequested(repeats=r), study_id=study) for r in (2, 3)]
        acks = [await bus.publish(one), *await bus.publish_many(many)]
        raw = await bus.publish_raw(telemetry_subject(study, "t1"), b"{}", msg_id=f"{study}-raw", stream=TELEMETRY_STREAM)
        again = await bus.publish(one)
    finally:
        await bus.close()
    assert again.duplicate and again.seq == acks[0].seq
    expected = [(a.stream, a.seq, e.event_id) for a, e in zip(acks, [one, *many], strict=True)]
    expected += [(raw.stream, raw.seq, f"{study}-raw"), (again.stream, again.seq, one.event_id)]
    assert AckJournal.read(journal) == expected
