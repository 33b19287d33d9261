"""``infrarsi dashboard [--host H] [--port P] [--db FILE] [--tls-cert C --tls-key K]``: a live, read-only web page.

Without ``--db`` it replays the running stack's streams into a private DuckDB (a temporary file, removed on
exit) and follows the bus, so a page open on a running study shows its new trials within a catch-up (about a
second). With ``--db FILE`` it serves that analyst DB as it is (e.g. a report's ``analyst.duckdb``), with no bus.

Listens on loopback unless told otherwise; beyond loopback it needs TLS (``--tls-cert``/``--tls-key``) and every
request must present the token in ``<data-dir>/creds/dashboard.token`` (made 0600 on first use;
``--token-file`` to use another): docs/dashboard.md. Prints ``dashboard: URL`` once it listens; Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from infrarsi.commands import UserError, data_dir_of

DEFAULT_PORT = 8765
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this host only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free port)")
    parser.add_argument("--db", type=Path, default=None,
                        help="serve this analyst DuckDB file as it is, read-only, without the bus")
    parser.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate (required beyond loopback)")
    parser.add_argument("--tls-key", type=Path, default=None, help="PEM private key of --tls-cert")
    parser.add_argument("--token-file", type=Path, default=None,
                        help="file holding the readers' token (default <data-dir>/creds/dashboard.token, made on first use)")
    parser.add_argument("--poll", type=float, default=2.0, help="seconds between catch-ups when no event rang (default 2)")


def _validate(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: not a TCP port (0-65535)")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UserError("--tls-cert and --tls-key go together")
    for option, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key), ("--db", args.db),
                         ("--token-file", args.token_file)):
        if path is not None and not Path(path).is_file():
            raise UserError(f"{option} {path}: no such file")
    if args.poll <= 0:
        raise UserError(f"--poll {args.poll}: must be positive")


def _token(args: argparse.Namespace) -> str | None:
    from infrarsi.bus import credentials
    from infrarsi.dashboard.access import TOKEN_FILE, is_loopback

    if is_loopback(args.host):
        return None
    if args.token_file is not None:
        token = Path(args.token_file).read_text().strip()
        if not token:
            raise UserError(f"--token-file {args.token_file}: empty")
        return token
    return credentials.ensure_token(data_dir_of(args), TOKEN_FILE)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        why = "already in use (pick another with --port, 0 for any)" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise UserError(f"cannot listen on {host}:{port}: {why}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from infrarsi.dashboard.app import create_app
    except ImportError as exc:
        raise UserError(
            f"infrarsi dashboard needs the dashboard extra ({(exc.name or str(exc)).split('.')[0]} is missing): "
            "pip install 'infrarsi[dashboard]'"
        ) from None

    class Server(uvicorn.Server):
        """uvicorn's server, stopped as ``infrarsi up`` is: SIGINT, SIGTERM or SIGHUP end it cleanly, exit 0
        (uvicorn's own handlers raise the signal again once it has stopped, which the CLI would report as an
        interruption), and the app is told at once, so that open event streams end instead of holding the
        shutdown for uvicorn's whole graceful timeout."""

        def __init__(self, config: uvicorn.Config, stopping: asyncio.Event) -> None:
            super().__init__(config)
            self.stopping = stopping

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            loop = asyncio.get_running_loop()
            previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self.handle_exit, sig, None)
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    loop.remove_signal_handler(sig)
                    signal.signal(sig, handler)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            self.stopping.set()
            super().handle_exit(sig, frame)

    from infrarsi import eventlog
    from infrarsi.dashboard.access import Access, AccessError, check_listen
    from infrarsi.dashboard.feed import LiveFeed
    from infrarsi.runtime.stack import connect_for_cli

    _validate(args)
    token = _token(args)
    tls = args.tls_cert is not None
    try:
        check_listen(args.host, tls, token)
    except AccessError as exc:
        raise UserError(str(exc)) from None

    scratch: Path | None = None
    bus = None
    feed_task: asyncio.Task[None] | None = None
    if args.db is not None:
        try:
            db = eventlog.AnalystDB.open(args.db, read_only=True)
        except eventlog.AnalystDBError as exc:
            raise UserError(str(exc)) from None
        feed = None
    else:
        bus = await connect_for_cli(args.nats_url, data_dir_of(args), "cli.dashboard", ensure=False)
        scratch = Path(tempfile.mkdtemp(prefix="infrarsi-dashboard-"))
        db = eventlog.AnalystDB.open(scratch / "dashboard.duckdb")
        feed = LiveFeed(bus, db, poll_s=args.poll)
    try:
        sock = _listen(args.host, args.port)
        port = sock.getsockname()[1]
        stopping = asyncio.Event()
        app = create_app(db, feed, Access(token), stopping=stopping)
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2,
            ssl_certfile=str(args.tls_cert) if tls else None, ssl_keyfile=str(args.tls_key) if tls else None,
        )
        server = Server(config, stopping)
        if feed is not None:
            feed_task = asyncio.create_task(feed.run(), name="dashboard-feed")
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(f"dashboard: {'https' if tls else 'http'}://{host}:{port}/"
              + ("" if token is None else "  (token required: docs/dashboard.md)"), flush=True)
        await server.serve(sockets=[sock])
    finally:
        if feed_task is not None:
            feed_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feed_task
        db.close()
        if bus is not None:
            await bus.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0
