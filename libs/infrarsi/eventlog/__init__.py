"""The analyst database: a DuckDB projection of the three streams, rebuilt deterministically by replay.

A package, one module per job: ``schema`` (tables, DDL, version, file names), ``decoding`` (stream messages into
columnar ``Batch``es), ``database`` (``AnalystDB``: the DuckDB file, applying a batch, snapshots) and ``catchup``
(``replay``/``catch_up``: reading the streams through ``infrarsi.bus.reader`` and applying them). Everything
callers use is re-exported here (``from infrarsi.eventlog import AnalystDB, replay``).

Owns the analyst schema (``events`` — a view over ``lifecycle_events`` and ``steps`` —, ``studies``, ``trials``,
``steps``, ``failures``, ``models``, ``verifications``, ``bank``, ``dead_letters``, ``undecodable``; see
``SCHEMA``), decoding stream messages into
columnar batches, applying a batch idempotently, ``replay``, and publishing
a read-only snapshot of the file for analysts (docs/analytics.md).

Rules it keeps (STYLE.md rule 3, the eventsourcing projection example):

- **Idempotent by stream sequence.** ``_positions(stream, last_seq)`` is updated in the same transaction as
  the rows of a batch; every insert takes only messages with ``seq > last_seq`` as read inside that
  transaction, so re-applying an old batch (or a half-old one) changes nothing.
- **Deterministic.** Every column comes from the log (no wall clock, no row ids); ``trials``/``studies``
  take, per column, the value of the event with the highest sequence that set it, whatever the batch
  boundaries were, so two replays of one log give identical tables.
- **Never crashes on bad input.** A message that fails the typed decoders is recorded in ``undecodable``
  (stream, seq, subject, error, raw bytes) and skipped; dead letters (``irsi.deadletter.*``, not events)
  are decoded with ``events.DeadLetter`` into ``dead_letters``.
- **Batched and set-based.** A batch (thousands of messages) is one transaction; rows are staged as numpy
  columns and inserted with one ``INSERT … SELECT`` per table; the per-trial upsert aggregates a batch
  per trial in SQL, then merges with ``ON CONFLICT``.

DuckDB allows one writing process per file: this module never opens a file for writing behind its
caller's back; the reporter service is the one writer of ``<data_dir>/analyst.duckdb`` and analysts read
``analyst.snapshot.duckdb`` (``publish_snapshot``). It must not publish to, or ack on, the bus.
"""

from infrarsi.bus.client import BANK_STREAM, LIFECYCLE_STREAM, TELEMETRY_STREAM
from infrarsi.bus.reader import StreamMessage, StreamReadError
from infrarsi.eventlog.catchup import Progress, ReplayStats, backlog, catch_up, replay, wait_until
from infrarsi.eventlog.database import AnalystDB
from infrarsi.eventlog.decoding import Batch, decode_batch, decode_batch_yielding, decode_step
from infrarsi.eventlog.schema import (
    ANALYST_DB_NAME,
    DB_SCHEMA_VERSION,
    DEFAULT_BATCH,
    PROJECTION_TABLES,
    REPLAYED_STREAMS,
    SCHEMA,
    SNAPSHOT_NAME,
    AnalystDBError,
    analyst_db_path,
    snapshot_path,
)

__all__ = [
    "ANALYST_DB_NAME", "BANK_STREAM", "DB_SCHEMA_VERSION", "DEFAULT_BATCH", "LIFECYCLE_STREAM", "PROJECTION_TABLES",
    "REPLAYED_STREAMS", "SCHEMA", "SNAPSHOT_NAME", "TELEMETRY_STREAM", "AnalystDB", "AnalystDBError", "Batch",
    "Progress", "ReplayStats", "StreamMessage", "StreamReadError", "analyst_db_path", "backlog", "catch_up",
    "decode_batch", "decode_batch_yielding", "decode_step", "replay", "snapshot_path", "wait_until",
]
