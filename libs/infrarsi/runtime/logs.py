"""structlog set-up shared by every process: JSON lines on stderr with study, trial and trace ids.

Bind ``study_id``/``trial_id`` with ``structlog.contextvars.bound_contextvars``; the trace id of the
current OpenTelemetry span is added to every line by a processor.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from infrarsi.runtime.tracing import current_trace_id

_configured = False


def _add_trace_id(_logger: object, _method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    trace_id = current_trace_id()
    if trace_id:
        event_dict.setdefault("trace_id", trace_id)
    return event_dict


class _CurrentStderr:
    """``sys.stderr`` as it is at each write, not as it was when logging was set up: a process that swaps its
    stderr (a CLI verb invoked in-process under a capture, then closed) must not leave loggers writing to a
    closed file."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def setup_logging(service_name: str, level: str | None = None) -> None:
    """Configure structlog once per process at ``level`` (``Settings.log_level``; default info)."""
    global _configured
    if _configured:
        return
    _configured = True
    level_name = (level or "info").upper()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _add_trace_id,
            structlog.processors.dict_tracebacks,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level_name]),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]  # a TextIO duck
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service_name)


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
