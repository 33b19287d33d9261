"""``infrarsi up``: the embedded NATS server and the six services, in the foreground.

Starts the stack under ``--data-dir`` (each service its own process and process group, logs in
``<data-dir>/logs/``), prints the URL and every pid, restarts a service that dies (with back-off), and on
Ctrl-C or SIGTERM stops every service and then the server, leaving no process behind. Other commands
find this stack through ``<data-dir>/nats-server.json``. With ``--nats-url`` the services join that
server instead and no embedded server is started.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time

from infrarsi.runtime.logs import get_logger
from infrarsi.runtime.stack import SERVICES, Stack

log = get_logger(__name__)

SUPERVISE_EVERY_S = 1.0
MAX_BACKOFF_S = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--service",
        dest="services",
        action="append",
        choices=SERVICES,
        help="start only this service (repeatable; default: all six)",
    )
    parser.add_argument(
        "--ready-timeout", type=float, default=60.0, help="seconds to wait for every service to answer a ping"
    )


async def run(args: argparse.Namespace) -> int:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stopping.set)
    services = tuple(args.services or SERVICES)
    # Start-up blocks (processes, health checks): off the loop, so a signal is still noticed.
    # A StackError (a service died at start, or a stack already runs here) is reported by the CLI.
    stack = await asyncio.to_thread(
        Stack.start,
        args.data_dir,
        nats_url=args.nats_url,
        services=services,
        ready_timeout_s=args.ready_timeout,
    )
    try:
        where = "embedded" if stack.server is not None else "external"
        print(f"NATS ({where}) at {stack.url}   data {stack.data_dir}", flush=True)
        for name, proc in stack.processes.items():
            print(f"  {name:<10} pid {proc.pid:<8} log {proc.log_path}", flush=True)
        print(f"infrarsi up: {len(stack.processes)} services ready; Ctrl-C to stop", flush=True)
        clean = await _supervise(stack, stopping)
    finally:
        print("stopping services...", file=sys.stderr, flush=True)
        await asyncio.to_thread(stack.stop)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
    print("stopped", file=sys.stderr, flush=True)
    return 0 if clean else 1


async def _supervise(stack: Stack, stopping: asyncio.Event) -> bool:
    """Until asked to stop: restart a dead service — at once the first time, then backing off
    (2, 4, … 30 s) while it keeps dying. ``False`` when it gave up because the embedded server died."""
    restarts: dict[str, int] = {}
    not_before: dict[str, float] = {}
    while True:
        try:
            await asyncio.wait_for(stopping.wait(), SUPERVISE_EVERY_S)
        except TimeoutError:
            pass
        if stopping.is_set():
            return True
        if stack.server is not None and not stack.alive().get("nats", True):
            print("error: the embedded nats-server died; stopping", file=sys.stderr, flush=True)
            return False
        now = time.monotonic()
        for name, proc in list(stack.processes.items()):
            if proc.alive():
                continue
            if name not in not_before:
                print(
                    f"warning: {name} (pid {proc.pid}) exited with code {proc.process.returncode}; "
                    f"see {proc.log_path}",
                    file=sys.stderr,
                    flush=True,
                )
                count = restarts.get(name, 0)
                not_before[name] = now + (0.0 if count == 0 else min(2.0**count, MAX_BACKOFF_S))
            if now < not_before[name]:
                continue
            del not_before[name]
            restarts[name] = restarts.get(name, 0) + 1
            new = stack.restart(name)
            print(f"  {name:<10} restarted, pid {new.pid}", file=sys.stderr, flush=True)
            log.info("service restarted", service=name, pid=new.pid, restarts=restarts[name])
