"""The local stack: one NATS server and the six services, each in its own process.

Owns starting the stack (the embedded nats-server unless a URL is given, then every service as
``python -m infrarsi_services.<name>``, each in its own process group with its log under
``<data_dir>/logs/``), waiting until every service answers a ping, and stopping it all with no
orphan left behind. ``infrarsi up`` runs it in the foreground; commands such as ``trial`` and ``demo``
start one for their own duration when none is running (``ensure_stack``). It also owns how a CLI
command finds the bus (``connect_for_cli``) and the ping that ``infrarsi status`` shows.

It must not import any service (services are addressed by module name only) nor know what they do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import nats
import nats.errors
import psutil
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from infrarsi.bus import credentials, subjects
from infrarsi.bus.client import Bus, BusError, server_urls
from infrarsi.bus.embedded import (
    SERVER_CONFIG_FILE,
    EmbeddedServer,
    StateFile,
    resolve_nats_url,
    running_server_url,
    server_state,
)
from infrarsi.bus.subjects import PING_SUBJECT
from infrarsi.runtime.logs import get_logger
from infrarsi.runtime.service import PARENT_PID_ENV
from infrarsi.runtime.settings import Settings, env_var

log = get_logger(__name__)

SERVICES = subjects.SERVICES
STACK_STATE_FILE = "stack.json"
PING_WINDOW_S = 0.5
"""How long a ping collects replies: every live service answers within milliseconds on a healthy bus."""

T = TypeVar("T")


class StackError(RuntimeError):
    """The stack could not be started (a service died or never answered), or is already running."""


class NoServerError(BusError):
    """No NATS server was named and no ``infrarsi up`` is running under the data directory."""


# --------------------------------------------------------------------------------------------------
# Ping and CLI connections
# --------------------------------------------------------------------------------------------------


async def ping_services(nc: NATS, timeout_s: float = PING_WINDOW_S) -> list[dict[str, Any]]:
    """Every reply to one ``irsi-svc.ping`` received within ``timeout_s``, sorted by service name.

    Each reply is a service runner's status: ``service``, ``pid``, ``uptime_s``, ``handled``,
    ``dead_lettered``, ``failed``, ``in_flight``, ``last_event_at`` and the service's own fields.
    Several replicas of one service each answer.
    """
    replies: list[dict[str, Any]] = []
    inbox = nc.new_inbox()

    async def on_reply(msg: Msg) -> None:
        with contextlib.suppress(ValueError):
            replies.append(json.loads(msg.data))

    sub = await nc.subscribe(inbox, cb=on_reply)
    try:
        await nc.publish(PING_SUBJECT, b"", reply=inbox)
        await nc.flush()
        await asyncio.sleep(timeout_s)
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    return sorted(replies, key=lambda r: (str(r.get("service")), r.get("pid") or 0))


async def connect_for_cli(
    nats_url: str | None,
    data_dir: Path | str,
    service: str = "cli",
    *,
    ensure: bool = True,
    connect_timeout_s: float = 2.0,
) -> Bus:
    """The bus a CLI command talks to: ``--nats-url``, else ``$INFRARSI_NATS_URL``, else a live ``infrarsi up``.

    ``ensure=False`` leaves the streams as they are (read-only commands such as ``status``; a CLI
    without ``INFRARSI_REPLICAS`` must not re-create a clustered stream with one replica).
    Raises ``NoServerError`` when no server is named or running, ``BusError`` when it cannot be reached.
    """
    url = resolve_nats_url(nats_url, data_dir)
    if url is None:
        raise NoServerError(
            f"no NATS server: pass --nats-url, set INFRARSI_NATS_URL, or start one with `infrarsi up` "
            f"(no running stack under {Path(data_dir).absolute()})"
        )
    return await Bus.connect(
        url, service=service, ensure=ensure, connect_timeout_s=connect_timeout_s, data_dir=data_dir
    )


# --------------------------------------------------------------------------------------------------
# Keeping the harness out of the trials' way
# --------------------------------------------------------------------------------------------------

SERVICE_NICE = 10
"""Niceness of every service but the launcher. The launcher's trial jobs inherit its priority (0); the others
— the modeler's and proposer's refits, the reporter's catch-up into DuckDB, telemetry's folds — then yield
the cores to a running trial instead of sharing them (CFS weights 110 against 1024: under a tenth of a core's
time each while a trial wants every core). Work they defer is done between trials. ``INFRARSI_SERVICE_NICE``
overrides it (0: off)."""
SPARE_CORES_FOR_SERVICES = 4
"""From this many cores on, the services run on the last core alone and the launcher (and so every local
trial job) on the others: a trial's threads and the harness's then never share a core. Below it there is no
core to spare — a 2-core host gives both cores to the job, and niceness alone keeps the services out of its way."""


@dataclass(frozen=True)
class Placement:
    """Where and at which priority one service process runs."""

    nice: int
    cpus: frozenset[int] | None
    """The cores it may run on; ``None``: any."""


def service_placement(name: str, cpus: Iterable[int], env: Mapping[str, str] = os.environ) -> Placement:
    """The launcher at the trials' priority, on every core but the services' one where cores are to spare; the
    other services niced (``SERVICE_NICE``) and, where cores are to spare, on the last core alone."""
    allowed = sorted(cpus)
    raw = env.get("INFRARSI_SERVICE_NICE", str(SERVICE_NICE))
    try:
        nice = max(0, min(19, int(raw)))
    except ValueError:
        raise StackError(f"INFRARSI_SERVICE_NICE={raw!r} is not an integer niceness (0-19)") from None
    spare = len(allowed) >= SPARE_CORES_FOR_SERVICES
    if name == "launcher":
        return Placement(0, frozenset(allowed[:-1]) if spare else None)
    return Placement(nice, frozenset(allowed[-1:]) if spare else None)


def _place(pid: int, placement: Placement) -> None:
    """Apply ``placement`` to a process just started (before it spawns threads of its own)."""
    with contextlib.suppress(OSError):  # a process that already exited; a host without affinity support
        if placement.cpus is not None:
            os.sched_setaffinity(pid, placement.cpus)


# --------------------------------------------------------------------------------------------------
# The stack
# --------------------------------------------------------------------------------------------------


def start_logged(command: list[str], log_path: Path, env: dict[str, str], cwd: Path | None = None,
                 nice: int = 0) -> subprocess.Popen[bytes]:
    """A service process: stdout and stderr appended to ``log_path``, no stdin, and its own session, so a
    terminal's Ctrl-C reaches only us and a group kill reaches everything it started. ``nice``: started
    through ``nice(1)``, so that every thread it ever starts has that niceness (a ``setpriority`` afterwards
    would reach its first thread only)."""
    if nice:
        command = ["nice", "-n", str(nice), *command]
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )


@dataclass
class ServiceProcess:
    """One service process of the stack."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    started_at: float = field(default_factory=time.time)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


def _run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from sync code, also when called from inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def stack_state(data_dir: Path | str) -> StateFile:
    """The record of the ``infrarsi up`` running the stack under ``data_dir``."""
    return StateFile(Path(data_dir) / STACK_STATE_FILE)


def _owner(data_dir: Path) -> str:
    """Who runs the stack under ``data_dir``, for error messages: the ``infrarsi up`` pid, else the server's."""
    for state, what in ((stack_state(data_dir), "infrarsi up"), (server_state(data_dir), "nats-server")):
        if (record := state.live()) is not None:
            return f"{what} pid {record['pid']}"
    return "owner unknown"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def reap_orphaned_server(data_dir: Path | str) -> int | None:
    """Stop the embedded server that a SIGKILLed stack left running under ``data_dir``; its pid, or ``None``.

    The server runs in its own session (a terminal's Ctrl-C reaches only the verb, which stops it in order), so
    SIGKILL of ``infrarsi up`` or ``trial`` leaves it running with no services: every later verb would find it
    and wait on a bus nobody serves. A stack records its own pid (``stack.json``) beside the server's: when
    that process is gone and the server is the one configured for this data dir, it is an orphan, stopped
    cleanly here (SIGTERM flushes JetStream; SIGKILL after 10 s). A server with no stack file was started
    some other way (``EmbeddedServer`` alone) and is left alone.
    """
    data_dir = Path(data_dir).absolute()
    stack, server_record = stack_state(data_dir).read(), server_state(data_dir).read()
    if stack is None or server_record is None:
        return None
    stack_pid, server_pid = stack["pid"], server_record["pid"]
    try:
        server = psutil.Process(server_pid)
        ours = str(data_dir / SERVER_CONFIG_FILE) in server.cmdline()
    except psutil.Error:
        return None
    if _alive(stack_pid) or not ours:
        return None
    log.warning("stopping the nats-server a killed stack left running", pid=server_pid, stack_pid=stack_pid)
    with contextlib.suppress(psutil.Error):
        server.terminate()
        try:
            server.wait(10)
        except psutil.TimeoutExpired:
            server.kill()
            server.wait(10)
    stack_state(data_dir).forget()
    server_state(data_dir).forget()
    return int(server_pid)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group led by ``pid`` (each service is a group leader)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


METRICS_PORT_VAR = env_var("metrics_port")


def env_metrics_port(extra: Mapping[str, str]) -> int | None:
    """The stack's metrics base port: ``INFRARSI_METRICS_PORT`` of ``extra`` (the stack's own env), else of
    this process (validated by ``Settings``); ``None`` when unset."""
    merged = {**os.environ, **extra}
    return Settings.from_env({METRICS_PORT_VAR: merged.get(METRICS_PORT_VAR, "")}).metrics_port


def _metrics_port_of(name: str, base: int | None) -> dict[str, str]:
    """Each service its own port from the base, in ``SERVICES`` order (0 stays 0: each picks a free one)."""
    if base is None:
        return {}
    port = base + SERVICES.index(name) if base else 0
    if port > 65535:
        raise StackError(f"{METRICS_PORT_VAR}={base}: the six services need ports {base}..{base + 5}")
    return {METRICS_PORT_VAR: str(port)}


class Stack:
    """A NATS server (embedded, or the one at ``nats_url``) and service processes, started and stopped together.

    Use as a context manager, or call ``stop()``; both leave no process behind.
    """

    def __init__(self, data_dir: Path, url: str, server: EmbeddedServer | None, env: Mapping[str, str]) -> None:
        self.data_dir = data_dir
        self._url = url
        self.server = server
        """The embedded server this stack started, or ``None`` when it was given a URL."""
        self.env = dict(env)
        self.processes: dict[str, ServiceProcess] = {}

    @property
    def url(self) -> str:
        return self._url

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    # ------------------------------------------------------------------ start

    @classmethod
    def start(
        cls,
        data_dir: Path | str,
        *,
        nats_url: str | None = None,
        services: Iterable[str] = SERVICES,
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = 60.0,
    ) -> Stack:
        """Start the server (unless ``nats_url``) and ``services``; return once every one answers a ping.

        ``env`` is added to this process's environment for the services. On any failure everything
        started so far is stopped and ``StackError`` (or ``EmbeddedServerError``) is raised with the
        failing service's log tail. It blocks for a few seconds: from async code call it as
        ``await asyncio.to_thread(Stack.start, ...)`` (it also works on the loop's thread, blocking it).
        """
        data_dir = Path(data_dir).absolute()
        names = tuple(services)
        unknown = sorted(set(names) - set(SERVICES))
        if unknown:
            raise StackError(f"unknown service(s) {unknown}; known: {', '.join(SERVICES)}")
        if nats_url is None:
            reap_orphaned_server(data_dir)
        if nats_url is None and (running := running_server_url(data_dir)):
            raise StackError(
                f"a stack is already running under {data_dir} (NATS at {running}, {_owner(data_dir)}); "
                "use it (commands find it by themselves), or stop it first"
            )
        data_dir.mkdir(parents=True, exist_ok=True)
        server = EmbeddedServer.start(data_dir, authorize=True) if nats_url is None else None
        url = nats_url if server is None else server.url
        assert url is not None  # one of the two: the given server's URL, or the one just started
        stack = cls(data_dir, url, server, env or {})
        try:
            for name in names:
                stack._spawn(name)
            stack._write_state()
            _run_blocking(stack.wait_ready(names, ready_timeout_s))
        except BaseException:
            stack.stop()
            raise
        log.info("stack started", url=stack.url, services={n: p.pid for n, p in stack.processes.items()})
        return stack

    def _spawn(self, name: str) -> ServiceProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        env = {
            # The proposer and modeler refit small dense models on every event: numpy's threaded BLAS only
            # contends with the training jobs for cores (observe+suggest p50 ~29 ms single-threaded vs ~300 ms
            # with a thread per core on a busy 2-core host, bench/modeler_refit.py). Overridable.
            "OPENBLAS_NUM_THREADS": "1",
            **os.environ,
            **self.env,
            "INFRARSI_DATA_DIR": str(self.data_dir),
            **_metrics_port_of(name, env_metrics_port(self.env)),
            "PYTHONUNBUFFERED": "1",
            PARENT_PID_ENV: str(os.getpid()),  # the service stops if this process dies, even by SIGKILL
        }
        command = [
            sys.executable,
            "-m",
            f"infrarsi_services.{name}",
            "--nats-url",
            self.url,
            "--data-dir",
            str(self.data_dir),
        ]
        placement = service_placement(name, os.sched_getaffinity(0), env)
        process = start_logged(command, log_path, env, nice=placement.nice)
        _place(process.pid, placement)
        self.processes[name] = ServiceProcess(name, process, log_path)
        return self.processes[name]

    def restart(self, name: str) -> ServiceProcess:
        """Start service ``name`` again after it died (its durable consumer resumes where it left off)."""
        old = self.processes.get(name)
        if old is not None and old.alive():
            raise StackError(f"{name} is still running (pid {old.pid})")
        if old is not None:
            _signal_group(old.pid, signal.SIGKILL)  # whatever it left behind in its group
        proc = self._spawn(name)
        self._write_state()
        return proc

    async def wait_ready(self, names: Iterable[str], timeout_s: float) -> list[dict[str, Any]]:
        """Ping until every service in ``names`` answered; raise ``StackError`` if one dies or time runs out."""
        wanted = set(names)
        deadline = time.monotonic() + timeout_s
        admin = credentials.for_principal(credentials.ADMIN, self.data_dir)
        nc = await nats.connect(
            server_urls(self.url),  # a cluster's comma list, as the services take it
            name="infrarsi-stack",
            connect_timeout=5,
            allow_reconnect=False,
            **(admin.connect_options() if admin is not None else {}),
            **credentials.tls_options(),
        )
        try:
            while True:
                self._raise_if_dead(wanted)
                replies = await ping_services(nc, timeout_s=0.25)
                by_pid = {r.get("pid") for r in replies}
                ready = {n for n in wanted if self.processes[n].pid in by_pid}
                if ready == wanted:
                    return replies
                if time.monotonic() > deadline:
                    missing = sorted(wanted - ready)
                    tails = "\n".join(f"--- {n} ---\n{self.processes[n].log_tail(800)}" for n in missing)
                    raise StackError(f"service(s) {missing} did not answer within {timeout_s:.0f}s\n{tails}")
        finally:
            await nc.close()

    def _raise_if_dead(self, names: Iterable[str]) -> None:
        for name in sorted(names):
            proc = self.processes[name]
            if not proc.alive():
                raise StackError(
                    f"service {name} exited with code {proc.process.returncode} during start-up; "
                    f"log {proc.log_path}:\n{proc.log_tail()}"
                )

    # ------------------------------------------------------------------ state

    def alive(self) -> dict[str, bool]:
        """Whether each service process (and ``nats``, when this stack started it) is still running."""
        status = {name: proc.alive() for name, proc in self.processes.items()}
        if self.server is not None:
            status["nats"] = self.server.process is not None and self.server.process.poll() is None
        return status

    def pids(self) -> dict[str, int]:
        out = {name: proc.pid for name, proc in self.processes.items()}
        if self.server is not None and self.server.process is not None:
            out["nats"] = self.server.process.pid
        return out

    def _write_state(self) -> None:
        services = {n: p.pid for n, p in self.processes.items()}
        stack_state(self.data_dir).write(url=self.url, pid=os.getpid(), services=services)

    # ------------------------------------------------------------------ stop

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM every service, wait up to ``timeout_s``, SIGKILL the groups of stragglers, stop the server.

        Services stop before the server so they can drain and ack what they finished.
        Idempotent; safe on a half-started stack.
        """
        for proc in self.processes.values():
            if proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    proc.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.process.wait(max(0.0, deadline - time.monotonic()))
        for proc in self.processes.values():
            if proc.alive():
                log.warning("service did not stop in time; killing its process group", service=proc.name)
            # Also after a clean exit: anything the service left running in its group is an orphan.
            _signal_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.process.wait(5.0)
        if self.server is not None:
            self.server.stop()
        stack_state(self.data_dir).forget()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ensure_stack(
    nats_url: str | None,
    data_dir: Path | str,
    *,
    services: Iterable[str] = SERVICES,
    env: Mapping[str, str] | None = None,
) -> tuple[str, Stack | None]:
    """The URL of the bus to use, starting an embedded stack when no server is named or running.

    Returns ``(url, stack)``: ``stack`` is ``None`` when an existing server was found (``--nats-url``,
    ``$INFRARSI_NATS_URL`` or a live ``infrarsi up``), else a stack the caller must ``stop()``
    (use it as a context manager).
    """
    if nats_url is None:
        reap_orphaned_server(data_dir)  # a killed verb's server, with no services: start a whole stack instead
    url = resolve_nats_url(nats_url, data_dir)
    if url is not None:
        return url, None
    stack = Stack.start(data_dir, services=services, env=env)
    return stack.url, stack


async def ensure_stack_for_verb(
    nats_url: str | None,
    data_dir: Path | str,
    *,
    services: Iterable[str] = SERVICES,
    env: Mapping[str, str] | None = None,
) -> tuple[str, Stack | None]:
    """``ensure_stack`` off the event loop, for a verb that stops the stack in its ``finally``.

    A verb interrupted while its stack starts (Ctrl-C, SIGTERM, SIGHUP: its task is cancelled) never gets the
    stack to stop, yet the worker thread goes on starting it: the services then stop with their parent, but
    the nats-server, in its own session, outlived the verb (``infrarsi demo`` did). Interrupted here, the start
    is awaited to its end and whatever it started is stopped before the interruption goes on.
    """
    # A plain executor future, not a task: asyncio.run cancels every *task* when interrupted, and a cancelled
    # wrapper would lose the stack the thread still returns.
    start = asyncio.get_running_loop().run_in_executor(
        None, functools.partial(ensure_stack, nats_url, data_dir, services=services, env=env)
    )
    try:
        return await asyncio.shield(start)
    except BaseException:
        with contextlib.suppress(Exception):
            _url, stack = await start
            if stack is not None:
                await asyncio.to_thread(stack.stop)
        raise
