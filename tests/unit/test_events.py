"""The event catalog offline: encoding round trips and ids (subjects and streams: test_subjects.py)."""

from __future__ import annotations

import time

import msgspec
import pytest
from infrarsi import events as ev


def test_every_payload_round_trips_through_the_wire_format(payload_samples: dict[str, object]) -> None:
    assert set(payload_samples) == set(ev.EVENT_TYPES)
    for name, payload in payload_samples.items():
        event = ev.make_event(payload, study_id="s1", trial_id="t1", source="test")  # type: ignore[arg-type]
        assert event.type == name
        wire = ev.encode(event)
        assert ev.decode(wire) == event
        assert msgspec.json.decode(wire)["payload"]["type"] == name, "payloads are tagged by class name"


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b'{"event_id": "x"}',
        # Envelope says one type, the payload is another: must not slip through as the wrong type.
        ev.encode(ev.make_event(ev.DoctorRequested(repeats=1), study_id="s", source="t")).replace(
            b'"type":"DoctorRequested"', b'"type":"StudyFinished"', 1
        ),
        ev.encode(ev.make_event(ev.DoctorRequested(repeats=1), study_id="s", source="t")).replace(
            b'"repeats":1', b'"repeats":"one"'
        ),
    ],
)
def test_decode_rejects_malformed(raw: bytes) -> None:
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        ev.decode(raw)


def test_new_ids_are_sortable_subject_safe_and_unique() -> None:
    first = ev.new_id()
    time.sleep(0.002)
    ids = [ev.new_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(len(i) == 26 and i.isalnum() and i.islower() for i in ids)
    assert all(first < i for i in ids), "ids created later sort later"


def test_derived_ids_are_deterministic_and_distinguish_their_parts() -> None:
    assert ev.derived_id("e1", "proposer", "TrialProposed", "a") == ev.derived_id("e1", "proposer", "TrialProposed", "a")
    variants = {
        ev.derived_id("e1", "proposer", "TrialProposed", "a"),
        ev.derived_id("e1", "proposer", "TrialProposed", "b"),
        ev.derived_id("e2", "proposer", "TrialProposed", "a"),
        ev.derived_id("e1", "proposerTrialProposed", "", "a"),
    }
    assert len(variants) == 4
