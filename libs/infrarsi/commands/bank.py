"""``infrarsi bank list|show ID|query SQL|export FILE|import FILE|federate ...``: the experience bank.

Reads the bank this cluster sees — its own ``IRSI_BANK`` ∪ the other clusters' ``IRSI_BANK_SHARED`` (or the
hub's ``IRSI_BANK_HUB`` when pointed at the hub), one row per entry id — by replaying it into an in-memory
DuckDB table ``bank`` (``infrarsi.bank.store``). ``import`` publishes entries into the local ``IRSI_BANK``;
``federate`` creates the sourcing streams of a hub or of a cluster (docs/bank.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import duckdb
import msgspec

from infrarsi import events as ev
from infrarsi.bank.federation import HUB_DOMAIN, ensure_bank_federation
from infrarsi.bank.store import export_bank, load_events, parse_import_file, replay_bank
from infrarsi.bus.client import Bus
from infrarsi.commands import settings_of
from infrarsi.commands.study_log import cli_bus
from infrarsi.errors import EXIT_FAILED, UserError

SOURCE = "cli.bank"

LIST_SQL = """
SELECT entry_id, cluster_id, accelerator, model_family, round(model_params / 1e9, 1) AS params_b, seq_len,
       micro_batch, n_time_effects AS effects, n_winners AS winners, n_failures AS failures,
       strftime(ts, '%Y-%m-%d %H:%M') AS published
FROM bank ORDER BY entry_id
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bank_command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="one line per entry (local and shared)")
    show = sub.add_parser("show", help="one entry as JSON (an id or a unique id prefix)")
    show.add_argument("entry_id")
    query = sub.add_parser("query", help="run SQL over the table `bank` (DuckDB)")
    query.add_argument("sql")
    query.add_argument("--json", action="store_true", help="one JSON object per row")
    export = sub.add_parser("export", help="write the bank to FILE (.jsonl or .parquet)")
    export.add_argument("file", type=Path)
    imp = sub.add_parser("import", help="publish the entries of FILE (.jsonl or .parquet) into the local bank")
    imp.add_argument("file", type=Path)
    fed = sub.add_parser("federate", help="create the sourcing stream of a hub or of a cluster (docs/bank.md)")
    fed.add_argument("role", choices=("hub", "leaf"))
    fed.add_argument("domains", nargs="*", help="hub: the clusters' JetStream domains to source from")
    fed.add_argument("--hub-domain", default=HUB_DOMAIN, help="leaf: the hub's JetStream domain")
    fed.add_argument("--peers", nargs="+", default=None,
                     help="leaf: the other clusters' ids (bank.<id>.>); default: everything, deduplicated on read")


async def _table(bus: Bus) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    await replay_bank(bus, con)
    return con


def _print_rows(cursor: duckdb.DuckDBPyConnection, as_json: bool = False) -> int:
    names = [d[0] for d in cursor.description or []]
    rows = cursor.fetchall()
    if as_json:
        for row in rows:
            print(json.dumps(dict(zip(names, row, strict=True)), default=str))
        return len(rows)
    cells = [names] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(names))]
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return len(rows)


async def run(args: argparse.Namespace) -> int:
    try:
        return await _run(args)
    except (ValueError, OSError, duckdb.Error) as exc:  # a bad import file, a missing file, bad SQL
        raise UserError(str(exc)) from None


async def _run(args: argparse.Namespace) -> int:
    match args.bank_command:
        case "list":
            async with cli_bus(args, SOURCE, ensure=False) as bus:
                n = _print_rows((await _table(bus)).execute(LIST_SQL))
            print(f"{n} entries", file=sys.stderr)
            return 0
        case "show":
            async with cli_bus(args, SOURCE, ensure=False) as bus:
                events = load_events(await _table(bus))
            found = [e for e in events
                     if isinstance(e.payload, ev.BankEntry) and e.payload.entry_id.startswith(args.entry_id)]
            if len(found) != 1:
                raise UserError(f"{len(found)} entries match {args.entry_id!r}", EXIT_FAILED)
            print(json.dumps(msgspec.to_builtins(found[0]), indent=2))
            return 0
        case "query":
            async with cli_bus(args, SOURCE, ensure=False) as bus:
                con = await _table(bus)
            _print_rows(con.execute(args.sql), as_json=args.json)
            return 0
        case "export":
            async with cli_bus(args, SOURCE, ensure=False) as bus:
                n = export_bank(await _table(bus), args.file)
            print(f"exported {n} entries to {args.file}", file=sys.stderr)
            return 0
        case "import":
            events = parse_import_file(args.file, cluster_id=settings_of(args).cluster)
            async with cli_bus(args, SOURCE, ensure=True) as bus:
                acks = [await bus.publish(e) for e in events]
            dup = sum(1 for a in acks if a.duplicate)
            print(f"imported {len(acks) - dup} entries ({dup} already present) from {args.file}", file=sys.stderr)
            return 0
        case "federate":
            async with cli_bus(args, SOURCE, ensure=args.role == "leaf") as bus:
                info = await ensure_bank_federation(bus, args.role, *args.domains, hub_domain=args.hub_domain,
                                                    peer_clusters=args.peers)
            sources: list[Any] = info.config.sources or []
            print(f"{info.config.name}: sources " + ", ".join(
                f"{s.name}@{s.external.api if s.external else 'local'}"
                + (f" [{s.filter_subject}]" if s.filter_subject else "")
                + (f" [{', '.join(t.src for t in s.subject_transforms)}]" if s.subject_transforms else "")
                for s in sources))
            return 0
        case other:
            raise AssertionError(f"argparse let through the unknown bank command {other!r}")
