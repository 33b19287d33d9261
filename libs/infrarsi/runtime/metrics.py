"""Prometheus metrics of one service process, with the official client (``prometheus_client``).

Owns ``ServiceMetrics``: the process's own ``CollectorRegistry`` (no module-level registry: a test may run
several services in one process) holding

- the runner's counts, read at scrape time from what the runner keeps anyway (``infrarsi.runtime.service.Runner``):
  events handled, dead letters, handler failures, events given up, events in flight, bus reconnects, and each
  durable consumer's lag (messages not yet delivered, and delivered but not acked) as the heartbeat last read it;
- what the service itself reports (``Service.metric_families``): the launcher's trials by outcome and their
  accelerator-seconds;
- two histograms the services observe: ``infrarsi_decision_seconds`` (a reactive service's fold deciding what
  to publish for one event: the proposer's proposals, the verifier's plans, the modeler's refit) and
  ``infrarsi_refit_seconds`` (the modeler's fit, ``ModelUpdated.fit_seconds``);

and ``serve_metrics``: the client's HTTP server on ``Settings.metrics_port`` (loopback unless
``Settings.metrics_addr`` says otherwise), with a Prometheus file-service-discovery target written under
``<data_dir>/metrics/<service>.json`` so a scrape config can find a stack whose ports were picked free
(``deploy/prometheus/``). Every metric carries a ``service`` label. Must not: count anything a second time
(the collectors read the runner's and the service's own counters), or block the event loop (the client serves
from its own thread).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

DECISION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds: the search's decision latency is tens of milliseconds at hundreds of trials (bench/modeler_refit.py)."""


@dataclass
class RunnerCounts:
    """What a collector reads of a runner at scrape time (callables: the values live in the runner)."""

    handled: Callable[[], int]
    dead_lettered: Callable[[], int]
    failed: Callable[[], int]
    given_up: Callable[[], int]
    in_flight: Callable[[], int]
    reconnects: Callable[[], int]
    consumer_lag: Callable[[], dict[str, tuple[int, int]]]
    """Durable name → (pending, ack pending), as the last heartbeat read them from JetStream."""


@dataclass
class ServiceMetrics:
    """One service process's metrics (see the module docstring)."""

    service: str
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))
    decision_seconds: Histogram = field(init=False)
    refit_seconds: Histogram = field(init=False)
    _collector: Collector | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.decision_seconds = Histogram(
            "infrarsi_decision_seconds", "Time a reactive service's fold took to decide its outputs for one event",
            ["service", "event_type"], registry=self.registry, buckets=DECISION_BUCKETS)
        self.refit_seconds = Histogram(
            "infrarsi_refit_seconds", "Time the modeler took to refit a study's time and memory models",
            ["service"], registry=self.registry, buckets=DECISION_BUCKETS)

    def follow(self, counts: RunnerCounts, own: Callable[[], Iterable[Metric]]) -> None:
        """Read ``counts`` (the runner's) and ``own`` (the service's ``metric_families``) at every scrape; a second
        runner of the same service object replaces the first's."""
        if self._collector is not None:
            self.registry.unregister(self._collector)
        self._collector = _RunnerCollector(self.service, counts, own)
        self.registry.register(self._collector)


class _RunnerCollector(Collector):
    def __init__(self, service: str, counts: RunnerCounts, own: Callable[[], Iterable[Metric]]) -> None:
        self.service = service
        self.counts = counts
        self.own = own

    def collect(self) -> Iterator[Metric]:
        s = [self.service]
        for name, doc, read in (
            ("infrarsi_events_handled", "Events handled and acked", self.counts.handled),
            ("infrarsi_dead_letters", "Messages that did not decode, parked on irsi.deadletter.<service>",
             self.counts.dead_lettered),
            ("infrarsi_handler_failures", "Handler runs that raised (each retried with backoff)", self.counts.failed),
            ("infrarsi_events_given_up", "Valid events given up after the last retry", self.counts.given_up),
            ("infrarsi_bus_reconnects", "Reconnections to the NATS server", self.counts.reconnects),
        ):
            counter = CounterMetricFamily(name, doc, labels=["service"])
            counter.add_metric(s, float(read()))
            yield counter
        in_flight = GaugeMetricFamily("infrarsi_events_in_flight", "Events being handled now", labels=["service"])
        in_flight.add_metric(s, float(self.counts.in_flight()))
        yield in_flight
        pending = GaugeMetricFamily("infrarsi_consumer_pending_messages",
                                    "Consumer lag: messages of the consumer's subjects not yet delivered to it",
                                    labels=["service", "consumer"])
        ack_pending = GaugeMetricFamily("infrarsi_consumer_ack_pending_messages",
                                        "Messages delivered to the consumer and not yet acked",
                                        labels=["service", "consumer"])
        for durable, (waiting, unacked) in sorted(self.counts.consumer_lag().items()):
            pending.add_metric([self.service, durable], float(waiting))
            ack_pending.add_metric([self.service, durable], float(unacked))
        yield pending
        yield ack_pending
        yield from self.own()


def counter_by(name: str, doc: str, service: str, label: str, values: dict[str, float]) -> CounterMetricFamily:
    """A counter family with one sample per ``values`` key (e.g. trials by outcome), for ``metric_families``."""
    family = CounterMetricFamily(name, doc, labels=["service", label])
    for key, value in sorted(values.items()):
        family.add_metric([service, key], value)
    return family


def serve_metrics(metrics: ServiceMetrics, *, port: int, addr: str, data_dir: Path | None,
                  cluster: str) -> tuple[WSGIServer, int]:
    """Serve ``/metrics`` on ``addr:port`` (0: a free port) from the client's thread; write the
    file-service-discovery target ``<data_dir>/metrics/<service>.json``. Returns the server and its port."""
    server, _thread = start_http_server(port, addr=addr, registry=metrics.registry)
    bound = int(server.server_port)
    if data_dir is not None:
        host = socket.gethostname() if addr in ("0.0.0.0", "::") else addr
        target = [{"targets": [f"{host}:{bound}"], "labels": {"service": metrics.service, "cluster": cluster}}]
        directory = Path(data_dir) / "metrics"
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{metrics.service}.json.{os.getpid()}"
        tmp.write_text(json.dumps(target))
        tmp.replace(directory / f"{metrics.service}.json")  # Prometheus never reads half a file
    return server, bound


def discovered_targets(data_dir: Path) -> dict[str, str]:
    """Service → ``host:port`` of the targets ``serve_metrics`` wrote under ``data_dir``."""
    out = {}
    for path in sorted((Path(data_dir) / "metrics").glob("*.json")):
        for group in json.loads(path.read_text()):
            out[group["labels"]["service"]] = group["targets"][0]
    return out
