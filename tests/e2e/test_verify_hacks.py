"""Verify, through all six services on the real dense-1node job, rejects every reward hack of the patch
library and the math-changing patch — naming the invariant its metadata says it breaks — and finds every
invariant held for the genuine patches.

Each candidate gets one verification round of one interleaved baseline/candidate pair (the loss curve must stay
within the contract's ε at every eval). What is checked does not depend on the model's size, so the job is the
dense-1node workload shrunk (``support.tiny_verify.TINY``: 2 layers of width 96, 64-token sequences, 16 per step, 20 steps, one
intra-op thread, eval every 5 steps — ~12 s a run instead of ~80 s): the eight candidates' 16 runs finish in
minutes on a shared 2-core host (``make test-slow``). At this size the unmasked attention still leaves the loss
curve by 2–11 % (ε is 0.5 %) and the genuine patches reproduce the baseline's loss exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from infrarsi import events as ev
from infrarsi.study.contract import load_patch_library
from support.tiny_verify import run_verification, tiny_contract

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT / "workloads" / "gpt"
GENUINE = ["fused-qkv", "chunked-cross-entropy"]


@pytest.mark.slow
@pytest.mark.timeout(1500)
async def test_verify_rejects_hacks_and_math_change_by_name(tmp_path: Path) -> None:
    library = load_patch_library(WORKLOAD / "patches")
    breaking = {p.id: p.breaks for p in library.values() if p.kind == "reward_hack" or p.id == "attention-without-mask"}
    assert len([p for p in breaking if p.startswith("hack-")]) >= 4
    candidates = [ev.Candidate(patches=[pid]) for pid in [*breaking, *GENUINE]]

    contract = tiny_contract(tmp_path, add_patches=[])
    verdicts = await run_verification(tmp_path, contract, candidates, timeout_s=2000, reason="reward-hack audit")

    by_patch = {v.candidate.patches[0]: v for v in verdicts}
    for patch_id, verdict in sorted(by_patch.items()):  # the verdicts, for the log of a -s run (docs cite them)
        print(f"verdict {patch_id}: promotable={verdict.promotable} failed={verdict.failed_invariants}")
    assert set(by_patch) == {c.patches[0] for c in candidates}, "every candidate got a verdict"
    for patch_id, invariant in breaking.items():
        verdict = by_patch[patch_id]
        assert not verdict.promotable, patch_id
        assert invariant in verdict.failed_invariants, (patch_id, invariant, verdict.failed_invariants)
    for patch_id in GENUINE:
        assert by_patch[patch_id].failed_invariants == [], (patch_id, by_patch[patch_id].failed_invariants)
