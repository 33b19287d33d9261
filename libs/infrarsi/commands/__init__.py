"""The ``infrarsi`` verbs, one module each; ``infrarsi.cli`` wires them from a static table.

A command module exposes two functions:

- ``add_arguments(parser: argparse.ArgumentParser) -> None`` adds the verb's own options (the global
  ``--nats-url``, ``--data-dir`` and ``-v`` are already on the top-level parser and reach ``args``);
- ``run(args: argparse.Namespace) -> int`` — ``async def`` (run with ``asyncio.run``) or plain — returns
  the exit code (``None`` counts as 0).

A module serving several verbs names its pairs in the CLI table instead (``approve_apply`` exposes
``add_approve_arguments``/``run_approve`` and ``add_apply_arguments``/``run_apply``).

Errors: raise ``UserError`` for anything the user can fix (bad input, missing file, nothing to do); the CLI
prints ``error: <message>`` and exits 2, without a traceback. ``BusError`` (from ``connect_for_cli`` and
the bus) is reported the same way. Anything else is a bug and keeps its traceback. A command talks to
the bus through ``infrarsi.stack.connect_for_cli(args.nats_url, args.data_dir)`` and starts an embedded
stack, when it needs one and none runs, with ``infrarsi.stack.ensure_stack``. Print results to stdout;
logs go to stderr through ``infrarsi.logs``.

Modules are imported only when their verb runs, so keep heavy imports (torch, duckdb) inside them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


class UserError(Exception):
    """A problem the user can fix; the CLI prints the message and exits with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def data_dir_of(args: argparse.Namespace) -> Path:
    """``--data-dir`` (every verb has it through the global options), for a ``Namespace`` built without it
    (a test, another command) ``$INFRARSI_DATA_DIR`` or ``.infrarsi``."""
    return Path(getattr(args, "data_dir", None) or os.environ.get("INFRARSI_DATA_DIR", ".infrarsi"))
