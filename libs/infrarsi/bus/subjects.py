"""Every name on the bus, in one place: streams, subjects, dedup ids, and who may publish or read what.

Owns: the stream names; the subject scheme (ARCHITECTURE.md §4); ``ROUTES``, the one table that maps each
event type of the catalog (``infrarsi.events``) to its stream, its publishers and its consumers; the
``Nats-Msg-Id`` of a telemetry step; the service control subjects (ping, heartbeats); and the per-principal
publish/subscribe lists derived from the table (``permissions``), which the deployment turns into NATS user
permissions. Nothing else in libs/ or services/ spells a subject or a stream name.

Subjects:

- ``irsi.<study>.<Type>``            lifecycle events, stream ``IRSI``
- ``irsi.telemetry.<study>.<trial>`` per-step samples (``TrialStep``), stream ``IRSI_TELEMETRY``
- ``bank.<cluster>.<entry>``          experience-bank entries, stream ``IRSI_BANK``
- ``irsi.deadletter.<service>``       messages a service could not decode (not an ``Event``), stream ``IRSI``
- ``irsi-svc.ping`` / ``irsi-svc.heartbeat.<service>``  core NATS only (``infrarsi status``), no stream

``irsi.*.*`` (three tokens) and ``irsi.telemetry.*.*`` (four tokens) never overlap, which JetStream requires of
two streams; dead letters land in the lifecycle stream, but no consumer's per-type filter selects them.

Principals (who holds a connection): the six services, ``probe`` (a training job reporting its steps), and one
per CLI verb, named as the verb's event ``source`` (``cli.doctor``, ...). The subscribe lists name the *event*
subjects a principal reads (through JetStream consumers or core subscriptions); the JetStream API subjects that
reading needs (``$JS.API.…``) are the deployment's to add. This module does no I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from infrarsi import events as ev

LIFECYCLE_STREAM = "IRSI"
TELEMETRY_STREAM = "IRSI_TELEMETRY"
BANK_STREAM = "IRSI_BANK"
BANK_HUB_STREAM = "IRSI_BANK_HUB"
"""The federation hub's aggregate of every cluster's bank (infrarsi.bank.federation)."""
BANK_SHARED_STREAM = "IRSI_BANK_SHARED"
"""A cluster's copy of the other clusters' bank entries (infrarsi.bank.federation)."""

ROOT = "irsi"
ALL_IRSI = "irsi.>"
"""Every lifecycle, telemetry and dead-letter subject."""
BANK_ROOT = "bank"
ALL_BANK = "bank.>"

STREAM_SUBJECTS: dict[str, tuple[str, ...]] = {
    LIFECYCLE_STREAM: ("irsi.*.*",),
    TELEMETRY_STREAM: ("irsi.telemetry.*.*",),
    BANK_STREAM: (ALL_BANK,),
}
"""The subjects each stream captures."""

DEADLETTER_PREFIX = "irsi.deadletter."
PING_SUBJECT = "irsi-svc.ping"
HEARTBEAT_PREFIX = "irsi-svc.heartbeat."

SERVICES: tuple[str, ...] = ("proposer", "launcher", "telemetry", "modeler", "verifier", "reporter")
PROBE = "probe"


@dataclass(frozen=True)
class Route:
    """One event type on the bus: its stream, and the principals that publish and consume it."""

    event_type: str
    stream: str
    publishers: tuple[str, ...]
    consumers: tuple[str, ...]


def _route(event_type: str, publishers: Iterable[str], consumers: Iterable[str]) -> Route:
    stream = {"TrialStep": TELEMETRY_STREAM, "BankEntry": BANK_STREAM}.get(event_type, LIFECYCLE_STREAM)
    return Route(event_type, stream, tuple(publishers), tuple(consumers))


_DEMO = "cli.demo"  # runs init, doctor, run and report in its own process, under its own name

# Publishers as found in the code (services' emits, the probe, each CLI verb); consumers are the services'
# ``consumes`` and replays (the reporter reads everything). ARCHITECTURE.md §5 is the narrative of this table.
ROUTES: tuple[Route, ...] = (
    _route("StudyCreated", ("cli.init", "cli.trial", _DEMO),
           ("proposer", "launcher", "telemetry", "modeler", "verifier", "reporter")),
    _route("DoctorRequested", ("cli.doctor", _DEMO), ("reporter",)),
    _route("DoctorCompleted", ("cli.doctor", _DEMO), ("proposer", "telemetry", "modeler", "reporter")),
    _route("RunRequested", ("cli.run", _DEMO), ("proposer", "reporter")),
    _route("TrialProposed", ("proposer", "verifier", "cli.doctor", "cli.trial", _DEMO),
           ("proposer", "launcher", "telemetry", "modeler", "reporter")),
    _route("TrialLaunched", ("launcher",), ("reporter",)),
    # The launcher relays the probe's own file after a job ends (steps a killed job never sent) and hosts the
    # simulator backend, which publishes for its simulated jobs, labelled "sim" (with the probe's credentials).
    _route("TrialStep", (PROBE, "launcher", "sim"), ("telemetry", "reporter")),
    _route("TrialFinished", ("launcher",), ("proposer", "telemetry", "modeler", "verifier", "reporter")),
    # Telemetry sees the steps and knows the incumbent: it asks the launcher to stop a search trial already
    # ruled out as far too slow; the launcher reads these beside its trial slots (``Service.control``).
    _route("TrialStopRequested", ("telemetry",), ("launcher", "reporter")),
    _route("TrialMeasured", ("telemetry",), ("proposer", "telemetry", "modeler", "verifier", "reporter")),
    _route("ModelUpdated", ("modeler",), ("reporter",)),
    _route("VerifyRequested", ("proposer", "cli.verify"), ("verifier", "reporter")),
    _route("VerifyCompleted", ("verifier",), ("proposer", "reporter")),
    _route("ReportPublished", ("cli.report", _DEMO), ("reporter",)),
    _route("ApprovalGranted", ("cli.approve",), ("reporter",)),
    _route("PatchPromoted", ("cli.apply",), ("reporter",)),
    _route("BankEntry", ("reporter", "cli.bank"), ("reporter",)),
    _route("StudyFinished", ("proposer",), ("reporter",)),
    # Studies as things a user manages (issue 36): cancel stops the trials and the search, resume goes on.
    _route("StudyCancelled", ("cli.cancel",), ("proposer", "launcher", "verifier", "reporter")),
    _route("StudyResumed", ("cli.resume",), ("proposer", "launcher", "reporter")),
    # Promoted branches followed to the main line, and the smoke run of a merged commit.
    _route("PromotionFollowed", ("cli.follow",), ("reporter",)),
    _route("SmokeCompleted", ("cli.smoke",), ("reporter",)),
    # The agent (libs/infrarsi/agent): the proposer asks the study's language model and records its answer;
    # ``init --ask`` records the contract draft's exchange. The proposer answers its own questions (the HTTP
    # exchange is the handler of its AgentAsked); the launcher reads the accepted diffs from the answers.
    _route("AgentAsked", ("proposer", "cli.init"), ("proposer", "reporter")),
    _route("AgentAnswered", ("proposer", "cli.init"), ("proposer", "launcher", "reporter")),
)
ROUTES_BY_TYPE: dict[str, Route] = {route.event_type: route for route in ROUTES}

CLI_READS: dict[str, tuple[str, ...]] = {
    "cli.init": (BANK_STREAM,),
    "cli.doctor": (LIFECYCLE_STREAM, TELEMETRY_STREAM),
    "cli.trial": (LIFECYCLE_STREAM, TELEMETRY_STREAM),  # steps shown as they come
    "cli.run": (LIFECYCLE_STREAM,),
    "cli.verify": (LIFECYCLE_STREAM,),
    "cli.model": (LIFECYCLE_STREAM,),
    "cli.report": (LIFECYCLE_STREAM, TELEMETRY_STREAM, BANK_STREAM),
    "cli.approve": (LIFECYCLE_STREAM,),
    "cli.apply": (LIFECYCLE_STREAM,),
    _DEMO: (LIFECYCLE_STREAM, TELEMETRY_STREAM, BANK_STREAM),
    "cli.bank": (BANK_STREAM,),
    "cli.events": (LIFECYCLE_STREAM, TELEMETRY_STREAM, BANK_STREAM),
    "cli.replay": (LIFECYCLE_STREAM, TELEMETRY_STREAM, BANK_STREAM),
    "cli.dashboard": (LIFECYCLE_STREAM, TELEMETRY_STREAM, BANK_STREAM),  # replays into its own DB; reads only
    "cli.status": (),
    "cli.studies": (LIFECYCLE_STREAM,),
    "cli.cancel": (LIFECYCLE_STREAM,),
    "cli.resume": (LIFECYCLE_STREAM,),
    "cli.follow": (LIFECYCLE_STREAM,),
    "cli.smoke": (LIFECYCLE_STREAM,),
}
"""The streams each CLI verb-group reads whole (a CLI reads a study's history, not one event type).

Reading the bank includes ``IRSI_BANK_SHARED`` where federation is on: its messages keep their ``bank.>``
subjects."""


def stream_for_type(event_type: str) -> str:
    """The stream that stores events of ``event_type``."""
    return route(event_type).stream


def route(event_type: str) -> Route:
    try:
        return ROUTES_BY_TYPE[event_type]
    except KeyError:
        raise ValueError(f"unknown event type {event_type!r}") from None


# --------------------------------------------------------------------------------------------------
# Subjects
# --------------------------------------------------------------------------------------------------


def lifecycle_subject(study: str, event_type: str) -> str:
    """``irsi.<study>.<Type>``; ``"*"`` for either token makes a filter (``irsi.<study>.*``)."""
    return f"{ROOT}.{study}.{event_type}"


def telemetry_subject(study: str, trial: str) -> str:
    """``irsi.telemetry.<study>.<trial>``; ``"*"`` for either token makes a filter."""
    return f"{ROOT}.telemetry.{study}.{trial}"


def bank_subject(cluster: str, entry: str) -> str:
    """``bank.<cluster>.<entry>``; ``">"`` for the entry makes a cluster's filter."""
    return f"{BANK_ROOT}.{cluster}.{entry}"


def deadletter_subject(service: str) -> str:
    return f"{DEADLETTER_PREFIX}{service}"


def is_deadletter(subject: str) -> bool:
    return subject.startswith(DEADLETTER_PREFIX)


def heartbeat_subject(service: str) -> str:
    return f"{HEARTBEAT_PREFIX}{service}"


def step_msg_id(trial: str, rank: int | str, step: int) -> str:
    """The ``Nats-Msg-Id`` of one telemetry step: a re-published step is dropped by JetStream's dedup window.

    The probe, the launcher's relay of the probe's file and the simulator must agree on it exactly.
    """
    return f"{trial}:{rank}:step:{step}"


def subject_for(event: ev.Event) -> str:
    """The subject an event is published on (see the module docstring)."""
    match event.payload:
        case ev.TrialStep():
            return telemetry_subject(event.study_id, event.trial_id or "")
        case ev.BankEntry(entry_id=entry_id):
            return bank_subject(event.cluster_id, entry_id)
        case _:
            return lifecycle_subject(event.study_id, event.type)


def filter_for(event_type: str, study: str = "*") -> str:
    """The consumer filter that selects every event of one type (of one study, or of all)."""
    stream = route(event_type).stream
    if stream == TELEMETRY_STREAM:
        return telemetry_subject(study, "*")
    if stream == BANK_STREAM:
        return ALL_BANK
    return lifecycle_subject(study, event_type)


# --------------------------------------------------------------------------------------------------
# Permissions
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Permissions:
    """The bus subjects one principal may publish to and read (sorted, no duplicates)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


@functools.cache  # the table is fixed at import: a consume loop asks once per message
def principals() -> tuple[str, ...]:
    """Everyone the table names: services, the probe, the CLI verb-groups."""
    named = {p for r in ROUTES for p in (*r.publishers, *r.consumers)} | set(SERVICES) | set(CLI_READS)
    return tuple(sorted(named))


def permissions(principal: str) -> Permissions:
    """What ``principal`` may publish and read, from ``ROUTES`` (plus the control subjects of its kind).

    Services also publish their dead letters and heartbeats and answer pings; ``cli.status`` sends the pings.
    Replies travel on the requester's ``_INBOX.>`` (the deployment's to allow, as the JetStream API).
    """
    if principal not in principals():
        raise ValueError(f"unknown principal {principal!r}; known: {', '.join(principals())}")
    publish = {filter_for(r.event_type) for r in ROUTES if principal in r.publishers}
    subscribe = {filter_for(r.event_type) for r in ROUTES if principal in r.consumers}
    subscribe |= {s for stream in CLI_READS.get(principal, ()) for s in STREAM_SUBJECTS[stream]}
    if principal in SERVICES:
        publish |= {deadletter_subject(principal), heartbeat_subject(principal)}
        subscribe.add(PING_SUBJECT)
    if principal == "cli.status":
        publish.add(PING_SUBJECT)
    return Permissions(tuple(sorted(publish)), tuple(sorted(subscribe)))


def publisher_problem(event: ev.Event, subject: str, *, strict: bool = True) -> str | None:
    """Why ``event``, read from ``subject``, is not one its publisher may own; ``None`` when it is.

    Two checks, so that a reader trusts an event only as far as the server's permissions do: the event must
    sit on the subject of its type and study (a principal may publish only its own types' subjects, so an
    envelope of another type smuggled onto one of them is ``misrouted``), and its ``source`` must be a
    publisher the table lists for the type (``wrong owner``; on a server without authorization this is the
    only check there is).

    ``strict=False`` is the consume loops' reading (``bus.decode_delivery``): a source the table does not
    name at all (a test, a tool) is left to the server's permissions, which decide who may publish where, and
    only ``irsi.…`` subjects other than dead letters are checked. ``strict`` (the default) is for readers
    that act on who published what (``apply``): every source must be a listed publisher, every subject its
    event's own.
    """
    checked = strict or (subject.startswith(ROOT + ".") and not is_deadletter(subject))
    expected = subject_for(event)
    if checked and subject != expected:
        return f"misrouted: a {event.type} of study {event.study_id!r} belongs on {expected}, not {subject}"
    publishers = route(event.type).publishers
    if event.source not in publishers and (strict or event.source in principals()):
        return f"wrong owner: {event.source} does not publish {event.type} (published by {', '.join(publishers)})"
    return None
