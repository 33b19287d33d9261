"""Emulated hosts on one machine: Linux network namespaces joined by a bridge, each with its own address.

A ``NetnsNetwork`` creates N namespaces ``<prefix>1..N``, a bridge in the root namespace holding the subnet's
first address (the "gateway": daemons in the root namespace are reachable there), and one veth pair per
namespace (``<prefix><i>h`` on the bridge, ``eth0`` inside, the subnet's ``10+i``-th address). Traffic between
two namespaces crosses real interfaces (veth → bridge → veth), so a rendezvous or a gloo ring between them is
a real, if local, network exchange — what a two-node trial needs to be tested honestly on one machine.

Everything is created with ``ip`` (iproute2) and needs root; ``unavailable_reason()`` says why not, for a
test's skip message. ``down()`` removes exactly what ``up()`` created (and what a previous, killed run with
the same names left), nothing else. The local backend uses ``exec_argv`` at run time to start a node's
processes inside its namespace.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any


class NetnsError(RuntimeError):
    """An ``ip`` command failed: its argv and output."""


@dataclass(frozen=True)
class Host:
    """One emulated host: a namespace, its interface inside, its address."""

    name: str
    """The namespace name (``ip netns exec <name> …``)."""
    address: str
    ifname: str = "eth0"


def exec_argv(netns: str, argv: list[str]) -> list[str]:
    """``argv`` run inside namespace ``netns`` (no shell)."""
    return ["ip", "netns", "exec", netns, *argv]


def namespace_address(netns: str, ifname: str = "eth0") -> str:
    """The IPv4 address of ``ifname`` inside ``netns``."""
    out = _ip(["-n", netns, "-4", "-o", "addr", "show", "dev", ifname])
    for field in out.split():
        if "/" in field and field[0].isdigit():
            return field.split("/")[0]
    raise NetnsError(f"namespace {netns!r} has no IPv4 address on {ifname}")


def unavailable_reason() -> str | None:
    """Why namespaces cannot be created here (``None`` when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (this process is not root)"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = "irsi-probe-ns"
    try:
        _ip(["netns", "add", probe])
    except NetnsError as exc:
        return f"`ip netns add` fails here: {exc}"
    try:
        _ip(["netns", "del", probe])
    except NetnsError:
        pass
    return None


class NetnsNetwork:
    """N namespaces on one bridge. ``with NetnsNetwork(...) as net:`` creates and removes them."""

    def __init__(self, prefix: str, bridge: str, subnet: str, hosts: int = 2) -> None:
        if not 1 <= hosts <= 200:
            raise ValueError(f"hosts: {hosts} is not between 1 and 200")
        if len(bridge) > 15 or len(prefix) + 4 > 15:
            raise ValueError("interface names are limited to 15 characters (bridge, prefix + 4)")
        self.prefix = prefix
        self.bridge = bridge
        self.network = ipaddress.ip_network(subnet)
        if self.network.num_addresses < 16 + hosts:
            raise ValueError(f"subnet {subnet} is too small for {hosts} hosts")
        self.gateway = str(self.network.network_address + 1)
        self.hosts = [
            Host(f"{prefix}{i}", str(self.network.network_address + 10 + i)) for i in range(1, hosts + 1)
        ]

    def __enter__(self) -> NetnsNetwork:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        self.down()  # what a killed previous run with these names left
        plen = self.network.prefixlen
        try:
            _ip(["link", "add", self.bridge, "type", "bridge"])
            _ip(["addr", "add", f"{self.gateway}/{plen}", "dev", self.bridge])
            _ip(["link", "set", self.bridge, "up"])
            for host in self.hosts:
                outer = f"{host.name}h"
                _ip(["netns", "add", host.name])
                _ip(["link", "add", outer, "type", "veth", "peer", "name", host.ifname, "netns", host.name])
                _ip(["link", "set", outer, "master", self.bridge, "up"])
                _ip(["-n", host.name, "addr", "add", f"{host.address}/{plen}", "dev", host.ifname])
                _ip(["-n", host.name, "link", "set", host.ifname, "up"])
                _ip(["-n", host.name, "link", "set", "lo", "up"])
                _ip(["-n", host.name, "route", "add", "default", "via", self.gateway])
        except NetnsError:
            self.down()
            raise

    def down(self) -> None:
        for host in self.hosts:
            _quiet(["link", "del", f"{host.name}h"])
            _quiet(["netns", "del", host.name])
        _quiet(["link", "del", self.bridge])

    def exec_argv(self, host: Host, argv: list[str]) -> list[str]:
        return exec_argv(host.name, argv)

    # ``Any`` keywords because they pass through to ``subprocess`` whole; which overload (bytes or text output)
    # applies depends on them, so the result is typed for either.
    def run(self, host: Host, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` inside ``host``'s namespace to completion (``subprocess.run`` keywords pass through)."""
        proc: subprocess.CompletedProcess[Any] = subprocess.run(self.exec_argv(host, argv), **kwargs)
        return proc

    def popen(self, host: Host, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        proc: subprocess.Popen[Any] = subprocess.Popen(self.exec_argv(host, argv), **kwargs)
        return proc


def _ip(args: list[str]) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def _quiet(args: list[str]) -> None:
    subprocess.run(["ip", *args], capture_output=True, timeout=30)
