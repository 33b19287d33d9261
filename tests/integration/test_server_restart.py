"""A killed embedded nats-server and its clients (issue 16, item 5): nobody retries a dead port forever.

Covers: the server restarts on its old port when that port is free (clients reconnect on their own); a client
that found the server through the data dir follows it to a new port; with no server back it gives up after
a bounded wait, with a reason, instead of retrying forever.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.bus.embedded import EmbeddedServer

pytestmark = pytest.mark.integration


def _event() -> ev.Event:
    return ev.make_event(ev.StudyFinished(reason="restart test", trials=0, accelerator_s=0.0), study_id=ev.new_id(),
                         source="test")  # fmt: skip


async def _publish_within(bus: Bus, timeout_s: float) -> float:
    started = time.monotonic()
    while True:
        try:
            await bus.publish(_event())
            return time.monotonic() - started
        except Exception:  # noqa: BLE001 — still reconnecting
            if time.monotonic() - started > timeout_s:
                raise
            await asyncio.sleep(0.2)


async def test_the_server_restarts_on_its_old_port_and_clients_reconnect(tmp_path) -> None:
    first = EmbeddedServer.start(tmp_path)
    bus = await Bus.connect(first.url, service="test", data_dir=tmp_path)
    try:
        await bus.publish(_event())
        first.kill()
        second = EmbeddedServer.start(tmp_path)
        try:
            assert second.port == first.port
            await _publish_within(bus, 15.0)
            assert (await bus.stream_counts())["IRSI"]["messages"] == 2, "the store survived the kill"
        finally:
            await bus.close()
            second.stop()
    finally:
        await bus.close()


async def test_a_client_follows_the_server_to_a_new_port(tmp_path) -> None:
    first = EmbeddedServer.start(tmp_path)
    bus = await Bus.connect(first.url, service="test", data_dir=tmp_path)
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        first.kill()
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", first.port))  # the old port is taken: the restart must choose another
        squatter.listen()
        second = EmbeddedServer.start(tmp_path)
        try:
            assert second.port != first.port
            await _publish_within(bus, 20.0)
            assert bus.nc.connected_url is not None and bus.nc.connected_url.port == second.port
        finally:
            await bus.close()
            second.stop()
    finally:
        squatter.close()
        await bus.close()


async def test_with_no_server_back_a_client_gives_up_with_the_reason(tmp_path) -> None:
    server = EmbeddedServer.start(tmp_path)
    bus = await Bus.connect(server.url, service="test", data_dir=tmp_path, lost_after_s=2.0)
    try:
        server.kill()
        started = time.monotonic()
        while bus.lost is None and time.monotonic() - started < 15.0:
            await asyncio.sleep(0.2)
        assert bus.lost is not None and "no server runs under" in bus.lost
        assert bus.nc.is_closed
    finally:
        await bus.close()
