"""``bus.reader.read_stream`` against real nats-servers: its own protocol connection (``_RawReader``) and
nats-py's ordered consumer read the same messages, whole or filtered, open or authenticated (nkeys as the
stack runs, a token, a user and password), under backpressure, and a filter that matches nothing ends the
read at once."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import pytest
from infrarsi import events as ev
from infrarsi.bus import reader as stream_reader
from infrarsi.bus.client import Bus, BusError
from infrarsi.bus.embedded import EmbeddedServer, free_port, nats_server_binary
from infrarsi.bus.reader import StreamMessage, read_stream
from infrarsi.bus.subjects import LIFECYCLE_STREAM, TELEMETRY_STREAM, lifecycle_subject, telemetry_subject

pytestmark = pytest.mark.integration


def _finished(study: str) -> ev.Event:
    return ev.make_event(ev.StudyFinished(reason="r", trials=0, accelerator_s=0.0), study_id=study, source="proposer")


async def _read(bus: Bus, stream: str, start: int = 1, subjects: str | None = None, *, direct: bool) -> list[StreamMessage]:
    reading = [m async for chunk in read_stream(bus, stream, start, subjects=subjects, direct=direct) for m in chunk]
    return reading


async def _both(bus: Bus, stream: str, start: int = 1, subjects: str | None = None) -> list[StreamMessage]:
    """What both transports read (asserted equal); each waits on the server, never on a clock of its own
    beyond the reader's idle timeout, so a read that does not end is a failure after 60 s."""
    raw = await asyncio.wait_for(_read(bus, stream, start, subjects, direct=True), 60)
    ordered = await asyncio.wait_for(_read(bus, stream, start, subjects, direct=False), 60)
    assert raw == ordered
    return raw


@contextlib.contextmanager
def _server_with(tmp_path: Path, *auth: str) -> Iterator[int]:
    """A JetStream nats-server on a free port with ``auth`` flags (``--auth TOKEN``, ``--user U --pass P``)."""
    port = free_port()
    log = open(tmp_path / f"nats-{port}.log", "wb")
    process = subprocess.Popen(
        [str(nats_server_binary()), "-js", "-sd", str(tmp_path / f"js-{port}"), "-a", "127.0.0.1", "-p", str(port), *auth],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield port
    finally:
        process.terminate()
        process.wait(20)
        log.close()


async def _connect(url: str, service: str = "test", **kwargs) -> Bus:
    """Connect once the server answers (it was just started)."""
    for _ in range(100):
        try:
            return await Bus.connect(url, service=service, connect_timeout_s=2.0, **kwargs)
        except BusError:
            await asyncio.sleep(0.1)
    return await Bus.connect(url, service=service, connect_timeout_s=5.0, **kwargs)


async def test_whole_and_filtered_reads_agree_and_a_filter_matching_nothing_ends_at_once(bus: Bus) -> None:
    studies = [ev.new_id() for _ in range(3)]
    for study in studies * 3:
        await bus.publish(_finished(study))
    mine = lifecycle_subject(studies[1], "*")
    filtered = await _both(bus, LIFECYCLE_STREAM, subjects=mine)
    assert [m[1] for m in filtered] == [lifecycle_subject(studies[1], "StudyFinished")] * 3
    assert [m[0] for m in filtered] == sorted(m[0] for m in filtered)
    first = filtered[0][0]
    assert await _both(bus, LIFECYCLE_STREAM, first + 1, mine) == filtered[1:]  # from a start sequence
    assert await _both(bus, LIFECYCLE_STREAM, subjects=lifecycle_subject(ev.new_id(), "*")) == []
    whole = await _both(bus, LIFECYCLE_STREAM, first)
    assert set(filtered) <= set(whole) and whole[0][0] == first
    assert await _both(bus, LIFECYCLE_STREAM, whole[-1][0] + 1) == []  # past the end: nothing, at once


async def test_raw_reader_authenticates_with_the_bus_nkey(tmp_path: Path) -> None:
    """The stack's servers run with nkeys (``authorize=True``): the raw connection signs the server's nonce
    with the bus's own seed and listens under the principal's inbox prefix, as its permissions require."""
    with EmbeddedServer.start(tmp_path / "data", authorize=True) as server:
        proposer = await Bus.connect(server.url, service="proposer", data_dir=server.data_dir)
        reporter = await Bus.connect(server.url, service="reporter", data_dir=server.data_dir)
        try:
            study = ev.new_id()
            for _ in range(5):
                await proposer.publish(_finished(study))
            assert reporter.credentials is not None and reporter.credentials.principal == "reporter"
            raw = await stream_reader._RawReader.connect(reporter)
            raw.close()
            read = await _both(reporter, LIFECYCLE_STREAM, subjects=lifecycle_subject(study, "*"))
            assert len(read) == 5
        finally:
            await proposer.close()
            await reporter.close()


@pytest.mark.parametrize("auth", [("--auth", "s3cret-token"), ("--user", "reader", "--pass", "pw")])
async def test_raw_reader_authenticates_with_the_url_credentials(tmp_path: Path, auth: tuple[str, ...]) -> None:
    with _server_with(tmp_path, *auth) as port:
        userinfo = auth[1] if auth[0] == "--auth" else f"{auth[1]}:{auth[3]}"
        bus = await _connect(f"nats://{userinfo}@127.0.0.1:{port}")
        try:
            study = ev.new_id()
            for _ in range(4):
                await bus.publish(_finished(study))
            assert len(await _both(bus, LIFECYCLE_STREAM)) == 4
        finally:
            await bus.close()
        # the same server refuses the raw connection a wrong secret opens: the reader says so
        wrong = SimpleNamespace(nc=SimpleNamespace(connected_url=urlparse(f"nats://not-{userinfo}@127.0.0.1:{port}")),
                                tls=False, credentials=None, service="test")  # what the reader takes of a Bus
        with pytest.raises(stream_reader._RawUnavailable, match="refused"):
            await stream_reader._RawReader.connect(wrong)  # type: ignore[arg-type]


async def test_a_slow_reader_gets_every_message_in_order_under_flow_control(bus: Bus) -> None:
    """More bytes than the push consumer's flow-control window, taken slowly: the server waits for the
    reader's flow-control replies (backpressure) and nothing is lost or reordered (a gap would raise)."""
    study, trial = ev.new_id(), ev.new_id()
    pad = "x" * 16_000
    events = [
        ev.make_event(ev.TrialStep(step=i, rank=0, world_size=1, loss=None, step_time_s=0.1, phases={pad: 0.1},
                                   tokens=1, optimizer_steps=1, peak_memory_bytes=0),
                      study_id=study, trial_id=trial, source="probe")
        for i in range(1500)
    ]  # ~24 MB
    for i in range(0, len(events), 100):
        await bus.publish_many(events[i:i + 100])
    subject = telemetry_subject(study, trial)
    got: list[StreamMessage] = []
    async for chunk in read_stream(bus, TELEMETRY_STREAM, subjects=subject, direct=True):
        got += chunk
        await asyncio.sleep(0.02)  # a slow projection: the socket fills, the server must wait
    assert len(got) == 1500
    assert [ev.decode(m[2]).payload.step for m in got] == list(range(1500))
