"""The probe a training job imports to report its steps (see ``core`` for the calling order).

Tiny on purpose: torch, msgspec (through ``infrarsi.events``) and, only when publishing, nats-py.
"""

from infrarsi.probe.core import (
    EvalContext,
    Probe,
    StepContext,
    count_tokens_default,
    peak_memory_bytes,
    read_records,
)

__all__ = ["EvalContext", "Probe", "StepContext", "count_tokens_default", "peak_memory_bytes", "read_records"]
