"""The embedded nats-server start survives a port taken between picking it and binding it.

``free_port`` closes its probe socket before nats-server binds the port, so on a busy host another process can
take it in between (CI once saw "address already in use" on the monitor port). The start then retries with
fresh ports. The race is reproduced by handing ``start`` a port that a socket of the test holds.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from infrarsi.bus import embedded
from infrarsi.bus.embedded import EmbeddedServer, EmbeddedServerError


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def picks_taken_first(monkeypatch: pytest.MonkeyPatch, taken: int) -> list[int]:
    """``free_port`` answers ``taken`` on its first call (the race lost), then real free ports."""
    picked: list[int] = []
    real = embedded.free_port

    def pick() -> int:
        picked.append(taken if not picked else real())
        return picked[-1]

    monkeypatch.setattr(embedded, "free_port", pick)
    return picked


def test_a_taken_monitor_port_is_replaced(
    tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    client_port = embedded.free_port()
    picked = picks_taken_first(monkeypatch, taken_port)
    with EmbeddedServer.start(tmp_path, port=client_port) as server:
        assert picked[0] == taken_port and server.monitor_port not in (taken_port, None)
        assert server.port == client_port, "the client port the caller asked for is kept"
        server.wait_healthy(5)
    log = (tmp_path / "nats-server.log").read_text()
    assert f"127.0.0.1:{taken_port}: bind: address already in use" in log


def test_a_taken_client_port_is_replaced_when_it_was_picked(
    tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    picks_taken_first(monkeypatch, taken_port)
    with EmbeddedServer.start(tmp_path) as server:
        assert server.port != taken_port
        server.wait_healthy(5)


def test_a_taken_client_port_the_caller_named_is_an_error(tmp_path: Path, taken_port: int) -> None:
    with pytest.raises(EmbeddedServerError, match=f"127.0.0.1:{taken_port} \\(address already in use\\)"):
        EmbeddedServer.start(tmp_path, port=taken_port)
    assert not (tmp_path / embedded.SERVER_STATE_FILE).exists()
