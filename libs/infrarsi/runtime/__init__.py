"""How an InfraRSI process runs: the service base, the local stack, settings, logs, traces and metrics.

- ``service``: the one small base every service is built on (consume, decide, publish, dead letters).
- ``stack``: the local stack, one NATS server and the six services in their own processes.
- ``settings``: every ``INFRARSI_*`` environment variable, read and validated in one place.
- ``logs``, ``tracing``, ``metrics``: structlog JSON lines, OpenTelemetry spans, Prometheus metrics.
"""
