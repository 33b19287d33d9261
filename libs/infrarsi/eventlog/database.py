"""``AnalystDB``: the DuckDB file — opening it (one writer per file), applying a ``Batch`` idempotently by
stream sequence in one transaction, queries, and the read-only snapshot for analysts. Must not read the bus."""
from __future__ import annotations

import contextlib
import json as _stdjson
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from infrarsi import events as ev
from infrarsi.bus.reader import StreamMessage
from infrarsi.eventlog.decoding import (
    _BANK_COLUMNS,
    _MODEL_COLUMNS,
    _VERIFICATION_COLUMNS,
    Batch,
    decode_batch,
)
from infrarsi.eventlog.schema import (
    _STUDY_COLUMNS,
    _TRIAL_COLUMNS,
    DB_SCHEMA_VERSION,
    REPLAYED_STREAMS,
    SCHEMA,
    AnalystDBError,
)

# --------------------------------------------------------------------------------------------------
# The database
# --------------------------------------------------------------------------------------------------


def _upsert_sql(table: str, keys: tuple[str, ...], columns: dict[str, str]) -> str:
    """Merge a staged batch into ``table``: per key and column, the value of the highest ``seq`` that set it."""
    key_list = ", ".join(keys)
    aggregated = ",\n".join(
        f'(arg_max("{c}", seq) FILTER (WHERE "{c}" IS NOT NULL))::{t} AS "{c}"' for c, t in columns.items()
    )
    updates = ",\n".join(f'"{c}" = coalesce(excluded."{c}", {table}."{c}")' for c in columns)
    names = ", ".join(f'"{c}"' for c in columns)
    return f"""
        INSERT INTO {table} ({key_list}, {names}, last_seq)
        SELECT {key_list}, {aggregated}, max(seq) FROM _stage_{table} WHERE seq > $after GROUP BY {key_list}
        ON CONFLICT ({key_list}) DO UPDATE SET {updates},
            last_seq = greatest(excluded.last_seq, {table}.last_seq)
    """


_STEP_JSON_STRUCTURE = _stdjson.dumps({
    "event_id": "VARCHAR", "study_id": "VARCHAR", "trial_id": "VARCHAR", "cluster_id": "VARCHAR", "source": "VARCHAR",
    "schema_version": "INTEGER",
    "payload": {
        "rank": "INTEGER", "world_size": "INTEGER", "step": "BIGINT", "loss": "DOUBLE", "step_time_s": "DOUBLE",
        "phases": "JSON", "tokens": "BIGINT", "optimizer_steps": "BIGINT", "loss_tokens": "BIGINT",
        "peak_memory_bytes": "BIGINT", "flops": "DOUBLE", "mfu": "DOUBLE", "eval_loss": "DOUBLE",
        "eval_tokens": "BIGINT", "wall_time": "DOUBLE", "shape": "JSON", "deterministic": "BOOLEAN",
    },
}, separators=(",", ":"))
"""How DuckDB reads a telemetry ``TrialStep`` message's columns. The message was validated by msgspec with
the catalog's types first (``_decode_into``), so this projection cannot meet a value of another type; its
``ts`` comes from the validated decode (``ts_us``), as RFC 3339 has forms DuckDB's cast reads differently."""

_INSERTS: dict[str, str] = {
    "lifecycle_events": """
        INSERT INTO lifecycle_events SELECT $stream, seq, subject, event_id, type, study_id, trial_id, cluster_id,
               source, make_timestamptz(ts_us), schema_version, payload
        FROM _stage_lifecycle_events WHERE seq > $after""",
    "steps": f"""
        INSERT INTO steps SELECT seq, m.study_id, m.trial_id, p.rank, p.world_size, p.step, p.loss, p.step_time_s,
               coalesce(p.phases, '{{}}'), p.tokens, p.optimizer_steps, p.loss_tokens, p.peak_memory_bytes, p.flops, p.mfu,
               p.eval_loss, p.eval_tokens, coalesce(p.wall_time, 0.0), make_timestamptz(ts_us), m.event_id,
               subject, m.cluster_id, m.source, coalesce(m.schema_version, {ev.SCHEMA_VERSION}), p.shape,
               p.deterministic
        FROM (SELECT seq, subject, ts_us, json_transform(json, '{_STEP_JSON_STRUCTURE}') AS m
              FROM _stage_steps WHERE seq > $after), LATERAL (SELECT m.payload AS p)""",
    "studies": _upsert_sql("studies", ("study_id",), _STUDY_COLUMNS),
    "trials": _upsert_sql("trials", ("study_id", "trial_id"), _TRIAL_COLUMNS),
    "models": f"""
        INSERT INTO models SELECT {", ".join(c if c != "ts_us" else "make_timestamptz(ts_us)" for c in _MODEL_COLUMNS)}
        FROM _stage_models WHERE seq > $after""",
    "verifications": f"""
        INSERT INTO verifications
        SELECT {", ".join(c if c != "ts_us" else "make_timestamptz(ts_us)" for c in _VERIFICATION_COLUMNS)}
        FROM _stage_verifications WHERE seq > $after""",
    "bank": f"""
        INSERT INTO bank SELECT {", ".join(c if c != "ts_us" else "make_timestamptz(ts_us)" for c in _BANK_COLUMNS)}
        FROM _stage_bank WHERE seq > $after""",
    "dead_letters": """
        INSERT INTO dead_letters SELECT $stream, seq, subject, service, original_subject, original_stream_seq,
               error, raw, make_timestamptz(ts_us)
        FROM _stage_dead_letters WHERE seq > $after""",
    "undecodable": """
        INSERT INTO undecodable SELECT $stream, seq, subject, error, raw FROM _stage_undecodable WHERE seq > $after""",
}


class AnalystDB:
    """One open analyst DuckDB file: writable (one process at a time) or read-only.

    Calling order: ``open`` → ``apply_batch``/``write_batch`` (from one thread at a time) and ``query`` → ``close``.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> None:
        self.con = con
        self.path = path
        self.read_only = read_only
        self._positions: dict[str, int] = {}

    @classmethod
    def open(cls, path: Path | str, *, read_only: bool = False) -> AnalystDB:
        """Open (creating the file and schema when writable); ``AnalystDBError`` with DuckDB's reason if not."""
        path = Path(path)
        if read_only and not path.exists():
            raise AnalystDBError(f"cannot open analyst DB {path}: no such file")
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            con = duckdb.connect(str(path), read_only=read_only)
        except duckdb.Error as exc:
            raise AnalystDBError(f"cannot open analyst DB {path}: {exc}") from None
        db = cls(con, path, read_only)
        try:
            con.execute("SET TimeZone = 'UTC'")
            if not read_only:
                # Fewer automatic checkpoints mid-replay (each rewrites the open row groups); the WAL is
                # folded in by ``checkpoint``/``publish_snapshot`` and at close.
                con.execute("SET checkpoint_threshold = '256MB'")
                db._create_schema()
            db._load_positions()
        except duckdb.Error as exc:
            con.close()
            raise AnalystDBError(f"cannot use analyst DB {path}: {exc}") from None
        return db

    def _create_schema(self) -> None:
        self.con.execute(SCHEMA)
        rows = self.con.execute("SELECT value FROM _meta WHERE key = 'schema_version'").fetchall()
        row = rows[0] if rows else None
        if row is None:
            self.con.execute("INSERT INTO _meta VALUES ('schema_version', ?)", [DB_SCHEMA_VERSION])
        elif row[0] != DB_SCHEMA_VERSION:
            raise AnalystDBError(
                f"{self.path} has analyst schema {row[0]}, this build writes {DB_SCHEMA_VERSION}: "
                "rebuild it with `infrarsi replay --from-scratch`"
            )

    def _load_positions(self) -> None:
        with contextlib.suppress(duckdb.CatalogException):
            self._positions = dict(self.con.execute("SELECT stream, last_seq FROM _positions").fetchall())

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> AnalystDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- reading

    def position(self, stream: str) -> int:
        """The last stream sequence applied (0: none)."""
        return self._positions.get(stream, 0)

    def positions(self) -> dict[str, int]:
        return {s: self.position(s) for s in REPLAYED_STREAMS}

    def refresh_positions(self) -> dict[str, int]:
        """Re-read positions from the file (a read-only handle on a file another connection writes)."""
        self._load_positions()
        return self.positions()

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run one statement; returns (column names, rows). DuckDB errors propagate as ``duckdb.Error``."""
        cursor = self.con.execute(sql, params) if params is not None else self.con.execute(sql)
        columns = [d[0] for d in cursor.description] if cursor.description else []
        return columns, cursor.fetchall() if cursor.description else []

    # ---------------------------------------------------------------- writing

    def apply_batch(self, stream: str, msgs: Sequence[StreamMessage]) -> int:
        """Decode and apply messages of ``stream`` (in order); returns how many were new. Idempotent."""
        return self.write_batch(decode_batch(stream, msgs, after_seq=self.position(stream)))

    def write_batch(self, batch: Batch) -> int:
        """Apply a decoded batch in one transaction with its position; returns the messages it advanced by."""
        if not batch.last_seq:
            return 0
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            rows = con.execute("SELECT last_seq FROM _positions WHERE stream = ?", [batch.stream]).fetchall()
            after = rows[0][0] if rows else 0
            if batch.last_seq <= after:
                con.execute("ROLLBACK")
                self._positions[batch.stream] = after
                return 0
            params = {"after": after, "stream": batch.stream}
            for table, arrays in batch.tables.items():
                self._insert(con, table, arrays, params)
            con.execute(
                "INSERT INTO _positions VALUES (?, ?) ON CONFLICT (stream) DO UPDATE SET last_seq = excluded.last_seq",
                [batch.stream, batch.last_seq],
            )
            con.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise
        advanced = batch.last_seq - max(after, batch.first_seq - 1)
        self._positions[batch.stream] = batch.last_seq
        return advanced

    @staticmethod
    def _insert(con: duckdb.DuckDBPyConnection, table: str, arrays: dict[str, np.ndarray], params: dict[str, Any]) -> None:
        stage = f"_stage_{table}"
        sql = _INSERTS[table]
        con.register(stage, arrays)
        try:
            con.execute(sql, {k: v for k, v in params.items() if f"${k}" in sql})
        finally:
            con.unregister(stage)

    def checkpoint(self) -> None:
        self.con.execute("CHECKPOINT")

    def publish_snapshot(self, dest: Path | str) -> Path:
        """Write a consistent read-only copy to ``dest``: copy into a temp file, rename it over ``dest``.

        Readers holding the previous snapshot keep reading it (a rename never changes an open file);
        new readers see the new one. Call it from the thread that writes, between batches.
        """
        dest = Path(dest)
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        for stale in (tmp, tmp.with_name(tmp.name + ".wal")):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        # A logical copy through DuckDB, not a file copy: opening and closing the DB file from this
        # process would drop DuckDB's fcntl lock on it (POSIX releases a process's locks on any close),
        # and a second writer could then open it.
        [(catalog,)] = self.con.execute("SELECT current_database()").fetchall()
        self.con.execute(f"ATTACH '{tmp}' AS _snapshot")
        try:
            self.con.execute(f'COPY FROM DATABASE "{catalog}" TO _snapshot')
        finally:
            self.con.execute("DETACH _snapshot")
        try:
            os.replace(tmp, dest)
        finally:
            for leftover in (tmp, tmp.with_name(tmp.name + ".wal")):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
        return dest
