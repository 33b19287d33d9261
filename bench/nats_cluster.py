"""A 3-node JetStream cluster of deploy/nats/secure/cluster, each node in its own network namespace (no benchmark).

Used by bench/chaos_cluster.py (and its slow test). ``NatsCluster`` copies deploy/nats/secure, writes
``auth.conf`` (``infrarsi creds``'s authorization block for a data dir's principals) and test certificates
(``make_certs``: a CA and one certificate per node whose SANs hold the node's address), and turns each node's
config into a runnable one: listening on its namespace's address, its store under the run's directory, routes
to the other nodes' addresses. Everything else — R3-ready JetStream with ``sync_interval: always``, TLS
between the routes and to clients, nkey authorization — is the deployed file's.

Faults: ``kill`` (SIGKILL, as a crashed host), ``start`` again over the same store, ``partition`` (the node's
link on the bridge set down: no packet in or out, connections hang rather than close, as a cut cable) and
``heal``. The namespaces come from ``infrarsi.trial.netns.NetnsNetwork`` and are removed with it.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from infrarsi.bus import credentials
from infrarsi.bus.embedded import answers_healthy, nats_server_binary
from infrarsi.trial.netns import Host, NetnsNetwork

SECURE = Path(__file__).resolve().parents[1] / "deploy" / "nats" / "secure"
NODES = ("n1", "n2", "n3")
CLIENT_PORT, ROUTE_PORT, MONITOR_PORT = 4222, 6222, 8222


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(tls: Path, sans: dict[str, list[str]]) -> None:
    """``tls/ca.pem`` and, per name, ``<name>.pem``/``<name>-key.pem`` signed by it with the given SANs
    (``DNS:…``/``IP:…``), usable as server and as client (route) certificates. Test certificates: 2 days."""
    tls.mkdir(parents=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=infrarsi-test-ca",
            "-keyout", "ca-key.pem", "-out", "ca.pem", cwd=tls)  # fmt: skip
    for name, alt in sans.items():
        (tls / f"{name}.ext").write_text(
            f"subjectAltName={','.join(alt)}\nextendedKeyUsage=serverAuth,clientAuth\n"
        )
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}-key.pem",
                "-out", f"{name}.csr", cwd=tls)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
                "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=tls)  # fmt: skip


def node_config(text: str, address: str, store: Path, routes: dict[str, str]) -> str:
    """A deploy/nats/secure/cluster node config made runnable on ``address`` with its store at ``store``."""
    replaced = {
        f"listen: 0.0.0.0:{CLIENT_PORT}": f"listen: {address}:{CLIENT_PORT}",
        f"http: 127.0.0.1:{MONITOR_PORT}": f"http: {address}:{MONITOR_PORT}",
        f"listen: 0.0.0.0:{ROUTE_PORT}": f"listen: {address}:{ROUTE_PORT}",
        'store_dir: "/data/jetstream"': f'store_dir: "{store}"',
        **{f"nats-route://{name}:{ROUTE_PORT}": f"nats-route://{addr}:{ROUTE_PORT}" for name, addr in routes.items()},
    }
    for old, new in replaced.items():
        if old not in text:
            raise ValueError(f"the deployed node config no longer has {old!r}; update bench/nats_cluster.py")
        text = text.replace(old, new)
    return text


@dataclass
class Node:
    name: str
    host: Host
    config: Path
    process: subprocess.Popen[bytes] | None = None
    partitioned: bool = False

    @property
    def url(self) -> str:
        return f"nats://{self.host.address}:{CLIENT_PORT}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class NatsCluster:
    """Three nodes of deploy/nats/secure/cluster in the namespaces of ``net`` (its first three hosts)."""

    root: Path
    net: NetnsNetwork
    data_dir: Path
    """Whose principals the servers authorize (``credentials.ensure``)."""
    nodes: dict[str, Node] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if shutil.which("openssl") is None:
            raise RuntimeError("openssl is not installed (the cluster's TLS certificates are made with it)")
        secure = self.root / "secure"
        shutil.copytree(SECURE, secure)
        (secure / "auth.conf").write_text(credentials.authorization_block(credentials.ensure(self.data_dir)))
        hosts = dict(zip(NODES, self.net.hosts, strict=False))
        make_certs(secure / "tls", {n: [f"DNS:{n}", f"IP:{h.address}", "DNS:localhost", "IP:127.0.0.1"]
                                    for n, h in hosts.items()})  # fmt: skip
        routes = {n: h.address for n, h in hosts.items()}
        for name, host in hosts.items():
            text = (secure / "cluster" / f"{name}.conf").read_text()
            config = secure / "cluster" / f"{name}.run.conf"
            config.write_text(node_config(text, host.address, self.root / "store" / name, routes))
            self.nodes[name] = Node(name, host, config)

    @property
    def ca_file(self) -> Path:
        return self.root / "secure" / "tls" / "ca.pem"

    @property
    def url(self) -> str:
        """Every node, comma-separated, as ``INFRARSI_NATS_URL`` names a cluster."""
        return ",".join(node.url for node in self.nodes.values())

    def start(self, name: str, *, wait: bool = True, timeout_s: float = 60.0) -> None:
        """Start (or restart over its store) node ``name``; with ``wait``, until it is healthy (a first start of
        the cluster starts every node before waiting: a node is healthy once it has met the others)."""
        node = self.nodes[name]
        with open(self.root / f"{name}.log", "ab") as log:  # the server keeps its own copy of the descriptor
            node.process = self.net.popen(node.host, [str(nats_server_binary()), "-c", str(node.config)],
                                          cwd=self.root / "secure", stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)  # fmt: skip
        if wait:
            self.wait_healthy(name, timeout_s)

    def wait_healthy(self, name: str, timeout_s: float = 60.0) -> None:
        """Until the node's ``/healthz`` says JetStream is up (after a restart: caught up with the others)."""
        node = self.nodes[name]
        url = f"http://{node.host.address}:{MONITOR_PORT}/healthz"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not node.alive():
                raise RuntimeError(f"nats-server {name} exited; log {self.root / f'{name}.log'}:\n{self.log_tail(name)}")
            if answers_healthy(url, timeout_s=2.0):
                return
            time.sleep(0.2)
        raise RuntimeError(f"nats-server {name} not healthy after {timeout_s:.0f}s:\n{self.log_tail(name)}")

    def log_tail(self, name: str, chars: int = 2000) -> str:
        with contextlib.suppress(FileNotFoundError):
            return (self.root / f"{name}.log").read_text(errors="replace")[-chars:]
        return ""

    def kill(self, name: str) -> None:
        """SIGKILL the node's server, as a crash would."""
        node = self.nodes[name]
        if node.process is not None and node.alive():
            node.process.kill()
            node.process.wait()

    def partition(self, name: str) -> None:
        """Cut the node off the bridge (its outer veth down): neither the other nodes nor clients reach it."""
        self.nodes[name].partitioned = True
        subprocess.run(["ip", "link", "set", f"{self.nodes[name].host.name}h", "down"], check=True, timeout=30)

    def heal(self, name: str) -> None:
        subprocess.run(["ip", "link", "set", f"{self.nodes[name].host.name}h", "up"], check=True, timeout=30)
        self.nodes[name].partitioned = False

    def stop(self) -> None:
        """Heal every partition, then stop every node (SIGTERM, SIGKILL after 10 s)."""
        for name, node in self.nodes.items():
            if node.partitioned:
                with contextlib.suppress(subprocess.CalledProcessError):
                    self.heal(name)
            if node.process is not None and node.alive():
                node.process.terminate()
                try:
                    node.process.wait(10)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait()
