"""The ``infrarsi`` verbs, one module each; ``infrarsi.cli`` wires them from a static table.

A command module exposes two functions:

- ``add_arguments(parser: argparse.ArgumentParser) -> None`` adds the verb's own options (the global
  ``--nats-url``, ``--data-dir`` and ``-v`` are already on the top-level parser and reach ``args``);
- ``run(args: argparse.Namespace) -> int`` — ``async def`` (run with ``asyncio.run``) or plain — returns
  the exit code (``None`` counts as 0).

A module serving several verbs names its pairs in the CLI table instead (``approve_apply`` exposes
``add_approve_arguments``/``run_approve`` and ``add_apply_arguments``/``run_apply``).

Errors: raise ``infrarsi.errors.UserError`` (re-exported here) for anything the user can fix, with the exit
code of its kind (the table in ``infrarsi.errors``); the CLI prints ``error: <message>`` without a traceback.
``BusError``, ``ContractError``, ``StackError`` and ``EmbeddedServerError`` are reported the same way, with
``EXIT_USAGE``. Anything else is a bug and keeps its traceback.

The bus (``infrarsi.commands.study_log``): a verb that only records a fact (``init``, ``approve``, ``apply``)
connects with ``recording_bus`` — to the running server, else a temporary embedded one over ``--data-dir``;
a verb that needs the services (``doctor``, ``run``, ``verify``) or reads what they made (``model``,
``report``, ``status``, ``events``) connects with ``cli_bus`` and fails with ``EXIT_USAGE`` before doing
anything when no server runs; ``trial`` and ``demo`` start their own stack (``infrarsi.runtime.stack.ensure_stack``).
Print results to stdout; logs go to stderr through ``infrarsi.runtime.logs``.

Modules are imported only when their verb runs, so keep heavy imports (torch, duckdb) inside them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from infrarsi.errors import UserError
from infrarsi.runtime.settings import Settings

__all__ = ["UserError", "data_dir_of", "nats_url_of", "settings_of"]


def settings_of(args: argparse.Namespace) -> Settings:
    """The process settings ``cli.main`` put on ``args``; for a ``Namespace`` built without them (a test, the
    demo calling a verb) the environment's."""
    settings = getattr(args, "settings", None)
    return settings if isinstance(settings, Settings) else Settings.from_env()


def data_dir_of(args: argparse.Namespace) -> Path:
    """``--data-dir`` (every verb has it through the global options), else ``INFRARSI_DATA_DIR`` or ``.infrarsi``."""
    return Path(getattr(args, "data_dir", None) or settings_of(args).data_dir)


def nats_url_of(args: argparse.Namespace) -> str | None:
    """``--nats-url``, else ``INFRARSI_NATS_URL`` (``None``: look for a running ``infrarsi up``)."""
    return getattr(args, "nats_url", None) or settings_of(args).nats_url
