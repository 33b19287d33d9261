"""The ``infrarsi`` command: global options, the verb table, and error reporting.

Owns parsing (``--nats-url``, ``--data-dir``, ``-v`` and one sub-parser per verb), importing a verb's
module only when that verb runs (``--help`` stays fast; a verb whose module is not in this build says so),
setting up logging and tracing for the CLI process, and turning user errors into ``error:`` lines and the
exit code of their kind (``infrarsi.errors``). What each verb does lives in ``infrarsi.commands.<module>`` (see that package's
docstring for the convention). It must not import services.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from infrarsi.errors import EXIT_INTERRUPTED, EXIT_USAGE
from infrarsi.runtime.settings import Settings, SettingsError


@dataclass(frozen=True)
class Verb:
    """One ``infrarsi`` verb: the module that implements it, and the names of its two entry points."""

    name: str
    module: str
    help: str
    add_arguments: str = "add_arguments"
    run: str = "run"

    @property
    def module_path(self) -> str:
        return f"infrarsi.commands.{self.module}"


VERBS: tuple[Verb, ...] = (
    Verb("up", "up", "start NATS and the six services here, in the foreground (Ctrl-C stops all)"),
    Verb("status", "status", "services alive, stream counts and consumer lag"),
    Verb("serve", "serve", "run one service in this process (containers, supervisors)"),
    Verb("events", "events_tail", "read the event log (`events tail`)"),
    Verb("replay", "replay", "rebuild the analyst DuckDB from the streams"),
    Verb("sql", "sql", "query the analyst DuckDB"),
    Verb("dashboard", "dashboard", "a live, read-only web page of the studies (loopback by default)"),
    Verb("scaffold", "scaffold", "draft a contract from a launch command (`scaffold -- torchrun … train.py …`)"),
    Verb("init", "init", "lock a contract and create a study"),
    Verb("doctor", "doctor", "profile the untouched baseline: noise, phases, stragglers"),
    Verb("trial", "trial", "run one candidate as a trial"),
    Verb("run", "run", "search: propose, launch, measure, model, repeat"),
    Verb("verify", "verify", "re-run the best candidates against the baseline"),
    Verb("model", "model", "show a study's time and memory models"),
    Verb("report", "report", "write the audit report of a study"),
    Verb(
        "approve",
        "approve_apply",
        "record a human approval of a verified candidate",
        add_arguments="add_approve_arguments",
        run="run_approve",
    ),
    Verb(
        "apply",
        "approve_apply",
        "write an approved candidate to a review branch",
        add_arguments="add_apply_arguments",
        run="run_apply",
    ),
    Verb("studies", "studies", "list studies: stage, trials, best verified speed-up, cost"),
    Verb("cancel", "studies", "cancel a study: stop its running trials, record why",
         add_arguments="add_cancel_arguments", run="run_cancel"),
    Verb("resume", "studies", "resume a cancelled (or stalled) study",
         add_arguments="add_resume_arguments", run="run_resume"),
    Verb("follow", "promotions", "follow a study's promoted branches to the main line: open, merged, reverted",
         add_arguments="add_follow_arguments", run="run_follow"),
    Verb("smoke", "promotions", "run the merged commit of a promotion shortly against the verified numbers",
         add_arguments="add_smoke_arguments", run="run_smoke"),
    Verb("demo", "demo", "the five stages end to end on the reference workload"),
    Verb("bank", "bank", "the experience bank: list, show, export, import"),
    Verb("creds", "creds", "make the bus credentials (nkeys) and the server's authorization block"),
)
VERBS_BY_NAME = {verb.name: verb for verb in VERBS}


class VerbUnavailable(Exception):
    """The verb's module is not part of this build."""


def load_verb(verb: Verb) -> ModuleType:
    """Import the verb's module; a missing module (and only that one) means the verb is unavailable."""
    try:
        return importlib.import_module(verb.module_path)
    except ModuleNotFoundError as exc:
        if exc.name == verb.module_path:
            raise VerbUnavailable(verb.name) from None
        raise


def _add_global_options(parser: argparse.ArgumentParser, settings: Settings, *, suppress: bool) -> None:
    """The options every verb shares; on a verb's parser they default to SUPPRESS so that
    ``infrarsi --nats-url X status`` and ``infrarsi status --nats-url X`` both work."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--nats-url",
        default=default(None),
        metavar="URL",
        help="NATS server (default: $INFRARSI_NATS_URL, else the one `infrarsi up` runs under --data-dir)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=default(settings.data_dir),
        metavar="DIR",
        help="state directory: embedded server, logs, databases (default: $INFRARSI_DATA_DIR or .infrarsi)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=default(0),
        help="log progress (-v) or everything (-vv) to stderr",
    )


def build_parser(
    load: str | None = None, settings: Settings | None = None
) -> tuple[argparse.ArgumentParser, ModuleType | None]:
    """The full parser; the verb named ``load`` gets its own arguments (its module is imported).
    ``settings`` give the global options' defaults (``INFRARSI_DATA_DIR``)."""
    settings = settings or Settings()
    parser = argparse.ArgumentParser(
        prog="infrarsi",
        description="Verified optimisation of PyTorch training jobs, event-sourced on NATS JetStream.",
    )
    _add_global_options(parser, settings, suppress=False)
    verbs = parser.add_subparsers(dest="verb", metavar="COMMAND", title="commands")
    loaded = None
    for verb in VERBS:
        sub = verbs.add_parser(verb.name, help=verb.help, description=verb.help, conflict_handler="resolve")
        _add_global_options(sub, settings, suppress=True)
        if verb.name == load:
            loaded = load_verb(verb)
            getattr(loaded, verb.add_arguments)(sub)
    return parser, loaded


def _verb_in(argv: Sequence[str]) -> str | None:
    """The verb named on the command line, found without importing any command module."""
    pre = argparse.ArgumentParser(add_help=False)
    _add_global_options(pre, Settings(), suppress=True)
    pre.add_argument("verb", nargs="?")
    known, _rest = pre.parse_known_args(argv)
    verb = getattr(known, "verb", None)
    return verb if verb in VERBS_BY_NAME else None


def _setup_observability(verbosity: int, settings: Settings) -> None:
    from infrarsi.runtime import tracing
    from infrarsi.runtime.logs import setup_logging

    if verbosity >= 2:
        level = "debug"
    elif verbosity == 1:
        level = "info"
    else:
        level = settings.log_level or "warning"
    setup_logging("cli", level=level)
    tracing.setup_tracing("infrarsi-cli", trace_file=settings.trace_file)


def _user_error_lines(exc: BaseException, args: argparse.Namespace) -> list[str] | None:
    """The stderr lines for an error the user can fix, or ``None`` for a bug (keep the traceback)."""
    from infrarsi.errors import UserError

    if isinstance(exc, UserError):
        return exc.lines()
    contract = sys.modules.get("infrarsi.study.contract")
    if contract is not None and isinstance(exc, contract.ContractError):
        return [f"error: {line}" for line in exc.lines()]
    message = _user_error_message(exc, args)
    return None if message is None else [f"error: {message}"]


def _user_error_message(exc: BaseException, args: argparse.Namespace) -> str | None:
    """The one-line message of a library error the user can fix, or ``None``.

    Error classes are looked up only in modules already imported, so that this check imports nothing.
    """
    bus = sys.modules.get("infrarsi.bus.client")
    if bus is not None and isinstance(exc, bus.BusError):
        return str(exc)
    nats_errors = sys.modules.get("nats.errors")
    if nats_errors is not None and isinstance(exc, nats_errors.Error):
        from infrarsi.bus.embedded import resolve_nats_url
        from infrarsi.commands import data_dir_of, nats_url_of

        url = resolve_nats_url(nats_url_of(args), data_dir_of(args)) or "(no server)"
        if isinstance(exc, nats_errors.NoServersError | nats_errors.ConnectionClosedError):
            return f"cannot reach NATS at {url}: {exc}"
        return f"NATS at {url}: {exc or type(exc).__name__}"
    for module_name, class_name in (
        ("infrarsi.runtime.stack", "StackError"),
        ("infrarsi.bus.embedded", "EmbeddedServerError"),
    ):
        module = sys.modules.get(module_name)
        if module is not None and isinstance(exc, getattr(module, class_name, ())):
            return str(exc)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``infrarsi`` (the generated script exits with the returned code)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print("\n".join(exc.lines()), file=sys.stderr)
        return exc.exit_code
    verb_name = _verb_in(argv)
    try:
        parser, module = build_parser(load=verb_name, settings=settings)
    except VerbUnavailable:
        print(f"error: '{verb_name}' is not available in this build", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    if args.verb is None or module is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args.data_dir = Path(args.data_dir)
    args.nats_url = args.nats_url or settings.nats_url
    args.settings = settings
    _setup_observability(args.verbose, settings)
    verb = VERBS_BY_NAME[args.verb]
    run = getattr(module, verb.run)

    from infrarsi.runtime import tracing

    _interrupt_on_termination()
    try:
        with tracing.span_from(None, f"infrarsi {verb.name}"):
            if inspect.iscoroutinefunction(run):
                return asyncio.run(invoke(run, args))
            return _reported(lambda: run(args), args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        tracing.shutdown_tracing()


def _interrupt_on_termination() -> None:
    """SIGTERM and SIGHUP (a closed terminal) stop a verb as Ctrl-C does.

    Python's default for both is to die on the spot, skipping every ``finally``: ``infrarsi trial`` then left
    its embedded nats-server running. As ``KeyboardInterrupt`` they unwind the verb like Ctrl-C, so each
    stack-starting verb's ``finally`` stops what it started (``up`` also handles them on its event loop).
    """
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)


async def invoke(run: Callable[[argparse.Namespace], Awaitable[int | None]], args: argparse.Namespace) -> int:
    """Run an async verb as ``main`` does: its exit code, or a user error reported on stderr as its code.

    Tests and ``demo`` call verbs through this, so they see the same messages and codes as a user."""
    try:
        code = await run(args)
    except Exception as exc:
        return _report(exc, args)
    return 0 if code is None else int(code)


def _reported(call: Callable[[], int | None], args: argparse.Namespace) -> int:
    try:
        code = call()
    except Exception as exc:
        return _report(exc, args)
    return 0 if code is None else int(code)


def _report(exc: Exception, args: argparse.Namespace) -> int:
    lines = _user_error_lines(exc, args)
    if lines is None:
        raise exc
    for line in lines:
        print(line, file=sys.stderr)
    return int(getattr(exc, "exit_code", EXIT_USAGE))


if __name__ == "__main__":
    sys.exit(main())
