"""The bus-name table offline: each event's subject and stream, the table against the services' code, and the
permission lists generated from it."""

from __future__ import annotations

import pytest
from infrarsi import events as ev
from infrarsi.bus import subjects
from infrarsi.bus.client import STREAMS
from infrarsi.bus.subjects import filter_for, permissions, stream_for_type
from infrarsi_services.launcher.service import LauncherService
from infrarsi_services.modeler.service import ModelerService
from infrarsi_services.proposer.service import ProposerService
from infrarsi_services.reporter.service import ReporterService
from infrarsi_services.telemetry.service import TelemetryService
from infrarsi_services.verifier.service import VerifierService

SERVICE_CLASSES = (ProposerService, LauncherService, TelemetryService, ModelerService, VerifierService, ReporterService)


def _matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, ``>`` the rest (at least one token)."""
    pat, sub = pattern.split("."), subject.split(".")
    for i, token in enumerate(pat):
        if token == ">":
            return len(sub) > i
        if i >= len(sub) or (token != "*" and token != sub[i]):
            return False
    return len(pat) == len(sub)


def _event(name: str, payload: object) -> ev.Event:
    return ev.make_event(payload, study_id=ev.new_id(), trial_id=ev.new_id(), source="test")  # type: ignore[arg-type]


def test_each_event_lands_in_exactly_its_stream(payload_samples: dict[str, object]) -> None:
    for name, payload in payload_samples.items():
        subject = subjects.subject_for(_event(name, payload))
        owners = [s.name for s in STREAMS if any(_matches(p, subject) for p in s.subjects)]
        assert owners == [stream_for_type(name)], f"{name} on {subject} is stored by {owners}"
        assert _matches(filter_for(name), subject), f"consumer filter of {name} misses {subject}"


def test_dead_letters_land_in_the_lifecycle_stream_but_match_no_consumer_filter() -> None:
    subject = subjects.deadletter_subject("proposer")
    assert [s.name for s in STREAMS if any(_matches(p, subject) for p in s.subjects)] == ["IRSI"]
    assert not any(_matches(filter_for(t), subject) for t in ev.EVENT_TYPES)
    assert subjects.is_deadletter(subject) and not subjects.is_deadletter(subjects.lifecycle_subject("s", "X"))


def test_filter_for_rejects_unknown_types() -> None:
    with pytest.raises(ValueError, match="unknown event type"):
        filter_for("TrialDone")


def test_the_table_names_every_event_type_once_with_a_publisher() -> None:
    assert [r.event_type for r in subjects.ROUTES] == list(ev.EVENT_TYPES)
    assert all(r.publishers for r in subjects.ROUTES)


def test_the_table_agrees_with_what_each_service_consumes() -> None:
    assert tuple(c.name for c in SERVICE_CLASSES) == subjects.SERVICES
    for cls in SERVICE_CLASSES:
        listed = {r.event_type for r in subjects.ROUTES if cls.name in r.consumers}
        consumed = {t.__name__ for t in cls.consumes}
        # The telemetry service also replays its own TrialMeasured (to skip trials it measured in a past life).
        assert consumed <= listed, f"{cls.name} consumes {sorted(consumed - listed)} the table does not list"
        extra = listed - consumed - ({"TrialMeasured"} if cls.name == "telemetry" else set())
        assert not extra, f"the table lists {cls.name} as a consumer of {sorted(extra)} it does not consume"


def test_step_message_ids_are_what_the_dedup_window_keys_on() -> None:
    assert subjects.step_msg_id("t1", 0, 7) == "t1:0:step:7" == subjects.step_msg_id("t1", "0", 7)
    assert subjects.telemetry_subject("s1", "t1") == "irsi.telemetry.s1.t1"
    assert subjects.lifecycle_subject("s1", "*") == "irsi.s1.*"


def test_permissions_let_each_principal_publish_exactly_its_events(payload_samples: dict[str, object]) -> None:
    for principal in subjects.principals():
        allowed = permissions(principal)
        for name, payload in payload_samples.items():
            subject = subjects.subject_for(_event(name, payload))
            may = any(_matches(p, subject) for p in allowed.publish)
            assert may == (principal in subjects.route(name).publishers), f"{principal} publishing {name}"


def test_permissions_of_the_launcher_and_a_read_only_verb() -> None:
    launcher = permissions("launcher")
    assert launcher.publish == (
        "irsi-svc.heartbeat.launcher", "irsi.*.TrialFinished", "irsi.*.TrialLaunched", "irsi.deadletter.launcher",
        "irsi.telemetry.*.*",
    )
    assert launcher.subscribe == ("irsi-svc.ping", "irsi.*.AgentAnswered", "irsi.*.StudyCancelled", "irsi.*.StudyCreated",
                                  "irsi.*.StudyResumed", "irsi.*.TrialProposed", "irsi.*.TrialStopRequested")
    replay = permissions("cli.replay")
    assert replay.publish == ()
    assert replay.subscribe == ("bank.>", "irsi.*.*", "irsi.telemetry.*.*")
    assert permissions("cli.status").publish == ("irsi-svc.ping",)
    assert permissions("probe") == subjects.Permissions(("irsi.telemetry.*.*",), ())
    with pytest.raises(ValueError, match="unknown principal"):
        permissions("cli.nobody")


def test_every_service_reads_every_subject_it_consumes(payload_samples: dict[str, object]) -> None:
    for cls in SERVICE_CLASSES:
        allowed = permissions(cls.name).subscribe
        for payload_type in cls.consumes:
            subject = subjects.subject_for(_event(payload_type.__name__, payload_samples[payload_type.__name__]))
            assert any(_matches(p, subject) for p in allowed), f"{cls.name} cannot read {subject}"


def _finished(source: str, study: str = "s1") -> ev.Event:
    return ev.make_event(ev.StudyFinished(reason="r", trials=0, accelerator_s=0.0), study_id=study, source=source)


def test_one_ownership_check_strict_for_readers_lenient_for_consume_loops() -> None:
    """``publisher_problem`` is the one check: both readings refuse a listed principal that does not publish
    the type and an event on another type's or study's subject; only the consume loops' (``strict=False``)
    let a source the table does not name at all through, and skip subjects outside ``irsi.…``."""
    own = subjects.lifecycle_subject("s1", "StudyFinished")
    for strict in (True, False):
        assert subjects.publisher_problem(_finished("proposer"), own, strict=strict) is None
        assert subjects.publisher_problem(_finished("cli.apply"), own, strict=strict) == (
            "wrong owner: cli.apply does not publish StudyFinished (published by proposer)"
        )
        for elsewhere in (subjects.lifecycle_subject("s1", "TrialProposed"), subjects.lifecycle_subject("s2", "StudyFinished")):
            assert subjects.publisher_problem(_finished("proposer"), elsewhere, strict=strict) == (
                f"misrouted: a StudyFinished of study 's1' belongs on {own}, not {elsewhere}"
            )
    assert subjects.publisher_problem(_finished("a-test"), own, strict=False) is None
    assert subjects.publisher_problem(_finished("a-test"), own) == (
        "wrong owner: a-test does not publish StudyFinished (published by proposer)"
    )
    outside = subjects.bank_subject("c1", "e1")
    assert subjects.publisher_problem(_finished("proposer"), outside, strict=False) is None
    assert subjects.publisher_problem(_finished("proposer"), outside).startswith("misrouted: ")
    dead = subjects.deadletter_subject("proposer")
    assert subjects.publisher_problem(_finished("proposer"), dead, strict=False) is None


def test_consume_loops_dead_letter_what_the_check_refuses() -> None:
    """``decode_delivery`` (every service's consume loop) turns a refused event into a bad message."""
    from types import SimpleNamespace

    from infrarsi.bus.client import decode_delivery

    forged = _finished("cli.apply")
    delivery = decode_delivery(SimpleNamespace(data=ev.encode(forged), subject=subjects.subject_for(forged)))
    assert delivery.event is None and delivery.error.startswith("wrong owner: cli.apply")
    tested = _finished("a-test")
    delivery = decode_delivery(SimpleNamespace(data=ev.encode(tested), subject=subjects.subject_for(tested)))
    assert delivery.error is None and delivery.event == tested
