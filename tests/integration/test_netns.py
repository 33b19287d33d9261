"""The emulated-hosts helper: two namespaces on a bridge exchange bytes over their own addresses."""

from __future__ import annotations

import subprocess
import sys

import pytest
from infrarsi.trial import netns

pytestmark = pytest.mark.integration

SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7601)); s.listen(1); print("listening", flush=True)
c, peer = s.accept(); c.sendall(f"hello {peer[0]}".encode()); c.close()
"""
CLIENT = (
    "import socket, sys; print(socket.create_connection((sys.argv[1], 7601), timeout=10).recv(100).decode())"
)


def test_two_hosts_talk_over_their_own_addresses(emulated_hosts) -> None:
    if isinstance(emulated_hosts, str):
        pytest.skip(emulated_hosts)
    net = emulated_hosts  # the session's hosts: the bridge is shared, so no second network here
    a, b = net.hosts
    assert netns.namespace_address(a.name) == a.address != b.address
    server = net.popen(a, [sys.executable, "-c", SERVER, a.address], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().startswith("listening")
        out = net.run(
            b, [sys.executable, "-c", CLIENT, a.address], capture_output=True, text=True, timeout=20
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"hello {b.address}"  # the peer is b's own address, not loopback
    finally:
        server.kill()
        server.wait()
    # a namespace's loopback is its own: b cannot reach a service bound to a's address via 127.0.0.1
    out = net.run(
        b, [sys.executable, "-c", CLIENT, "127.0.0.1"], capture_output=True, text=True, timeout=20
    )
    assert out.returncode != 0
