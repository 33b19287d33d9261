"""The reference GPT workloads train, are deterministic, keep their loss curve under schedule-only
changes, run on two "nodes" and with expert parallelism, and report what the probe counted."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY, WORKLOAD, Run, rel_diff, run_workload
from infrarsi.probe import read_records

STEPS = TINY["run.steps"]
GLOBAL_TOKENS = TINY["run.global_batch_size"] * TINY["model.seq_len"]


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_workload(tmp_path_factory.mktemp("dense"), "dense-1node")


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_workload(tmp_path_factory.mktemp("moe"), "moe-1node")


def assert_trains(run: Run) -> None:
    losses = run.losses()
    assert len(losses) == STEPS
    assert losses[-1] < 0.95 * losses[0], losses
    evals = [e for _, e in run.eval_losses()]
    assert evals[-1] < evals[0], evals


def test_dense_trains_and_probe_counts(dense: Run) -> None:
    assert_trains(dense)
    for i, rec in enumerate(dense.rank0):
        assert rec.step == i
        assert rec.tokens == GLOBAL_TOKENS
        assert rec.loss_tokens == GLOBAL_TOKENS
        assert rec.optimizer_steps == i + 1
        assert rec.peak_memory_bytes > 0
        assert {"data", "forward", "backward", "optimizer"} <= rec.phases.keys()
        assert rec.step_time_s >= sum(rec.phases[p] for p in ("forward", "backward", "optimizer")) * 0.99
    eval_steps = [s for s, _ in dense.eval_losses()]
    assert eval_steps == [3, 7, 11, 15]
    assert {r.eval_tokens for r in dense.rank0 if r.eval_loss is not None} == {
        TINY["run.eval_batch_size"] * TINY["model.seq_len"]
    }


def test_dense_flops_match_analytic_formula(dense: Run) -> None:
    L, d, V, T = TINY["model.n_layer"], TINY["model.d_model"], TINY["model.vocab_size"], TINY["model.seq_len"]
    matmul_params = L * (4 * d * d + 2 * d * TINY["model.mlp_hidden"]) + V * d  # blocks + tied LM head
    analytic = GLOBAL_TOKENS * (6 * matmul_params + 12 * L * T * d)  # 6·N·tokens + attention
    measured = dense.rank0[0].flops
    assert measured == pytest.approx(analytic, rel=0.05)


def test_same_seed_same_curve(dense: Run, tmp_path: Path) -> None:
    again = run_workload(tmp_path, "dense-1node")
    assert again.losses() == dense.losses()
    assert again.eval_losses() == dense.eval_losses()


def test_micro_batch_does_not_change_dense_curve(dense: Run, tmp_path: Path) -> None:
    run = run_workload(tmp_path, "dense-1node", {"knobs.micro_batch_size": 8})  # accumulation 4 → 1
    assert rel_diff(run.losses(), dense.losses()) < 1e-4


def test_two_nodes_data_parallel_same_curve(dense: Run, tmp_path: Path) -> None:
    run = run_workload(tmp_path, "dense-2node", {"knobs.micro_batch_size": 1}, nnodes=2)
    assert sorted(run.records) == [0, 1]
    for rank, recs in run.records.items():
        assert [r.step for r in recs] == list(range(STEPS))
        assert all(r.world_size == 2 and r.rank == rank for r in recs)
        assert recs[-1].optimizer_steps == STEPS
        assert all(r.tokens == GLOBAL_TOKENS for r in recs)
    assert rel_diff(run.losses(0), dense.losses()) < 1e-4
    assert run.losses(0) == run.losses(1)


def test_moe_trains_and_micro_batch_invariant(moe: Run, tmp_path: Path) -> None:
    assert_trains(moe)
    assert all(r.tokens == GLOBAL_TOKENS for r in moe.rank0)
    run = run_workload(tmp_path, "moe-1node", {"knobs.micro_batch_size": 4, "knobs.moe_expert_impl": "batched"})
    assert rel_diff(run.losses(), moe.losses()) < 1e-4


def test_moe_expert_parallel_two_nodes(moe: Run, tmp_path: Path) -> None:
    run = run_workload(tmp_path, "moe-2node", {"knobs.micro_batch_size": 2}, nnodes=2)
    assert sorted(run.records) == [0, 1]
    for recs in run.records.values():
        assert [r.step for r in recs] == list(range(STEPS))
        assert recs[-1].optimizer_steps == STEPS
    # Experts split over two ranks, the same global batch: the same training run.
    assert rel_diff(run.losses(0), moe.losses()) < 1e-4


def test_knobs_keep_the_curve_within_tolerance(dense: Run, tmp_path: Path) -> None:
    run = run_workload(
        tmp_path,
        "dense-1node",
        {
            "knobs.attention": "sdpa",
            "knobs.autocast_dtype": "bfloat16",
            "knobs.activation_checkpointing": "full",
            "knobs.optimizer_impl": "foreach",
            "knobs.dataloader_workers": 1,
        },
    )
    assert rel_diff(run.losses(), dense.losses()) < 5e-3  # the contracts' loss tolerance


def test_fsdp1_is_refused_on_cpu(tmp_path: Path) -> None:
    run = run_workload(tmp_path, "dense-1node", {"knobs.sharding": "fsdp1"}, check=False)
    assert run.returncode != 0
    assert "fsdp1 needs CUDA" in run.output


@pytest.mark.slow
def test_fsdp2_same_curve(dense: Run, tmp_path: Path) -> None:
    run = run_workload(tmp_path, "dense-2node", {"knobs.sharding": "fsdp2"}, nproc=2)
    assert rel_diff(run.losses(0), dense.losses()) < 1e-4


@pytest.mark.slow
def test_compile_same_curve(dense: Run, tmp_path: Path) -> None:
    run = run_workload(tmp_path, "dense-1node", {"knobs.compile": True}, timeout=600)
    assert rel_diff(run.losses(), dense.losses()) < 1e-3


def test_sigkill_keeps_finished_steps(tmp_path: Path) -> None:
    probe_dir = tmp_path / "probe"
    args = []
    for key, value in {**TINY, "run.steps": 500}.items():
        args += ["--set", f"{key}={value}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("INFRARSI_NATS_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "train.py", "--launch-file", "launch/dense-1node.yaml", "--probe-dir", str(probe_dir), *args],
        cwd=WORKLOAD, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    path = probe_dir / "probe-rank0.jsonl"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if path.exists() and path.read_bytes().count(b"\n") >= 4:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the job reported no steps")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    records = read_records(path)
    assert len(records) >= 4
    assert [r.step for r in records] == list(range(len(records)))
    assert all(math.isfinite(r.loss) for r in records)
