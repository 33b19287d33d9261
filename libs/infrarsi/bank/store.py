"""The bank's DuckDB projection (table ``bank``), and its export/import as JSONL or Parquet.

Owns: the ``bank`` table (one row per ``entry_id``, the latest revision; the full envelope in ``event``), the
per-stream positions that make the projection idempotent (``bank_positions``, written in the same transaction
as the rows), the replay of the bank streams a server holds into it, and file export/import.
Must not: publish (``infrarsi bank import`` does, with ``parse_import_file``'s output) or read other streams.

The table is a function of the *set* of bank events only — not of which stream, in which order, held them — so
a replay on cluster A and on cluster B of a converged federation gives the same rows (``ORDER BY entry_id``).

How the event log engineer calls it (``infrarsi replay``)::

    from infrarsi.bank.store import create_bank_tables, project_bank
    create_bank_tables(con)
    project_bank(con, stream_name, [(msg.metadata.sequence.stream, event), ...])  # per fetched batch

or, for everything at once, ``await replay_bank(bus, con)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import duckdb
import msgspec

from infrarsi import events as ev
from infrarsi.bank.distil import bank_event
from infrarsi.bus.client import Bus
from infrarsi.study import userfiles

BANK_TABLE_DDL = """
CREATE TABLE IF NOT EXISTS bank (
    entry_id            VARCHAR PRIMARY KEY,
    cluster_id          VARCHAR NOT NULL,   -- the cluster that published the entry (subject bank.<cluster>.<entry>)
    origin_study        VARCHAR NOT NULL,
    event_id            VARCHAR NOT NULL,   -- of the latest revision
    ts                  TIMESTAMPTZ NOT NULL,
    accelerator         VARCHAR,
    generation          VARCHAR,
    device_memory_bytes BIGINT,
    interconnect        VARCHAR,
    nodes               INTEGER,
    devices_per_node    INTEGER,
    parallelism         JSON,
    model_family        VARCHAR,
    model_params        DOUBLE,
    seq_len             INTEGER,
    global_batch        INTEGER,
    micro_batch         INTEGER,
    precision           VARCHAR,
    n_time_effects      INTEGER,
    n_memory_effects    INTEGER,
    n_winners           INTEGER,
    n_failures          INTEGER,
    event               JSON NOT NULL       -- the whole envelope, as published
);
CREATE TABLE IF NOT EXISTS bank_positions (
    stream   VARCHAR PRIMARY KEY,
    last_seq BIGINT NOT NULL
);
"""

COLUMNS = (
    "entry_id", "cluster_id", "origin_study", "event_id", "ts", "accelerator", "generation", "device_memory_bytes",
    "interconnect", "nodes", "devices_per_node", "parallelism", "model_family", "model_params", "seq_len",
    "global_batch", "micro_batch", "precision", "n_time_effects", "n_memory_effects", "n_winners", "n_failures",
    "event",
)


def create_bank_tables(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(BANK_TABLE_DDL)


def _row(event: ev.Event) -> tuple[Any, ...]:
    entry = event.payload
    assert isinstance(entry, ev.BankEntry)
    m = entry.meta
    return (
        entry.entry_id, event.cluster_id, entry.origin_study, event.event_id, event.ts, m.accelerator, m.generation,
        m.device_memory_bytes, m.interconnect, m.nodes, m.devices_per_node, msgspec.json.encode(m.parallelism).decode(),
        m.model_family, m.model_params, m.seq_len, m.global_batch, m.micro_batch, m.precision,
        len(entry.time_effects), len(entry.memory_effects), len(entry.winners), len(entry.failures),
        ev.encode(event).decode(),
    )


def project_bank(con: duckdb.DuckDBPyConnection, stream: str, batch: Sequence[tuple[int, ev.Event]]) -> int:
    """Apply one batch of ``(stream_seq, event)`` from ``stream``; returns the rows written.

    In one transaction: events at or below the stream's recorded position are skipped (a repeated batch
    changes nothing), each entry keeps its latest revision (later ``ts``, then larger event id), the position
    moves to the batch's last sequence.
    """
    con.execute("BEGIN")
    try:
        have = con.execute("SELECT last_seq FROM bank_positions WHERE stream = ?", [stream]).fetchone()
        last = have[0] if have else 0
        written = 0
        top = last
        for seq, event in batch:
            if seq <= last:
                continue
            top = max(top, seq)
            if not isinstance(event.payload, ev.BankEntry):
                continue
            current = con.execute("SELECT ts, event_id FROM bank WHERE entry_id = ?",
                                  [event.payload.entry_id]).fetchone()
            if current is not None and (event.ts, event.event_id) <= (current[0], current[1]):
                continue
            con.execute(f"INSERT OR REPLACE INTO bank VALUES ({', '.join('?' * len(COLUMNS))})", list(_row(event)))
            written += 1
        if top > last:
            con.execute("INSERT OR REPLACE INTO bank_positions VALUES (?, ?)", [stream, top])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return written


async def replay_bank(bus: Bus, con: duckdb.DuckDBPyConnection, streams: Sequence[str] | None = None) -> int:
    """Bring ``bank`` up to date with the bank streams of the connected server (local ∪ shared by default)."""
    from infrarsi.bank.federation import bank_streams

    create_bank_tables(con)
    names = list(streams) if streams is not None else await bank_streams(bus)
    written = 0
    for name in names:
        have = con.execute("SELECT last_seq FROM bank_positions WHERE stream = ?", [name]).fetchone()
        async for batch in bus.event_batches(name, start_seq=(have[0] if have else 0) + 1):
            written += project_bank(con, name, batch)
    return written


def load_entries(con: duckdb.DuckDBPyConnection, where: str = "") -> list[ev.BankEntry]:
    """The entries of the table (optionally filtered by a SQL ``where`` clause), sorted by entry id."""
    rows = con.execute(f"SELECT event FROM bank {('WHERE ' + where) if where else ''} ORDER BY entry_id").fetchall()
    # the table holds bank events only (``project_bank`` writes nothing else)
    return [cast(ev.BankEntry, ev.decode(r[0].encode()).payload) for r in rows]


def load_events(con: duckdb.DuckDBPyConnection) -> list[ev.Event]:
    return [ev.decode(r[0].encode()) for r in con.execute("SELECT event FROM bank ORDER BY entry_id").fetchall()]


# ------------------------------------------------------------------------------------------- export/import


def _format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".parquet":
        return "parquet"
    raise ValueError(f"{path}: unknown format (use .jsonl or .parquet)")


def export_bank(con: duckdb.DuckDBPyConnection, path: Path | str) -> int:
    """Write the table to ``path``: JSONL (one envelope per line) or Parquet (every column, via DuckDB COPY)."""
    path = Path(path)
    fmt = _format(path)
    if fmt == "parquet":
        # COPY cannot take the path as a parameter; quote it as a SQL string literal.
        literal = "'" + str(path).replace("'", "''") + "'"
        con.execute(f"COPY (SELECT * FROM bank ORDER BY entry_id) TO {literal} (FORMAT parquet)")
        (count,) = con.execute("SELECT count(*) FROM bank").fetchall()  # count(*) has exactly one row
        return int(count[0])
    rows = con.execute("SELECT event FROM bank ORDER BY entry_id").fetchall()
    with open(path, "w", encoding="utf-8") as out:
        for (event_json,) in rows:
            out.write(event_json + "\n")
    return len(rows)


def parse_import_file(path: Path | str, *, cluster_id: str, source: str = "bank-import") -> list[ev.Event]:
    """Bank events from a file written by ``export_bank`` (or by hand: one bare ``BankEntry`` per JSONL line).

    Envelopes keep their original ids, cluster and time (re-importing is a no-op for readers: same
    ``entry_id``, same revision); bare entries are wrapped as published by ``cluster_id``.
    """
    path = Path(path)
    texts: list[str]
    if _format(path) == "parquet":
        con = duckdb.connect()
        try:
            literal = "'" + str(path).replace("'", "''") + "'"
            texts = [r[0] for r in con.execute(f"SELECT event FROM read_parquet({literal}) ORDER BY entry_id").fetchall()]
        finally:
            con.close()
    else:
        text = userfiles.read_text(path, what="the bank import", max_bytes=userfiles.MAX_IMPORT_BYTES)
        texts = [line for line in text.splitlines() if line.strip()]
    entry_decoder = msgspec.json.Decoder(ev.BankEntry)
    out: list[ev.Event] = []
    for n, text in enumerate(texts, 1):
        raw = text.encode()
        try:
            event = ev.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            try:
                entry = entry_decoder.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise ValueError(f"{path}:{n}: neither a bank event nor a BankEntry: {exc}") from None
            event = bank_event(entry, cluster_id=cluster_id, source=source)
        if not isinstance(event.payload, ev.BankEntry):
            raise ValueError(f"{path}:{n}: a {event.type} event, not a BankEntry")
        out.append(event)
    return out


def project_events(con: duckdb.DuckDBPyConnection, events: Iterable[ev.Event], stream: str = "file") -> int:
    """Load events that did not come from a stream (tests, offline analysis) into the table."""
    create_bank_tables(con)
    have = con.execute("SELECT last_seq FROM bank_positions WHERE stream = ?", [stream]).fetchone()
    start = have[0] if have else 0
    return project_bank(con, stream, [(start + i + 1, e) for i, e in enumerate(events)])
