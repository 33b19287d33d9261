"""``infrarsi report STUDY --out DIR``: render the study's audit report and publish ``ReportPublished``.

1. Bring the analyst DB up to date: ``infrarsi.eventlog.replay(bus, db_path)`` (idempotent by stream
   sequence) into ``--db`` (default ``<out>/analyst.duckdb``: the reporter service holds ``<data-dir>/analyst.duckdb``); ``--fresh`` replays into a new file under
   ``DIR`` instead. ``--offline`` skips the bus altogether and reads the DB as it is.
2. ``report.build_report`` (SQL over the DB) → ``report.render_all`` (HTML, Markdown + PNGs, PDF).
3. Publish ``ReportPublished(out_dir, files, winners)`` and print the file paths.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import duckdb

from infrarsi import events as ev
from infrarsi.commands import settings_of
from infrarsi.commands.study_log import cli_bus
from infrarsi.errors import UserError
from infrarsi.eventlog import replay
from infrarsi.report import build_report, render_all
from infrarsi.report.source import ReportSourceError

SOURCE = "cli.report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="study id")
    parser.add_argument("--out", type=Path, required=True, help="directory for report.html, report.md (+ PNGs), report.pdf")
    parser.add_argument("--db", type=Path, default=None,
                        help="DuckDB to replay into and read (default <out>/analyst.duckdb; the reporter service "
                             "holds <data-dir>/analyst.duckdb, so the report keeps its own replay of the log)")
    parser.add_argument("--fresh", action="store_true", help="replay into a new DB under --out instead of --db")
    parser.add_argument("--offline", action="store_true", help="read the DB as it is; no bus, nothing published")
    parser.add_argument("--format", action="append", choices=["html", "md", "pdf"], help="formats (default all)")


async def run(args: argparse.Namespace) -> int:
    out_dir: Path = args.out
    db_path = out_dir / "analyst.duckdb" if args.fresh else (args.db or out_dir / "analyst.duckdb")
    formats = tuple(args.format or ("html", "md", "pdf"))
    if args.offline:
        _prepare(out_dir, db_path, args.fresh)
        _render(args.study, db_path, out_dir, formats)
        return 0
    async with cli_bus(args, SOURCE) as bus:  # connected before anything is written: no server, no --out dir
        _prepare(out_dir, db_path, args.fresh)
        await replay(bus, db_path)
        files, winners = _render(args.study, db_path, out_dir, formats)
        await bus.publish(ev.make_event(
            ev.ReportPublished(out_dir=str(out_dir.resolve()), files=[str(f.resolve()) for f in files], winners=winners),
            study_id=args.study, source=SOURCE, cluster_id=settings_of(args).cluster,
        ))
    return 0


def _prepare(out_dir: Path, db_path: Path, fresh: bool) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    db_path.parent.mkdir(parents=True, exist_ok=True)
    if fresh and db_path.exists():
        db_path.unlink()


def _render(study_id: str, db_path: Path, out_dir: Path, formats: tuple[str, ...]) -> tuple[list[Path], list[str]]:
    try:
        con = duckdb.connect(str(db_path))
    except duckdb.Error as exc:
        raise UserError(f"cannot open analyst DB {db_path}: {exc}") from None
    try:
        report = build_report(con, study_id)
    except (ReportSourceError, LookupError) as exc:
        raise UserError(str(exc)) from None
    finally:
        con.close()
    files = render_all(report, out_dir, formats)
    for f in files:
        print(f)
    winners = [v.candidate_key for v in report.winners]
    print(f"{len(report.winners)} winner(s); {report.accelerator_hours:.4g} accelerator-hours", file=sys.stderr)
    return files, winners
