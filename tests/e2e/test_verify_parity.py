"""Numeric parity modes at verify, through all six services on the real dense-1node job (shrunk:
``support.tiny_verify``).

``parity: bitwise``: the launcher tells verify runs to be deterministic (``INFRARSI_DETERMINISTIC``; the probe
turns torch's deterministic algorithms on and reports them at every step). ``float64-cross-entropy`` (same
math, other rounding) holds ε but is not bitwise equal → ``loss.parity``; ``nondeterministic-algorithms``
turns determinism off → refused as ``parity.deterministic``; ``keyword-calls`` (the model called with keywords:
the same kernels in the same order) reproduces the baseline bit for bit with determinism on → holds both.
``fused-qkv`` (one C→3C GEMM instead of three) is *not* bitwise equal on this CPU (≈3e-6 relative after a few
steps: another GEMM blocking), so bitwise rejects it too — tight parity is the mode for such patches:
it lets both last-bit changes through and still fails ``slow-loss-drift`` (0.3 % off by the last step, inside ε).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.tiny_verify import verify_candidates

LAST_BITS, NONDETERMINISTIC, SAME_KERNELS = "float64-cross-entropy", "nondeterministic-algorithms", "keyword-calls"
FUSED, DRIFT = "fused-qkv", "slow-loss-drift"


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_bitwise_parity_rejects_last_bit_changes_and_nondeterminism_by_name(tmp_path: Path) -> None:
    verdicts = await verify_candidates(tmp_path, [LAST_BITS, NONDETERMINISTIC, SAME_KERNELS, FUSED],
                                       invariants={"parity": "bitwise"})
    assert set(verdicts) == {LAST_BITS, NONDETERMINISTIC, SAME_KERNELS, FUSED}
    last_bits = verdicts[LAST_BITS]
    assert last_bits.failed_invariants == ["loss.parity"], last_bits.failed_invariants
    assert {i.name: i.ok for i in last_bits.invariants}["loss"] is True, "inside ε: only parity catches it"
    nondet = verdicts[NONDETERMINISTIC]
    assert "parity.deterministic" in nondet.failed_invariants and not nondet.promotable, nondet.failed_invariants
    detail = next(i.detail for i in nondet.invariants if i.name == "parity.deterministic")
    assert "candidate had them off at some step" in detail and "baseline" not in detail
    assert verdicts[FUSED].failed_invariants == ["loss.parity"], verdicts[FUSED].failed_invariants
    same = verdicts[SAME_KERNELS]
    assert same.failed_invariants == [], same.failed_invariants
    held = {i.name: i.ok for i in same.invariants}
    assert held["loss.parity"] and held["parity.deterministic"]


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_tight_parity_lets_last_bit_rounding_through_and_fails_a_drift_inside_epsilon(tmp_path: Path) -> None:
    verdicts = await verify_candidates(tmp_path, [LAST_BITS, FUSED, DRIFT], invariants={"parity": "tight"})
    for patch_id in (LAST_BITS, FUSED):
        assert verdicts[patch_id].failed_invariants == [], (patch_id, verdicts[patch_id].failed_invariants)
        parity = next(i for i in verdicts[patch_id].invariants if i.name == "loss.parity")
        assert parity.ok and "closest: pair 1: tight: max |Δ|" in parity.detail  # a held invariant keeps its evidence
    drift = {i.name: i for i in verdicts[DRIFT].invariants}
    assert drift["loss"].ok and not drift["loss.parity"].ok and "loss.parity" in verdicts[DRIFT].failed_invariants
