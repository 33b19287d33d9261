"""``infrarsi sql "SELECT …" [--db FILE] [--format table|csv|json]``: query the analyst DuckDB, read-only.

Without ``--db`` it reads the newest snapshot the reporter service publishes
(``<data-dir>/analyst.snapshot.duckdb``): DuckDB allows one writing process per file, and the reporter is
it, so analysts never open the live file; a snapshot is replaced by rename, so a query that is running
keeps reading the copy it opened. With ``--db`` it opens that file read-only (e.g. one built with
``infrarsi replay --db FILE``). A file that cannot be opened, and SQL DuckDB rejects, give one
``error:`` line (DuckDB's message) and exit code 2. See docs/analytics.md.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import sys
from pathlib import Path
from typing import Any, TextIO

from infrarsi.commands import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sql", help="one SQL statement (DuckDB dialect)")
    parser.add_argument("--db", type=Path, default=None, help="DuckDB file (default: the reporter's newest snapshot)")
    parser.add_argument("--format", choices=("table", "csv", "json"), default="table", help="output format")


def query(path: Path, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Open ``path`` read-only and run ``sql``; ``UserError`` (exit 2) for an unopenable file or bad SQL."""
    import duckdb

    from infrarsi.eventlog import AnalystDB, AnalystDBError

    try:
        db = AnalystDB.open(path, read_only=True)
    except AnalystDBError as exc:
        raise UserError(str(exc)) from None
    try:
        return db.query(sql)
    except duckdb.Error as exc:
        raise UserError(str(exc)) from None
    finally:
        db.close()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def format_table(columns: list[str], rows: list[tuple[Any, ...]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row[i], int | float) or row[i] is None for row in rows) for i in range(len(columns))]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()

    out = [line(columns), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def write_csv(columns: list[str], rows: list[tuple[Any, ...]], stream: TextIO) -> None:
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([_cell(v) for v in row] for row in rows)


def format_json(columns: list[str], rows: list[tuple[Any, ...]]) -> str:
    import msgspec

    return msgspec.json.encode([dict(zip(columns, row, strict=True)) for row in rows], enc_hook=str).decode()


async def run(args: argparse.Namespace) -> int:
    from infrarsi.eventlog import snapshot_path

    path = Path(args.db) if args.db else snapshot_path(args.data_dir)
    if args.db is None and not path.exists():
        raise UserError(
            f"no analyst snapshot at {path}: start the stack (`infrarsi up`, whose reporter publishes it), "
            "or build a DB with `infrarsi replay --db FILE` and query it with --db FILE"
        )
    columns, rows = await asyncio.to_thread(query, path, args.sql)
    match args.format:
        case "csv":
            write_csv(columns, rows, sys.stdout)
        case "json":
            print(format_json(columns, rows))
        case _:
            print(format_table(columns, rows))
    return 0
