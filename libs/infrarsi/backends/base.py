"""The launcher's backend interface: where and how a trial's processes run.

A backend runs *jobs*: one command per rank, laid out over nodes, with an environment and a working
directory. It reports facts (exit code, wall time, memory peaks, whether memory ran out, the output's
tail); the launcher decides what they mean for the trial (ok, crash, timeout, oom…).

Calling order and consistency rules:

1. ``open()`` once, before anything else; then ``reap()`` once, to clean up after a previous life of the
   same owner (a launcher killed mid-trial);
2. per job: ``submit(spec)`` → ``poll(handle)`` repeatedly until it returns ``True`` → ``collect(handle)``
   once. ``cancel(handle, reason)`` may come at any time between ``submit`` and ``collect``, any number of
   times; the job then ends and ``poll`` turns ``True``. ``collect`` leaves no process of the job behind;
3. ``close()`` once, at the end; it cancels whatever is still running.

A backend whose jobs outlive the launcher (``survives_launcher``: a scheduler runs them, not this process)
is not reaped for running jobs: a restarted launcher calls ``attach(spec)`` for a trial it had submitted and
follows the same job to its end. ``ScheduledBackend`` is the base of those (Slurm, Kubernetes): it keeps the
submitted job's record and the cancel reason in the job's state directory, where the next life finds them.

The launcher calls ``submit``, ``poll``, ``cancel`` and ``collect`` from worker threads (``asyncio.to_thread``),
so they may block (an ``sbatch``, an API call); calls for different jobs may run at the same time in different
threads, so state shared between jobs needs a lock. Several jobs may run at once.
Slurm (sbatch/squeue/scancel) and Kubernetes (Job manifests) fit the same five calls.
"""

from __future__ import annotations

import json
import re
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

DEVICE_OOM = re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError|HIP out of memory|\bMemoryError\b")
"""What a real out-of-memory leaves in a rank's output."""


def device_oom_detail(output: str) -> str:
    """``JobResult.oom_detail`` for a job whose ``output`` reports a device out-of-memory (``DEVICE_OOM``): that
    line, at most 300 characters; ``""`` when it reports none."""
    match = DEVICE_OOM.search(output)
    if match is None:
        return ""
    line_start = output.rfind("\n", 0, match.start()) + 1
    line_end = output.find("\n", match.end())
    return f"out-of-memory reported by the job: {output[line_start : line_end if line_end != -1 else None].strip()[:300]}"


def read_json_record(path: Path) -> dict[str, Any] | None:
    """A JSON object a job or the launcher wrote to a state directory (a cancel note, a node's OOM, a submitted
    job), or ``None`` when it is missing or unreadable (not written yet, or torn by a kill)."""
    try:
        record: dict[str, Any] = json.loads(path.read_text())
        return record
    except (OSError, ValueError):
        return None


class SubmitError(Exception):
    """The scheduler refused the job (``sbatch`` failed, the API answered an error): nothing runs."""


@dataclass(frozen=True)
class JobSpec:
    """One job: what to run for each rank, where, with what environment."""

    name: str
    """Unique job name (the trial id)."""
    argv: list[str]
    """One rank's command, no shell. For ``torchrun`` jobs ``argv[0]`` is the Python interpreter."""
    workdir: Path
    """Working directory of every rank (the trial's materialised workload)."""
    env: dict[str, str]
    """Environment of every rank (complete: the backend adds only its own rank/rendezvous variables)."""
    state_dir: Path
    """A directory the backend may write to (logs, pid files); it outlives the job."""
    launcher: Literal["python", "torchrun"] = "python"
    """``python``: one process; ``torchrun``: ``nnodes`` torchrun agents with ``nproc_per_node`` ranks each."""
    nnodes: int = 1
    nproc_per_node: int = 1
    memory_capacity_bytes: int | None = None
    """Per rank. Set on hosts whose devices do not enforce it themselves (CPU): the backend emulates it."""
    isolation: Literal["auto", "sandbox", "none"] = "none"
    """What the contract asks (``backend.isolation``; ``infrarsi.trial.sandbox``): the local backend sandboxes the
    job for ``sandbox`` (or refuses it, ``SubmitError``, where it cannot) and for ``auto`` where it can; the Slurm
    backend has each node do the same (``slurm_node``). The Kubernetes backend ignores it: a pod is its own
    boundary, and mounts only the trial's paths of the volume claim."""
    read_only: list[str] = field(default_factory=list)
    """Paths a sandboxed job may read (the launch file, the contract's inputs; the sandbox adds the Python
    environment); a Kubernetes pod mounts those on the volume claim read-only."""
    writable: list[str] = field(default_factory=list)
    """Directories a sandboxed job may write besides ``workdir`` (its probe directory); a Kubernetes pod mounts
    them from the volume claim read-write."""
    hidden: list[str] = field(default_factory=list)
    """Paths a sandboxed job must never see (the data directory): a read-only input holding one is refused."""

    @property
    def ranks(self) -> int:
        return self.nnodes * self.nproc_per_node


@dataclass
class JobHandle:
    """A submitted job, as the backend knows it."""

    job_id: str
    spec: JobSpec
    host: str
    command: list[str]
    """What was started (of node 0, for multi-node jobs), for the record; without a sandbox's own prefix
    (``bwrap …``), which ``isolation`` names."""
    started_at: float
    """Unix time of the submit."""
    private: Any = field(default=None, repr=False)
    """The backend's own state of the job."""
    isolation: str = ""
    """What kept the job from the host (``TrialLaunched.isolation``): ``bwrap``, ``none``, or ``""`` (the
    backend does not say: Kubernetes, the simulator)."""


@dataclass(frozen=True)
class JobResult:
    """What the backend saw of a finished job."""

    exit_code: int | None
    """0 when every process exited 0; else the first failure's code (negative: killed by that signal)."""
    wall_s: float
    """From submit until every process had exited."""
    oom: bool = False
    """Memory ran out: the emulated capacity was exceeded (the job was killed) or a device OOM was reported."""
    oom_detail: str = ""
    peak_memory_bytes: int = 0
    """Highest per-rank peak seen (0 when the backend cannot see memory)."""
    peak_per_rank: dict[int, int] = field(default_factory=dict)
    cancelled: str | None = None
    """The reason given to ``cancel``, if it was cancelled."""
    output_tail: str = ""
    accelerator_s: float | None = None
    """Device-seconds as the scheduler accounted them (Slurm's ``sacct``); ``None``: ranks × ``wall_s``."""
    infrastructure_failure: str | None = None
    """The job ended because of the infrastructure (a node failed, it was preempted), not the candidate."""


class Backend(ABC):
    """Runs jobs. See the module docstring for the calling order."""

    name: ClassVar[str]
    survives_launcher: ClassVar[bool] = False
    """Jobs keep running when the launcher dies (a scheduler holds them) and can be re-attached."""

    def open(self) -> None:  # noqa: B027 — a no-op hook by design
        """Acquire what the backend needs (connections, directories). Default: nothing."""

    def reap(self) -> int:
        """Cancel every job a previous life of this owner left running; returns how many processes/jobs."""
        return 0

    def attach(self, spec: JobSpec) -> JobHandle | None:
        """The job a previous life submitted for ``spec`` (same name and state directory), if the backend still
        knows it; ``None`` otherwise. Only backends that ``survives_launcher``."""
        return None

    def live_jobs(self) -> list[JobHandle]:
        """The jobs submitted and not yet collected, for ``close``. Default: none (the backend tracks none)."""
        return []

    def close(self) -> None:
        """Release everything: cancel and collect every live job (``live_jobs``). A backend that holds more (a
        client) releases it after calling this."""
        for handle in self.live_jobs():
            self.cancel(handle, "backend closed")
            self.collect(handle)

    @abstractmethod
    def submit(self, spec: JobSpec) -> JobHandle:
        """Start the job; returns at once."""

    @abstractmethod
    def poll(self, handle: JobHandle) -> bool:
        """``True`` once every process of the job has exited."""

    @abstractmethod
    def cancel(self, handle: JobHandle, reason: str) -> None:
        """End the job now (idempotent)."""

    @abstractmethod
    def collect(self, handle: JobHandle) -> JobResult:
        """The job's result; call once, after ``poll`` returned ``True``."""


class ScheduledBackend(Backend):
    """A backend whose jobs a scheduler holds (Slurm, Kubernetes): they outlive the launcher
    (``survives_launcher``), so what was submitted and why a job was cancelled live in the job's state
    directory, where a restarted launcher finds them (``attach``, ``collect``)."""

    survives_launcher = True
    record_name: ClassVar[str]
    """The file of ``state_dir`` that records a submitted job (``slurm.json``, ``kubernetes.json``)."""
    CANCEL_NOTE: ClassVar[str] = "cancel.json"

    def record_submitted(self, spec: JobSpec, record: dict[str, Any]) -> None:
        """Keep what ``attach`` needs to follow the job again."""
        (spec.state_dir / self.record_name).write_text(json.dumps(record))

    def submitted(self, spec: JobSpec) -> dict[str, Any] | None:
        """The record of the job a previous life submitted for ``spec``; ``None``: none, or torn by a kill."""
        return read_json_record(spec.state_dir / self.record_name)

    def note_cancel(self, handle: JobHandle, reason: str) -> None:
        """Keep the reason of a cancel; the first one wins (a restarted launcher still knows it was ours)."""
        note = handle.spec.state_dir / self.CANCEL_NOTE
        if not note.exists():
            note.write_text(json.dumps({"reason": reason, "at": time.time()}))

    def cancel_note(self, spec: JobSpec) -> dict[str, Any] | None:
        """The note ``note_cancel`` kept (``reason``, ``at``), or ``None``: the job was not cancelled by us."""
        return read_json_record(spec.state_dir / self.CANCEL_NOTE)
