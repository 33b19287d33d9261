"""The five stages end to end through all six services, run as a user would: ``infrarsi demo``.

``test_short_real_run_through_all_six_services`` runs the demo on the real dense-1node workload with a
shortened horizon and a three-trial budget (a few minutes on 2 cores): init → doctor → run → verify →
report, every trial a real PyTorch job launched by the launcher service. ``test_demo_verifies_a_speedup``
is the README's ``make demo`` itself (minutes; ``make test-slow``). ``test_demo_through_slurm`` is the short
run with ``--backend slurm``: every trial a batch job on the tests' own Slurm cluster (``make test-slow``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml
from infrarsi.commands.demo import hack_ids

ROOT = Path(__file__).resolve().parents[2]
DENSE = ROOT / "workloads" / "gpt" / "contracts" / "dense-1node.yaml"
DEMO = ROOT / "workloads" / "gpt" / "contracts" / "dense-1node-carried.yaml"


def _demo(tmp_path: Path, contract: Path, trials: int, timeout_s: float, *extra: str) -> tuple[int, dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFRARSI_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "infrarsi.cli", "--data-dir", str(tmp_path / "data"), "demo",
         "--contract", str(contract), "--trials", str(trials), "--json", *extra],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # SIGTERM, not subprocess.run's SIGKILL: demo stops the stack it started on SIGTERM, so a run that is
        # too slow fails without leaving its nats-server behind for the rest of the suite.
        proc.terminate()
        out, err = proc.communicate(timeout=120)
        pytest.fail(f"demo did not finish within {timeout_s:.0f} s; its output:\n{(out + err)[-4000:]}")
    summary = json.loads(out[out.index("{\n"):]) if "{\n" in out else {}
    return proc.returncode, summary, out + err


def _no_stack_left(tmp_path: Path) -> None:
    mine = [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not mine, f"processes left behind: {[p.info['cmdline'] for p in mine]}"


def _short_contract(tmp_path: Path, steps: int = 10, trials: int = 4) -> Path:
    """dense-1node with a short horizon, a few trials, 2 doctor repeats and one verify round of one repeat."""
    contract = yaml.safe_load(DENSE.read_text())
    contract["workload"]["repo"] = str(DENSE.parent.parent)
    contract["workload"]["steps"] = steps
    contract["workload"]["verify_steps"] = steps
    contract["budget"]["trials"] = trials
    contract["doctor"]["repeats"] = 2
    contract["verify"] = {"top_k": 1, "repeats": 1, "passes_required": 1}
    path = tmp_path / "dense-short.yaml"
    path.write_text(yaml.safe_dump(contract, sort_keys=False))
    return path


def _five_stages_ran(rc: int, summary: dict, output: str) -> None:
    assert rc in (0, 3), output[-4000:]  # 3: the flow completed but nothing was verified faster
    assert summary["finished"], output[-4000:]  # the proposer ended the study (StudyFinished)
    assert summary["baseline_step_s"] > 0  # doctor measured the baseline through launcher + telemetry
    # Four trials may or may not find a candidate predicted faster than the baseline; either the verifier
    # ran its round (VerifyCompleted) or the proposer said why there was nothing to verify.
    if summary["speedup"] is None:
        assert "no candidate predicted faster" in summary["finished"], summary
    report = Path(summary["report"])
    assert report.is_file() and report.with_suffix(".pdf").is_file() and report.with_suffix(".md").is_file()
    assert "InfraRSI report" in report.read_text()


@pytest.mark.timeout(1200)
def test_short_real_run_through_all_six_services(tmp_path: Path) -> None:
    rc, summary, output = _demo(tmp_path, _short_contract(tmp_path), trials=4, timeout_s=1100)
    _five_stages_ran(rc, summary, output)
    # the reward-hack stage: every planted hack ran once, outside the search, and an invariant caught it
    assert sorted(h["patch"] for h in summary["hacks"]) == sorted(hack_ids(DENSE)), summary.get("hacks")
    assert all(h["caught_by"] for h in summary["hacks"]), summary["hacks"]
    _no_stack_left(tmp_path)


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(3000)
def test_demo_through_slurm(tmp_path: Path, slurm_cluster) -> None:
    """``infrarsi demo --backend slurm``: the same five stages, every trial (doctor's baseline runs, the
    search, the verifier's rounds) a batch job on the tests' own Slurm cluster. Shorter than the local short
    run (3 steps, 2 trials): its jobs run in the namespaced nodes of a shared 2-core host."""
    rc, summary, output = _demo(tmp_path, _short_contract(tmp_path, steps=3, trials=2), 2, 2900, "--backend", "slurm", "--skip-hacks")
    print(json.dumps(summary, indent=2))  # the run's figures (pytest -s)
    _five_stages_ran(rc, summary, output)
    trials = sorted((tmp_path / "data" / "launcher" / "trials").iterdir())
    submitted = [json.loads((t / "slurm.json").read_text())["job_id"] for t in trials if (t / "slurm.json").exists()]
    assert trials and len(submitted) == len(trials), "every trial went through sbatch"
    accounted = subprocess.run(["sacct", "--completion", "-n", "-X", "-P", "-o", "JobIDRaw,State", "-j", ",".join(submitted)],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert {line.split("|")[0] for line in accounted.splitlines()} >= set(submitted), accounted
    _no_stack_left(tmp_path)


DEMO_SPEEDUP_BAR = 1.5
"""Lower end of the verified speed-up's 95% CI the demo must reach, on any CPU: the carried-over golden
(micro-batch 2, full recomputation) has its headroom in the work each step does, not in bf16 units (README, "The
demo"; measured by hand: x1.85 on an AMX Xeon, x1.77 with oneDNN capped at AVX2)."""


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_demo_verifies_a_speedup(tmp_path: Path) -> None:
    """The README's main command: a verified speed-up on dense-1node (``DEMO_SPEEDUP_BAR``), loss parity held."""
    rc, summary, output = _demo(tmp_path, DEMO, trials=10, timeout_s=1700)
    assert rc == 0, output[-4000:]
    assert summary["verified"] and summary["speedup_ci"][0] >= DEMO_SPEEDUP_BAR, summary
    assert not any("hack-" in p for p in summary["winner"]["patches"])
    assert summary["hacks"] and all(h["caught_by"] for h in summary["hacks"]), summary["hacks"]
    assert 0 < summary["mfu_before"] < summary["mfu_after"] <= 1.0, summary
    _no_stack_left(tmp_path)
