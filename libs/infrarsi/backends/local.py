"""The ``local`` backend: a trial's ranks as subprocesses of this host.

- ``python`` jobs: one process;
- ``torchrun`` jobs: ``nnodes`` torchrun agents (``python -m torch.distributed.run``), each with
  ``--nnodes N --node-rank i --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:<free port>`` — one agent is a
  single node with several ranks; two agents on loopback are a two-node job;
- bare-metal multi-node (``netns``: one network namespace per node, ``infrarsi.trial.netns``): agent ``i`` runs
  inside namespace ``i`` and advertises that namespace's address, the rendezvous is on the first one's
  address, and gloo uses the namespace's interface — the job's traffic crosses a real bridge.

Where the spec asks for isolation (``JobSpec.isolation``: ``sandbox``, or ``auto`` on a host with bubblewrap),
each process is started inside the trial sandbox (``infrarsi.trial.sandbox``): its worktree, its probe directory and
its read-only inputs, nothing else of the host; a one-node job gets no network, the agents of a multi-node job
keep theirs (loopback, or their namespace's). ``sandbox`` on a host that cannot start one is refused
(``SubmitError``, naming why); ``auto`` there runs unisolated, and the handle says so (``JobHandle.isolation``).

Every process is started without a shell, in its own session, with the launch tag in its environment
(``procs.LAUNCH_TAG_VAR``), its output in ``<state_dir>/node<i>.log``, and the pids it has spawned kept in
``<state_dir>/pids.json``. A ``MemoryWatchdog`` per job samples the tree every 50 ms and, when the spec
carries an emulated capacity, SIGKILLs the whole job the moment a rank exceeds it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from infrarsi.backends.base import Backend, JobHandle, JobResult, JobSpec, SubmitError, device_oom_detail
from infrarsi.bus.embedded import free_port
from infrarsi.runtime.logs import get_logger
from infrarsi.runtime.settings import LAUNCH_TAG_VAR
from infrarsi.trial import netns, procs, sandbox

TAIL_BYTES = 6000
log = get_logger(__name__)


@dataclass
class _LocalJob:
    popens: list[subprocess.Popen[bytes]]
    logs: list[Path]
    watchdog: procs.MemoryWatchdog
    tag: str
    ended_at: float | None = None
    cancelled: str | None = None
    oom: procs.MemoryExceeded | None = None
    extra: list[psutil.Process] = field(default_factory=list)


class LocalBackend(Backend):
    """Subprocesses (and torchrun agents) on this host.

    ``owner`` identifies the launcher (its state directory): ``reap`` kills every process tagged with it.
    """

    name = "local"

    def __init__(
        self, owner: str, *, netns: list[str] | None = None, sample_interval_s: float = 0.05, term_grace_s: float = 3.0
    ) -> None:
        self.owner = owner
        self.netns = list(netns or [])
        """Node ``i`` of a multi-node job runs in namespace ``netns[i]`` (an emulated host); empty: loopback."""
        self.sample_interval_s = sample_interval_s
        self.term_grace_s = term_grace_s
        self._live: dict[str, JobHandle] = {}

    # ---------------------------------------------------------------- lifecycle

    def reap(self) -> int:
        found = {p.pid: p for p in procs.tagged_processes(f"{self.owner}|")}
        # Processes that dropped the tag from their environment are still in the pid files.
        state_root = Path(self.owner)
        if state_root.is_dir():
            for pid_file in state_root.glob("*/pids.json"):
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    for item in json.loads(pid_file.read_text()):
                        proc = procs.ProcRef(int(item["pid"]), float(item["create_time"])).process()
                        if proc is not None:
                            found.setdefault(proc.pid, proc)
        return procs.kill_all(found.values(), grace_s=self.term_grace_s) if found else 0

    def live_jobs(self) -> list[JobHandle]:
        return list(self._live.values())

    # ---------------------------------------------------------------- jobs

    def submit(self, spec: JobSpec) -> JobHandle:
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        tag = f"{self.owner}|{spec.name}"
        env = {**spec.env, LAUNCH_TAG_VAR: tag}
        isolation = self.isolation_for(spec)
        commands, shown = self._commands(spec, sandboxed=isolation == sandbox.SANDBOXED)
        if spec.nnodes > 1:
            # Agents on loopback keep gloo there whatever the hostname resolves to; in namespaces, on the
            # namespace's own interface (the bridge), so the ranks' traffic crosses it.
            env.setdefault("GLOO_SOCKET_IFNAME", "eth0" if self.netns else "lo")
        popens, logs = [], []
        started = time.time()
        try:
            for i, argv in enumerate(commands):
                log_path = spec.state_dir / f"node{i}.log"
                logs.append(log_path)
                with open(log_path, "wb") as out:
                    popens.append(
                        subprocess.Popen(
                            argv,
                            cwd=spec.workdir,
                            env=env,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                            start_new_session=True,
                        )
                    )
        except OSError:
            procs.kill_all([psutil.Process(p.pid) for p in popens if p.poll() is None], hard=True)
            raise
        (spec.state_dir / "job.json").write_text(
            json.dumps({"tag": tag, "commands": commands, "pids": [p.pid for p in popens], "started_at": started})
        )
        def on_exceed(exceeded: procs.MemoryExceeded) -> None:
            job.oom = exceeded
            procs.kill_all(job.watchdog.processes(), hard=True)

        def on_procs(refs: list[procs.ProcRef]) -> None:
            with contextlib.suppress(OSError):
                tmp = spec.state_dir / "pids.json.tmp"
                tmp.write_text(json.dumps([{"pid": r.pid, "create_time": r.create_time} for r in refs]))
                tmp.replace(spec.state_dir / "pids.json")

        # on_exceed reads ``job`` when it fires, which is after ``start()``: the job exists by then.
        watchdog = procs.MemoryWatchdog(
            [p.pid for p in popens],
            capacity_bytes=spec.memory_capacity_bytes,
            untagged_rank=0 if spec.launcher == "python" else None,
            interval_s=self.sample_interval_s,
            on_exceed=on_exceed,
            on_procs=on_procs,
        )
        job = _LocalJob(popens=popens, logs=logs, watchdog=watchdog, tag=tag)
        watchdog.start()
        handle = JobHandle(
            job_id=f"local-{popens[0].pid}",
            spec=spec,
            host=socket.gethostname(),
            command=shown[0],
            started_at=started,
            private=job,
            isolation=isolation,
        )
        self._live[spec.name] = handle
        return handle

    def poll(self, handle: JobHandle) -> bool:
        job: _LocalJob = handle.private
        if job.ended_at is not None:
            return True
        if all(p.poll() is not None for p in job.popens):
            job.ended_at = time.time()
            return True
        if job.oom is None and job.watchdog.exceeded is not None:
            job.oom = job.watchdog.exceeded
        # One agent of a multi-node job died: the others would wait for it at the next collective.
        if any(p.poll() not in (None, 0) for p in job.popens) and job.cancelled is None:
            procs.kill_all(job.watchdog.processes(), grace_s=self.term_grace_s)
        return False

    def cancel(self, handle: JobHandle, reason: str) -> None:
        job: _LocalJob = handle.private
        if job.cancelled is None:
            job.cancelled = reason
        live = job.watchdog.processes() + [psutil.Process(p.pid) for p in job.popens if p.poll() is None]
        procs.kill_all(live, grace_s=self.term_grace_s)
        for p in job.popens:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10.0)

    def collect(self, handle: JobHandle) -> JobResult:
        job: _LocalJob = handle.private
        for p in job.popens:
            try:
                p.wait(timeout=30.0)
            except subprocess.TimeoutExpired:
                self.cancel(handle, job.cancelled or "collect: job did not exit")
        ended = job.ended_at or time.time()
        job.watchdog.stop()
        # Whatever outlived the agents (a worker in its own session, a daemonised helper) goes now.
        leftovers = [p for p in job.watchdog.processes() if procs.is_live(p)]
        leftovers += procs.tagged_processes(job.tag)
        if leftovers:
            procs.kill_all(leftovers, grace_s=1.0)
        self._live.pop(handle.spec.name, None)
        output = tails_of(job.logs)
        codes = [p.returncode for p in job.popens]
        exit_code = next((c for c in codes if c != 0), 0)
        oom = job.oom or job.watchdog.exceeded
        if oom is not None:
            detail = f"rank {oom.rank} RSS {oom.rss_bytes} B exceeded the emulated capacity {oom.capacity_bytes} B"
        else:
            detail = device_oom_detail(output)
        return JobResult(
            exit_code=exit_code,
            wall_s=ended - handle.started_at,
            oom=bool(detail),
            oom_detail=detail,
            peak_memory_bytes=job.watchdog.peak_bytes,
            peak_per_rank=dict(job.watchdog.peak_per_rank),
            cancelled=job.cancelled,
            output_tail=output[-TAIL_BYTES:],
        )

    # ---------------------------------------------------------------- helpers

    def isolation_for(self, spec: JobSpec) -> str:
        """``sandbox.SANDBOXED`` or ``sandbox.UNISOLATED`` for ``spec``; ``SubmitError`` when it asks for the
        sandbox and this host cannot start one."""
        if spec.isolation == "none":
            return sandbox.UNISOLATED
        reason = sandbox.unavailable_reason()
        if reason is None:
            return sandbox.SANDBOXED
        if spec.isolation == "sandbox":
            raise SubmitError(f"isolation: sandbox, but {reason}")
        log.warning("trial runs unisolated: no sandbox on this host", trial_id=spec.name, reason=reason)
        return sandbox.UNISOLATED

    def _commands(self, spec: JobSpec, *, sandboxed: bool = False) -> tuple[list[list[str]], list[list[str]]]:
        """Each node's command as started, and as shown (``JobHandle.command``: without the sandbox's ``bwrap``
        prefix, which ``JobHandle.isolation`` stands for)."""
        # One node: its own network namespace. Several: they need each other, on loopback or their namespaces.
        box = job_sandbox(spec, private_network=spec.nnodes == 1, hidden=(Path(self.owner),)) if sandboxed else None
        shown: list[list[str]] = []

        def inside(argv: list[str], netns_name: str | None = None) -> list[str]:
            shown.append(netns.exec_argv(netns_name, argv) if netns_name else argv)
            if box is not None and shutil.which(argv[0], path=spec.env.get("PATH")) is None:
                # inside the sandbox bwrap would find out, after the launch; unsandboxed, Popen does it up front
                raise FileNotFoundError(errno.ENOENT, "No such file or directory (not an executable)", argv[0])
            try:
                boxed = sandbox.wrap(box, argv) if box is not None else argv
            except sandbox.SandboxError as exc:
                raise SubmitError(str(exc)) from None
            return netns.exec_argv(netns_name, boxed) if netns_name else boxed

        if spec.launcher == "python":
            if spec.ranks != 1:
                raise ValueError(f"job {spec.name}: {spec.ranks} ranks need launcher torchrun")
            return [inside(list(spec.argv))], shown
        if not self.netns:
            endpoint = f"127.0.0.1:{free_port()}"
            # Sandboxed agents each have their own PID namespace, so all have the same pid: the rendezvous tells
            # nodes apart by address and pid, so each advertises its own loopback address (127.0.0.<node+1>).
            return [
                inside(torchrun_argv(spec, node, endpoint, local_addr=f"127.0.0.{node + 1}" if box and spec.nnodes > 1 else None))
                for node in range(spec.nnodes)
            ], shown
        if len(self.netns) < spec.nnodes:
            raise ValueError(f"job {spec.name}: {spec.nnodes} nodes but only {len(self.netns)} namespaces (backend.netns)")
        addresses = [netns.namespace_address(ns) for ns in self.netns[: spec.nnodes]]
        endpoint = f"{addresses[0]}:{free_port()}"
        started = [
            inside(torchrun_argv(spec, node, endpoint, local_addr=addresses[node]), self.netns[node])
            for node in range(spec.nnodes)
        ]
        return started, shown


def job_sandbox(spec: JobSpec, *, private_network: bool, hidden: tuple[Path, ...] = ()) -> sandbox.SandboxSpec:
    """What a sandboxed job of ``spec`` sees, on whichever host starts it (this backend's, or a Slurm node's
    ``slurm_node``): its worktree, its writable directories, the Python environment of the interpreter asking,
    an installed tool's own environment (``sandbox.program_inputs``) and the spec's read-only inputs; ``hidden``
    adds paths no bind may hold to the spec's own."""
    return sandbox.SandboxSpec(
        workdir=spec.workdir,
        writable=tuple(Path(p) for p in spec.writable),
        read_only=(*sandbox.python_inputs(), *sandbox.program_inputs(spec.argv),
                   *(Path(p) for p in spec.read_only)),
        private_network=private_network,
        hidden=(*hidden, *(Path(p) for p in spec.hidden)),
    )


def torchrun_argv(spec: JobSpec, node_rank: int | None, endpoint: str, *, local_addr: str | None = None) -> list[str]:
    """Node ``node_rank``'s torchrun agent for ``spec``, its rendezvous at ``endpoint`` (``host:port``).

    ``node_rank=None``: one argv for every node (a pod template); the c10d rendezvous assigns the ranks.

    ``local_addr`` is the address this agent advertises to the others (its own host's); without it torchrun
    uses the hostname, which on one machine with several emulated hosts names the wrong one.
    """
    argv = list(spec.argv)
    if Path(argv[0]).name.startswith("python"):
        python, rest = argv[0], argv[1:]
        script = ["--module", *rest[1:]] if rest[:1] == ["-m"] else rest
    else:
        python, script = "python3", ["--no-python", *argv]
    return [
        python, "-m", "torch.distributed.run",
        "--nnodes", str(spec.nnodes),
        "--nproc-per-node", str(spec.nproc_per_node),
        *(["--node-rank", str(node_rank)] if node_rank is not None else []),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint,
        "--rdzv-id", spec.name,
        "--max-restarts", "0",
        "--monitor-interval", "0.5",
        # torchrun hosts the rendezvous store where the endpoint names this machine's hostname; an emulated
        # host's address never does, so node 0 is told it is the host
        *(["--local-addr", local_addr, "--rdzv-conf", f"is_host={node_rank == 0}".lower()] if local_addr else []),
        *script,
    ]  # fmt: skip


def tail_of(path: Path, size: int = TAIL_BYTES) -> str:
    """The last ``size`` bytes of a log file (empty when it is not there)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def tails_of(paths: list[Path]) -> str:
    """The ends of a job's logs within ``TAIL_BYTES``, each log its equal share under its name.

    A multi-node job's failure is usually on one node while another fills its log with the aftermath (a broken
    rendezvous, a peer's traceback): a single tail of the logs joined kept only the last node's.
    """
    if len(paths) == 1:
        return tail_of(paths[0])
    share = TAIL_BYTES // max(1, len(paths)) - 40
    return "\n".join(f"--- {path.name} ---\n{tail}" for path in paths if (tail := tail_of(path, share)))
