"""deploy/nats/secure against a real nats-server: every config parses (``-t``) with the authorization block
``infrarsi creds`` writes and test certificates made here with openssl; the 3-node cluster starts on loopback
with TLS between its routes and to clients, takes an R3 stream, and refuses a client without credentials."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from infrarsi import events as ev
from infrarsi.bus import credentials
from infrarsi.bus.client import Bus, BusError
from infrarsi.bus.embedded import free_port, nats_server_binary

pytestmark = pytest.mark.integration

SECURE = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "secure"
BENCH = Path(__file__).resolve().parents[2] / "bench"  # nats_cluster.make_certs: the test CA, as the cluster bench
CONFIGS = ["single.conf", "cluster/n1.conf", "cluster/n2.conf", "cluster/n3.conf"]
NODES = ("n1", "n2", "n3")


def make_certs(tls: Path) -> None:
    """A CA, and a certificate per server name (SANs: the name, localhost, 127.0.0.1) signed by it."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    from nats_cluster import make_certs as make

    make(tls, {name: [f"DNS:{name}", "DNS:localhost", "IP:127.0.0.1"] for name in ("server", *NODES)})


@pytest.fixture()
def secure(tmp_path: Path) -> Path:
    """A copy of deploy/nats/secure with auth.conf (``infrarsi creds``) and tls/ beside its configs."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    root = tmp_path / "secure"
    shutil.copytree(SECURE, root)
    public = credentials.ensure(tmp_path / "data")
    (root / "auth.conf").write_text(credentials.authorization_block(public))
    make_certs(root / "tls")
    return root


@pytest.mark.parametrize("name", CONFIGS)
def test_secure_config_is_accepted_by_nats_server(secure: Path, name: str) -> None:
    result = subprocess.run([str(nats_server_binary()), "-c", name, "-t"], cwd=secure, capture_output=True,
                            text=True, timeout=30)  # fmt: skip
    assert result.returncode == 0, result.stderr or result.stdout


def _healthy(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz?js-enabled-only=true", timeout=1):
                return
        time.sleep(0.2)
    raise AssertionError(f"node with monitor port {port} not healthy")


async def test_tls_cluster_with_auth(secure: Path, tmp_path: Path, monkeypatch) -> None:
    """The three node configs, ports and store moved to loopback and tmp: they form a cluster over TLS
    routes, an authenticated TLS client creates an R3 stream and publishes, an anonymous one is refused."""
    ports = {n: (free_port(), free_port(), free_port()) for n in NODES}  # client, monitor, route
    procs = []
    try:
        for node in NODES:
            client, monitor, route = ports[node]
            text = (secure / "cluster" / f"{node}.conf").read_text()
            text = text.replace("listen: 0.0.0.0:4222", f"listen: 127.0.0.1:{client}")
            text = text.replace("http: 127.0.0.1:8222", f"http: 127.0.0.1:{monitor}")
            text = text.replace("listen: 0.0.0.0:6222", f"listen: 127.0.0.1:{route}")
            text = text.replace('store_dir: "/data/jetstream"', f'store_dir: "{tmp_path / node}"')
            for other in NODES:
                text = text.replace(f"nats-route://{other}:6222", f"nats-route://127.0.0.1:{ports[other][2]}")
            (secure / "cluster" / f"{node}.local.conf").write_text(text)
            log = open(tmp_path / f"{node}.log", "wb")  # noqa: SIM115 — closed with the process below
            procs.append((subprocess.Popen([str(nats_server_binary()), "-c", f"cluster/{node}.local.conf"],
                                           cwd=secure, stdout=log, stderr=subprocess.STDOUT), log))  # fmt: skip
        for node in NODES:
            _healthy(ports[node][1])
        url = ",".join(f"nats://127.0.0.1:{ports[n][0]}" for n in NODES)
        monkeypatch.setenv(credentials.TLS_CA_ENV, str(secure / "tls" / "ca.pem"))
        with pytest.raises(BusError, match="(?i)authorization"):
            await Bus.connect(url, service="intruder", connect_timeout_s=3.0)
        bus = None
        for _ in range(30):  # the meta leader is elected a moment after the nodes are healthy
            try:
                bus = await Bus.connect(url, service="cli.doctor", data_dir=tmp_path / "data", replicas=3)
                break
            except Exception:  # noqa: BLE001 — "no meta leader" / "insufficient resources" while electing
                await _sleep(1.0)
        assert bus is not None, "no R3 streams on the TLS cluster"
        try:
            ack = await bus.publish(ev.make_event(ev.DoctorRequested(repeats=1), study_id="s1", source="cli.doctor"))
            assert ack.seq == 1
            info = await bus.js.stream_info("IRSI")
            assert info.config.num_replicas == 3 and len(info.cluster.replicas or []) == 2
        finally:
            await bus.close()
    finally:
        for proc, log in procs:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)
