"""Process trees of trials: memory sampling, the emulated-capacity watchdog, killing, and reaping.

Owns what the launcher (and the verifier/doctor through the backends) needs to keep the host clean:

- ``ProcRef``: a process named by (pid, create time), so a recycled pid is never killed by mistake;
- ``MemoryWatchdog``: a thread that samples the RSS of a job's whole process tree every ~50 ms (from
  ``/proc``; what that costs: README's "launcher overhead" row, ``bench/launcher_overhead.py``), keeps the peak per rank (with the kernel's high-water marks),
  and calls back once when a rank exceeds the emulated device capacity (CPU hosts);
- ``kill_all``: SIGTERM (or straight SIGKILL) to every process and its process group, then SIGKILL
  what is left; ``tagged_processes``: every process whose environment carries a launch tag, which is how
  a restarted launcher finds what its previous life left, even processes that moved to their own session
  (torchrun starts each worker with ``start_new_session=True``).

Accounting (docs/trials.md): memory is counted **per rank** — a rank's process and its descendants
(data-loader workers) — against the capacity of one device (``ClusterInfo.memory_capacity_bytes``), as a
device OOM would be. A process is attributed to a rank by the ``RANK`` variable in its environment
(torchrun sets it; children inherit it); processes without one are either rank 0 (a single-process job)
or the launcher's machinery (torchrun agents), which are not a device and are not counted.
RSS is summed over processes, so pages shared by forked workers are counted once per process.

This module must not know about events or the bus.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from infrarsi.runtime.settings import (
    LAUNCH_TAG_VAR,  # re-exported: the backends tag the jobs they start with it
)


@dataclass(frozen=True)
class ProcRef:
    """A process as (pid, create time): survives pid reuse."""

    pid: int
    create_time: float

    @classmethod
    def of(cls, proc: psutil.Process) -> ProcRef:
        return cls(proc.pid, proc.create_time())

    def process(self) -> psutil.Process | None:
        """The live process this names, or ``None`` if it is gone (or the pid now names another)."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > 0.01 or proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return {}


def tagged_processes(prefix: str) -> list[psutil.Process]:
    """Every live process (of this user) whose ``INFRARSI_LAUNCH_TAG`` starts with ``prefix``."""
    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        tag = _environ(proc).get(LAUNCH_TAG_VAR)
        if tag is not None and tag.startswith(prefix):
            found.append(proc)
    return found


def kill_all(procs: Iterable[psutil.Process], *, grace_s: float = 3.0, hard: bool = False) -> int:
    """Terminate every process (and its process group, unless that group is ours); returns how many were live.

    ``hard`` sends SIGKILL at once (an emulated OOM dies like a device OOM: no clean-up in the job).
    """
    procs = [p for p in procs if p.pid != os.getpid()]
    own_group = os.getpgid(0)
    first = signal.SIGKILL if hard else signal.SIGTERM
    groups: set[int] = set()
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError, PermissionError, OSError):
            pgid = os.getpgid(proc.pid)
            if pgid != own_group and pgid not in groups:
                groups.add(pgid)
                os.killpg(pgid, first)
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(first)
    alive = _wait_gone(procs, 0.0 if hard else grace_s)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.kill()
    _wait_gone(alive, 5.0)
    return len(procs)


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until each process has exited (a zombie counts as exited); returns those still alive.

    Never reaps: ``psutil.wait_procs`` would ``waitpid`` our own children and steal their exit status
    from ``subprocess.Popen``, which would then report 0 for a job we killed.
    """
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if is_live(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if is_live(p)]
    return alive


@dataclass(frozen=True)
class MemoryExceeded:
    rank: int
    rss_bytes: int
    capacity_bytes: int


class MemoryWatchdog(threading.Thread):
    """Samples a job's process tree; keeps per-rank peaks; enforces an emulated per-rank capacity.

    ``on_exceed`` is called once, from the watchdog thread, the first time a rank's RSS exceeds
    ``capacity_bytes`` (``None``: only measure). ``on_procs`` is called with every process seen so far
    whenever a new one appears, so a caller can persist them for reaping after its own death.

    Cost (bench/launcher_overhead.py): each sample reads ``/proc/<pid>/status`` of the processes already
    known, nothing else; new descendants are looked up every ``discover_s`` through the kernel's per-thread
    ``children`` lists, not by scanning every process of the host (as psutil's ``children(recursive=True)``
    does: the bench measures both side by side, README's "launcher overhead" row has the figures). The kernel's high-water mark ``VmHWM`` makes the peak exact for a
    one-process rank whatever the interval: a spike that came and went between two samples still counts.
    """

    def __init__(
        self,
        roots: Iterable[int],
        *,
        capacity_bytes: int | None,
        untagged_rank: int | None,
        interval_s: float = 0.05,
        discover_s: float = 0.25,
        on_exceed: Callable[[MemoryExceeded], None] | None = None,
        on_procs: Callable[[list[ProcRef]], None] | None = None,
    ) -> None:
        super().__init__(name="infrarsi-memory-watchdog", daemon=True)
        self._root_pids = list(roots)
        self.capacity_bytes = capacity_bytes
        self.untagged_rank = untagged_rank
        self.interval_s = interval_s
        self.discover_s = discover_s
        self.on_exceed = on_exceed
        self.on_procs = on_procs
        self.peak_per_rank: dict[int, int] = {}
        self.exceeded: MemoryExceeded | None = None
        self.seen: dict[ProcRef, psutil.Process] = {}
        self._live: dict[int, tuple[ProcRef, int | None]] = {}
        """pid → (its ref, its rank) of the tree's processes alive at the last look."""
        self._discovered_at = -math.inf
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(2.0)

    def processes(self) -> list[psutil.Process]:
        """Every process of the job seen so far (some may have exited)."""
        with self._lock:
            return list(self.seen.values())

    @property
    def peak_bytes(self) -> int:
        """Highest per-rank peak seen."""
        return max(self.peak_per_rank.values(), default=0)

    def _discover(self) -> None:
        """Walk the tree from the roots through ``/proc/<pid>/task/<tid>/children``; remember new processes."""
        pending, tree_pids = list(self._root_pids), []
        while pending:
            pid = pending.pop()
            tree_pids.append(pid)
            pending += _children(pid)
        new = []
        for pid in tree_pids:
            if pid in self._live:
                continue
            try:
                proc = psutil.Process(pid)
                ref = ProcRef.of(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            raw = _environ(proc).get("RANK")
            self._live[pid] = (ref, int(raw) if raw is not None and raw.isdigit() else self.untagged_rank)
            if ref not in self.seen:
                new.append((ref, proc))
        if new:
            with self._lock:
                self.seen.update(new)
            if self.on_procs is not None:
                self.on_procs(list(self.seen))

    def sample(self) -> dict[int, int]:
        """One sample: RSS per rank now (also updates peaks and the set of processes seen)."""
        now = time.monotonic()
        if now - self._discovered_at >= self.discover_s:
            self._discover()
            self._discovered_at = now
        per_rank: dict[int, int] = {}
        hwm_per_rank: dict[int, int] = {}
        for pid, (_ref, rank) in list(self._live.items()):
            memory = _status_memory(pid)
            if memory is None:
                del self._live[pid]  # gone (or a zombie): a new process with this pid is found afresh
                continue
            if rank is None:
                continue
            rss, hwm = memory
            per_rank[rank] = per_rank.get(rank, 0) + rss
            # One process's own high-water mark is a moment its rank held at least that much.
            hwm_per_rank[rank] = max(hwm_per_rank.get(rank, 0), hwm)
        for rank, rss in per_rank.items():
            peak = max(rss, hwm_per_rank.get(rank, 0))
            if peak > self.peak_per_rank.get(rank, 0):
                self.peak_per_rank[rank] = peak
        return per_rank

    def run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            self.sample()
            if self.capacity_bytes and self.exceeded is None:
                over = [(peak, rank) for rank, peak in self.peak_per_rank.items() if peak > self.capacity_bytes]
                if over:
                    rss, rank = max(over)
                    self.exceeded = MemoryExceeded(rank=rank, rss_bytes=rss, capacity_bytes=self.capacity_bytes)
                    if self.on_exceed is not None:
                        self.on_exceed(self.exceeded)
            if not any(pid in self._live for pid in self._root_pids):
                return
            self._stopping.wait(max(0.0, self.interval_s - (time.monotonic() - started)))


def _children(pid: int) -> list[int]:
    """Direct children of ``pid``, from the kernel's per-thread lists (a child belongs to the thread that forked it)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                out += [int(c) for c in fh.read().split()]
        except OSError:
            continue
    return out


def _status_memory(pid: int) -> tuple[int, int] | None:
    """(RSS, peak RSS) of a live process in bytes, from ``/proc/<pid>/status``; ``None`` if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            text = fh.read()
    except OSError:
        return None
    rss = hwm = None
    for line in text.split(b"\n"):
        if line.startswith(b"State:") and b"Z" in line.split()[1]:
            return None
        if line.startswith(b"VmHWM:"):
            hwm = int(line.split()[1]) * 1024
        elif line.startswith(b"VmRSS:"):
            rss = int(line.split()[1]) * 1024
            break  # VmRSS follows VmHWM
    if rss is None:
        return None  # a kernel thread or an exiting process: no memory of its own
    return rss, hwm or rss


PSI_CPU = Path("/proc/pressure/cpu")


def cpu_stall_s() -> float | None:
    """Seconds, since boot, in which some task on the host waited for a CPU (PSI ``some total``); ``None``
    where the kernel has no pressure accounting. The difference over a trial is its interference."""
    try:
        first = PSI_CPU.read_text().split("\n", 1)[0]
    except OSError:
        return None
    total = next((f for f in first.split() if f.startswith("total=")), None)
    return int(total.removeprefix("total=")) / 1e6 if total is not None else None


def cpu_seconds(pids: Iterable[int]) -> dict[int, float]:
    """User + system CPU seconds each live process of ``pids`` has used itself (not its children): sampled
    before and after a trial, the difference is what those processes took from the host meanwhile."""
    used: dict[int, float] = {}
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            t = psutil.Process(pid).cpu_times()
            used[pid] = t.user + t.system
    return used


def is_live(proc: psutil.Process) -> bool:
    """Alive and not a zombie (an exited child its parent has not waited for yet)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
