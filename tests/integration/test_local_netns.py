"""Bare-metal multi-node with the local backend: one torchrun agent per emulated host (network namespace),
the rendezvous on the first host's address and a gloo all-reduce across the bridge."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from infrarsi.backends import JobSpec, LocalBackend

pytestmark = pytest.mark.integration

JOB = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank()) + 1.0])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} allreduce {t.item()} master {os.environ['MASTER_ADDR']}", flush=True)
    dist.destroy_process_group()
    """
)


def rx_bytes(ns: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", "/sys/class/net/eth0/statistics/rx_bytes"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return int(out.stdout)


@pytest.mark.parametrize("isolation", ["none", "sandbox"])
def test_two_node_job_runs_on_two_emulated_hosts(emulated_hosts, tmp_path, isolation, sandbox_ready) -> None:
    """Unisolated, and each agent in the trial sandbox inside its namespace (``ip netns exec … bwrap …``)."""
    if isinstance(emulated_hosts, str):
        pytest.skip(f"no emulated hosts: {emulated_hosts}")
    if isolation == "sandbox" and sandbox_ready is not None:
        pytest.skip(f"no sandbox: {sandbox_ready}")
    first, second = emulated_hosts.hosts
    backend = LocalBackend(str(tmp_path / "state"), netns=[first.name, second.name])
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    spec = JobSpec(
        name="netns-job", argv=[sys.executable, str(work / "job.py")], workdir=work,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, state_dir=tmp_path / "state" / "netns-job",
        launcher="torchrun", nnodes=2, nproc_per_node=1, isolation=isolation,  # type: ignore[arg-type]
    )  # fmt: skip
    rx_before = rx_bytes(second.name)
    handle = backend.submit(spec)
    assert handle.command[:4] == ["ip", "netns", "exec", first.name]
    assert handle.isolation == ("bwrap" if isolation == "sandbox" else "none")
    deadline = time.monotonic() + 300
    while not backend.poll(handle):
        assert time.monotonic() < deadline, "the two-node job did not finish"
        time.sleep(0.2)
    result = backend.collect(handle)
    assert result.exit_code == 0, result.output_tail
    for rank in (0, 1):
        assert f"rank {rank} allreduce 3.0 master {first.address}" in result.output_tail, result.output_tail
    assert (
        rx_bytes(second.name) > rx_before
    )  # the rendezvous and the all-reduce reached it over its interface
