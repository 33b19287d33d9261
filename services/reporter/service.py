"""The reporter service: the one writer of the analyst DuckDB, and the publisher of its read-only snapshot.

It owns ``<data_dir>/analyst.duckdb`` (DuckDB's file lock makes a second writer — another reporter, or
``infrarsi replay`` on the same file — fail to open it) and ``<data_dir>/analyst.snapshot.duckdb``, the
consistent copy analysts query (``infrarsi sql``, any DuckDB client; docs/analytics.md). Report rendering
will live here later; it must not write any other service's state, and publishes only ``BankEntry`` events.

Design: a delivery is a doorbell, not the data. The runner's durable consumers (one per stream, every
payload type) hand ``handle`` an ``Event`` without its stream sequence, and the projection must be
idempotent by sequence and cover messages no consumer selects (dead letters, undecodable ones). So
``handle`` only rings the bell; one background task (``_keep_current``) brings the DB up to the end of the
three streams with ``eventlog.catch_up`` — the same code as ``infrarsi replay``, reading from the positions
stored in the DB in the same transaction as the rows — whenever the bell rings, and at least every
``POLL_S`` (dead letters ring no bell). Acking a delivery before its rows are written is safe: the DB's
positions, not the consumer's acks, say what has been applied, and a restart resumes from them.
After a catch-up it publishes a snapshot (checkpoint, copy, rename) at most every ``SNAPSHOT_MIN_S`` and
no more often than ``SNAPSHOT_COST_FACTOR`` × the last copy's duration, so copying a large DB never takes
more than a small share of the time.

Second concern, separate from the DB: the experience bank. ``handle`` also feeds each delivery to a
``BankDistiller`` (``bank.py``, a pure fold rebuilt by replaying the lifecycle stream on start) and publishes
the ``BankEntry`` revisions it returns — when a study finishes, and when a later verification completes —
before returning, so the delivery is acked only after they are stored (a crash in between re-publishes the
same event ids on redelivery; JetStream drops the copies).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from pathlib import Path
from typing import ClassVar

from infrarsi import eventlog
from infrarsi import events as ev
from infrarsi.runtime.logs import get_logger
from infrarsi.runtime.service import Outbox, Service
from infrarsi.runtime.settings import Settings

from .bank import BankDistiller

log = get_logger(__name__)

SHUTDOWN_CATCH_UP_S = 10.0
"""How long a stopping reporter spends on a last catch-up before it closes the DB."""

POLL_S = 1.0
"""Longest wait between catch-ups without a delivery (dead letters are on no consumer's filter)."""
SNAPSHOT_MIN_S = 1.0
"""Snapshots are published at most this often."""
SNAPSHOT_COST_FACTOR = 10.0
"""…and at most once per this many times the duration of the last snapshot copy."""


class ReporterService(Service):
    name: ClassVar[str] = "reporter"
    consumes: ClassVar[tuple[type, ...]] = ev.PAYLOAD_TYPES

    def __init__(self, data_dir: Path | str | None = None) -> None:
        self.data_dir = Path(data_dir or Settings.from_env().data_dir)
        self.db_path = eventlog.analyst_db_path(self.data_dir)
        self.snapshot_path = eventlog.snapshot_path(self.data_dir)
        self.db: eventlog.AnalystDB | None = None
        self._doorbell = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        # Every DuckDB call runs on this one thread: one writer, never two statements at once.
        self._writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="analyst-db")
        self._applied = 0
        self._snapshot_at = 0.0
        self._snapshot_cost_s = 0.0
        self._snapshot_positions: dict[str, int] = {}
        self._catch_up_error: str | None = None
        self.bank = BankDistiller()
        self._bank_published = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.db = await loop.run_in_executor(self._writer, eventlog.AnalystDB.open, self.db_path)
        await self._catch_up()  # rebuild before the first delivery: the DB is current when we say we are up
        replayed = 0
        async for event in self.replay(BankDistiller.consumes):
            self.bank.apply(event)  # outputs discarded: published by an earlier life, or on redelivery
            replayed += 1
        log.info("bank distiller rebuilt by replay", events=replayed)
        self._task = asyncio.create_task(self._keep_current(), name="reporter-keep-current")

    async def handle(self, event: ev.Event, out: Outbox) -> None:
        self._doorbell.set()
        for entry in self.bank.apply(event):
            await self.bus.publish(entry)
            self._bank_published += 1
            if isinstance(entry.payload, ev.BankEntry):  # the distiller emits nothing else
                log.info("bank entry published", entry_id=entry.payload.entry_id, event_id=entry.event_id)

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.db is not None:
            # Best effort and bounded: positions are stored with the rows, so the next life resumes anyway.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._catch_up(), timeout=SHUTDOWN_CATCH_UP_S)
            db, self.db = self.db, None
            await asyncio.get_running_loop().run_in_executor(self._writer, db.close)
        self._writer.shutdown(wait=True)

    @classmethod
    def from_settings(cls, settings: Settings) -> ReporterService:
        return cls(settings.data_dir)

    def status(self) -> dict[str, object]:
        positions = self.db.positions() if self.db is not None else {}
        return {
            "analyst_db": str(self.db_path),
            "snapshot": str(self.snapshot_path),
            "positions": positions,
            "snapshot_positions": self._snapshot_positions,
            "applied": self._applied,
            "catch_up_error": self._catch_up_error,
            "bank_entries_published": self._bank_published,
            **self.bank.status(),
        }

    async def _keep_current(self) -> None:
        wait_s = POLL_S
        while not self._stopping:  # besides the cancel: a loop that outlived one must still end
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._doorbell.wait(), wait_s)
            self._doorbell.clear()
            try:
                snapshot_due_in = await self._catch_up()
                wait_s = min(POLL_S, snapshot_due_in) if snapshot_due_in is not None else POLL_S
                self._catch_up_error = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 — keep serving; the next bell retries from the positions
                self._catch_up_error = repr(exc)
                log.exception("analyst DB catch-up failed", error=repr(exc))
                await asyncio.sleep(POLL_S)

    async def _catch_up(self) -> float | None:
        """Apply what is new, then snapshot if due; returns seconds until a pending snapshot is due."""
        assert self.db is not None
        self._applied += await eventlog.catch_up(self.bus, self.db, executor=self._writer)
        return await self._maybe_snapshot()

    async def _maybe_snapshot(self) -> float | None:
        assert self.db is not None
        positions = self.db.positions()
        if positions == self._snapshot_positions and self.snapshot_path.exists():
            return None
        interval = max(SNAPSHOT_MIN_S, SNAPSHOT_COST_FACTOR * self._snapshot_cost_s)
        due_in = self._snapshot_at + interval - time.monotonic()
        if due_in > 0 and self.snapshot_path.exists():
            return due_in  # newer rows wait for the next snapshot slot
        started = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(self._writer, self.db.publish_snapshot, self.snapshot_path)
        self._snapshot_cost_s = time.monotonic() - started
        self._snapshot_at = time.monotonic()
        self._snapshot_positions = positions
        return None
