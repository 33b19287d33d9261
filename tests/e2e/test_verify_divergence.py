"""Verify, through all six services on the real dense-1node job (shrunk: ``support.tiny_verify``), rejects a
slow drift that stays inside ε at every step — by ``loss.trend`` alone — and still passes a genuine patch.

The planted candidate is the patch library's ``slow-loss-drift``: the reported training loss creeps up by
0.015 % of itself per step while the training itself is untouched, so over the 20-step verify horizon every
point is within the contract's 0.5 % ε (``loss`` holds; 0.57 ε at the last step) but the fitted gap reaches ε
well before twice the horizon. ``fused-qkv`` reproduces the baseline's loss exactly: a flat gap, no trend.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.tiny_verify import verify_candidates

DRIFT, GENUINE = "slow-loss-drift", "fused-qkv"


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_verify_rejects_a_slow_drift_inside_epsilon_by_loss_trend(tmp_path: Path) -> None:
    verdicts = await verify_candidates(tmp_path, [DRIFT, GENUINE])
    assert set(verdicts) == {DRIFT, GENUINE}
    drift = verdicts[DRIFT]
    assert not drift.promotable and drift.failed_invariants == ["loss.trend"], drift.failed_invariants
    by_name = {i.name: i for i in drift.invariants}
    assert by_name["loss"].ok, "every point inside ε: only the trend can catch this drift"
    assert by_name["loss.trend"].observed > 1.0 and "projected" in by_name["loss.trend"].detail
    genuine = verdicts[GENUINE]
    assert genuine.failed_invariants == [], genuine.failed_invariants
    assert {i.name: i.ok for i in genuine.invariants}.get("loss.trend") is True
