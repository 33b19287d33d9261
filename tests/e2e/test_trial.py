"""``infrarsi trial`` as a user runs it, on the real reference workload (workloads/gpt).

Short horizons (``--steps``) keep the default suite small; the reward-hack set and moe-2node are ``slow``.
All tests of the module share one data directory, so the study and its baseline are created once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from infrarsi.trial import procs

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "workloads" / "gpt" / "contracts"
STEPS = 8
"""Enough for the timing invariant's three comparable steady steps (``stats.MIN_TIMING_RATIOS``) after a warm-up
read as up to five steps. At 6, a warm-up of four (or evals beside the steps) left fewer and the invariant
unchecked: the candidate run failed here once on a clean clone (KeyError 'timing')."""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("trial-data")


def infrarsi_trial(data_dir: Path, contract: Path, *args: str, timeout: float = 900) -> tuple[int, dict]:
    env = {k: v for k, v in os.environ.items() if k != "INFRARSI_NATS_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "trial", str(contract), "--data-dir", str(data_dir),
         "--steps", str(STEPS), "--json", *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert procs.tagged_processes(f"{data_dir.absolute() / 'launcher' / 'trials'}|") == []
    return proc.returncode, report


def check_plausible(run: dict, *, ranks: int) -> None:
    m, f = run["measured"], run["finished"]
    assert f["status"] == "ok", f["output_tail"]
    assert m["steps"] == STEPS and m["optimizer_steps"] == STEPS
    assert m["tokens"] == STEPS * 32 * 128  # global batch 32 × seq_len 128
    checked = {i["name"]: i for i in m["invariants"]}
    assert "timing" in checked, (m["warmup_steps"], m["unchecked_invariants"])
    assert checked["timing"]["ok"], checked["timing"]
    assert m["mfu"] is not None and 0.001 < m["mfu"] < 1.0, m["mfu"]
    assert len(m["peak_memory_bytes"]) == ranks
    assert f["accelerator_s"] == pytest.approx(ranks * f["wall_s"])


def test_trial_dense_1node(data_dir) -> None:
    code, report = infrarsi_trial(data_dir, CONTRACTS / "dense-1node.yaml", "--set", "knobs.optimizer_impl=foreach")
    check_plausible(report["baseline"], ranks=1)
    check_plausible(report["candidate"][0], ranks=1)
    assert code == 0, report
    assert report["candidate"][0]["measured"]["invariants_ok"]


def test_reward_hack_is_caught(data_dir) -> None:
    code, report = infrarsi_trial(data_dir, CONTRACTS / "dense-1node.yaml", "--patch", "hack-skip-optimizer-steps")
    assert code == 3
    m = report["candidate"][0]["measured"]
    assert m["status"] == "invariant_violation"
    assert "work.optimizer_steps" in {i["name"] for i in m["invariants"] if not i["ok"]}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("patch", "breaks"),
    [("hack-truncate-loss-sequence", "work.tokens"), ("hack-shrink-eval", "work.eval"), ("hack-untimed-optimizer", "work.optimizer_steps"),
     ("hack-slow-probe-clock", "timing")],
)
def test_every_reward_hack_is_caught(data_dir, patch, breaks) -> None:
    code, report = infrarsi_trial(data_dir, CONTRACTS / "dense-1node.yaml", "--patch", patch)
    m = report["candidate"][0]["measured"]
    assert code == 3 and m["status"] == "invariant_violation"
    assert breaks in {i["name"] for i in m["invariants"] if not i["ok"]}, m["invariants"]


def test_emulated_oom_on_the_real_workload(tmp_path) -> None:
    contract = yaml.safe_load((CONTRACTS / "dense-1node.yaml").read_text())
    contract["workload"]["repo"] = str(ROOT / "workloads" / "gpt")
    capacity = 600 << 20
    contract["cluster"]["memory_capacity_bytes"] = capacity
    path = tmp_path / "small-capacity.yaml"
    path.write_text(yaml.safe_dump(contract))
    code, report = infrarsi_trial(tmp_path / "data", path, "--set", "knobs.micro_batch_size=32", "--no-baseline")
    f = report["candidate"][0]["finished"]
    assert code == 3 and f["status"] == "oom", f
    assert f["censored_peak_bytes"] > capacity and f["memory_capacity_bytes"] == capacity
    assert f["accelerator_s"] > 0
    assert report["candidate"][0]["measured"]["status"] == "oom"


@pytest.mark.slow
def test_trial_moe_2node(tmp_path) -> None:
    code, report = infrarsi_trial(tmp_path / "data", CONTRACTS / "moe-2node.yaml")
    check_plausible(report["baseline"], ranks=2)
    check_plausible(report["candidate"][0], ranks=2)
    assert code == 0
