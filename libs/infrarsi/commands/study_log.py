"""What the CLI verbs share: their bus connection, and reading one study's history from the bus.

Owns ``cli_bus`` (connect to the running server, or fail before doing anything), ``recording_bus`` (connect, or
start a temporary embedded server over ``--data-dir`` for a verb that only records a fact), the study-log
readers used by doctor, run, verify, model, report, trial and demo, ``study_verb`` (the ``run`` of a verb that
acts on one study: connect, open it, then the verb's work), and the flags of the verbs that publish a
request and follow the answer (``add_follow_arguments``). Must not hold any one verb's logic.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass

from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.bus.subjects import LIFECYCLE_STREAM, TELEMETRY_STREAM, lifecycle_subject, telemetry_subject
from infrarsi.commands import data_dir_of, nats_url_of
from infrarsi.errors import EXIT_TIMEOUT, UserError
from infrarsi.study.contract import Contract, ContractError, locked_contract

POLL_S = 0.5
"""How often a verb that waits on the services re-reads the study (the services answer within milliseconds)."""


def add_follow_arguments(parser: argparse.ArgumentParser, *, timeout_s: float, follows: str, request: str,
                         json_help: str) -> None:
    """The flags of a verb that publishes ``request`` and then follows the services' answer (``follows``)."""
    parser.add_argument("--timeout", type=float, default=timeout_s, help=f"seconds to wait for {follows}")
    parser.add_argument("--no-wait", action="store_true", help=f"publish {request} and return")
    parser.add_argument("--json", action="store_true", help=json_help)


@contextlib.asynccontextmanager
async def cli_bus(args: argparse.Namespace, source: str, *, ensure: bool = True) -> AsyncIterator[Bus]:
    """A bus connection to the running stack (these verbs need the services, or read what they made: no
    temporary server). A missing or unreachable server raises ``BusError`` before the verb does anything.
    ``ensure=False`` for read-only verbs: they must not create or resize streams."""
    from infrarsi.runtime.stack import connect_for_cli

    bus = await connect_for_cli(nats_url_of(args), data_dir_of(args), service=source, ensure=ensure)
    try:
        yield bus
    finally:
        await bus.close()


async def read_study(
    bus: Bus, study_id: str, start_seq: int = 1, *, owned_only: bool = False
) -> tuple[list[ev.Event], int]:
    """The study's lifecycle events from stream position ``start_seq``, and the next position to read.

    ``owned_only``: only events their publisher may own (``subjects.publisher_problem``), for verbs that
    act on who published what (``apply``)."""
    out: list[ev.Event] = []
    next_seq = start_seq
    async for batch in bus.event_batches(
        LIFECYCLE_STREAM, lifecycle_subject(study_id, "*"), start_seq=start_seq, owned_only=owned_only
    ):
        out.extend(event for _, event in batch)
        next_seq = batch[-1][0] + 1
    return out, next_seq


async def read_steps(bus: Bus, study_id: str, trial_ids: Iterable[str]) -> dict[str, list[ev.TrialStep]]:
    """Per-step samples of the given trials from the telemetry stream, in one pass over the study's
    subjects (a trial's list is empty when retention dropped its samples)."""
    steps: dict[str, list[ev.TrialStep]] = {t: [] for t in trial_ids}
    async for event in bus.events(TELEMETRY_STREAM, telemetry_subject(study_id, "*"), (ev.TrialStep,)):
        if isinstance(event.payload, ev.TrialStep) and event.trial_id in steps:
            steps[event.trial_id].append(event.payload)
    return steps


async def follow_study(
    bus: Bus, study_id: str, next_seq: int, *, timeout_s: float, unfinished: Callable[[], str]
) -> AsyncIterator[list[ev.Event]]:
    """The study's new events as they arrive, one (possibly empty) list per poll, until the caller stops
    reading; past ``timeout_s`` a ``UserError`` (``EXIT_TIMEOUT``) that says what is ``unfinished()``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if time.monotonic() > deadline:
            raise UserError(f"{unfinished()} after {timeout_s:.0f}s", EXIT_TIMEOUT)
        new, next_seq = await read_study(bus, study_id, next_seq)
        yield new
        if not new:
            await asyncio.sleep(POLL_S)


def study_created(events: Iterable[ev.Event]) -> ev.StudyCreated | None:
    return next((e.payload for e in events if isinstance(e.payload, ev.StudyCreated)), None)


def trial_results(events: Iterable[ev.Event], trial_ids: set[str]) -> dict[str, ev.TrialMeasured | ev.TrialFinished]:
    """Per trial: its ``TrialMeasured``, else its failed ``TrialFinished`` (a run that died is finished too)."""
    results: dict[str, ev.TrialMeasured | ev.TrialFinished] = {}
    for event in events:
        if event.trial_id not in trial_ids:
            continue
        match event.payload:
            case ev.TrialMeasured() as measured:
                results[event.trial_id] = measured
            case ev.TrialFinished(status=status) as finished if status != "ok":
                results.setdefault(event.trial_id, finished)
    return results


def require_study(events: Iterable[ev.Event], study_id: str) -> ev.StudyCreated:
    """The study's ``StudyCreated``; an unknown study is the user's error (``EXIT_USAGE``)."""
    created = study_created(events)
    if created is None:
        raise UserError(f"no study {study_id!r} (no StudyCreated on the bus)")
    return created


def study_contract(created: ev.StudyCreated) -> Contract:
    """The study's locked contract; one that no longer validates is reported, not a traceback."""
    try:
        return locked_contract(created)
    except ContractError as exc:
        raise UserError(f"the study's contract does not load: {exc}") from None


@dataclass(frozen=True)
class OpenStudy:
    """What a verb that acts on a study starts from (``open_study``)."""

    events: list[ev.Event]
    """The study's lifecycle events so far."""
    next_seq: int
    """The stream position to follow from."""
    created: ev.StudyCreated
    contract: Contract
    """The locked contract."""


async def open_study(bus: Bus, study_id: str) -> OpenStudy:
    """The study's events so far, its ``StudyCreated`` and its locked contract; an unknown study or a contract
    that no longer loads is a ``UserError`` (``require_study``, ``study_contract``)."""
    events, next_seq = await read_study(bus, study_id)
    created = require_study(events, study_id)
    return OpenStudy(events, next_seq, created, study_contract(created))


StudyVerb = Callable[[Bus, argparse.Namespace, OpenStudy], Awaitable[int]]
"""A verb's work on the study it was given: (bus, arguments, the opened study) → exit code."""


def study_verb(source: str, verb: StudyVerb) -> Callable[[argparse.Namespace], Awaitable[int]]:
    """The ``run`` of a verb that acts on the study ``args.study`` names (doctor, run, verify): connect as
    ``source`` (``cli_bus``: no server, nothing done), open the study, then ``verb``."""

    async def run(args: argparse.Namespace) -> int:
        async with cli_bus(args, source) as bus:
            return await verb(bus, args, await open_study(bus, args.study))

    return run


@contextlib.asynccontextmanager
async def recording_bus(args: argparse.Namespace, source: str) -> AsyncIterator[Bus]:
    """A bus connection: to ``--nats-url``/``$INFRARSI_NATS_URL``/a running ``infrarsi up``, else to a
    temporary embedded server over the same data directory (the event lands in the store ``up`` uses)."""
    from infrarsi.bus.embedded import EmbeddedServer, resolve_nats_url

    data_dir = data_dir_of(args)
    url = resolve_nats_url(nats_url_of(args), data_dir)
    server = None
    if url is None:
        print(f"note: no NATS server running; starting a temporary one over {data_dir}", file=sys.stderr)
        server = EmbeddedServer.start(data_dir, authorize=True)
        url = server.url
    try:
        bus = await Bus.connect(url, service=source, data_dir=data_dir)
        try:
            yield bus
        finally:
            await bus.close()
    finally:
        if server is not None:
            server.stop()
