"""One node of a Slurm trial: what ``srun`` starts on each allocated node (``python -m infrarsi.backends.slurm_node``).

The Slurm backend writes everything a node needs into ``<state_dir>/node-job.json`` (the rank's argv, its
environment, the working directory, the emulated capacity) and the job script only runs
``srun … python -m infrarsi.backends.slurm_node <that file>`` — no value of the trial reaches a shell. Here,
on the node:

1. the node's rank is ``SLURM_NODEID``; the rendezvous host is the first node of ``SLURM_JOB_NODELIST``
   (``scontrol show hostnames``), at its ``NodeAddr`` (``scontrol show node``), on a port derived from the
   job id; this node advertises its own ``NodeAddr`` and gloo uses the interface holding it;
2. the torchrun agent (or the single python process) runs as a child, its output in ``node<i>.log``; with
   isolation ``sandbox`` (the backend settled ``auto`` at submit) the child is started inside the trial sandbox
   (``infrarsi.trial.sandbox``, the local backend's ``job_sandbox``): its worktree and probe directory, its read-only
   inputs and the Python environment, a private ``/tmp``, nothing else of the shared data directory; a job of
   one node gets no network (its rendezvous on loopback), the agents of several keep the node's. A node that
   cannot start the sandbox refuses the job (``SANDBOX_REFUSED``, the reason in the node's log and in
   ``refused-node<i>.txt`` for the backend): it never runs unisolated under a record that says ``bwrap``. This process itself stays outside, so the node's log, memory
   records and the signal handling below are out of the job's reach;
3. a ``MemoryWatchdog`` samples the ranks and, with an emulated capacity (CPU hosts), kills the node's
   processes the moment a rank exceeds it, leaving ``oom-node<i>.json`` for the backend to read;
4. a SIGTERM from Slurm (``scancel``, the time limit) is passed to the whole process tree.

The exit status is the child's (or 137 after an emulated OOM, ``SANDBOX_REFUSED`` when the sandbox is missing).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from infrarsi.backends.base import JobSpec
from infrarsi.backends.local import job_sandbox, torchrun_argv
from infrarsi.trial import procs, sandbox

RDZV_PORT_BASE = 29600
RDZV_PORT_SPAN = 2000
SANDBOX_REFUSED = 126
"""The node's exit status when the job asks for the sandbox and this node cannot start one (nothing ran)."""


def node_address(node: str) -> str:
    """The address Slurm reaches ``node`` at (its ``NodeAddr``)."""
    out = subprocess.run(
        ["scontrol", "show", "node", "-o", node], capture_output=True, text=True, check=True
    ).stdout
    for field in out.split():
        if field.startswith("NodeAddr="):
            return field.removeprefix("NodeAddr=")
    return node


def first_node(nodelist: str) -> str:
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
    )
    return out.stdout.split()[0]


def interface_of(address: str) -> str | None:
    """The network interface holding ``address`` on this host (``None`` when none does)."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == address for a in addrs):
            return name
    return None


def rdzv_port(job_id: str) -> int:
    return RDZV_PORT_BASE + int(job_id) % RDZV_PORT_SPAN


def in_sandbox(spec: JobSpec, argv: list[str]) -> list[str]:
    """``argv`` started inside the trial sandbox on this node; ``sandbox.SandboxError`` when this node cannot start
    one (no ``bwrap``, or the kernel refuses its namespaces) or a bind would expose a hidden path."""
    if (reason := sandbox.unavailable_reason()) is not None:
        raise sandbox.SandboxError(reason)
    return sandbox.wrap(job_sandbox(spec, private_network=spec.nnodes == 1), argv)


def main(job_file: Path) -> int:
    job = json.loads(job_file.read_text())
    spec = JobSpec(**{**job, "workdir": Path(job["workdir"]), "state_dir": Path(job["state_dir"])})
    node_rank = int(os.environ.get("SLURM_NODEID", "0"))
    log_path = spec.state_dir / f"node{node_rank}.log"
    sandboxed = spec.isolation != "none"
    env = dict(spec.env)
    if spec.launcher == "python":
        argv = list(spec.argv)
    elif sandboxed and spec.nnodes == 1:
        # the sandbox of a one-node job has only loopback: the rendezvous is there, not on the node's address
        argv = torchrun_argv(spec, node_rank, f"127.0.0.1:{rdzv_port(os.environ['SLURM_JOB_ID'])}")
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    else:
        own = node_address(os.environ["SLURMD_NODENAME"])
        head = node_address(first_node(os.environ["SLURM_JOB_NODELIST"]))
        endpoint = f"{head}:{rdzv_port(os.environ['SLURM_JOB_ID'])}"
        argv = torchrun_argv(spec, node_rank, endpoint, local_addr=own)
        if (ifname := interface_of(own)) is not None:
            env.setdefault("GLOO_SOCKET_IFNAME", ifname)
    if sandboxed:
        try:
            argv = in_sandbox(spec, argv)
        except sandbox.SandboxError as exc:
            refusal = f"SandboxError: isolation: sandbox, refused on node {os.environ.get('SLURMD_NODENAME', '?')}: {exc}"
            with open(log_path, "a") as log:
                log.write(refusal + "\n")
            (spec.state_dir / f"refused-node{node_rank}.txt").write_text(refusal)
            return SANDBOX_REFUSED
    with open(log_path, "ab") as out:
        child = subprocess.Popen(
            argv, cwd=spec.workdir, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    watchdog: procs.MemoryWatchdog | None = None

    def on_exceed(exceeded: procs.MemoryExceeded) -> None:
        (spec.state_dir / f"oom-node{node_rank}.json").write_text(
            json.dumps(
                {
                    "rank": exceeded.rank,
                    "rss_bytes": exceeded.rss_bytes,
                    "capacity_bytes": exceeded.capacity_bytes,
                }
            )
        )
        assert watchdog is not None
        procs.kill_all(watchdog.processes(), hard=True)

    watchdog = procs.MemoryWatchdog(
        [child.pid],
        capacity_bytes=spec.memory_capacity_bytes,
        untagged_rank=0 if spec.launcher == "python" else None,
        on_exceed=on_exceed,
    )
    watchdog.start()

    def on_term(signum: int, _frame: object) -> None:
        procs.kill_all(watchdog.processes() + [psutil.Process(child.pid)], grace_s=2.0)

    signal.signal(signal.SIGTERM, on_term)
    code = child.wait()
    watchdog.stop()
    peaks = {str(rank): peak for rank, peak in watchdog.peak_per_rank.items()}
    (spec.state_dir / f"peaks-node{node_rank}.json").write_text(json.dumps(peaks))
    if watchdog.exceeded is not None:
        return 137
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
