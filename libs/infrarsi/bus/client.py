"""NATS JetStream access for every InfraRSI process: streams, publishing, durable pull consumers.

Owns: the stream definitions (``IRSI``, ``IRSI_TELEMETRY``, ``IRSI_BANK``) and keeping them in place
(also after a reconnect); publishing an ``Event`` with ``Nats-Msg-Id`` = its event id and the W3C
``traceparent`` header, waiting for the ack; batch publishing with every future checked; durable
pull consumers fetched in batches; dead-lettering messages that fail decoding.

It must not know what any service does with an event: dispatch lives in ``infrarsi.runtime.service``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from infrarsi import events as ev
from infrarsi.bus import credentials, subjects
from infrarsi.bus import subjects as _subjects  # event_batches' parameter shadows the module
from infrarsi.bus.embedded import running_server_url
from infrarsi.bus.reader import read_stream
from infrarsi.runtime import tracing
from infrarsi.runtime.logs import get_logger
from infrarsi.runtime.settings import Settings

log = get_logger(__name__)

# Re-exported for callers that address streams through the bus; the names live in ``infrarsi.bus.subjects``.
LIFECYCLE_STREAM = subjects.LIFECYCLE_STREAM
TELEMETRY_STREAM = subjects.TELEMETRY_STREAM
BANK_STREAM = subjects.BANK_STREAM
stream_for_type = subjects.stream_for_type


DEADLETTER_RAW_MAX = 64 * 1024
"""Bytes of a bad message kept in its dead letter: a copy of the whole (up to the server's max payload,
less base64's third) would itself be refused, and a consumer that cannot park a message cannot move on."""
DEADLETTER_ERROR_MAX = 2000
MAX_EVENT_BYTES = 4 << 20
"""The largest message a service handles: the largest real events (a ``StudyCreated`` of a big repo's locked
files, a long trial's ``step_seen_s``) stay well under it; a bigger one is a bad message, not a slow decode."""


LOST_AFTER_S = 120.0
"""How long a client following a data dir's server waits for it to come back before giving up."""
FOLLOW_POLL_S = 1.0


def server_urls(url: str) -> list[str]:
    """``nats://a:4222,nats://b:4222`` (a cluster, as ``INFRARSI_NATS_URL`` may name it) as a server list."""
    return [part.strip() for part in url.split(",") if part.strip()]


class BusError(RuntimeError):
    """The bus could not be reached, or refused a publish."""


ACK_JOURNAL_SUFFIX = ".acks"


WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a publish whose ``Nats-Expected-Last-Subject-Sequence`` did not hold."""


class PublishRaced(BusError):
    """A conditional publish lost: the subject had a newer message than the publisher had read."""


class AckJournal:
    """Every JetStream ack one process received, one line each: ``<stream> <seq> <msg id>``.

    A write the server acknowledged must be in the stream whatever happens to the servers afterwards; a fault
    benchmark can only check that if it knows every ack, including those a killed service received. Lines are
    appended unbuffered with ``O_APPEND`` (one ``write`` each: whole lines even from a process killed mid-run)
    to ``<directory>/<service>-<pid>.acks``."""

    def __init__(self, directory: Path, service: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{service}-{os.getpid()}{ACK_JOURNAL_SUFFIX}"
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def record(self, ack: api.PubAck, msg_id: str) -> None:
        if self._fd is not None:
            os.write(self._fd, f"{ack.stream} {ack.seq} {msg_id}\n".encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def read(directory: Path) -> list[tuple[str, int, str]]:
        """Every ack journaled under ``directory``: (stream, sequence, msg id)."""
        acks = []
        for path in sorted(directory.glob(f"*{ACK_JOURNAL_SUFFIX}")):
            for line in path.read_text().splitlines():
                stream, seq, msg_id = line.split(" ", 2)
                acks.append((stream, int(seq), msg_id))
        return acks


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    description: str
    max_age_s: float = 0.0
    """0 = keep forever (the lifecycle log and the bank are the system of record)."""
    duplicate_window_s: float = 20 * 60.0

    def config(self, replicas: int) -> api.StreamConfig:
        return api.StreamConfig(
            name=self.name,
            description=self.description,
            subjects=list(self.subjects),
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            num_replicas=replicas,
            max_age=self.max_age_s,
            duplicate_window=self.duplicate_window_s,
            discard=api.DiscardPolicy.OLD,
            allow_direct=True,
        )


# Their subjects (and why they never overlap): ``infrarsi.bus.subjects``.
STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(LIFECYCLE_STREAM, subjects.STREAM_SUBJECTS[LIFECYCLE_STREAM], "InfraRSI lifecycle events (system of record)"),
    StreamSpec(
        TELEMETRY_STREAM,
        subjects.STREAM_SUBJECTS[TELEMETRY_STREAM],
        "Per-step samples from the probe",
        max_age_s=90 * 24 * 3600.0,
    ),
    StreamSpec(BANK_STREAM, subjects.STREAM_SUBJECTS[BANK_STREAM], "Experience bank entries"),
)


def replicas_from_env() -> int:
    """1 for the embedded server; ``INFRARSI_REPLICAS=3`` on a 3-node cluster (deploy/nats/cluster).

    The default of ``Bus.connect`` for a caller that passes no ``replicas``: never 1 by mistake, which would
    shrink a clustered stream on ``ensure``."""
    return Settings.from_env().replicas


@dataclass(frozen=True)
class Delivery:
    """One message fetched from a consumer: decoded (``event``) or not (``error``)."""

    msg: Msg
    event: ev.Event | None
    error: str | None

    @property
    def stream_seq(self) -> int:
        return self.msg.metadata.sequence.stream

    @property
    def headers(self) -> dict[str, str]:
        return dict(self.msg.headers or {})


class Bus:
    """A connection to NATS with JetStream, used by one process (``service`` names it in logs and DLQs)."""

    def __init__(self, nc: NATS, service: str, replicas: int) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=10.0)
        self.service = service
        self.replicas = replicas
        self.lost: str | None = None
        """Why the connection was given up (see ``connect(data_dir=…)``); ``None`` while it is not."""
        self.credentials: credentials.Credentials | None = None
        """The principal's credentials the connection authenticated with (``None``: none)."""
        self.tls = False
        """Whether the connection runs over TLS."""
        self._follower: asyncio.Task[None] | None = None
        self.ack_journal: AckJournal | None = None
        self.reconnects = 0
        """Times the connection was re-established after a loss (``infrarsi_bus_reconnects_total``)."""

    # ---------------------------------------------------------------- connection

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        service: str,
        ensure: bool = True,
        connect_timeout_s: float = 5.0,
        replicas: int | None = None,
        data_dir: Path | str | None = None,
        lost_after_s: float = LOST_AFTER_S,
        ack_journal: Path | None = None,
    ) -> Bus:
        """Connect (failing fast with ``BusError`` if the server cannot be reached) and ensure the streams.

        ``service`` is also the principal whose credentials authenticate the connection
        (``credentials.for_principal``: ``$INFRARSI_NKEY_FILE``, else ``<data_dir>/creds/<service>.nk``;
        ``data_dir`` defaults to ``$INFRARSI_DATA_DIR``); none found means connecting without.

        ``data_dir``: when ``url`` is the embedded server that ``infrarsi up`` runs there, follow it: if the
        connection is lost and the server comes back on another port, switch to it; if none is back after
        ``lost_after_s``, close the connection and set ``lost`` (the next call fails with a clear error).

        ``ack_journal``: a directory where every ack this connection receives is logged (``AckJournal``).
        """
        holder: dict[str, Bus] = {}
        creds = credentials.for_principal(service, data_dir or _explicit_data_dir())

        async def on_reconnect() -> None:
            # A server restarted from an empty store (or a fresh cluster member) has no streams:
            # put them back before anyone publishes into the void.
            if (bus := holder.get("bus")) is not None:
                bus.reconnects += 1
                try:
                    await bus.ensure_streams()
                except Exception as exc:  # noqa: BLE001 — logged; the next publish surfaces the error
                    log.warning("ensure_streams after reconnect failed", error=str(exc))

        initial_errors: list[BaseException] = []

        async def on_error(exc: Exception) -> None:
            if "bus" not in holder:
                initial_errors.append(exc)  # reported once, in the BusError below
                return
            log.warning("nats error", error=str(exc))

        # With reconnects allowed forever, nats-py also retries the *first* connect forever; bound it,
        # so a wrong URL or a stopped server fails within ``connect_timeout_s`` instead of hanging.
        tls = credentials.tls_options()
        nc = NATS()
        try:
            await asyncio.wait_for(
                nc.connect(
                    server_urls(url),
                    name=f"infrarsi-{service}",
                    connect_timeout=connect_timeout_s,  # type: ignore[arg-type]  # nats-py annotates int; it takes seconds as float
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,  # type: ignore[arg-type]  # as connect_timeout
                    reconnected_cb=on_reconnect,
                    error_cb=on_error,
                    **(creds.connect_options() if creds is not None else {}),
                    **tls,
                ),
                timeout=connect_timeout_s,
            )
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            with contextlib.suppress(Exception):
                await nc.close()
            # Against a cluster each URL is tried in turn: one refuses the credentials, the next drops
            # the socket mid-handshake. The refusal is the error the user can act on, so it wins.
            refusals = [e for e in initial_errors if "authorization" in str(e).lower()]
            cause = refusals[-1] if refusals else initial_errors[-1] if initial_errors else exc
            hint = ""
            if "authorization" in str(cause).lower():
                hint = (
                    f" (connecting as {creds.principal!r} with {creds.seed_file})" if creds is not None
                    else f" (the server requires credentials; none found for {service!r}: run the verb with the "
                    f"--data-dir of the `infrarsi up` that made them, or set {credentials.NKEY_FILE_ENV})"
                )
            raise BusError(f"cannot reach NATS at {url}: {cause or type(cause).__name__}{hint}") from None
        bus = cls(nc, service, replicas if replicas is not None else replicas_from_env())
        bus.credentials, bus.tls = creds, bool(tls)
        if ack_journal is not None:
            bus.ack_journal = AckJournal(Path(ack_journal), service)
        holder["bus"] = bus
        if data_dir is not None and running_server_url(data_dir) == url:
            bus._follower = asyncio.create_task(bus._follow_server(Path(data_dir), lost_after_s), name="follow-server")
        if ensure:
            await bus.ensure_streams()
        return bus

    async def _follow_server(self, data_dir: Path, lost_after_s: float) -> None:
        """While disconnected, look for the embedded server under ``data_dir`` (restarted, maybe on a new port)."""
        lost_since: float | None = None
        while not self.nc.is_closed:
            await asyncio.sleep(FOLLOW_POLL_S)
            if self.nc.is_connected:
                lost_since = None
                continue
            lost_since = lost_since or time.monotonic()
            url = running_server_url(data_dir)
            pool = [srv.uri.geturl() for srv in self.nc.server_pool]
            if url is not None and server_urls(url) != pool:
                log.warning("the NATS server under the data dir moved; following it", old=pool, new=url)
                with contextlib.suppress(nats.errors.Error):
                    self.nc.set_server_pool(server_urls(url))
            elif time.monotonic() - lost_since > lost_after_s:
                self.lost = (f"lost the NATS server at {', '.join(pool)} for {lost_after_s:.0f}s and no server "
                             f"runs under {data_dir} (start one with `infrarsi up`)")  # fmt: skip
                log.error("giving up on NATS", reason=self.lost)
                await self.nc.close()
                return

    async def close(self) -> None:
        """Drain (finish in-flight deliveries and flush publishes), then close."""
        if self._follower is not None:
            self._follower.cancel()
        try:
            if not self.nc.is_closed:
                await self.nc.drain()
        except (nats.errors.ConnectionClosedError, nats.errors.FlushTimeoutError):
            await self.nc.close()
        finally:
            if self.ack_journal is not None:
                self.ack_journal.close()

    async def ensure_streams(self) -> None:
        """Create each stream, or update it to the current definition; idempotent."""
        for spec in STREAMS:
            config = spec.config(self.replicas)
            try:
                await self.js.add_stream(config)
            except nats.js.errors.BadRequestError as exc:
                # 10058: "stream name already in use with a different configuration"
                if exc.err_code != 10058:
                    raise
                await self.js.update_stream(config)

    # ---------------------------------------------------------------- publishing

    def _headers(self, event: ev.Event) -> dict[str, str]:
        headers = {"Nats-Msg-Id": event.event_id}
        # nats-py drops *all* headers of a message if one value is not ASCII; traceparent is hex.
        tracing.inject(headers)
        return headers

    async def publish(self, event: ev.Event, *, expected_last_subject_seq: int | None = None) -> api.PubAck:
        """Publish one event and wait for JetStream's ack. A duplicate id is acked with ``duplicate=True``.

        ``expected_last_subject_seq``: JetStream stores the event only if the last message on its subject is at
        that stream sequence (0: none yet); else ``PublishRaced`` — another publisher got there first."""
        headers = self._headers(event)
        if expected_last_subject_seq is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expected_last_subject_seq)
        try:
            ack = await self.js.publish(
                subjects.subject_for(event),
                ev.encode(event),
                headers=headers,
                stream=stream_for_type(event.type),
            )
        except (nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError) as exc:
            raise BusError(f"publish of {event.type} {event.event_id} not acknowledged: {exc!r}") from exc
        except nats.js.errors.APIError as exc:
            if expected_last_subject_seq is not None and exc.err_code == WRONG_LAST_SEQUENCE:
                raise PublishRaced(f"{event.type} of study {event.study_id}: another one was published first") from exc
            raise
        return self._acked(ack, event.event_id)

    async def last_seq_on(self, stream: str, subject: str) -> int:
        """The stream sequence of the last message on ``subject`` of ``stream``; 0 when it has none."""
        try:
            msg = await self.js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            return 0
        return int(msg.seq or 0)

    def _acked(self, ack: api.PubAck, msg_id: str | None) -> api.PubAck:
        if self.ack_journal is not None and msg_id is not None:
            self.ack_journal.record(ack, msg_id)
        return ack

    async def publish_many(self, events: Sequence[ev.Event], timeout_s: float = 30.0) -> list[api.PubAck]:
        """Publish a batch asynchronously and check every ack; raises ``BusError`` if any failed."""
        futures = []
        for event in events:
            futures.append(
                await self.js.publish_async(
                    subjects.subject_for(event),
                    ev.encode(event),
                    headers=self._headers(event),
                    stream=stream_for_type(event.type),
                    wait_stall=timeout_s,
                )
            )
        try:
            results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), timeout_s)
        except TimeoutError:
            raise BusError(f"{len(futures)} async publishes not all acknowledged in {timeout_s}s") from None
        for event, result in zip(events, results, strict=True):
            if not isinstance(result, BaseException):
                self._acked(result, event.event_id)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise BusError(f"{len(failures)} of {len(events)} publishes failed; first: {failures[0]!r}")
        return [r for r in results if not isinstance(r, BaseException)]  # all of them: none failed

    async def publish_raw(
        self, subject: str, data: bytes, msg_id: str | None = None, stream: str | None = None
    ) -> api.PubAck:
        """Publish bytes that are not an ``Event`` (dead letters, probe records; tests of malformed input)."""
        headers = {"Nats-Msg-Id": msg_id} if msg_id else None
        return self._acked(await self.js.publish(subject, data, headers=headers, stream=stream), msg_id)

    async def dead_letter(self, delivery: Delivery) -> None:
        """Park a message on ``irsi.deadletter.<service>`` with the error, its first bytes and its digest."""
        raw = delivery.msg.data or b""
        letter = ev.DeadLetter(
            service=self.service,
            subject=delivery.msg.subject,
            error=(delivery.error or "")[:DEADLETTER_ERROR_MAX],
            raw=raw[:DEADLETTER_RAW_MAX],
            stream_seq=delivery.stream_seq,
            ts=datetime.now(UTC),
            raw_size=len(raw),
            raw_sha256=hashlib.sha256(raw).hexdigest(),
        )
        await self.publish_raw(
            subjects.deadletter_subject(self.service),
            msgspec.json.encode(letter),
            msg_id=f"deadletter:{self.service}:{delivery.msg.metadata.stream}:{delivery.stream_seq}",
        )
        log.warning("dead-lettered message", subject=delivery.msg.subject, error=letter.error[:300])

    # ---------------------------------------------------------------- consuming

    async def durable_consumer(
        self,
        durable: str,
        event_types: Iterable[str],
        *,
        max_ack_pending: int = 256,
        ack_wait_s: float = 60.0,
        deliver_new_only: bool = False,
    ) -> nats.js.JetStreamContext.PullSubscription:
        """A durable pull consumer on the one stream that holds ``event_types`` (all must share a stream)."""
        types = sorted(set(event_types))
        streams = {stream_for_type(t) for t in types}
        if len(streams) != 1:
            raise ValueError(f"event types {types} span streams {sorted(streams)}; use one consumer per stream")
        stream = streams.pop()
        filters = [subjects.filter_for(t) for t in types]
        config = api.ConsumerConfig(
            durable_name=durable,
            name=durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=ack_wait_s,
            max_ack_pending=max_ack_pending,
            deliver_policy=api.DeliverPolicy.NEW if deliver_new_only else api.DeliverPolicy.ALL,
            filter_subjects=filters if len(filters) > 1 else None,
            filter_subject=filters[0] if len(filters) == 1 else None,
        )
        try:
            info = await self.js.consumer_info(stream, durable)
            wanted = set(filters)
            have = set(info.config.filter_subjects or ([info.config.filter_subject] if info.config.filter_subject else []))
            if have != wanted:
                await self.js.add_consumer(stream, config)  # updates filters of an existing durable
        except nats.js.errors.NotFoundError:
            await self.js.add_consumer(stream, config)
        return await self.js.pull_subscribe_bind(durable=durable, stream=stream)

    @staticmethod
    async def fetch(
        sub: nats.js.JetStreamContext.PullSubscription, batch: int = 64, timeout_s: float = 1.0
    ) -> list[Delivery]:
        """Fetch up to ``batch`` messages (waiting at most ``timeout_s``), each decoded or marked bad."""
        try:
            msgs = await sub.fetch(batch, timeout=timeout_s)
        except TimeoutError:
            return []
        return [decode_delivery(m) for m in msgs]

    async def event_batches(
        self,
        stream: str,
        subjects: str | None = None,
        types: tuple[type, ...] | None = None,
        *,
        start_seq: int = 1,
        owned_only: bool = False,
    ) -> AsyncIterator[list[tuple[int, ev.Event]]]:
        """``bus.reader.read_stream`` decoded: per chunk read, the (stream sequence, event) of every message that
        decodes and, given ``types``, has one of those payload types, up to where the stream ended when the read
        began. Dead letters and foreign bytes are skipped; ``owned_only`` also skips events their publisher may
        not own (``subjects.publisher_problem``)."""
        async for msgs in read_stream(self, stream, start_seq, subjects=subjects):
            batch = []
            for seq, subject, data in msgs:
                event = ev.decode_or_none(data, types)
                problem = _subjects.publisher_problem(event, subject) if event and owned_only else None
                if problem is not None:
                    log.warning("skipped an event its publisher may not own", problem=problem)
                elif event is not None:
                    batch.append((seq, event))
            if batch:
                yield batch

    async def events(
        self,
        stream: str,
        subjects: str | None = None,
        types: tuple[type, ...] | None = None,
        *,
        start_seq: int = 1,
    ) -> AsyncIterator[ev.Event]:
        """Every decodable event of ``stream`` (filtered by ``subjects`` and payload ``types``), in order."""
        async for batch in self.event_batches(stream, subjects, types, start_seq=start_seq):
            for _, event in batch:
                yield event

    async def stream_counts(self) -> dict[str, dict[str, int]]:
        out = {}
        for spec in STREAMS:
            try:
                info = await self.js.stream_info(spec.name)
            except nats.js.errors.NotFoundError:
                continue
            out[spec.name] = {
                "messages": info.state.messages,
                "bytes": info.state.bytes,
                "first_seq": info.state.first_seq,
                "last_seq": info.state.last_seq,
            }
        return out


def _explicit_data_dir() -> Path | None:
    """``$INFRARSI_DATA_DIR`` when it is set (``Settings.data_dir``), never its default: a process that was
    told no data directory looks for no credentials in its working directory."""
    settings = Settings.from_env()
    return settings.data_dir if "data_dir" in settings.model_fields_set else None


def decode_delivery(msg: Msg) -> Delivery:
    if len(msg.data) > MAX_EVENT_BYTES:
        return Delivery(msg=msg, event=None, error=f"oversized: {len(msg.data)} bytes, over the {MAX_EVENT_BYTES} an event may take")
    try:
        event = ev.decode(msg.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return Delivery(msg=msg, event=None, error=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 — whatever a message can make a decoder raise, it is a bad message
        return Delivery(msg=msg, event=None, error=f"undecodable ({type(exc).__name__}): {exc}")
    problem = subjects.publisher_problem(event, msg.subject, strict=False)
    if problem is not None:
        return Delivery(msg=msg, event=None, error=problem)
    return Delivery(msg=msg, event=event, error=None)
