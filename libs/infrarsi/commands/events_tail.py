"""``infrarsi events tail``: print the event log, optionally one study's or one type's, and follow it.

Reads with an ephemeral, server-filtered consumer (no acks, nothing left on the server), one JSON line
per message as it is on the wire (pipe it to ``jq``), or a compact table. Dead letters
(``irsi.deadletter.<service>``) are shown too when no type filter is given. Read-only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from datetime import datetime
from typing import TYPE_CHECKING

import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api

from infrarsi import events as ev
from infrarsi.bus.subjects import LIFECYCLE_STREAM, filter_for, lifecycle_subject, stream_for_type
from infrarsi.commands import UserError
from infrarsi.runtime.stack import connect_for_cli

if TYPE_CHECKING:
    from infrarsi.bus.client import Bus


FETCH_BATCH = 256


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="events_action", metavar="ACTION", required=True)
    tail = actions.add_parser("tail", help="print events, oldest first; --follow for new ones")
    tail.add_argument("--study", help="only this study's events")
    tail.add_argument(
        "--type",
        dest="types",
        action="append",
        choices=ev.EVENT_TYPES,
        metavar="TYPE",
        help="only this event type (repeatable; the types must share a stream)",
    )
    tail.add_argument("-f", "--follow", action="store_true", help="keep printing new events until Ctrl-C")
    tail.add_argument("--last", type=int, default=None, metavar="N", help="start with the last N matching events")
    tail.add_argument(
        "--format",
        choices=("json", "table"),
        default=None,
        help="one JSON line per event, or a compact table (default: table on a terminal, else json)",
    )


def subject_filters(study: str | None, types: list[str] | None) -> tuple[str, list[str]]:
    """The stream to read and the subject filters that select ``study``/``types`` on it."""
    if not types:
        return LIFECYCLE_STREAM, [lifecycle_subject(study or "*", "*")]
    streams = {stream_for_type(t) for t in types}
    if len(streams) != 1:
        raise UserError(f"event types {sorted(types)} live in different streams {sorted(streams)}; tail one at a time")
    return streams.pop(), sorted({filter_for(t, study or "*") for t in types})


def table_row(msg: Msg) -> str:
    seq = msg.metadata.sequence.stream
    event = ev.decode_or_none(msg.data)
    if event is None:
        return f"{seq:>7}  {'':<23}  {'(undecodable)':<16}  {msg.subject}"
    ts = event.ts.astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")[:23] if isinstance(event.ts, datetime) else ""
    trial = f" trial={event.trial_id}" if event.trial_id else ""
    return f"{seq:>7}  {ts:<23}  {event.type:<16}  study={event.study_id}{trial} from={event.source}"


async def run(args: argparse.Namespace) -> int:
    stream, filters = subject_filters(args.study, args.types)
    fmt = args.format or ("table" if sys.stdout.isatty() else "json")
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    bus = await connect_for_cli(args.nats_url, args.data_dir, "cli.events", ensure=False)
    try:
        await _tail(bus, stream, filters, args, fmt, stopping)
    except BrokenPipeError:
        # The reader (``| head``) went away: not an error; keep Python from complaining at exit.
        with contextlib.suppress(OSError):
            sys.stdout = open("/dev/null", "w")  # noqa: SIM115
    finally:
        await bus.close()
    return 0


async def _tail(
    bus: Bus, stream: str, filters: list[str], args: argparse.Namespace, fmt: str, stopping: asyncio.Event
) -> None:
    try:
        await bus.js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        raise UserError(f"stream {stream} does not exist yet (nothing was ever published)") from None
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.NONE,
        deliver_policy=api.DeliverPolicy.ALL,
        inactive_threshold=30.0,
        max_ack_pending=-1,
        filter_subject=filters[0] if len(filters) == 1 else None,
        filter_subjects=filters if len(filters) > 1 else None,
    )
    if args.last is not None:
        start = await _start_of_last(bus, stream, filters, args.last)
        config.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
        config.opt_start_seq = start
    sub = await bus.js.pull_subscribe(_single(filters), stream=stream, config=config)
    try:
        while not stopping.is_set():
            try:
                msgs = await sub.fetch(FETCH_BATCH, timeout=0.5)
            except TimeoutError:  # nats-py raises its own TimeoutError or asyncio's; both are TimeoutError
                msgs = []
            for msg in msgs:
                if args.study and stream != LIFECYCLE_STREAM and not _of_study(msg, args.study):
                    continue  # bank subjects are per cluster, not per study: filter here
                if fmt == "json":
                    sys.stdout.write(msg.data.decode(errors="replace") + "\n")
                else:
                    sys.stdout.write(table_row(msg) + "\n")
            sys.stdout.flush()
            if args.follow:
                continue
            caught_up = msgs[-1].metadata.num_pending == 0 if msgs else (await sub.consumer_info()).num_pending == 0
            if caught_up:
                return
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


def _single(filters: list[str]) -> str:
    # nats-py copies the subject argument into ``filter_subject`` unless ``filter_subjects`` is set.
    return filters[0] if len(filters) == 1 else ""


def _of_study(msg: Msg, study: str) -> bool:
    try:
        return bool(json.loads(msg.data).get("study_id") == study)
    except (ValueError, AttributeError):
        return False


async def _start_of_last(bus: Bus, stream: str, filters: list[str], last: int) -> int:
    """The stream sequence from which the last ``last`` messages matching ``filters`` start."""
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.NONE,
        deliver_policy=api.DeliverPolicy.ALL,
        inactive_threshold=10.0,
        filter_subject=filters[0] if len(filters) == 1 else None,
        filter_subjects=filters if len(filters) > 1 else None,
    )
    sub = await bus.js.pull_subscribe(_single(filters), stream=stream, config=config)
    try:
        pending = (await sub.consumer_info()).num_pending or 0
        skip = max(0, pending - last)
        if skip == 0:
            return 1
        seq = 1
        while skip > 0:
            try:
                msgs = await sub.fetch(min(skip, 1024), timeout=2.0)
            except TimeoutError:
                break  # fewer than counted (removed by retention meanwhile): start after what was seen
            skip -= len(msgs)
            seq = msgs[-1].metadata.sequence.stream + 1
        return seq
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
