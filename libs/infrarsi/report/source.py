"""Where the report reads from: the analyst DuckDB's ``events`` table, seen through one view.

Every number in a report is a SQL query over the analyst database that ``infrarsi.eventlog.replay`` builds.
The report needs only one table of it, ``events`` (one row per event: type, study, trial, time, stream
position, payload JSON), which keeps it independent of how the other projections (``trials``, ``steps``, …)
lay out their columns. ``ensure_view`` maps that table's columns onto the view ``report_events``:

    report_events(seq BIGINT, event_id, type, study_id, trial_id, ts, payload JSON)

``load_events`` writes a minimal ``events`` table from decoded events: what unit tests use to build a DB
without NATS.
"""

from __future__ import annotations

from collections.abc import Iterable

import duckdb
import msgspec

from infrarsi import events as ev
from infrarsi.subjects import LIFECYCLE_STREAM

VIEW = "report_events"

_PAYLOAD_COLUMNS = ("payload", "payload_json")
_ENVELOPE_COLUMNS = ("envelope", "event", "data", "raw", "json", "body")
_SEQ_COLUMNS = ("stream_seq", "seq", "sequence", "position")
_EVENT_ID_COLUMNS = ("event_id", "id")


class ReportSourceError(RuntimeError):
    """The analyst DB has no usable ``events`` table."""


def ensure_view(con: duckdb.DuckDBPyConnection) -> None:
    """Create (or replace) the temporary view ``report_events`` over the DB's ``events`` table."""
    try:
        cols = {row[0].lower(): row[1].upper() for row in con.execute("DESCRIBE events").fetchall()}
    except duckdb.CatalogException:
        raise ReportSourceError("the analyst DB has no `events` table; run `infrarsi replay` first") from None
    missing = [c for c in ("type", "study_id") if c not in cols]
    if missing:
        raise ReportSourceError(f"table events lacks columns {missing}")
    payload = next((f"CAST({c} AS JSON)" for c in _PAYLOAD_COLUMNS if c in cols), None)
    if payload is None:
        envelope = next((c for c in _ENVELOPE_COLUMNS if c in cols), None)
        if envelope is None:
            raise ReportSourceError(f"table events has no payload column (looked for {_PAYLOAD_COLUMNS + _ENVELOPE_COLUMNS})")
        payload = f"(CAST({envelope} AS JSON)->'payload')"
    seq = next((c for c in _SEQ_COLUMNS if c in cols), None)
    event_id = next((c for c in _EVENT_ID_COLUMNS if c in cols), "NULL")
    ts = "ts" if "ts" in cols else "NULL"
    trial = "trial_id" if "trial_id" in cols else "NULL"
    order = seq or (ts if ts != "NULL" else "rowid")
    con.execute(
        f"""
        CREATE OR REPLACE TEMP VIEW {VIEW} AS
        SELECT row_number() OVER (ORDER BY {order}) AS seq,
               {event_id} AS event_id, type, study_id, {trial} AS trial_id,
               CAST({ts} AS TIMESTAMPTZ) AS ts, {payload} AS payload
        FROM events
        """
    )


def load_events(con: duckdb.DuckDBPyConnection, events: Iterable[tuple[int, ev.Event]]) -> int:
    """Create the minimal ``events`` table and insert (stream_seq, event) rows; idempotent by stream_seq."""
    con.execute(
        """
        CREATE TABLE IF NOT EXISTS events (
            stream_seq BIGINT, stream VARCHAR, event_id VARCHAR, type VARCHAR, study_id VARCHAR,
            trial_id VARCHAR, cluster_id VARCHAR, source VARCHAR, ts TIMESTAMPTZ, payload JSON,
            PRIMARY KEY (stream, stream_seq)
        )
        """
    )
    rows = [
        (
            seq, LIFECYCLE_STREAM, e.event_id, e.type, e.study_id, e.trial_id, e.cluster_id, e.source, e.ts,
            msgspec.json.encode(e.payload).decode(),
        )
        for seq, e in events
    ]
    if rows:
        con.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    return len(rows)
