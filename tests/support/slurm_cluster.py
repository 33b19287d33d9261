"""A real Slurm cluster of its own on this machine: munged, slurmctld and two slurmd "nodes".

Each slurmd runs in its own network namespace (``infrarsi.trial.netns``: ``irsi-s1``, ``irsi-s2`` on bridge
``irsisbr0``, 10.213.0.0/24) with its own address, so a two-node job's rendezvous and gloo traffic cross
real interfaces; slurmctld listens on the bridge's address in the root namespace. Where namespaces cannot be
created, one node on 127.0.0.1 (``SlurmCluster.single_node_reason`` says why).

Accounting: no slurmdbd (it needs a MySQL server). ``AccountingStorageType=accounting_storage/none`` and
``JobCompType=jobcomp/filetxt``: every finished job's record (state, exit code, start/end, allocated TRES)
is appended to ``jobcomp.txt``, which ``sacct --completion`` reads — the Slurm backend's accounting source.

Used by the tests' ``slurm_cluster`` fixture and by ``make slurm-up`` / ``make slurm-down``
(``PYTHONPATH=tests python -m support.slurm_cluster up|down``): the cluster's files live under ``BASE`` and
``SLURM_CONF=BASE/slurm.conf`` points the client commands at it. Starting one stops any previous one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from infrarsi.trial import netns
from support import apt

BASE = Path(os.environ.get("INFRARSI_SLURM_BASE", "/run/infrarsi-slurm"))
PACKAGES = ["slurm-wlm", "slurm-client", "munge"]
NETNS_PREFIX = "irsi-s"
BRIDGE = "irsisbr0"
SUBNET = "10.213.0.0/24"
PARTITION = "irsi"


def install_reason() -> str | None:
    """Install Slurm and munge with apt-get when missing; ``None`` when they are there, else why not."""
    return apt.install_reason("Slurm", PACKAGES, ("sbatch", "slurmctld", "slurmd", "munged", "sacct"))


@dataclass
class SlurmCluster:
    base: Path
    nodes: list[tuple[str, str]]
    """(node name, address) per slurmd."""
    network: netns.NetnsNetwork | None
    single_node_reason: str | None
    """Why there is one node only (no namespaces here); ``None`` with two."""

    @property
    def conf(self) -> Path:
        return self.base / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def scontrol(self, *args: str) -> str:
        return _run(["scontrol", *args], env={**os.environ, **self.env})


def emulated_hosts(hosts: int = 2) -> netns.NetnsNetwork:
    """The namespaces this project's tests use (``irsi-s1``…, bridge ``irsisbr0``, 10.213.0.0/24)."""
    return netns.NetnsNetwork(NETNS_PREFIX, BRIDGE, SUBNET, hosts=hosts)


def up(
    base: Path = BASE, *, network: netns.NetnsNetwork | None = None, single_reason: str | None = None
) -> SlurmCluster:
    """Start a cluster under ``base`` (stopping whatever ran there before); raises ``RuntimeError``.

    One slurmd per host of ``network`` (already up; the caller owns it); without one, this creates its own
    two hosts, or runs one node on loopback when namespaces are unavailable (``single_reason`` says why)."""
    if (reason := install_reason()) is not None:
        raise RuntimeError(reason)
    down(base, remove_network=network is None)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    if network is None and single_reason is None:
        single_reason = netns.unavailable_reason()
        if single_reason is None:
            network = emulated_hosts()
            network.up()
    if network is not None:
        ctl_addr = network.gateway
        node_list = [(f"irsi-n{i + 1}", h.address) for i, h in enumerate(network.hosts)]
    else:
        ctl_addr = "127.0.0.1"
        node_list = [("irsi-n1", "127.0.0.1")]
    cluster = SlurmCluster(base, node_list, network, single_reason)
    cluster.conf.write_text(_slurm_conf(base, ctl_addr, node_list))
    # slurmd initialises its cgroup plugin even with proctrack/linuxproc; name the v1 hierarchy outright
    # (autodetection fails on a hybrid mount whose /sys/fs/cgroup is a tmpfs, as in containers).
    cluster.conf.with_name("cgroup.conf").write_text(
        "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n"
    )
    for name, _addr in node_list:
        (base / f"slurmd-{name}").mkdir()
    env = {**os.environ, **cluster.env}
    _start_munge(base)
    _run(["slurmctld", "-f", str(cluster.conf)], env=env)
    for i, (name, _addr) in enumerate(node_list):
        argv = ["slurmd", "-f", str(cluster.conf), "-N", name]
        _run(network.exec_argv(network.hosts[i], argv) if network else argv, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(RuntimeError):
            states = _run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env).split("\n")
            if len(states) == len(node_list) and all(s.split()[1] == "idle" for s in states if s.strip()):
                return cluster
        time.sleep(0.5)
    log = (
        (base / "slurmctld.log").read_text(errors="replace")[-2000:]
        if (base / "slurmctld.log").exists()
        else ""
    )
    down(base, remove_network=False)
    raise RuntimeError(f"the Slurm nodes did not come up within 60 s; slurmctld log tail:\n{log}")


def down(base: Path = BASE, *, remove_network: bool = True) -> None:
    """Cancel the cluster's jobs, stop the daemons started under ``base`` (by their pid files); remove the
    namespaces unless told not to. (A stopped slurmd leaves its job steps running: they are cancelled first.)"""
    if (base / "slurm.conf").exists():
        env = {**os.environ, "SLURM_CONF": str(base / "slurm.conf")}
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["scancel", f"--partition={PARTITION}"], env=env, capture_output=True, timeout=30)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                left = subprocess.run(["squeue", "-h", "-t", "running,completing"], env=env, capture_output=True,
                                      text=True, timeout=30)  # fmt: skip
                if left.returncode != 0 or not left.stdout.strip():
                    break
                time.sleep(0.5)
    for pid_file in sorted(base.glob("*.pid")) if base.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text().split()[0])
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                os.kill(pid, 0)
                time.sleep(0.1)
    if remove_network:
        emulated_hosts().down()


def _start_munge(base: Path) -> None:
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        _run(["mungekey", "--create", "--keyfile", str(key)])
    for path in (Path("/run/munge"), Path("/var/log/munge"), Path("/var/lib/munge")):
        path.mkdir(parents=True, exist_ok=True)
    socket_path = Path("/run/munge/munge.socket.2")
    if socket_path.exists() and subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
        return  # a munged already answers
    _run(["munged", "--force", "--pid-file", str(base / "munged.pid")])


def _slurm_conf(base: Path, ctl_addr: str, nodes: list[tuple[str, str]]) -> str:
    cpus = os.cpu_count() or 1
    node_lines = "\n".join(
        f"NodeName={name} NodeAddr={addr} CPUs={cpus} RealMemory=2000 State=UNKNOWN" for name, addr in nodes
    )
    return f"""\
# Written by tests/support/slurm_cluster.py: a test cluster on one machine.
ClusterName=irsi
SlurmctldHost={socket.gethostname()}({ctl_addr})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation={base}/ctld
SlurmdSpoolDir={base}/slurmd-%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd-%n.pid
SlurmctldLogFile={base}/slurmctld.log
SlurmdLogFile={base}/slurmd-%n.log
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={base}/jobcomp.txt
JobAcctGatherType=jobacct_gather/none
MinJobAge=600
KillWait=3
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
{node_lines}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def _run(argv: list[str], env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}"
        )
    return proc.stdout.strip()


if __name__ == "__main__":
    match sys.argv[1:]:
        case ["up"]:
            c = up()
            note = f" (one node: {c.single_node_reason})" if c.single_node_reason else ""
            print(f"Slurm cluster up{note}: nodes {[n for n, _ in c.nodes]}")
            print(f"export SLURM_CONF={c.conf}")
        case ["down"]:
            down()
            print("Slurm cluster stopped")
        case _:
            sys.exit("usage: python -m support.slurm_cluster up|down")
