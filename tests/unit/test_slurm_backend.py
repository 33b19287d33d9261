"""The Slurm backend's pure parts: sacct parsing, GPU counting from --gres, the sbatch argv and job script."""

from __future__ import annotations

from pathlib import Path

from infrarsi.backends import JobSpec
from infrarsi.backends.slurm import SlurmBackend, SlurmEnd, gres_gpus, parse_sacct, slurm_end
from infrarsi.study.contract import BackendSpec


def test_parse_sacct_states_exit_codes_and_gpus() -> None:
    r = parse_sacct("12|CANCELLED by 0|0:15|42|2|billing=2,cpu=2,gres/gpu=16,mem=4000M,node=2")
    assert (r.state, r.raw_state, r.exit_code, r.elapsed_s, r.nnodes, r.gpus) == (
        "CANCELLED",
        "CANCELLED by 0",
        -15,
        42.0,
        2,
        16,
    )
    r = parse_sacct("13|FAILED|3:0|7|1|")
    assert (r.state, r.exit_code, r.gpus) == ("FAILED", 3, None)
    assert parse_sacct("14|OUT_OF_MEMORY|0:125|9|1|").state == "OUT_OF_MEMORY"


def test_gres_gpus() -> None:
    assert gres_gpus("gpu:8") == 8
    assert gres_gpus("gpu:a100:4") == 4
    assert gres_gpus("gpu") == 1
    assert gres_gpus("shard:2") is None
    assert gres_gpus(None) is None


def test_sbatch_argv_carries_options_as_items_and_the_script_no_values(tmp_path: Path) -> None:
    options = BackendSpec(
        kind="slurm", partition="gpu", account="lab", qos="high", time_limit="30", gres="gpu:8",
        constraint="ib", exclusive=True, extra_sbatch=["--mem=0"],
    )  # fmt: skip
    backend = SlurmBackend(str(tmp_path), options, python="/opt/py env/bin/python")
    spec = JobSpec(
        name="t1", argv=["python", "train.py", "--lr", "$(rm -rf /)"], workdir=tmp_path / "w", env={"X": "'; ls"},
        state_dir=tmp_path / "s", launcher="torchrun", nnodes=2, nproc_per_node=4,
    )  # fmt: skip
    argv = backend.sbatch_argv(spec)
    assert argv[:2] == ["sbatch", "--parsable"] and argv[-1] == str(tmp_path / "s" / "job.sh")
    for item in (
        "--partition=gpu",
        "--account=lab",
        "--qos=high",
        "--time=30",
        "--gres=gpu:8",
        "--constraint=ib",
        "--exclusive",
        "--mem=0",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=4",
        "--no-requeue",
    ):
        assert item in argv
    script = backend.job_script(spec)
    assert "rm -rf" not in script and "'; ls" not in script and "train.py" not in script
    assert "'/opt/py env/bin/python' -m infrarsi.backends.slurm_node" in script


def end(state: str, raw: str | None = None, **kw) -> SlurmEnd:
    args = {"ours": None, "node_oom": None, "output": "", "time_limit": "10", **kw}
    return slurm_end("7", state, raw or state, **args)


def test_slurm_ends_become_facts() -> None:
    assert end("OUT_OF_MEMORY").oom_detail == "Slurm job 7 ended OUT_OF_MEMORY"
    cuda = end("FAILED", output="x\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\ny")
    assert cuda.oom_detail.startswith("out-of-memory reported by the job: torch.OutOfMemoryError")
    node = end("FAILED", node_oom={"rank": 1, "rss_bytes": 300, "capacity_bytes": 200})
    assert "rank 1 RSS 300 B exceeded the emulated capacity 200 B" in node.oom_detail
    assert end("TIMEOUT").cancelled == "timeout: Slurm time limit 10 reached (job 7)"
    assert end("CANCELLED", "CANCELLED by 0", ours={"reason": "timeout: still running after 4s"}).cancelled == (
        "timeout: still running after 4s"
    )
    assert end("CANCELLED", "CANCELLED by 1001").cancelled == "cancelled outside InfraRSI: Slurm job 7 CANCELLED by 1001"
    for state in ("NODE_FAIL", "PREEMPTED", "BOOT_FAIL"):
        e = end(state)
        assert e.infrastructure_failure == f"Slurm job 7 ended {state}" and not e.oom_detail and e.cancelled is None
    ok = end("COMPLETED")
    assert (ok.oom_detail, ok.cancelled, ok.infrastructure_failure) == ("", None, None)
