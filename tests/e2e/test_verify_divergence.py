"""Verify, through all six services on the real dense-1node job (shrunk as in ``test_verify_hacks``), rejects a
slow drift that stays inside ε at every step — by ``loss.trend`` alone — and still promotes a genuine patch.

The planted candidate is the patch library's ``slow-loss-drift``: the reported training loss creeps up by
0.015 % of itself per step while the training itself is untouched, so over the 20-step verify horizon every
point is within the contract's 0.5 % ε (``loss`` holds; 0.57 ε at the last step) but the fitted gap reaches ε
well before twice the horizon. ``fused-qkv`` reproduces the baseline's loss exactly: a flat gap, no trend.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import yaml
from infrarsi import events as ev
from infrarsi.bus import Bus
from infrarsi.commands.init import prepare_study, study_created_event
from infrarsi.commands.study_log import read_study
from infrarsi.stack import Stack

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT / "workloads" / "gpt"
DENSE = WORKLOAD / "contracts" / "dense-1node.yaml"
TINY = {
    "model": {"vocab_size": 256, "seq_len": 64, "n_layer": 2, "n_head": 4, "d_model": 96, "mlp_hidden": 384},
    "run": {"steps": 20, "global_batch_size": 16, "lr": 0.01, "warmup_steps": 3, "eval_every": 5, "eval_batch_size": 8},
    "knobs": {"intra_op_threads": 1},
}
DRIFT, GENUINE = "slow-loss-drift", "fused-qkv"


def _contract(tmp_path: Path) -> Path:
    repo = tmp_path / "workload"
    shutil.copytree(WORKLOAD, repo, ignore=shutil.ignore_patterns("__pycache__", ".infrarsi"))
    launch = repo / "launch" / "dense-1node.yaml"
    golden = yaml.safe_load(launch.read_text())
    for section, values in TINY.items():
        golden[section].update(values)
    launch.write_text(yaml.safe_dump(golden, sort_keys=False))
    contract = yaml.safe_load(DENSE.read_text())
    contract["workload"]["repo"] = str(repo)
    contract["workload"]["steps"] = contract["workload"]["verify_steps"] = TINY["run"]["steps"]
    contract["workload"]["env"]["OMP_NUM_THREADS"] = "1"
    contract["search_space"]["constraints"]["global_batch"]["size"] = TINY["run"]["global_batch_size"]
    micro = contract["search_space"]["knobs"]["knobs.micro_batch_size"]
    micro["choices"] = [m for m in micro["choices"] if TINY["run"]["global_batch_size"] % m == 0]
    contract["search_space"]["patches"].append(DRIFT)
    contract["verify"] = {"top_k": 1, "repeats": 1, "passes_required": 1}
    path = tmp_path / "dense-divergence.yaml"
    path.write_text(yaml.safe_dump(contract, sort_keys=False))
    return path


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_verify_rejects_a_slow_drift_inside_epsilon_by_loss_trend(tmp_path: Path) -> None:
    candidates = [ev.Candidate(patches=[DRIFT]), ev.Candidate(patches=[GENUINE])]
    data_dir = tmp_path / "data"
    stack = await asyncio.to_thread(Stack.start, data_dir)
    try:
        prepared = prepare_study(_contract(tmp_path), data_dir)
        bus = await Bus.connect(stack.url, service="admin", data_dir=data_dir)
        try:
            await bus.publish(study_created_event(prepared))
            await bus.publish(ev.make_event(
                ev.VerifyRequested(candidates=candidates, repeats=1, reason="divergence audit"),
                study_id=prepared.study_id, source="cli.verify",
            ))
            verdicts: dict[str, ev.VerifyCompleted] = {}
            for _ in range(800):
                events, _ = await read_study(bus, prepared.study_id)
                verdicts = {e.payload.candidate.patches[0]: e.payload for e in events if isinstance(e.payload, ev.VerifyCompleted)}
                if len(verdicts) == len(candidates):
                    break
                await asyncio.sleep(1.0)
        finally:
            await bus.close()
    finally:
        await asyncio.to_thread(stack.stop)

    for patch_id, verdict in sorted(verdicts.items()):
        print(f"verdict {patch_id}: promotable={verdict.promotable} failed={verdict.failed_invariants}")
        for inv in verdict.invariants:
            print(f"  {inv.name}: ok={inv.ok} {inv.detail}")
    assert set(verdicts) == {DRIFT, GENUINE}
    drift = verdicts[DRIFT]
    assert not drift.promotable and drift.failed_invariants == ["loss.trend"], drift.failed_invariants
    by_name = {i.name: i for i in drift.invariants}
    assert by_name["loss"].ok, "every point inside ε: only the trend can catch this drift"
    assert by_name["loss.trend"].observed > 1.0 and "projected" in by_name["loss.trend"].detail
    genuine = verdicts[GENUINE]
    assert genuine.failed_invariants == [], genuine.failed_invariants
    assert {i.name: i.ok for i in genuine.invariants}.get("loss.trend") is True
