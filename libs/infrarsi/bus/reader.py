"""The one in-order reader of a JetStream stream: ``read_stream``.

Owns reading a stream (or the subjects of it a filter selects) from a start sequence up to where the stream
ended when the read began, as ``StreamMessage`` chunks in sequence order, leaving nothing on the server (an
ephemeral consumer, no acks). ``Bus.event_batches``/``Bus.events``, the analyst DB's replay and every tool
that reads a stream whole go through it.

Two transports behind the one function, because the replay benchmark needs the fast one
(``bench/eventlog.py``: ``replay_reader_events_per_s`` against nats-py's ``ordered_consumer``, docs/analytics.md):

- ``_RawReader``: a second, minimal NATS connection that receives one push consumer's deliveries in bulk,
  cutting messages out of 1 MiB socket reads (nats-py spends most of a replay's time per message). It
  authenticates as the bus does (its nkey, signing the server's nonce; or a user/password or token in the
  URL) and speaks only the part of the protocol a push consumer needs: ``MSG``/``HMSG``, flow control,
  heartbeats, ``PING``. It reads what it needs from ``Bus`` (the URL connected to, the credentials, whether
  TLS is on), never nats-py's private attributes; over TLS it is unavailable.
- nats-py's ordered push consumer (``_read_ordered``): the fallback over TLS, and ``direct=False``.

A read that finds JetStream temporarily unavailable — a cluster electing a meta or stream leader after a node
was lost answers "JetStream system temporarily unavailable", or nothing — asks again for up to
``UNAVAILABLE_WAIT_S`` before it gives up (``_answered``): every CLI verb reads a study through here, so none
fails on an election that a few seconds resolve. ``tests/integration/test_read_during_election.py``.

``tests/integration/test_stream_reader.py`` checks the protocol against real servers (open, token,
user/password, nkeys), both transports against each other, filters, backpressure and the end of a read.
Must not decode events (``infrarsi.events``) or know what a stream holds.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from infrarsi.bus.credentials import Credentials
from infrarsi.runtime.logs import get_logger

log = get_logger(__name__)


class Bus(Protocol):
    """What the reader needs of a connection (``client.Bus`` is one; the reader does not import the client,
    which imports the reader)."""

    nc: NATS
    js: JetStreamContext
    service: str
    tls: bool
    credentials: Credentials | None

StreamMessage = tuple[int, str, bytes]
"""(stream sequence, subject, data): what a reader of a stream needs of one stored message."""

_READ_CHUNK = 1 << 20
T = TypeVar("T")

UNAVAILABLE_WAIT_S = 60.0
"""How long a read asks again while JetStream is temporarily unavailable (a cluster's leader election takes
seconds; a quorum that stays lost longer is an outage the caller should hear about)."""


class _NoLeader(Exception):
    """A replica answered for a stream that has no leader: its state may lag what was acknowledged."""


_UNAVAILABLE = (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError, nats.errors.TimeoutError,
                _NoLeader)
"""What a JetStream request gets while no leader answers: a 503, no responders, no reply at all, or a replica's
own (possibly stale) view of the stream."""


class StreamReadError(RuntimeError):
    """The ordered read stalled or lost a message; the caller resumes from its stored position."""


def _sequences(reply: str) -> tuple[int, int]:
    """(stream seq, consumer seq) from a JetStream delivery's reply subject (v1 and v2 ack formats)."""
    tokens = reply.split(".")
    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
        return int(tokens[5]), int(tokens[6])
    # $JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>]
    return int(tokens[7]), int(tokens[8])


async def read_stream(
    bus: Bus,
    stream: str,
    start_seq: int = 1,
    *,
    subjects: str | None = None,
    idle_timeout_s: float = 10.0,
    direct: bool | None = None,
    unavailable_wait_s: float = UNAVAILABLE_WAIT_S,
) -> AsyncIterator[list[StreamMessage]]:
    """Every message of ``stream`` (those on ``subjects``, a filter, when given) from ``start_seq`` up to the
    stream's last sequence when the read began, in order, in chunks.

    ``_RawReader`` where the connection allows it, else nats-py's ordered push consumer; ``direct`` forces
    one or the other. A read that stalls for ``idle_timeout_s`` raises ``StreamReadError``, unless the tail
    was deleted meanwhile (retention, purge): then the read ends. While JetStream is temporarily unavailable
    (a leader election), the read's requests are asked again for up to ``unavailable_wait_s``.
    """
    try:
        info = await _answered(lambda: _led_stream_info(bus, stream), stream, unavailable_wait_s)
    except nats.js.errors.NotFoundError:
        return  # a stream nobody created yet is an empty one
    last = info.state.last_seq
    start_seq = max(start_seq, info.state.first_seq or 1)
    if info.state.messages == 0 or last < start_seq:
        return
    reader: _RawReader | None = None
    if direct is not False:
        try:
            reader = await _RawReader.connect(bus)
        except _RawUnavailable as exc:
            if direct:
                raise StreamReadError(f"{stream}: cannot read with a raw connection: {exc}") from None
            log.debug("raw reader unavailable; reading with nats-py's ordered consumer", reason=str(exc))
    chunks = (
        _read_ordered(bus, stream, start_seq, last, subjects, idle_timeout_s, unavailable_wait_s)
        if reader is None
        else _read_raw(bus, reader, stream, start_seq, last, subjects, idle_timeout_s, unavailable_wait_s)
    )
    async for chunk in chunks:
        yield chunk


async def _led_stream_info(bus: Bus, stream: str) -> api.StreamInfo:
    """The stream's info from its leader. A replica of a leaderless stream answers with its own state, which
    may miss messages the others acknowledged: reading up to its last sequence would end the read early."""
    info = await bus.js.stream_info(stream)
    if info.cluster is not None and info.cluster.replicas and info.cluster.leader is None:
        raise _NoLeader(f"{stream} has no leader")
    return info


async def _answered(request: Callable[[], Awaitable[T]], stream: str, wait_s: float) -> T:
    """``request()``'s answer, asking again (0.25 s, doubling to 2 s) while JetStream is temporarily
    unavailable, for up to ``wait_s``; then the last error is raised as it came."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    delay = 0.25
    while True:
        try:
            return await request()
        except _UNAVAILABLE as exc:
            if loop.time() + delay > deadline:
                raise
            log.info("JetStream temporarily unavailable; asking again", stream=stream, error=str(exc) or type(exc).__name__)
        await asyncio.sleep(delay)
        delay = min(2 * delay, 2.0)


async def _read_raw(
    bus: Bus, reader: _RawReader, stream: str, start_seq: int, last: int, subjects: str | None, idle_timeout_s: float,
    unavailable_wait_s: float,
) -> AsyncIterator[list[StreamMessage]]:
    consumer: str | None = None
    try:
        # Named after the reader's inbox: asking again after a lost reply finds the consumer the first request
        # made instead of adding a second one delivering into the same inbox.
        created = await _answered(lambda: bus.js.add_consumer(stream, api.ConsumerConfig(
            name=reader.inbox.rsplit(".", 1)[-1], deliver_subject=reader.inbox, deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start_seq, ack_policy=api.AckPolicy.NONE, max_deliver=1, flow_control=True,
            idle_heartbeat=5.0, mem_storage=True, num_replicas=1, inactive_threshold=30.0, filter_subject=subjects,
        )), stream, unavailable_wait_s)  # fmt: skip
        consumer = created.name
        # what matches the filter from start_seq, as the consumer began (some may be on their way already)
        remaining = (created.num_pending or 0) + ((created.delivered.consumer_seq or 0) if created.delivered else 0)
        seen = start_seq - 1
        while remaining > 0 and seen < last:
            try:
                msgs = await reader.receive(idle_timeout_s)
            except TimeoutError:
                await _stalled(bus, stream, seen, idle_timeout_s)
                return
            seen = msgs[-1][0]
            upto = _upto(msgs, last)
            remaining -= len(msgs)
            if upto:
                yield msgs if upto == len(msgs) else msgs[:upto]
    finally:
        reader.close()
        if consumer is not None:
            with contextlib.suppress(Exception):
                await bus.js.delete_consumer(stream, consumer)


async def _read_ordered(
    bus: Bus, stream: str, start_seq: int, last: int, subjects: str | None, idle_timeout_s: float,
    unavailable_wait_s: float, max_buffer: int = 32_768,
) -> AsyncIterator[list[StreamMessage]]:
    """nats-py's ordered push consumer: flow control and gap recovery (it re-creates the consumer after a lost
    message) done by nats-py, messages handed to one callback. Backpressure: when ``max_buffer`` messages wait
    to be taken, the callback waits too, nats-py withholds the flow-control reply, and the server pauses."""
    buffer: list[StreamMessage] = []
    ready = asyncio.Event()
    room = asyncio.Event()
    room.set()

    async def on_message(msg: Msg) -> None:
        if len(buffer) >= max_buffer:
            room.clear()
            await room.wait()
        seq = _sequences(msg.reply)[0]
        buffer.append((seq, msg.subject, msg.data))
        if len(buffer) >= 1024 or seq >= last or msg.reply.endswith(".0"):
            ready.set()

    sub = await _answered(lambda: bus.js.subscribe(
        subjects or "",
        stream=stream,
        cb=on_message,
        ordered_consumer=True,
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
        config=api.ConsumerConfig(opt_start_seq=start_seq),
        pending_msgs_limit=-1,
        pending_bytes_limit=-1,
    ), stream, unavailable_wait_s)
    try:
        began = await sub.consumer_info()
        remaining = (began.num_pending or 0) + ((began.delivered.consumer_seq or 0) if began.delivered else 0)
        seen = start_seq - 1
        while remaining > 0 and seen < last:
            try:
                await asyncio.wait_for(ready.wait(), 0.05 if buffer else idle_timeout_s)
            except TimeoutError:
                if not buffer:
                    await _stalled(bus, stream, seen, idle_timeout_s)
                    return
            ready.clear()
            if buffer:
                chunk = buffer[:]
                buffer.clear()
                room.set()
                seen = chunk[-1][0]
                remaining -= len(chunk)
                yield chunk[: _upto(chunk, last)]
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def _stalled(bus: Bus, stream: str, seen: int, idle_timeout_s: float) -> None:
    """Nothing arrived for ``idle_timeout_s``: fine when the tail was deleted meanwhile, else a stalled read."""
    now = await bus.js.stream_info(stream)
    if now.state.messages == 0 or now.state.last_seq <= seen:
        return  # the tail was deleted (retention, purge) while we read
    raise StreamReadError(f"{stream}: nothing delivered for {idle_timeout_s:.0f}s after seq {seen}")


def _upto(chunk: list[StreamMessage], last: int) -> int:
    """How many messages of ``chunk`` have sequence ``<= last`` (the read stops where the stream ended)."""
    if chunk[-1][0] <= last:
        return len(chunk)
    return next(i for i, m in enumerate(chunk) if m[0] > last)


# --------------------------------------------------------------------------------------------------
# The raw connection
# --------------------------------------------------------------------------------------------------


class _RawUnavailable(Exception):
    """This connection cannot be mirrored by ``_RawReader``; use nats-py's ordered consumer."""


class _RawReader:
    """A second, minimal NATS connection that receives one ephemeral push consumer's deliveries in bulk.

    It reads the socket in 1 MiB chunks and cuts messages out of them with ``bytes.find``. The consumer is
    created through the bus (JetStream API), ack policy none, flow control and heartbeats on, delivering to an
    inbox only this connection subscribes to; flow-control requests are answered as they are parsed, so the
    server never runs more than its flow-control window ahead of the reader (backpressure). A lost delivery
    (a gap in the consumer sequence) is a ``StreamReadError``: the caller resumes from its stored position.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, inbox: str) -> None:
        self._reader, self._writer = reader, writer
        self._buf = b""
        self._pos = 0
        self.inbox = inbox
        self.next_cseq = 1

    @classmethod
    async def connect(cls, bus: Bus, timeout_s: float = 5.0) -> _RawReader:
        uri = bus.nc.connected_url
        if uri is None or uri.scheme not in ("nats", "") or bus.tls:
            raise _RawUnavailable("not a plain TCP connection")
        creds = bus.credentials
        # A principal may listen only under its own inbox prefix (``credentials.inbox_prefix``).
        inbox = f"{creds.inbox_prefix if creds else '_INBOX'}.irsi_replay_{secrets.token_hex(8)}"
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(uri.hostname, uri.port or 4222, limit=_READ_CHUNK), timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise _RawUnavailable(f"cannot connect: {exc}") from None
        self = cls(reader, writer, inbox)
        try:
            line = await asyncio.wait_for(reader.readline(), timeout_s)
            if not line.startswith(b"INFO "):
                raise _RawUnavailable(f"unexpected greeting {line[:40]!r}")
            info = json.loads(line[5:])
            if info.get("tls_required") or not info.get("headers"):
                raise _RawUnavailable("server requires TLS or lacks headers")
            connect = _connect_options(bus, uri.username, uri.password, info.get("nonce"))
            writer.write(b"CONNECT %s\r\nSUB %s 1\r\nPING\r\n" % (json.dumps(connect).encode(), inbox.encode()))
            while True:
                line = await asyncio.wait_for(reader.readline(), timeout_s)
                if line.startswith(b"PONG"):
                    break
                if line.startswith(b"-ERR") or not line:
                    raise _RawUnavailable(f"server refused the connection: {line.strip()!r}")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.close()

    async def receive(self, timeout_s: float) -> list[StreamMessage]:
        """The deliveries parsed from what has arrived (waiting up to ``timeout_s`` for at least one)."""
        out: list[StreamMessage] = []
        append = out.append
        write = self._writer.write
        buf, pos = self._buf, self._pos
        cseq = self.next_cseq
        while True:
            n = len(buf)
            while True:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                c = buf[pos]
                if c == 72 or c == 77:  # HMSG subject sid [reply] hdr_len total_len / MSG subject sid [reply] len
                    parts = buf[pos:eol].split(b" ")
                    hmsg = c == 72
                    start = eol + 2
                    hdr_end = start + int(parts[-2]) if hmsg else start
                    end = start + int(parts[-1])
                    if end + 2 > n:
                        break
                    pos = end + 2
                    reply = parts[3] if len(parts) == (6 if hmsg else 5) else b""
                    if hmsg and buf[start + 8] == 32:  # "NATS/1.0 100 …": flow control or heartbeat
                        if reply:
                            write(b"PUB %s 0\r\n\r\n" % reply)
                        else:
                            i = buf.find(b"Nats-Consumer-Stalled: ", start, hdr_end)
                            if i >= 0:
                                write(b"PUB %s 0\r\n\r\n" % buf[i + 23:buf.find(b"\r", i)].strip())
                        continue
                    tokens = reply.split(b".")
                    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
                        sseq, dseq = int(tokens[5]), int(tokens[6])
                    elif len(tokens) >= 11:  # $JS.ACK.<domain>.<account>.<stream>.<consumer>.<d>.<sseq>.<cseq>…
                        sseq, dseq = int(tokens[7]), int(tokens[8])
                    else:
                        raise StreamReadError(f"unexpected delivery {buf[pos:eol][:200]!r}")
                    if dseq != cseq:
                        raise StreamReadError(f"delivery {dseq} after {cseq - 1}: a message was lost")
                    cseq += 1
                    append((sseq, parts[1].decode(), buf[hdr_end:end]))
                elif buf.startswith(b"PING", pos):
                    write(b"PONG\r\n")
                    pos = eol + 2
                elif buf.startswith(b"-ERR", pos):
                    raise StreamReadError(f"server error: {buf[pos:eol]!r}")
                else:  # +OK, PONG, INFO
                    pos = eol + 2
            self._buf, self._pos, self.next_cseq = buf, pos, cseq
            if out:
                return out
            data = await asyncio.wait_for(self._reader.read(_READ_CHUNK), timeout_s)
            if not data:
                raise StreamReadError("connection closed")
            buf, pos = buf[pos:] + data, 0


def _connect_options(bus: Bus, user: str | None, password: str | None, nonce: str | None) -> dict[str, Any]:
    """The ``CONNECT`` of the raw connection: the bus's nkey (signing ``nonce``), else the URL's user and
    password or token, else nothing."""
    options: dict[str, Any] = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True,
                               "protocol": 1, "lang": "python-infrarsi", "version": "1",
                               "name": f"infrarsi-{bus.service}-stream-reader"}
    if bus.credentials is not None:
        import nkeys  # nats-py's own dependency for nkeys

        if nonce is None:
            raise _RawUnavailable("the server sent no nonce to sign")
        keys = nkeys.from_seed(bus.credentials.seed_file.read_bytes().strip())
        options.update(nkey=keys.public_key.decode(), sig=base64.b64encode(keys.sign(nonce.encode())).decode())
    elif user and password is None:
        options["auth_token"] = user  # nats://TOKEN@host
    elif user:
        options.update(user=user, **{"pass": password or ""})
    elif nonce is not None:
        raise _RawUnavailable("the server wants a signed nonce and the bus has no nkey")
    return options
