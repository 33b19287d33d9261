"""Replay: each stream read from the DB's stored positions (``bus.reader.read_stream``), decoded and applied
batch by batch with a little read-ahead — ``replay``, ``catch_up``, ``backlog``, ``wait_until``. Must not publish
or ack."""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb

from infrarsi.bus.client import Bus
from infrarsi.bus.reader import StreamMessage, StreamReadError, read_stream
from infrarsi.eventlog.database import AnalystDB
from infrarsi.eventlog.decoding import decode_batch_yielding
from infrarsi.eventlog.schema import DEFAULT_BATCH, REPLAYED_STREAMS, AnalystDBError
from infrarsi.runtime.logs import get_logger

log = get_logger(__name__)

# --------------------------------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayStats:
    events: int
    """Messages applied (events, dead letters and undecodable ones) in this run."""
    seconds: float
    events_per_s: float


Progress = Callable[[int, int], None]
"""Called with (messages applied so far, messages to apply in this run)."""


async def backlog(bus: Bus, db: AnalystDB) -> dict[str, int]:
    """Messages per stream past the DB's position (what a catch-up will read)."""
    counts = await bus.stream_counts()
    return {
        stream: max(0, counts[stream]["last_seq"] - db.position(stream))
        for stream in REPLAYED_STREAMS
        if stream in counts and counts[stream]["messages"]
    }


async def catch_up(
    bus: Bus,
    db: AnalystDB,
    *,
    progress: Progress | None = None,
    batch_size: int = DEFAULT_BATCH,
    executor: concurrent.futures.Executor | None = None,
) -> int:
    """Apply every message past the DB's positions, stream by stream; returns how many were applied.

    Three stages overlap: a reader task drains the stream into batches (so the server's flow control is
    answered while the rest works), the event loop decodes a batch (in slices, giving the reader turns),
    and ``executor`` (one thread: DuckDB releases the GIL while it inserts) writes the previous one.

    Throughput is the same as a plain ``async for`` over ``read_stream`` that decodes and writes in turn; what
    the split buys is a clean cancellation (a stopping reporter cancels its catch-up): the reader task is
    cancelled and awaited and the pending write awaited, each in its own ``finally``. With the plain loop a
    stopping reporter hung past 60 s in 3 of 8 runs of
    ``tests/integration/test_bank_wiring.py::test_a_finished_study_seeds_the_next_init_through_the_reporter``
    (0 of 10 with this one; a later CI run still hung once, on a cancel that arrived while the finished stream's
    reader was awaited — ``_catch_up_stream`` now re-raises it, ``tests/unit/test_eventlog_catchup_cancel.py``).
    """
    todo = await backlog(bus, db)
    total = sum(todo.values())
    if total == 0:
        return 0
    own_executor = executor is None
    pool = executor or concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="analyst-db")
    applied = _Applied(total, progress)
    try:
        for stream in todo:
            for attempt in range(3):
                try:
                    await _catch_up_stream(bus, db, stream, pool, batch_size, applied)
                    break
                except StreamReadError as exc:
                    if attempt == 2:
                        raise
                    log.warning("stream read interrupted; resuming from the stored position", error=str(exc))
    finally:
        if own_executor:
            pool.shutdown(wait=True)
    return applied.count


@dataclass
class _Applied:
    """Messages applied so far in one catch-up (kept across a resumed stream read), reported to ``progress``."""

    total: int
    progress: Progress | None
    count: int = 0

    def add(self, n: int) -> None:
        self.count += n
        if self.progress:
            self.progress(self.count, self.total)


_READ_AHEAD_BATCHES = 2
"""Batches the reader may hold while the previous ones decode and write (then it stops reading, and the
server waits on flow control: memory stays bounded)."""


async def _catch_up_stream(
    bus: Bus, db: AnalystDB, stream: str, pool: concurrent.futures.Executor, batch_size: int, applied: _Applied
) -> None:
    """One stream from the DB's position to its end (``catch_up``'s pipeline). Every batch handed to the
    writer is awaited (and counted) before returning or raising."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[list[StreamMessage] | BaseException | None] = asyncio.Queue(_READ_AHEAD_BATCHES)
    decoded_to = db.position(stream)

    async def read() -> None:
        buffer: list[StreamMessage] = []
        try:
            async for chunk in read_stream(bus, stream, decoded_to + 1):
                buffer.extend(chunk)
                if len(buffer) >= batch_size:
                    await queue.put(buffer)
                    buffer = []
            if buffer:
                await queue.put(buffer)
            await queue.put(None)
        except Exception as exc:  # handed to the consumer, which raises it after its pending write
            await queue.put(exc)

    reader = asyncio.create_task(read())
    pending: asyncio.Future[int] | None = None
    try:
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                break
            batch = await decode_batch_yielding(stream, item, after_seq=decoded_to)
            decoded_to = batch.last_seq or decoded_to
            if pending is not None:
                applied.add(await pending)
                pending = None
            pending = loop.run_in_executor(pool, db.write_batch, batch)
    finally:
        reader.cancel()
        cancelled = False
        try:
            await reader
        except asyncio.CancelledError:
            # the reader's own cancellation, or this task's arriving while it waits for the reader: the latter
            # must not be swallowed (a stopping reporter would wait forever for a catch-up that went on)
            task = asyncio.current_task()
            cancelled = task is not None and task.cancelling() > 0
        except Exception:  # noqa: BLE001, S110 — the reader hands its errors over the queue; this is its teardown
            pass
        if pending is not None:
            applied.add(await pending)
        if cancelled:
            raise asyncio.CancelledError


async def replay(
    bus: Bus,
    db_path: Path | str,
    *,
    from_scratch: bool = False,
    progress: Progress | None = None,
    batch_size: int = DEFAULT_BATCH,
) -> ReplayStats:
    """Bring the analyst DB at ``db_path`` up to the end of the streams (``from_scratch``: delete it first).

    Incremental by default: only messages past the stored positions are read. ``from_scratch`` removes the
    file in place; for a rebuild that never leaves a half-written DB behind, replay into a temporary
    file and rename it (what ``infrarsi replay --from-scratch`` does).
    """
    path = Path(db_path)
    if from_scratch:
        for stale in (path, path.with_name(path.name + ".wal")):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
    started = time.perf_counter()
    db = await asyncio.to_thread(AnalystDB.open, path)
    try:
        applied = await catch_up(bus, db, progress=progress, batch_size=batch_size)
        await asyncio.to_thread(db.checkpoint)
    finally:
        db.close()
    seconds = time.perf_counter() - started
    return ReplayStats(events=applied, seconds=seconds, events_per_s=applied / seconds if seconds > 0 else 0.0)


async def wait_until(
    db: AnalystDB | Path | str, stream: str, seq: int, timeout: float = 10.0, interval: float = 0.05
) -> dict[str, int]:
    """Wait until the DB (an open one, or a file — a snapshot — reopened read-only each time) has applied
    ``stream`` up to ``seq``; returns the positions. ``TimeoutError`` says where it stood."""
    deadline = time.monotonic() + timeout
    positions: dict[str, int] = {}
    while True:
        if isinstance(db, AnalystDB):
            positions = db.positions()
        else:
            with contextlib.suppress(AnalystDBError, duckdb.Error):
                snapshot = AnalystDB.open(db, read_only=True)
                try:
                    positions = snapshot.positions()
                finally:
                    snapshot.close()
        if positions.get(stream, 0) >= seq:
            return positions
        if time.monotonic() > deadline:
            raise TimeoutError(f"analyst DB {getattr(db, 'path', db)} at {positions}, not at {stream}:{seq} after {timeout}s")
        await asyncio.sleep(interval)
