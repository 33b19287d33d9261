"""The ``slurm`` backend: each trial is one Slurm batch job (``sbatch``), followed with ``squeue``/``sacct``.

Submit: ``<state_dir>/node-job.json`` holds what every node runs (argv, environment, working directory,
emulated capacity, isolation and what a sandbox binds); ``<state_dir>/job.sh`` is a fixed script, ``srun`` with
one task per node starting ``python -m infrarsi.backends.slurm_node node-job.json`` (the rendezvous on the first
node's address is worked out there, from ``SLURM_JOB_NODELIST``, and the job started inside the trial sandbox). The contract's Slurm options (partition, account, qos,
time limit, gres, constraint, exclusive, extra options) go to ``sbatch --parsable`` as argv items — no
value of the trial or the contract passes through a shell. ``<state_dir>/slurm.json`` records the job id,
so a restarted launcher re-attaches (``attach``) instead of abandoning the job.

Follow: ``squeue --states=all`` (throttled: the launcher polls every 50 ms) until a terminal state; then
the job's accounting record from ``sacct`` — with ``--completion`` on clusters without slurmdbd, where
``JobCompType=jobcomp/filetxt`` keeps the record (``INFRARSI_SLURM_SACCT_COMPLETION=1``; auto-detected
when ``AccountingStorageType`` is none). The cost is Slurm's: elapsed × GPUs (from ``--gres``), or ×
ranks on CPU-only allocations — not the launcher's clock.

How Slurm's ends become facts (the launcher turns facts into statuses): ``OUT_OF_MEMORY``, a node's
emulated-capacity kill or a CUDA OOM in the output → ``oom``; ``TIMEOUT`` → cancelled ``timeout: …``;
``CANCELLED`` by this backend → its reason, by anyone else → ``cancelled outside InfraRSI``;
``NODE_FAIL``/``PREEMPTED``/``BOOT_FAIL`` → ``infrastructure_failure`` (the launcher: ``cancelled``,
``infrastructure``: it costs, the candidate is run again).

Isolation (``JobSpec.isolation``, ``infrarsi.trial.sandbox``) is settled here, at submit, so ``JobHandle.isolation``
(``TrialLaunched.isolation``) is what the job gets: ``sandbox`` → ``bwrap``, and a node that cannot start the
sandbox refuses the job (``slurm_node``); ``auto`` → ``bwrap`` where the launcher's host can start one (the nodes
run the launcher's own Python environment from the shared filesystem, so they are taken to be the same install,
and a node that differs refuses the job rather than run it unisolated under a record that says ``bwrap``), else
``none``; ``none`` → ``none``. The node is told ``sandbox`` or ``none``, never ``auto``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from infrarsi.backends.base import (
    JobHandle,
    JobResult,
    JobSpec,
    ScheduledBackend,
    SubmitError,
    device_oom_detail,
    read_json_record,
)
from infrarsi.backends.local import TAIL_BYTES, job_sandbox, tails_of
from infrarsi.runtime.logs import get_logger
from infrarsi.study.contract import BackendSpec
from infrarsi.trial import sandbox

POLL_EVERY_S = 0.25
TERMINAL = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
    "DEADLINE", "REVOKED", "SPECIAL_EXIT",
}  # fmt: skip
INFRASTRUCTURE = {"NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}
SACCT_FIELDS = ("JobIDRaw", "State", "ExitCode", "ElapsedRaw", "NNodes", "AllocTRES")
log = get_logger(__name__)


class SlurmError(SubmitError):
    """A Slurm command failed: its argv and what it said."""


@dataclass(frozen=True)
class AccountingRecord:
    """What ``sacct`` says of a finished job."""

    state: str
    """The base state (``CANCELLED``, not ``CANCELLED by 0``)."""
    raw_state: str
    exit_code: int
    """The batch script's exit code; negative: killed by that signal."""
    elapsed_s: float
    nnodes: int
    gpus: int | None
    """Allocated GPUs from AllocTRES (``None``: accounting does not say)."""


@dataclass
class _SlurmJob:
    job_id: str
    polled_at: float = 0.0
    state: str | None = None
    ended_at: float | None = None


def parse_sacct(line: str) -> AccountingRecord:
    """One ``sacct -P -n -o JobIDRaw,State,ExitCode,ElapsedRaw,NNodes,AllocTRES`` line."""
    fields = line.split("|")
    job_id, raw_state, exit_code, elapsed, nnodes, tres = fields[:6]
    code, _, signal_no = exit_code.partition(":")
    gpus = None
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key in ("gres/gpu", "gpu"):
            gpus = int(value)
    return AccountingRecord(
        state=raw_state.split()[0] if raw_state else "",
        raw_state=raw_state,
        exit_code=-int(signal_no) if signal_no not in ("", "0") and int(code or 0) == 0 else int(code or 0),
        elapsed_s=float(elapsed or 0),
        nnodes=int(nnodes or 0),
        gpus=gpus,
    )


def gres_gpus(gres: str | None) -> int | None:
    """GPUs per node in a ``--gres`` request (``gpu:8``, ``gpu:a100:4``); ``None`` when it asks for none."""
    for item in (gres or "").split(","):
        parts = item.split(":")
        if parts[0] == "gpu":
            return int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return None


@dataclass(frozen=True)
class SlurmEnd:
    """How a Slurm job's end reads as facts (``JobResult`` fields)."""

    oom_detail: str = ""
    cancelled: str | None = None
    infrastructure_failure: str | None = None


def slurm_end(
    job_id: str, state: str, raw_state: str, *, ours: dict[str, Any] | None, node_oom: dict[str, Any] | None,
    output: str,
    time_limit: str | None,
) -> SlurmEnd:  # fmt: skip
    """Slurm's final state, this backend's own cancel record (``ours``), a node's emulated-OOM record and the
    job's output → the facts the launcher turns into a status."""
    oom_detail = ""
    if node_oom:
        oom_detail = (
            f"rank {node_oom['rank']} RSS {node_oom['rss_bytes']} B exceeded the emulated capacity "
            f"{node_oom['capacity_bytes']} B (Slurm job {job_id})"
        )
    elif state == "OUT_OF_MEMORY":
        oom_detail = f"Slurm job {job_id} ended OUT_OF_MEMORY"
    else:
        oom_detail = device_oom_detail(output)
    cancelled = None
    if state == "TIMEOUT":
        cancelled = f"timeout: Slurm time limit {time_limit} reached (job {job_id})"
    elif ours is not None:
        cancelled = str(ours["reason"])
    elif state == "CANCELLED":
        cancelled = f"cancelled outside InfraRSI: Slurm job {job_id} {raw_state}"
    infrastructure = f"Slurm job {job_id} ended {raw_state}" if state in INFRASTRUCTURE else None
    return SlurmEnd(oom_detail, cancelled, infrastructure)


def node_job(spec: JobSpec, isolation: str, owner: str) -> dict[str, Any]:
    """What ``slurm_node`` reads from ``node-job.json``: ``spec`` with its isolation settled (``sandbox`` for a
    ``JobHandle.isolation`` of ``bwrap``, else ``none``) and the launcher's state root ``owner`` among the paths no
    sandbox bind may hold."""
    settled = dataclasses.replace(
        spec, isolation="sandbox" if isolation == sandbox.SANDBOXED else "none", hidden=[*spec.hidden, owner]
    )
    return {**asdict(settled), "workdir": str(spec.workdir), "state_dir": str(spec.state_dir)}


class SlurmBackend(ScheduledBackend):
    """Trials as Slurm batch jobs. ``owner`` is the launcher's state root (it tags the jobs' comment)."""

    name = "slurm"
    record_name = "slurm.json"

    def __init__(
        self, owner: str, options: BackendSpec | None = None, *, python: str | None = None,
        sacct_completion: bool | None = None,
    ) -> None:
        self.owner = owner
        self.options = options or BackendSpec(kind="slurm")
        self.python = python or sys.executable
        """The interpreter the nodes run (it must exist at the same path there: a shared filesystem)."""
        self._completion = sacct_completion
        """Read the job-completion log instead of the accounting database (``Settings.slurm_sacct_completion``);
        ``None`` until ``scontrol`` was asked."""

    # ---------------------------------------------------------------- lifecycle

    def reap(self) -> int:
        """Nothing is cancelled: a restarted launcher re-attaches to its jobs (``attach``)."""
        return 0

    # ---------------------------------------------------------------- jobs

    def sbatch_argv(self, spec: JobSpec) -> list[str]:
        o = self.options
        argv = [
            "sbatch", "--parsable",
            f"--job-name=irsi-{spec.name}",
            f"--chdir={spec.workdir}",
            f"--output={spec.state_dir / 'slurm-%j.out'}",
            f"--nodes={spec.nnodes}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={spec.nproc_per_node}",
            "--no-requeue",
            f"--comment=infrarsi:{spec.name}",
        ]  # fmt: skip
        argv += [f"--partition={o.partition}"] if o.partition else []
        argv += [f"--account={o.account}"] if o.account else []
        argv += [f"--qos={o.qos}"] if o.qos else []
        argv += [f"--time={o.time_limit}"] if o.time_limit else []
        argv += [f"--gres={o.gres}"] if o.gres else []
        argv += [f"--constraint={o.constraint}"] if o.constraint else []
        argv += ["--exclusive"] if o.exclusive else []
        return [*argv, *o.extra_sbatch, str(spec.state_dir / "job.sh")]

    def job_script(self, spec: JobSpec) -> str:
        """The batch script: fixed text; the only variable parts are this backend's own paths, quoted."""
        node_job = spec.state_dir / "node-job.json"
        return (
            "#!/bin/sh\n"
            f"# InfraRSI trial {spec.name}: one agent per node; what each runs is in node-job.json.\n"
            f"exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 {shlex.quote(self.python)} "
            f"-m infrarsi.backends.slurm_node {shlex.quote(str(node_job))}\n"
        )

    def isolation_for(self, spec: JobSpec) -> str:
        """``sandbox.SANDBOXED`` or ``sandbox.UNISOLATED`` for ``spec`` (see the module docstring)."""
        if spec.isolation == "sandbox":
            return sandbox.SANDBOXED
        if spec.isolation == "auto":
            reason = sandbox.unavailable_reason()
            if reason is None:
                return sandbox.SANDBOXED
            log.warning("Slurm trial runs unisolated: no sandbox on the launcher's host", trial_id=spec.name,
                        reason=reason)  # fmt: skip
        return sandbox.UNISOLATED

    def submit(self, spec: JobSpec) -> JobHandle:
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        isolation = self.isolation_for(spec)
        if isolation == sandbox.SANDBOXED:
            try:  # a bind that would expose the data directory is refused before anything is queued
                sandbox.check(job_sandbox(spec, private_network=spec.nnodes == 1, hidden=(Path(self.owner),)))
            except sandbox.SandboxError as exc:
                raise SubmitError(str(exc)) from None
        (spec.state_dir / "node-job.json").write_text(json.dumps(node_job(spec, isolation, self.owner)))
        (spec.state_dir / "job.sh").write_text(self.job_script(spec))
        for stale in [*spec.state_dir.glob("oom-node*.json"), *spec.state_dir.glob("refused-node*.txt")]:
            stale.unlink()
        started = time.time()
        argv = self.sbatch_argv(spec)
        job_id = _slurm(argv).split(";")[0]
        self.record_submitted(spec, {"job_id": job_id, "started_at": started, "argv": argv, "isolation": isolation})
        return self._handle(spec, job_id, started, argv, isolation)

    def attach(self, spec: JobSpec) -> JobHandle | None:
        if (record := self.submitted(spec)) is None:
            return None
        job_id = str(record["job_id"])
        if self._squeue_state(job_id) is None and self._sacct(job_id) is None:
            return None  # Slurm has forgotten it
        return self._handle(spec, job_id, float(record["started_at"]), list(record["argv"]),
                            str(record.get("isolation", "")))  # fmt: skip

    def poll(self, handle: JobHandle) -> bool:
        job: _SlurmJob = handle.private
        if job.ended_at is not None:
            return True
        now = time.monotonic()
        if now - job.polled_at < POLL_EVERY_S:
            return False
        job.polled_at = now
        job.state = self._squeue_state(job.job_id)
        if job.state is None or job.state in TERMINAL:
            job.ended_at = time.time()
            return True
        return False

    def cancel(self, handle: JobHandle, reason: str) -> None:
        job: _SlurmJob = handle.private
        self.note_cancel(handle, reason)
        if job.ended_at is None:
            _slurm(["scancel", job.job_id])
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not self.poll(handle):
                time.sleep(POLL_EVERY_S)

    def collect(self, handle: JobHandle) -> JobResult:
        job: _SlurmJob = handle.private
        spec = handle.spec
        record = None
        deadline = time.monotonic() + 30  # the accounting record is written as the job completes
        while (record := self._sacct(job.job_id)) is None or record.state not in TERMINAL:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        logs = sorted(spec.state_dir.glob("node*.log")) + list(spec.state_dir.glob(f"slurm-{job.job_id}.out"))
        # a node's sandbox refusal goes last, where the launcher looks for the line that says why the job failed
        # (after srun's own "task 0: Exited with exit code 126")
        refusals = [p.read_text(errors="replace").strip() for p in sorted(spec.state_dir.glob("refused-node*.txt"))]
        output = "\n".join([tails_of(logs), *refusals])
        state = record.state if record else (job.state or "UNKNOWN")
        raw_state = record.raw_state if record else state
        node_ooms = [read_json_record(p) for p in sorted(spec.state_dir.glob("oom-node*.json"))]
        end = slurm_end(
            job.job_id, state, raw_state, ours=self.cancel_note(spec),
            node_oom=node_ooms[0] if node_ooms else None, output=output, time_limit=self.options.time_limit,
        )  # fmt: skip
        peaks: dict[int, int] = {}
        for path in spec.state_dir.glob("peaks-node*.json"):
            peaks.update({int(k): int(v) for k, v in (read_json_record(path) or {}).items()})
        ended = job.ended_at or time.time()
        accelerator_s = None
        if record is not None:
            devices = record.gpus if record.gpus is not None else self._requested_gpus(record.nnodes)
            accelerator_s = record.elapsed_s * (devices if devices is not None else spec.ranks)
        return JobResult(
            exit_code=record.exit_code if record else None,
            wall_s=ended - handle.started_at,
            oom=bool(end.oom_detail),
            oom_detail=end.oom_detail,
            peak_memory_bytes=max(peaks.values(), default=0),
            peak_per_rank=peaks,
            cancelled=end.cancelled,
            output_tail=output[-TAIL_BYTES:],
            accelerator_s=accelerator_s,
            infrastructure_failure=end.infrastructure_failure,
        )

    # ---------------------------------------------------------------- Slurm's commands

    def _handle(self, spec: JobSpec, job_id: str, started: float, argv: list[str], isolation: str) -> JobHandle:
        return JobHandle(
            job_id=job_id,
            spec=spec,
            host="slurm",
            command=argv,
            started_at=started,
            private=_SlurmJob(job_id),
            isolation=isolation,
        )

    def _requested_gpus(self, nnodes: int) -> int | None:
        per_node = gres_gpus(self.options.gres)
        return per_node * nnodes if per_node is not None else None

    def _squeue_state(self, job_id: str) -> str | None:
        """The job's state while slurmctld remembers it; ``None`` once it has forgotten the job."""
        proc = subprocess.run(
            ["squeue", "-h", "-j", job_id, "--states=all", "-o", "%T"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        state = proc.stdout.strip()
        if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
            raise SlurmError(f"squeue -j {job_id}: {proc.stderr.strip()}")
        return state.split()[0] if state else None

    def _sacct(self, job_id: str) -> AccountingRecord | None:
        argv = ["sacct", "-j", job_id, "-P", "-n", "-X", "-o", ",".join(SACCT_FIELDS)]
        if self._use_completion():
            argv.insert(1, "--completion")
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
        for line in out.splitlines():
            if line.split("|")[0] == job_id:
                return parse_sacct(line)
        return None

    def _use_completion(self) -> bool:
        """Read the job-completion log (``sacct --completion``) when there is no accounting database."""
        if self._completion is None:
            conf = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
            match = re.search(r"^AccountingStorageType\s*=\s*(\S+)", conf.stdout, re.MULTILINE)
            self._completion = match is not None and match.group(1).endswith("/none")
        return self._completion


def _slurm(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise SlurmError(f"{argv[0]} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout.strip()


