"""The dashboard's live side: a private analyst DB kept current from the bus, and a version the pages follow.

Design (the reporter's, in small): a message on a lifecycle subject is a doorbell, not the data. A core
subscription to ``irsi.*.*`` rings it; one task then reads the three streams from the positions stored in the
DB with ``eventlog.catch_up`` — the same code as ``infrarsi replay``, so the page shows exactly what the analyst
tables hold. It also polls every ``poll_s`` (telemetry and the bank ring no bell). When a catch-up applied
something, ``version`` goes up and every page waiting in ``wait_newer`` is told to fetch again.

Why a DB of its own rather than the reporter's snapshot: the snapshot is published at most once a second and
at most once per ten copy-durations (docs/analytics.md), so it lags a live study by seconds to minutes on a
large log, and it needs the reporter running; a private catch-up needs only read access to the streams.
Must not publish or ack.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import TYPE_CHECKING

import nats.errors

from infrarsi import eventlog
from infrarsi.bus import subjects
from infrarsi.bus.client import LIFECYCLE_STREAM, BusError
from infrarsi.runtime.logs import get_logger

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from infrarsi.bus.client import Bus
    from infrarsi.eventlog import AnalystDB

log = get_logger(__name__)

MIN_GAP_S = 0.25
"""Least time between two catch-ups: a burst of events becomes one catch-up and one page refresh, not many."""


class LiveFeed:
    """Keeps ``db`` at the end of the streams of ``bus`` while ``run`` runs; ``version`` counts the catch-ups that
    applied something. Calling order: ``run`` (a task, cancelled to stop) and, from any task, ``wait_newer``."""

    def __init__(self, bus: Bus, db: AnalystDB, *, poll_s: float = 2.0) -> None:
        self.bus = bus
        self.db = db
        self.poll_s = poll_s
        self.version = 0
        self.error: str | None = None
        """The last catch-up's failure (shown on the page), ``None`` once one succeeds again."""
        self._doorbell = asyncio.Event()
        self._moved = asyncio.Condition()
        self._writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="dashboard-db")

    async def run(self) -> None:
        subscriptions = [
            await self.bus.nc.subscribe(subject, cb=self._ring) for subject in subjects.STREAM_SUBJECTS[LIFECYCLE_STREAM]
        ]
        try:
            while True:
                started = time.monotonic()
                await self._catch_up()
                self._doorbell.clear()
                await asyncio.sleep(max(0.0, MIN_GAP_S - (time.monotonic() - started)))
                if not self._doorbell.is_set():
                    try:
                        await asyncio.wait_for(self._doorbell.wait(), self.poll_s)
                    except TimeoutError:
                        pass
        finally:
            for subscription in subscriptions:
                await subscription.unsubscribe()
            self._writer.shutdown(wait=True)

    async def _ring(self, msg: Msg) -> None:
        self._doorbell.set()

    async def _catch_up(self) -> None:
        try:
            applied = await eventlog.catch_up(self.bus, self.db, executor=self._writer)
        except (eventlog.StreamReadError, eventlog.AnalystDBError, BusError, nats.errors.Error, OSError) as exc:
            self.error = f"catch-up failed: {exc}"
            log.warning("dashboard catch-up failed", error=str(exc))
            return
        self.error = None
        if applied:
            async with self._moved:
                self.version += 1
                self._moved.notify_all()

    async def wait_newer(self, version: int, timeout_s: float) -> int:
        """The current version once it is past ``version``, or after ``timeout_s`` (the same one then)."""
        async with self._moved:
            try:
                await asyncio.wait_for(self._moved.wait_for(lambda: self.version > version), timeout_s)
            except TimeoutError:
                pass
            return self.version
