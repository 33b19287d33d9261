"""The service runner: the one small base every InfraRSI service is built on.

A service is a subclass of ``Service`` that names the event types it consumes and implements
``handle`` with one ``match`` over the payload. The runner owns everything else:

1. connect to the bus, ensure streams, and let the service rebuild its read model (``start``);
2. one durable pull consumer per stream the service reads, fetched in batches;
3. for each message: decode (undecodable → dead letter, ack, go on); open a span that is a child of
   the ``traceparent`` in the message headers; bind study/trial ids into the logs; call ``handle``;
   publish what it emits (ids derived from the input event, so a redelivery publishes nothing new);
   **ack only after** the outputs are acknowledged by JetStream;
4. a handler that raises is retried (nak with a doubling delay); after ``MAX_DELIVER`` tries the service's
   ``give_up`` reports the failure on the bus and the event is acked (a valid event is never dead-lettered);
5. no error ends a consume loop: it backs off and binds its consumer again, and re-binds one that has
   pending messages but fetches none; dead letters keep a bounded copy and a digest, so any message can be
   parked;
6. heartbeats on ``irsi-svc.heartbeat.<name>``, and a reply on ``irsi-svc.ping`` for ``infrarsi status``,
   naming any consume loop that stopped pulling (``stalled``);
7. SIGTERM/SIGINT set an ``asyncio.Event``: stop fetching, let in-flight handlers finish within the grace
   period (then cancel them — unacked, they are redelivered to the next life), ``stop()``, drain, close.

Calling order of the hooks: ``start`` once → ``handle`` many times (concurrently up to ``concurrency``)
→ ``stop`` once. A service must not import another service; it meets them only on the bus.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from prometheus_client.core import Metric

from infrarsi import events as ev
from infrarsi.bus.client import Bus, BusError, Delivery
from infrarsi.bus.embedded import resolve_nats_url
from infrarsi.bus.subjects import LIFECYCLE_STREAM, PING_SUBJECT, heartbeat_subject, stream_for_type
from infrarsi.runtime import tracing
from infrarsi.runtime.logs import get_logger, setup_logging
from infrarsi.runtime.metrics import RunnerCounts, ServiceMetrics, serve_metrics
from infrarsi.runtime.settings import Settings, SettingsError, env_var

log = get_logger(__name__)

MAX_DELIVER = 5
HEARTBEAT_S = 2.0


@dataclass(frozen=True)
class Emission:
    """One event a state machine wants published: payload, its envelope's study/trial, and the emit key."""

    payload: ev.Payload
    study_id: str
    trial_id: str | None
    key: str


class StateMachine(Protocol):
    """A service's behaviour as a pure fold over events (no I/O), so it can be rebuilt by replay.

    ``apply`` must be deterministic, and applying an event id a second time must return the emissions of
    the first time and change nothing (replay on start overlaps with live redelivery).
    """

    def apply(self, event: ev.Event) -> list[Emission]: ...

    def status(self) -> dict[str, object]: ...


class Fold(ABC):
    """Base of the ``StateMachine`` s: applies each event id once; a repeat returns the first emissions."""

    def __init__(self) -> None:
        self._emitted: dict[str, list[Emission]] = {}

    def apply(self, event: ev.Event) -> list[Emission]:
        if event.event_id not in self._emitted:
            self._emitted[event.event_id] = self._apply(event)
        return list(self._emitted[event.event_id])

    @abstractmethod
    def _apply(self, event: ev.Event) -> list[Emission]:
        """Fold one new event into the state; return what to publish (``match event.payload``)."""

    @abstractmethod
    def status(self) -> dict[str, object]: ...


@dataclass
class Outbox:
    """What a handler publishes through: ids are derived from the input event, so re-runs dedup."""

    bus: Bus
    source: str
    cause: ev.Event | None
    published: list[ev.Event] = field(default_factory=list)

    async def emit(
        self,
        payload: ev.Payload,
        *,
        study_id: str | None = None,
        trial_id: str | None = None,
        key: str = "",
    ) -> ev.Event:
        """Publish ``payload`` now and wait for its ack.

        ``key`` distinguishes several outputs of one type from one input (e.g. one TrialProposed per
        candidate); the event id is ``derived_id(cause id, service, type, key)``.
        """
        cause_id = self.cause.event_id if self.cause else ev.new_id()
        event = ev.make_event(
            payload,
            study_id=study_id or (self.cause.study_id if self.cause else ""),
            trial_id=trial_id if trial_id is not None else (self.cause.trial_id if self.cause else None),
            source=self.source,
            cluster_id=self.cause.cluster_id if self.cause else None,
            event_id=ev.derived_id(cause_id, self.source, type(payload).__name__, key),
        )
        await self.bus.publish(event)
        self.published.append(event)
        return event


class Service(ABC):
    """Base of the six services. Subclasses set ``name`` and ``consumes`` and implement ``handle``."""

    name: ClassVar[str]
    consumes: ClassVar[tuple[type, ...]]
    """Payload types this service reacts to."""
    concurrency: int = 1
    """How many events may be handled at once (the launcher's parallel trial slots; set per instance)."""
    control: ClassVar[tuple[type, ...]] = ()
    """Payload types (among ``consumes``) read by a consumer of their own (``<name>-control``) and handled as
    they come, beside the slots: a request about work in progress (the launcher's ``TrialStopRequested``)
    must not wait for that work to end. Their handlers must be quick."""
    ack_wait_s: float = 30.0
    """Redelivery wait of the service's consumer (the launcher's comes from its settings, per instance)."""
    retry_delay_s: ClassVar[float] = 1.0
    """Delay before the first retry of a failed handler; it doubles with each try (1, 2, 4, 8 s)."""

    bus: Bus
    _metrics: ServiceMetrics | None = None

    @property
    def metrics(self) -> ServiceMetrics:
        """The service's Prometheus metrics (``infrarsi.runtime.metrics``); made on first use, so a service driven without a
        runner (a benchmark's in-memory bus) observes into its own registry too."""
        if self._metrics is None:
            self._metrics = ServiceMetrics(self.name)
        return self._metrics

    def metric_families(self) -> Iterable[Metric]:
        """The service's own metrics, read at every scrape (the launcher's trials by outcome). Default: none."""
        return ()

    async def start(self) -> None:
        """Rebuild the read model (e.g. ``async for e in self.replay(...)``). Default: nothing."""

    async def stop(self) -> None:
        """Release what the service holds (processes, files). Default: nothing."""

    @abstractmethod
    async def handle(self, event: ev.Event, out: Outbox) -> None:
        """React to one event: ``match event.payload: case TrialProposed(): ...``."""

    def status(self) -> dict[str, object]:
        """Extra fields for ``infrarsi status``."""
        return {}

    @classmethod
    def from_settings(cls, settings: Settings) -> Service:
        """The service as ``service.main`` builds it; a service with settings of its own overrides this."""
        return cls()

    async def give_up(self, event: ev.Event, out: Outbox, reason: str) -> None:
        """Called once when ``handle`` failed ``MAX_DELIVER`` times on a valid event: publish what ends it
        as a failure (the launcher: a ``TrialFinished`` with status ``crash``). Default: log it (counted as
        ``given_up`` in ``infrarsi status``); nothing downstream waits on the other services' events alone."""
        log.error("gave up on an event", event_id=event.event_id, reason=reason)

    async def replay(self, event_types: tuple[type, ...] | None = None) -> AsyncIterator[ev.Event]:
        """Every decodable event of the given types, in stream order, for read-model rebuilds."""
        types = event_types or self.consumes
        for stream in sorted({stream_for_type(t.__name__) for t in types}):
            async for event in self.bus.events(stream, types=types):
                yield event  # poison is skipped here as the live consumer dead-letters it


class ReactiveService(Service):
    """A service whose reactions are a ``StateMachine``: proposer, modeler and verifier.

    ``start`` folds the stream into a fresh state with outputs discarded (they were published by an earlier
    life, or will be re-published, with the same derived ids, when the durable consumer redelivers an event
    it never acked); ``handle`` applies one live event and publishes what the state returns.
    """

    state: StateMachine

    @abstractmethod
    def make_state(self) -> StateMachine:
        """A fresh, empty state."""

    async def start(self) -> None:
        self.state = self.make_state()
        replayed = 0
        skipped = 0
        async for event in self.replay():
            try:
                self.state.apply(event)
            except Exception:  # noqa: BLE001 — one event the fold cannot take must not crash-loop the service
                log.exception("replay skipped an event the state cannot apply", event_id=event.event_id)
                skipped += 1
                continue
            replayed += 1
        log.info("state rebuilt by replay", events=replayed, skipped=skipped)

    async def handle(self, event: ev.Event, out: Outbox) -> None:
        started = time.perf_counter()
        emissions = self.state.apply(event)
        self.metrics.decision_seconds.labels(self.name, event.type).observe(time.perf_counter() - started)
        for emission in emissions:
            await out.emit(
                emission.payload, study_id=emission.study_id, trial_id=emission.trial_id, key=emission.key
            )

    def status(self) -> dict[str, object]:
        return self.state.status()


@dataclass
class _Stats:
    started_at: float = field(default_factory=time.time)
    handled: int = 0
    dead_lettered: int = 0
    failed: int = 0
    given_up: int = 0
    in_flight: int = 0
    last_event_at: float | None = None


@dataclass
class _ConsumerHealth:
    """What the heartbeat tells of one consume loop: is it still pulling?"""

    durable: str
    progress_at: float = field(default_factory=time.monotonic)
    """Last time the loop fetched (even nothing) or finished waiting for a handler."""
    errors: int = 0
    rebinds: int = 0
    last_error: str = ""
    task: asyncio.Task[None] | None = None
    sub: JetStreamContext.PullSubscription | None = None
    """The pull subscription the loop holds now (unsubscribed on stop: a drain waits on a bound one)."""
    pending: int = 0
    """Messages of the consumer's subjects not yet delivered (its lag), as the last heartbeat read it."""
    ack_pending: int = 0

    def stalled(self, now: float) -> bool:
        if self.task is not None and self.task.done():
            return True  # the loop is gone: nothing will ever pull again
        return now - self.progress_at > STALL_S


STALL_S = 30.0
"""A consume loop with no fetch for this long, not waiting for a handler, is reported stalled."""
RECHECK_EMPTY_FETCHES = 10
"""After this many empty fetches in a row the loop asks the server whether its consumer has pending messages:
a pull subscription orphaned by a cluster leader change fetches nothing forever while the log fills."""
CONSUME_BACKOFF_MAX_S = 5.0


class Runner:
    """Runs one ``Service`` against a bus until ``stopping`` is set."""

    def __init__(self, service: Service, bus: Bus, *, grace_s: float = 10.0, batch: int = 64) -> None:
        self.service = service
        self.bus = bus
        self.grace_s = grace_s
        self.batch = batch
        self.stopping = asyncio.Event()
        self.stats = _Stats()
        self.consumers: dict[str, _ConsumerHealth] = {}
        self._slots = asyncio.Semaphore(service.concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self.metrics = service.metrics
        self.metrics.follow(RunnerCounts(
            handled=lambda: self.stats.handled, dead_lettered=lambda: self.stats.dead_lettered,
            failed=lambda: self.stats.failed, given_up=lambda: self.stats.given_up,
            in_flight=lambda: self.stats.in_flight, reconnects=lambda: self.bus.reconnects,
            consumer_lag=lambda: {d: (h.pending, h.ack_pending) for d, h in self.consumers.items()},
        ), service.metric_families)

    async def run(self) -> None:
        service = self.service
        service.bus = self.bus
        await service.start()
        by_durable: dict[str, list[str]] = {}
        for payload_type in service.consumes:
            stream = stream_for_type(payload_type.__name__)
            if payload_type in service.control:
                durable = f"{service.name}-control"
            else:
                durable = service.name if stream == LIFECYCLE_STREAM else f"{service.name}-{stream.lower()}"
            by_durable.setdefault(durable, []).append(payload_type.__name__)
        consumers = []
        for durable, types in sorted(by_durable.items()):
            sub = await self._bind(durable, types)
            health = self.consumers[durable] = _ConsumerHealth(durable, sub=sub)
            slotted = not durable.endswith("-control")
            health.task = asyncio.create_task(self._consume(durable, types, sub, health, slotted=slotted),
                                              name=f"consume-{durable}")  # fmt: skip
            consumers.append(health.task)
        ping = await self.bus.nc.subscribe(PING_SUBJECT, cb=self._on_ping)
        heartbeat = asyncio.create_task(self._heartbeat(), name="heartbeat")
        log.info("service started", consumes=[t.__name__ for t in service.consumes])
        await self.stopping.wait()
        log.info("service stopping", in_flight=len(self._tasks))
        for task in consumers:
            task.cancel()
        await asyncio.gather(*consumers, return_exceptions=True)
        if self._tasks:
            _done, pending = await asyncio.wait(self._tasks, timeout=self.grace_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        heartbeat.cancel()
        await ping.unsubscribe()
        for health in self.consumers.values():
            if health.sub is not None:
                with contextlib.suppress(Exception):
                    await health.sub.unsubscribe()
        await service.stop()

    async def _bind(self, durable: str, types: list[str]) -> JetStreamContext.PullSubscription:
        return await self.bus.durable_consumer(
            durable,
            types,
            max_ack_pending=max(64, 4 * self.service.concurrency),
            ack_wait_s=self.service.ack_wait_s,
        )

    async def _consume(
        self, durable: str, types: list[str], sub: JetStreamContext.PullSubscription | None, health: _ConsumerHealth,
        *, slotted: bool = True,
    ) -> None:
        """Fetch and dispatch until stopping; no error ends the loop (it backs off, re-binds and goes on)."""
        empty = 0
        while not self.stopping.is_set():
            try:
                if sub is None or empty >= RECHECK_EMPTY_FETCHES:
                    sub, empty = await self._rebound(durable, types, sub, health), 0
                    health.sub = sub
                if slotted:
                    await self._slots.acquire()
                    self._slots.release()
                deliveries = await self.bus.fetch(sub, batch=self.batch, timeout_s=1.0)
                health.progress_at = time.monotonic()
                empty = 0 if deliveries else empty + 1
                for delivery in deliveries:
                    await self._dispatch(delivery, health, slotted=slotted)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 — a consume loop that dies stalls the service silently
                health.errors += 1
                health.last_error = f"{type(exc).__name__}: {exc}"[:300]
                log.warning("consume loop error; backing off", durable=durable, error=health.last_error)
                if sub is not None:
                    with contextlib.suppress(Exception):
                        await sub.unsubscribe()
                sub = None  # bind again: the consumer or its leader may be gone
                await asyncio.sleep(min(0.5 * 2 ** min(health.errors, 4), CONSUME_BACKOFF_MAX_S))

    async def _rebound(
        self, durable: str, types: list[str], sub: JetStreamContext.PullSubscription | None, health: _ConsumerHealth
    ) -> JetStreamContext.PullSubscription:
        """``sub`` if it still delivers what its consumer holds; else a fresh binding (re-creating the consumer)."""
        if sub is not None:
            info = await sub.consumer_info()
            if not info.num_pending:
                return sub
            log.warning("consumer has pending messages but fetches none; re-binding", durable=durable,
                        pending=info.num_pending)  # fmt: skip
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        health.rebinds += 1
        return await self._bind(durable, types)

    async def _dispatch(self, delivery: Delivery, health: _ConsumerHealth, *, slotted: bool = True) -> None:
        if delivery.event is None:
            await self.bus.dead_letter(delivery)
            await delivery.msg.ack_sync()
            self.stats.dead_lettered += 1
            return
        if not slotted:  # a control event: handled now, in order, whatever the slots are doing
            await self._process(delivery, slotted=False)
            health.progress_at = time.monotonic()
            return
        await self._slots.acquire()
        task = asyncio.create_task(self._process(delivery))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self.service.concurrency == 1:
            # Strict order for single-slot services: finish one event before the next.
            await asyncio.wait({task})
            health.progress_at = time.monotonic()

    async def _process(self, delivery: Delivery, *, slotted: bool = True) -> None:
        event = delivery.event
        assert event is not None
        self.stats.in_flight += 1
        keepalive = asyncio.create_task(self._keep_alive(delivery))
        try:
            with (
                structlog.contextvars.bound_contextvars(
                    study_id=event.study_id, trial_id=event.trial_id, event_type=event.type
                ),
                tracing.span_from(
                    delivery.headers,
                    f"{self.service.name}.handle {event.type}",
                    **{
                        "infrarsi.study_id": event.study_id,
                        "infrarsi.trial_id": event.trial_id or "",
                        "infrarsi.event_id": event.event_id,
                    },
                ),
            ):
                out = Outbox(self.bus, self.service.name, event)
                await self.service.handle(event, out)
                # One line per handled event, with study/trial/trace ids bound: a trace joins its log lines.
                # Per-step telemetry only at debug level (thousands per trial).
                (log.debug if event.type == "TrialStep" else log.info)(
                    "event handled", outputs=[e.type for e in out.published]
                )
            await delivery.msg.ack_sync()
            self.stats.handled += 1
            self.stats.last_event_at = time.time()
        except asyncio.CancelledError:
            raise  # shutdown: leave it unacked, the next life gets it again
        except Exception as exc:  # noqa: BLE001 — one event's failure must not end the service
            await self._failed(delivery, exc)
        finally:
            keepalive.cancel()
            self.stats.in_flight -= 1
            if slotted:
                self._slots.release()

    async def _failed(self, delivery: Delivery, exc: Exception) -> None:
        """A valid event whose handler raised: retry with backoff; after ``MAX_DELIVER`` tries, give up on it
        through the service's ``give_up`` (which reports the failure on the bus), then ack.

        The event is valid, so it is never dead-lettered: a dead letter is for what cannot be read.
        """
        event = delivery.event
        assert event is not None
        self.stats.failed += 1
        try:
            attempts = delivery.msg.metadata.num_delivered
            log.exception("handler failed", attempts=attempts)
            if attempts < MAX_DELIVER:
                await delivery.msg.nak(delay=self.service.retry_delay_s * 2.0 ** (attempts - 1))
                return
            reason = f"{self.service.name} failed {attempts}x handling {event.type}: {type(exc).__name__}: {exc}"
            await self.service.give_up(event, Outbox(self.bus, self.service.name, event), reason[:2000])
            await delivery.msg.ack_sync()
            self.stats.given_up += 1
        except Exception:  # noqa: BLE001 — the bus itself failed: left unacked, JetStream redelivers it
            log.exception("could not settle a failed event; it will be redelivered")

    async def _keep_alive(self, delivery: Delivery) -> None:
        """Long handlers (a trial runs for minutes) tell JetStream they are still working on it."""
        while True:
            await asyncio.sleep(self.service.ack_wait_s / 3)
            with contextlib.suppress(Exception):
                await delivery.msg.in_progress()

    def status(self) -> dict[str, object]:
        return {
            "service": self.service.name,
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.stats.started_at, 3),
            "handled": self.stats.handled,
            "dead_lettered": self.stats.dead_lettered,
            "failed": self.stats.failed,
            "given_up": self.stats.given_up,
            "in_flight": self.stats.in_flight,
            "stalled": sorted(d for d, h in self.consumers.items() if h.stalled(time.monotonic())),
            "consumers": {
                d: {"errors": h.errors, "rebinds": h.rebinds, "last_error": h.last_error,
                    "since_progress_s": round(time.monotonic() - h.progress_at, 1)}
                for d, h in self.consumers.items()
            },  # fmt: skip
            "last_event_at": self.stats.last_event_at,
            **self.service.status(),
        }

    async def _on_ping(self, msg: Msg) -> None:
        if msg.reply:
            await self.bus.nc.publish(msg.reply, json.dumps(self.status()).encode())

    async def _heartbeat(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.bus.nc.publish(heartbeat_subject(self.service.name), json.dumps(self.status()).encode())
            await self._read_lag()
            await asyncio.sleep(HEARTBEAT_S)

    async def _read_lag(self) -> None:
        """Each consumer's lag, from JetStream, for the ``infrarsi_consumer_*`` gauges."""
        for health in list(self.consumers.values()):
            if health.sub is None:
                continue
            with contextlib.suppress(Exception):  # a consumer between bindings: the next heartbeat reads it
                info = await health.sub.consumer_info()
                health.pending, health.ack_pending = int(info.num_pending or 0), int(info.num_ack_pending or 0)


PARENT_PID_ENV = env_var("parent_pid")
"""Set by a stack (``infrarsi up``, or a command's own stack) on the services it starts: the process whose
death must stop them. A service started by hand, systemd or compose has none and runs until signalled."""
PARENT_POLL_S = 1.0


async def _stop_when_orphaned(parent_pid: int, stopping: asyncio.Event) -> None:
    """Stop gracefully (as on SIGTERM) once the stack that started us is gone.

    A stack killed with SIGKILL cannot stop its services, which would go on consuming and launching trials
    for nobody. Its death reparents us, so ``getppid`` changes; polled rather than ``PR_SET_PDEATHSIG``,
    which fires when the forking *thread* exits and needs an unsafe ``preexec_fn``.
    """
    while not stopping.is_set():
        if os.getppid() != parent_pid:
            log.warning("the stack that started this service is gone; stopping", parent_pid=parent_pid)
            stopping.set()
            return
        await asyncio.sleep(PARENT_POLL_S)


async def _stop_when_lost(bus: Bus, stopping: asyncio.Event) -> None:
    while bus.lost is None:
        await asyncio.sleep(1.0)
    stopping.set()


async def serve(
    service: Service, nats_url: str, data_dir: Path | None = None, settings: Settings | None = None
) -> None:
    """Run ``service`` until SIGTERM/SIGINT (or, started by a stack, until that stack's process is gone).

    With ``data_dir`` it follows the embedded server there (``Bus.connect``); when the bus gives up on it,
    the service stops and exits non-zero, for its supervisor (``infrarsi up``, systemd) to restart it.
    """
    settings = settings or Settings.from_env()
    bus = await Bus.connect(nats_url, service=service.name, data_dir=data_dir, replicas=settings.replicas,
                            ack_journal=settings.ack_journal)
    runner = Runner(service, bus)
    exporter = None
    if settings.metrics_port is not None:
        exporter, port = serve_metrics(runner.metrics, port=settings.metrics_port, addr=settings.metrics_addr,
                                       data_dir=data_dir, cluster=settings.cluster)
        log.info("serving Prometheus metrics", addr=settings.metrics_addr, port=port)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runner.stopping.set)
    parent = settings.parent_pid
    watch = asyncio.create_task(_stop_when_orphaned(parent, runner.stopping)) if parent is not None else None
    lost = asyncio.create_task(_stop_when_lost(bus, runner.stopping))
    try:
        await runner.run()
    finally:
        lost.cancel()
        if watch is not None:
            watch.cancel()
        if exporter is not None:
            exporter.shutdown()
        await bus.close()
        tracing.shutdown_tracing()
        log.info("service stopped")
    if bus.lost is not None:
        raise BusError(bus.lost)


def main(service_factory: type[Service]) -> None:
    """Entry point of ``python -m infrarsi_services.<name>`` (and so of ``infrarsi serve <name>``)."""
    try:
        settings = Settings.from_env()
    except SettingsError as exc:  # a broken deployment: fail in the first second, like a broken install
        print("\n".join(exc.lines()), file=sys.stderr)
        raise SystemExit(1) from None
    parser = argparse.ArgumentParser(prog=f"infrarsi-{service_factory.name}")
    parser.add_argument("--nats-url", default=None, help="NATS server (default: $INFRARSI_NATS_URL or embedded)")
    parser.add_argument("--data-dir", type=Path, default=settings.data_dir)
    args = parser.parse_args()
    settings = settings.model_copy(update={"data_dir": args.data_dir, "nats_url": args.nats_url or settings.nats_url})
    setup_logging(service_factory.name, settings.log_level)
    tracing.setup_tracing(f"infrarsi-{service_factory.name}", trace_file=settings.trace_file)
    url = resolve_nats_url(settings.nats_url, settings.data_dir)
    if url is None:
        print(
            "error: no NATS server: pass --nats-url, set INFRARSI_NATS_URL, or start one with `infrarsi up`",
            file=sys.stderr,
        )
        raise SystemExit(2)
    try:
        asyncio.run(serve(service_factory.from_settings(settings), url, settings.data_dir, settings))
    except Exception as exc:  # noqa: BLE001 — top of the process: report and exit non-zero
        log.exception("service crashed", error=repr(exc))
        raise SystemExit(1) from None
