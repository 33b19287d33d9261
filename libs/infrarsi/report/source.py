"""Where the report reads from: the analyst DuckDB's ``events`` view, seen through one view of its own.

Every number in a report is a SQL query over the analyst database that ``infrarsi.eventlog.replay`` builds.
The report needs only its ``events`` (one row per event, with the columns ``eventlog.schema.EVENT_COLUMNS``
declares: stream position, envelope, payload JSON), which keeps it independent of how the other projections
(``trials``, ``steps``, …) lay out their columns. ``ensure_view`` numbers those rows in stream order as the
view ``report_events``:

    report_events(seq BIGINT, event_id, type, study_id, trial_id, ts, payload JSON)

A DB whose ``events`` lacks a declared column (another schema version, another tool's table) is refused with
what is missing, never read by guessing. ``load_events`` writes decoded events into the analyst schema itself
(``lifecycle_events`` under the ``events`` view): what unit tests use to build a DB without NATS.
"""

from __future__ import annotations

from collections.abc import Iterable

import duckdb
import msgspec

from infrarsi import events as ev
from infrarsi.bus.subjects import LIFECYCLE_STREAM, subject_for
from infrarsi.eventlog.schema import DB_SCHEMA_VERSION, EVENT_COLUMNS, SCHEMA

VIEW = "report_events"


class ReportSourceError(RuntimeError):
    """The analyst DB has no usable ``events`` table."""


def ensure_view(con: duckdb.DuckDBPyConnection) -> None:
    """Create (or replace) the temporary view ``report_events`` over the DB's ``events``."""
    try:
        cols = {row[0].lower() for row in con.execute("DESCRIBE events").fetchall()}
    except duckdb.CatalogException:
        raise ReportSourceError("the analyst DB has no `events` table; run `infrarsi replay` first") from None
    missing = [c for c in EVENT_COLUMNS if c not in cols]
    if missing:
        raise ReportSourceError(
            f"table events lacks the analyst schema's columns {missing} (schema version {DB_SCHEMA_VERSION}); "
            "rebuild the DB: infrarsi replay --from-scratch"
        )
    # Positions are per stream: numbering in (stream, seq) order keeps each stream's own order.
    con.execute(
        f"""
        CREATE OR REPLACE TEMP VIEW {VIEW} AS
        SELECT row_number() OVER (ORDER BY stream, seq) AS seq,
               event_id, type, study_id, trial_id, ts, CAST(payload AS JSON) AS payload
        FROM events
        """
    )


def load_events(con: duckdb.DuckDBPyConnection, events: Iterable[tuple[int, ev.Event]]) -> int:
    """Create the analyst schema (``SCHEMA``) if missing and insert (stream position, event) rows into its
    ``lifecycle_events``; idempotent by position (a position already there is skipped). Returns the rows written."""
    con.execute(SCHEMA)
    have = con.execute("SELECT seq FROM lifecycle_events WHERE stream = ?", [LIFECYCLE_STREAM]).fetchall()
    known = {seq for (seq,) in have}
    rows = [
        (
            LIFECYCLE_STREAM, seq, subject_for(e), e.event_id, e.type, e.study_id, e.trial_id, e.cluster_id,
            e.source, e.ts, e.schema_version, msgspec.json.encode(e.payload).decode(),
        )
        for seq, e in events
        if seq not in known
    ]
    if rows:
        marks = ", ".join("?" * len(EVENT_COLUMNS))
        con.executemany(f"INSERT INTO lifecycle_events ({', '.join(EVENT_COLUMNS)}) VALUES ({marks})", rows)
    return len(rows)
