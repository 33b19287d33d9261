"""The problems a user can fix, and the CLI's exit codes: one code per kind of failure.

Owns ``UserError`` (a message, optional detail lines, and an exit code) and the exit-code table below. Commands
raise ``UserError``; ``infrarsi.cli`` prints ``error: <message>`` (then the detail lines) on stderr, without a
traceback, and exits with the code. Anything else that escapes a command is a bug and keeps its traceback.
This module imports nothing of InfraRSI's, so any layer may raise from it.

=====  ==================  ==================================================================================
code   name                meaning
=====  ==================  ==================================================================================
0      ``EXIT_OK``         done
1      ``EXIT_FAILED``     the command ran and the outcome is negative: too few baseline runs succeeded, no
                           candidate to verify, nothing to model yet, no bank entry matches, services down
2      ``EXIT_USAGE``      it cannot run as asked: bad arguments or contract, unknown study or candidate, no
                           NATS server reachable, a file it must write is held
3      ``EXIT_REFUSED``    a verdict said no: the policy refused an apply (or its branch exists), a trial did
                           not pass its checks
4      ``EXIT_TIMEOUT``    the runs it waited for did not finish within ``--timeout``
130    ``EXIT_INTERRUPTED`` Ctrl-C
=====  ==================  ==================================================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """A problem the user can fix; the CLI prints the message (and ``details``) and exits with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE, *, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.details = tuple(details)
        """Further lines printed as they are, after ``error: <message>`` (reasons, per-run failures)."""

    def lines(self) -> list[str]:
        return [f"error: {self}", *self.details]


class Refused(Exception):
    """A request turned down, with each reason (one line each): the base of the refusals the CLI turns into a
    ``UserError`` with the reasons as its detail lines."""

    def __init__(self, reasons: Iterable[str]) -> None:
        self.reasons = list(reasons)
        super().__init__("; ".join(self.reasons))
