"""Trials through a real Slurm cluster (the ``slurm_cluster`` fixture: slurmctld + two slurmd in their own
network namespaces), with the real launcher and telemetry services on a real nats-server.

Covers: the reference dense workload on one node and on two nodes (rendezvous and gloo across the bridge; each
node's job in the trial sandbox, isolation left at ``auto``), an
emulated-capacity OOM reported ``oom`` from the Slurm job, a timeout ended with ``scancel``, a launcher killed
mid-trial that re-attaches to its job, a job cancelled from outside InfraRSI, and a node lost mid-job
(``NODE_FAIL``: an infrastructure failure).
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from infrarsi_services.launcher.service import LauncherService
from infrarsi_services.telemetry.service import TelemetryService
from test_launcher_helpers import git_worktrees, launcher_processes, make_workload, serving

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

GPT = Path(__file__).resolve().parents[2] / "workloads" / "gpt"
SLURM = {"kind": "slurm", "time_limit": "10"}


@pytest.fixture
async def harness(tmp_path, slurm_cluster):
    async with serving(
        tmp_path,
        lambda h, url: LauncherService(h.data_dir, nats_url=url),
        lambda h, url: TelemetryService(complete_grace_s=5.0),
    ) as h:
        yield h


def squeue(job_id: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-j", job_id, "--states=all", "-o", "%T"], capture_output=True, text=True
    ).stdout.strip()


def wait_until_running(job_id: str, timeout_s: float = 60.0) -> None:
    """Slurm starts a submitted job when a node takes it; the caller's next assertion says if it never did."""
    deadline = time.monotonic() + timeout_s
    while squeue(job_id) != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)


def node_state(node: str) -> str:
    return subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True).stdout.strip()


def rx_bytes(ns: str) -> int:
    path = "/sys/class/net/eth0/statistics/rx_bytes"
    return int(
        subprocess.run(
            ["ip", "netns", "exec", ns, "cat", path], capture_output=True, text=True, check=True
        ).stdout
    )


def gpt_contract(tmp_path: Path, name: str, backend: dict) -> Path:
    """The reference contract ``name`` with its repo made absolute and the given backend."""
    contract = yaml.safe_load((GPT / "contracts" / f"{name}.yaml").read_text())
    contract["workload"]["repo"] = str(GPT)
    contract["backend"] = {**backend, "timeout_s": 900}
    path = tmp_path / f"{name}-slurm.yaml"
    path.write_text(yaml.safe_dump(contract))
    return path


async def test_dense_1node_through_slurm(harness, tmp_path) -> None:
    study = await harness.create_study(gpt_contract(tmp_path, "dense-1node", SLURM))
    trial = await harness.propose(study, kind="baseline", steps=2)
    launched = await harness.wait_for(trial, "TrialLaunched", timeout_s=60)
    assert launched.backend == "slurm" and launched.job_id.isdigit()
    assert launched.isolation == "bwrap"  # isolation left at auto: the node started it in the sandbox
    finished = await harness.wait_for(trial, "TrialFinished", timeout_s=600)
    assert finished.status == "ok", finished.output_tail
    assert finished.steps_completed == 2
    assert squeue(launched.job_id) == "COMPLETED"
    # the cost is Slurm's accounting (elapsed × ranks on a CPU allocation), not the launcher's clock
    assert 0 < finished.accelerator_s <= finished.wall_s + 1.0
    measured = await harness.wait_for(trial, "TrialMeasured", timeout_s=60)
    assert measured.steps == 2


async def test_two_node_trial_rendezvous_across_namespaces(harness, tmp_path, slurm_cluster) -> None:
    if slurm_cluster.single_node_reason is not None:
        pytest.skip(f"one Slurm node only: {slurm_cluster.single_node_reason}")
    study = await harness.create_study(gpt_contract(tmp_path, "dense-2node", SLURM))
    second = slurm_cluster.network.hosts[1].name
    rx_before = rx_bytes(second)
    trial = await harness.propose(study, kind="baseline", steps=2)
    launched = await harness.wait_for(trial, "TrialLaunched", timeout_s=60)
    finished = await harness.wait_for(trial, "TrialFinished", timeout_s=600)
    assert finished.status == "ok", finished.output_tail
    assert finished.ranks == 2 and finished.steps_completed == 2
    assert launched.isolation == "bwrap"  # each agent in its sandbox, keeping its node's network
    tdir = harness.data_dir / "launcher" / "trials" / trial
    assert (tdir / "node0.log").exists() and (tdir / "node1.log").exists()  # one agent per node
    job = subprocess.run(["scontrol", "show", "job", launched.job_id], capture_output=True, text=True).stdout
    assert "NumNodes=2" in job and "NodeList=irsi-n[1-2]" in job, job
    # DDP's gradient all-reduce (1.9M fp32 parameters per step) reached the second node over its interface
    assert rx_bytes(second) - rx_before > 4 << 20
    measured = await harness.wait_for(trial, "TrialMeasured", timeout_s=60)
    assert measured.steps == 2 and len(measured.peak_memory_bytes) == 2


async def test_emulated_oom_is_reported_oom_from_the_slurm_job(harness, tmp_path) -> None:
    study = await harness.create_study(make_workload(tmp_path, capacity=150 << 20, backend=SLURM))
    trial = await harness.propose(study, knobs={"knobs.mode": "hog", "knobs.sleep": 0.05})
    launched = await harness.wait_for(trial, "TrialLaunched", timeout_s=60)
    finished = await harness.wait_for(trial, "TrialFinished", timeout_s=120)
    assert finished.status == "oom", finished
    assert "emulated capacity" in finished.reason and f"Slurm job {launched.job_id}" in finished.reason
    assert finished.censored_peak_bytes and finished.censored_peak_bytes > 150 << 20
    assert squeue(launched.job_id) == "FAILED"


async def test_timeout_is_cancelled_with_scancel(harness, tmp_path) -> None:
    study = await harness.create_study(make_workload(tmp_path, timeout_s=4.0, backend=SLURM))
    trial = await harness.propose(study, knobs={"knobs.mode": "sleep"})
    launched = await harness.wait_for(trial, "TrialLaunched", timeout_s=60)
    finished = await harness.wait_for(trial, "TrialFinished", timeout_s=120)
    assert finished.status == "timeout" and "still running after 4s" in finished.reason, finished
    assert squeue(launched.job_id) == "CANCELLED"
    assert finished.accelerator_s > 0


async def test_job_cancelled_from_outside_is_cancelled(harness, tmp_path) -> None:
    study = await harness.create_study(make_workload(tmp_path, timeout_s=120.0, backend=SLURM))
    trial = await harness.propose(study, knobs={"knobs.mode": "sleep"})
    launched = await harness.wait_for(trial, "TrialLaunched", timeout_s=60)
    wait_until_running(launched.job_id)
    subprocess.run(["scancel", launched.job_id], check=True)  # an operator, not InfraRSI
    finished = await harness.wait_for(trial, "TrialFinished", timeout_s=60)
    assert finished.status == "cancelled", finished
    assert "cancelled outside InfraRSI" in finished.reason and launched.job_id in finished.reason


async def test_killed_launcher_reattaches_to_its_slurm_job(tmp_path, slurm_cluster) -> None:
    data_dir = tmp_path / "data"
    async with serving(tmp_path) as h:
        with launcher_processes(h, tmp_path / "launcher.log") as launchers:
            first = launchers.start()
            study = await h.create_study(make_workload(tmp_path, timeout_s=120.0, backend=SLURM))
            study_repo = data_dir / "studies" / study / "workload"
            # 12 steps of ≥0.3 s: the job outlives the first launcher by several seconds
            trial = await h.propose(study, knobs={"knobs.mode": "ok", "knobs.sleep": 0.3})
            launched = await h.wait_for(trial, "TrialLaunched", timeout_s=60)
            probe = data_dir / "launcher" / "trials" / trial / "probe" / "probe-rank0.jsonl"
            deadline = time.monotonic() + 60
            while not (probe.exists() and probe.read_bytes().count(b"\n") >= 2) and time.monotonic() < deadline:
                time.sleep(0.1)
            first.send_signal(signal.SIGKILL)
            first.wait()
            assert squeue(launched.job_id) == "RUNNING"  # Slurm holds the job, not the launcher
            launchers.start()
            finished = await h.wait_for(trial, "TrialFinished", timeout_s=120)
            assert finished.status == "ok", finished  # followed to its end, not abandoned
            assert finished.steps_completed == 12
            assert squeue(launched.job_id) == "COMPLETED"
            assert "re-attached to a running job" in (tmp_path / "launcher.log").read_text()
            assert git_worktrees(study_repo) == []


def test_demo_backend_slurm_runs_the_reference_contract_on_slurm(slurm_cluster, tmp_path, monkeypatch) -> None:
    """``infrarsi demo --backend slurm``: the reference contract, its trials on the cluster; a clear error
    when no cluster answers."""
    from infrarsi.commands.demo import DEFAULT_CONTRACT, with_backend
    from infrarsi.errors import UserError
    from infrarsi.study.contract import load_contract

    contract = load_contract(with_backend(GPT.parent.parent / DEFAULT_CONTRACT, "slurm", tmp_path))
    assert contract.backend.kind == "slurm" and contract.workload.repo == GPT
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    with pytest.raises(UserError, match="make slurm-up"):
        with_backend(GPT.parent.parent / DEFAULT_CONTRACT, "slurm", tmp_path)


async def test_a_node_lost_mid_job_is_an_infrastructure_failure(harness, tmp_path, slurm_cluster) -> None:
    """An administrator sets the job's node DOWN (``scontrol update state=down``, as slurmctld does when a node
    stops answering): Slurm ends the job ``NODE_FAIL``; the trial is ``cancelled``, marked ``infrastructure``
    (it costs, says nothing of the candidate, and is run again)."""
    study = await harness.create_study(make_workload(tmp_path, timeout_s=120.0, backend=SLURM))
    trial = await harness.propose(study, knobs={"knobs.mode": "sleep"})
    launched = await harness.wait_for(trial, "TrialLaunched", timeout_s=60)
    wait_until_running(launched.job_id)
    node = subprocess.run(["squeue", "-h", "-j", launched.job_id, "-o", "%N"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    assert node, "the job runs on a node"
    time.sleep(3)  # a few seconds of running for Slurm's accounting to price
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=infrarsi test: node lost"],
                   check=True)  # fmt: skip
    try:
        finished = await harness.wait_for(trial, "TrialFinished", timeout_s=120)
    finally:
        # the node is back for the next test: ReturnToService=2 may have returned it already (then
        # "resume" is refused as an invalid state), else resume it
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
        deadline = time.monotonic() + 60
        while node_state(node) not in ("idle", "mixed", "allocated") and time.monotonic() < deadline:
            time.sleep(0.5)
    assert squeue(launched.job_id) == "NODE_FAIL"
    assert finished.status == "cancelled" and finished.infrastructure, finished
    assert f"Slurm job {launched.job_id} ended NODE_FAIL" in finished.reason
    assert finished.accelerator_s >= 1, "the lost node's time is still spent (Slurm's elapsed × ranks)"
    assert node_state(node) == "idle", "the node is back for the next test"
