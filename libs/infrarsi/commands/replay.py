"""``infrarsi replay [--db FILE] [--from-scratch]``: bring the analyst DuckDB up to the end of the streams.

Incremental by default: reads only what lies past the positions stored in the DB. ``--from-scratch``
rebuilds into a temporary file next to FILE and renames it over FILE only when complete, so a crash or
Ctrl-C never leaves a half-written DB. The default FILE, ``<data-dir>/analyst.duckdb``, is the reporter
service's while it runs (DuckDB allows one writer): then this command says so and exits 2 — analysts
query the reporter's snapshot with ``infrarsi sql``, or replay into a file of their own.
Prints the events/s; a progress bar goes to stderr when it is a terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from infrarsi.commands import UserError

if TYPE_CHECKING:
    from infrarsi.bus.client import Bus


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", type=Path, default=None, help="analyst DuckDB file (default <data-dir>/analyst.duckdb)")
    parser.add_argument(
        "--from-scratch", action="store_true", help="rebuild the whole DB (atomically replaces FILE when done)"
    )
    parser.add_argument("--batch-size", type=int, default=None, help="messages per transaction (default 10000)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


class ProgressBar:
    """``[#####.....]  52%  52,000/100,000  48,211 ev/s`` redrawn on one stderr line, at most 10×/s."""

    def __init__(self, stream: TextIO = sys.stderr, width: int = 30) -> None:
        self.stream = stream
        self.width = width
        self.started = time.perf_counter()
        self._drawn_at = 0.0
        self._drawn = False

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if now - self._drawn_at < 0.1 and done < total:
            return
        self._drawn_at = now
        fraction = done / total if total else 1.0
        filled = int(self.width * fraction)
        rate = done / (now - self.started) if now > self.started else 0.0
        self.stream.write(
            f"\r[{'#' * filled}{'.' * (self.width - filled)}] {fraction:4.0%}  {done:,}/{total:,}  {rate:,.0f} ev/s"
        )
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()


async def connect(args: argparse.Namespace, service: str) -> Bus:
    """A bus for a read-only CLI command (streams are not created or changed)."""
    try:
        from infrarsi.runtime.stack import connect_for_cli
    except ImportError:  # a build without the stack module
        from infrarsi.bus.client import Bus, BusError
        from infrarsi.bus.embedded import resolve_nats_url

        url = resolve_nats_url(args.nats_url, args.data_dir)
        if url is None:
            raise BusError(
                "no NATS server: pass --nats-url, set INFRARSI_NATS_URL, or start one with `infrarsi up`"
            ) from None
        return await Bus.connect(url, service=service, ensure=False, data_dir=args.data_dir)
    return await connect_for_cli(args.nats_url, args.data_dir, service, ensure=False)


def _check_writable(path: Path) -> None:
    """Fail early, with the reason, when another process holds FILE (DuckDB allows one writer)."""
    import duckdb

    if not path.exists():
        return
    try:
        duckdb.connect(str(path)).close()
    except duckdb.Error as exc:
        raise UserError(
            f"cannot write {path}: {exc}\n(the reporter service owns <data-dir>/analyst.duckdb while it runs: "
            "query its snapshot with `infrarsi sql`, or replay into another file with --db)"
        ) from None


async def run(args: argparse.Namespace) -> int:
    from infrarsi import eventlog

    target = Path(args.db) if args.db else eventlog.analyst_db_path(args.data_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    _check_writable(target)
    bus = await connect(args, "cli.replay")
    progress = ProgressBar() if sys.stderr.isatty() and not args.no_progress else None
    batch = {"batch_size": args.batch_size} if args.batch_size else {}
    try:
        if args.from_scratch:
            tmp = target.with_name(f".{target.name}.rebuild-{os.getpid()}")
            try:
                stats = await eventlog.replay(bus, tmp, from_scratch=True, progress=progress, **batch)
                _check_writable(target)
                # A WAL left by the old file's last writer must not be replayed onto the new file.
                with contextlib.suppress(FileNotFoundError):
                    target.with_name(target.name + ".wal").unlink()
                os.replace(tmp, target)
            finally:
                for leftover in (tmp, tmp.with_name(tmp.name + ".wal")):
                    with contextlib.suppress(FileNotFoundError):
                        leftover.unlink()
        else:
            try:
                stats = await eventlog.replay(bus, target, progress=progress, **batch)
            except eventlog.AnalystDBError as exc:
                raise UserError(str(exc)) from None
    finally:
        if progress is not None:
            progress.close()
        await bus.close()
    print(
        f"replayed {stats.events:,} messages in {stats.seconds:.2f}s ({stats.events_per_s:,.0f} events/s) into {target}"
    )
    return 0
