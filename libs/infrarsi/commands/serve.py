"""``infrarsi serve NAME``: become one service (the container and supervisor entry point).

Replaces this process with ``python -m infrarsi_services.<name>`` so that signals from a container
runtime or systemd reach the service directly. The library never imports a service; the name is
checked against ``infrarsi.runtime.stack.SERVICES``.
"""

from __future__ import annotations

import argparse
import os
import sys

from infrarsi.runtime.stack import SERVICES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=SERVICES, help="the service to run")


def service_argv(args: argparse.Namespace) -> list[str]:
    argv = [sys.executable, "-m", f"infrarsi_services.{args.name}", "--data-dir", str(args.data_dir)]
    if args.nats_url:
        argv += ["--nats-url", args.nats_url]  # else the service resolves $INFRARSI_NATS_URL itself
    return argv


def run(args: argparse.Namespace) -> int:
    argv = service_argv(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
    return 0  # not reached
