"""The Slurm backend's pure parts: sacct parsing, GPU counting from --gres, the sbatch argv and job script."""

from __future__ import annotations

from pathlib import Path

from infrarsi.backends import JobSpec
from infrarsi.backends.slurm import SlurmBackend, gres_gpus, parse_sacct
from infrarsi.contract import BackendSpec


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
