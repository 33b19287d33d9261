"""Reading a study while a 3-node JetStream cluster has lost its quorum and elects leaders again.

Three real nats-servers on loopback form a cluster (``cluster { routes }``, as deploy/nats/cluster); the lifecycle
stream has three replicas. With two nodes killed, the survivor answers every JetStream request with "JetStream
system temporarily unavailable" (or not at all). A CLI verb's read (``read_study``, through
``bus.reader.read_stream``) started then must wait for the restarted node and the elections, and return
the whole study — before the reads asked again, it failed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import nats.errors
import pytest
from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.bus.embedded import EmbeddedServer, free_port
from infrarsi.bus.subjects import LIFECYCLE_STREAM
from infrarsi.commands.study_log import read_study

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NODES = ("n1", "n2", "n3")


class LoopbackCluster:
    """Three embedded servers joined by routes on loopback; a node restarts on its own ports over its store."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = {n: (free_port(), free_port()) for n in NODES}  # client, route
        routes = ", ".join(f'"nats-route://127.0.0.1:{route}"' for _, route in self.ports.values())
        self.config = {n: f"cluster {{\n  name: irsi-election\n  listen: 127.0.0.1:{self.ports[n][1]}\n"
                          f"  routes: [{routes}]\n}}\n" for n in NODES}  # fmt: skip
        self.servers: dict[str, EmbeddedServer] = {}

    def start(self, node: str) -> None:
        self.servers[node] = EmbeddedServer.start(self.root / node, port=self.ports[node][0], server_name=node,
                                                  extra_config=self.config[node], ready_timeout_s=60.0)  # fmt: skip

    def url(self, node: str) -> str:
        return f"nats://127.0.0.1:{self.ports[node][0]}"

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


async def _connect_r3(url: str) -> Bus:
    """The admin's bus with R3 streams, once the cluster has a meta leader (elected a moment after start)."""
    last: BaseException | None = None
    for _ in range(60):
        try:
            return await Bus.connect(url, service="admin", replicas=3)
        except Exception as exc:  # noqa: BLE001 — "no meta leader" / "insufficient resources" while electing
            last = exc
            await asyncio.sleep(1.0)
    raise AssertionError(f"the cluster never accepted R3 streams: {last}")


async def _unanswered(bus: Bus, timeout_s: float = 60.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        try:
            await bus.js.stream_info(LIFECYCLE_STREAM)
        except nats.errors.Error:
            return True
        await asyncio.sleep(0.5)
    return False


async def test_a_study_read_waits_out_a_lost_quorum(tmp_path: Path) -> None:
    cluster = LoopbackCluster(tmp_path)
    buses: list[Bus] = []
    try:
        for node in NODES:
            cluster.start(node)
        bus = await _connect_r3(cluster.url("n1"))
        buses.append(bus)
        study = "01election00000000000000000"
        published = [ev.make_event(ev.DoctorRequested(repeats=i + 1), study_id=study, source="cli.doctor")
                     for i in range(20)]  # fmt: skip
        for event in published:
            await bus.publish(event)

        # Keep a node that does not lead the stream (a leader cut off from its peers may go on answering
        # reads for a while) and kill the two others: the survivor has no leader to ask.
        leader = (await bus.js.stream_info(LIFECYCLE_STREAM)).cluster.leader
        survivor = next(n for n in NODES if n != leader)
        reader = await Bus.connect(cluster.url(survivor), service="admin", ensure=False)
        buses.append(reader)
        killed = [n for n in NODES if n != survivor]
        for node in killed:
            cluster.servers[node].kill()
        assert await _unanswered(reader), f"{survivor} alone still answered for the R3 stream after 60 s"

        read = asyncio.create_task(read_study(reader, study))
        # The survivor may answer stream info (leader: none) and then not answer creating the consumer; two
        # JetStream requests' 5 s timeouts later, a read that does not ask again has failed.
        await asyncio.sleep(12.0)
        assert not read.done(), f"the read gave up while the quorum was lost: {read.exception()!r}"
        await asyncio.to_thread(cluster.start, killed[0])  # a quorum again: leaders are elected, the read goes on
        events, _ = await asyncio.wait_for(read, timeout=120)
        assert [e.event_id for e in events] == [e.event_id for e in published]
    finally:
        for bus in buses:
            with contextlib.suppress(Exception):
                await bus.close()
        cluster.stop()
