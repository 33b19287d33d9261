"""The local backend's own behaviour, beyond the contract every backend meets (test_backend_contract.py):
rank layouts (python, torchrun 1×2 and 2×1), the emulated device capacity, device-OOM messages, reaping what a
previous life left. The jobs are a tiny Python script (no torch in the ranks), so the suite runs in seconds.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from infrarsi.backends import Backend, JobSpec, LocalBackend
from infrarsi.trial import procs
from support.backend_jobs import run_to_end

JOB = textwrap.dedent(
    """
    import os, sys, time
    mode = sys.argv[1]
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    print(f"rank {rank}/{world} mode {mode}", flush=True)
    if mode == "ok":
        sys.exit(0)
    if mode == "fail":
        print("Traceback: boom", flush=True)
        sys.exit(3 if rank == world - 1 else 0)
    if mode == "sleep":
        time.sleep(600)
    if mode == "hog":
        chunks = []
        while True:
            chunks.append(bytearray(os.urandom(1)) * (16 << 20))
            time.sleep(0.02)
    if mode == "cuda-oom":
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        sys.exit(1)
    """
)


@dataclass(frozen=True)
class Case:
    id: str
    launcher: str
    nnodes: int
    nproc_per_node: int


CASES = [Case("python", "python", 1, 1), Case("torchrun-1x2", "torchrun", 1, 2), Case("torchrun-2x1", "torchrun", 2, 1)]
FAST = [c for c in CASES if c.id != "torchrun-2x1"]


@pytest.fixture
def backend(tmp_path) -> Backend:
    b = LocalBackend(str(tmp_path / "state"))
    b.open()
    yield b
    b.close()


def spec_for(case: Case, tmp_path: Path, mode: str, name: str = "job1", capacity: int | None = None) -> JobSpec:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return JobSpec(
        name=name,
        argv=[sys.executable, str(script), mode],
        workdir=tmp_path,
        env=dict(os.environ),
        state_dir=tmp_path / "state" / name,
        launcher=case.launcher,  # type: ignore[arg-type]
        nnodes=case.nnodes,
        nproc_per_node=case.nproc_per_node,
        memory_capacity_bytes=capacity,
    )


def assert_nothing_left(tmp_path: Path) -> None:
    assert procs.tagged_processes(f"{tmp_path / 'state'}|") == []


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_ok_job_runs_every_rank(backend, tmp_path, case) -> None:
    handle = backend.submit(spec_for(case, tmp_path, "ok"))
    result = run_to_end(backend, handle)
    assert result.exit_code == 0, result.output_tail
    assert not result.oom and result.cancelled is None
    for rank in range(case.nnodes * case.nproc_per_node):
        assert f"rank {rank}/{case.nnodes * case.nproc_per_node}" in result.output_tail
    assert result.wall_s > 0
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize("case", FAST, ids=lambda c: c.id)
def test_failing_rank_fails_the_job(backend, tmp_path, case) -> None:
    result = run_to_end(backend, backend.submit(spec_for(case, tmp_path, "fail")))
    assert result.exit_code not in (0, None)
    assert "boom" in result.output_tail and not result.oom
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cancel_ends_the_job_and_leaves_nothing(backend, tmp_path, case) -> None:
    handle = backend.submit(spec_for(case, tmp_path, "sleep"))
    deadline = time.monotonic() + 60
    ranks = case.nnodes * case.nproc_per_node
    while procs.tagged_processes(f"{tmp_path / 'state'}|").__len__() < ranks and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not backend.poll(handle)
    backend.cancel(handle, "timeout after 5s")
    backend.cancel(handle, "again")  # idempotent; the first reason stands
    result = run_to_end(backend, handle, timeout_s=20)
    assert result.cancelled == "timeout after 5s"
    assert result.exit_code != 0
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize("case", FAST, ids=lambda c: c.id)
def test_emulated_capacity_kills_like_a_device_oom(backend, tmp_path, case) -> None:
    capacity = 300 << 20
    result = run_to_end(backend, backend.submit(spec_for(case, tmp_path, "hog", capacity=capacity)))
    assert result.oom, result
    assert "emulated capacity" in result.oom_detail
    assert result.peak_memory_bytes > capacity
    assert result.exit_code != 0
    assert_nothing_left(tmp_path)


def test_device_oom_message_is_recognised(backend, tmp_path) -> None:
    result = run_to_end(backend, backend.submit(spec_for(CASES[0], tmp_path, "cuda-oom")))
    assert result.oom and "CUDA out of memory" in result.oom_detail


def test_reap_kills_what_a_previous_life_left(tmp_path) -> None:
    first = LocalBackend(str(tmp_path / "state"))
    first.submit(spec_for(CASES[1], tmp_path, "sleep"))
    deadline = time.monotonic() + 60
    while len(procs.tagged_processes(f"{tmp_path / 'state'}|")) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    left = procs.tagged_processes(f"{tmp_path / 'state'}|")
    assert len(left) >= 3  # agent + two ranks
    # the launcher dies without cleaning up; a new life reaps
    second = LocalBackend(str(tmp_path / "state"))
    assert second.reap() >= 3
    psutil.wait_procs([p for p in left], timeout=5)
    assert_nothing_left(tmp_path)


# ---------------------------------------------------------------- the same contract through a real Slurm


@pytest.fixture
def slurm_backend(slurm_cluster, tmp_path) -> Backend:
    from infrarsi.backends.slurm import SlurmBackend

    b = SlurmBackend(str(tmp_path / "state"))
    b.open()
    yield b
    b.close()


def slurm_states(job_id: str) -> str:
    import subprocess

    return subprocess.run(
        ["squeue", "-h", "-j", job_id, "--states=all", "-o", "%T"], capture_output=True, text=True
    ).stdout.strip()


@pytest.mark.slurm
@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=lambda c: c.id)
def test_slurm_ok_job_runs_every_rank(slurm_backend, slurm_cluster, tmp_path, case) -> None:
    if case.nnodes > len(slurm_cluster.nodes):
        pytest.skip(f"one Slurm node only: {slurm_cluster.single_node_reason}")
    handle = slurm_backend.submit(spec_for(case, tmp_path, "ok"))
    result = run_to_end(slurm_backend, handle, timeout_s=300)
    assert result.exit_code == 0, result.output_tail
    assert not result.oom and result.cancelled is None
    for rank in range(case.nnodes * case.nproc_per_node):
        assert f"rank {rank}/{case.nnodes * case.nproc_per_node}" in result.output_tail
    assert result.accelerator_s is not None and result.accelerator_s >= 0  # Slurm's accounting
    assert slurm_states(handle.job_id) == "COMPLETED"


@pytest.mark.slurm
def test_slurm_failing_job_and_device_oom(slurm_backend, tmp_path) -> None:
    failed = run_to_end(
        slurm_backend, slurm_backend.submit(spec_for(CASES[0], tmp_path, "fail", name="f")), 120
    )
    assert failed.exit_code == 3 and "boom" in failed.output_tail and not failed.oom
    oom = run_to_end(
        slurm_backend, slurm_backend.submit(spec_for(CASES[0], tmp_path, "cuda-oom", name="o")), 120
    )
    assert oom.oom and "CUDA out of memory" in oom.oom_detail


@pytest.mark.slurm
def test_slurm_cancel_ends_the_job(slurm_backend, tmp_path) -> None:
    handle = slurm_backend.submit(spec_for(CASES[0], tmp_path, "sleep"))
    deadline = time.monotonic() + 60
    while slurm_states(handle.job_id) != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
    slurm_backend.cancel(handle, "timeout after 5s")
    slurm_backend.cancel(handle, "again")  # idempotent; the first reason stands
    result = run_to_end(slurm_backend, handle, timeout_s=60)
    assert result.cancelled == "timeout after 5s"
    assert slurm_states(handle.job_id) == "CANCELLED"


@pytest.mark.slurm
def test_a_slurm_node_without_bwrap_refuses_a_sandboxed_job(slurm_backend, tmp_path, monkeypatch) -> None:
    """``isolation: sandbox`` through the real cluster, the job's ``PATH`` holding Slurm's commands but no
    ``bwrap``: the node refuses the job (nothing of it runs) and the output ends with the reason, the line the
    launcher reports; the record said ``bwrap``, never ``none``."""
    import shutil

    bin_dir = tmp_path / "bin-without-bwrap"
    bin_dir.mkdir()
    for command in ("sbatch", "squeue", "scancel", "scontrol", "sacct", "srun"):
        (bin_dir / command).symlink_to(shutil.which(command) or command)
    monkeypatch.setenv("PATH", str(bin_dir))  # sbatch passes the submitter's environment to the job
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    spec = JobSpec(name="boxed", argv=[sys.executable, str(work / "job.py"), "ok"], workdir=work, env=dict(os.environ),
                   state_dir=tmp_path / "state" / "boxed", isolation="sandbox")  # fmt: skip
    handle = slurm_backend.submit(spec)
    assert handle.isolation == "bwrap"
    result = run_to_end(slurm_backend, handle, timeout_s=120)
    assert result.exit_code == 126, result.output_tail
    assert "rank 0/1" not in result.output_tail  # the job never ran
    last = result.output_tail.splitlines()[-1]
    assert last.startswith("SandboxError: isolation: sandbox, refused on node irsi-n"), result.output_tail
    assert "bubblewrap (`bwrap`) is not installed" in last, result.output_tail
