"""Verify, through all six services on the real dense-1node job (shrunk: ``support.tiny_verify``), rejects a
candidate that breaks resuming from a mid-run checkpoint — by ``checkpoint.restart`` alone — and one that keeps
the training loss but serves a worse model — by ``downstream`` alone — and still passes a genuine patch.

- ``checkpoint-weights-only``: on resume, load the weights and leave AdamW's moments at zero. Every run from
  step zero is the baseline's run, so loss, trend, work and timing hold; the restart trial (a fresh process
  resumed from the candidate run's own checkpoint after 10 of 20 steps, through torch.distributed.checkpoint)
  leaves the uninterrupted curve by more than ε.
- ``eval-mode-early-exit``: skips the last block in eval mode. Training and the training loop's own eval never
  call ``.eval()``; the contract's downstream command (``evaluate.py``: held-out perplexity of the final
  weights in eval mode) is worse than the baseline's beyond its 1 % tolerance.
- ``fused-qkv``: passes both (its checkpoint has another format, so ``across_change`` stays off here; the
  across-change test below shows what it does there).

The HF Trainer example does the same through the Trainer's own ``resume_from_checkpoint`` (last test).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from infrarsi import events as ev
from infrarsi.verdicts import verification as vf
from support.tiny_verify import EXAMPLE_DOWNSTREAM, example_contract, run_verification, verify_candidates

RESTART_BUG, DOWNSTREAM_BUG, GENUINE, SAME_FORMAT = (
    "checkpoint-weights-only", "eval-mode-early-exit", "fused-qkv", "keyword-calls",
)  # fmt: skip
DOWNSTREAM = {
    "command": ["{python}", "evaluate.py", "--launch-file", "{launch_file}", "--weights", "{weights}"],
    "metric": "perplexity",
    "tolerance": 0.01,
}


def _verify(across_change: bool) -> dict[str, Any]:
    return {"checkpoint_restart": {"at_step": 10, "across_change": across_change}, "downstream": DOWNSTREAM}


@pytest.mark.slow
@pytest.mark.timeout(1500)
async def test_verify_rejects_a_broken_restart_and_a_worse_downstream_model_each_by_its_own_invariant(
    tmp_path: Path,
) -> None:
    verdicts = await verify_candidates(tmp_path, [RESTART_BUG, DOWNSTREAM_BUG, GENUINE], verify=_verify(False),
                                       timeout_s=1400)  # fmt: skip
    assert set(verdicts) == {RESTART_BUG, DOWNSTREAM_BUG, GENUINE}
    restart = verdicts[RESTART_BUG]
    assert not restart.promotable and restart.failed_invariants == ["checkpoint.restart"], restart.failed_invariants
    rows = {i.name: i for i in restart.invariants}
    assert rows["loss"].ok and rows["downstream"].ok, "from step zero it is the baseline's run"
    assert rows["checkpoint.restart"].observed > 1.0 and "after 10 steps" in rows["checkpoint.restart"].detail

    downstream = verdicts[DOWNSTREAM_BUG]
    assert not downstream.promotable and downstream.failed_invariants == ["downstream"], downstream.failed_invariants
    rows = {i.name: i for i in downstream.invariants}
    assert rows["loss"].ok and rows["checkpoint.restart"].ok, "training, its eval and its resume are untouched"
    assert rows["downstream"].detail.startswith("failed on 1/1 checks; first: pair 1: perplexity ")

    genuine = verdicts[GENUINE]
    assert genuine.failed_invariants == [], genuine.failed_invariants
    rows = {i.name: i for i in genuine.invariants}
    assert rows["checkpoint.restart"].ok and rows["downstream"].ok
    assert "checkpoint.across_change" not in rows

    # Telemetry measures the restart trials on the steps they owe (after the checkpoint), not as violations.
    restarts = {vf.restart_trial_id_for(v.verify_id, 1, "candidate") for v in verdicts.values()}
    measured = {m["trial_id"]: m["status"] for line in (tmp_path / "data" / "logs" / "telemetry.log").read_text().splitlines()
                if '"trial measured"' in line and (m := json.loads(line))["trial_id"] in restarts}  # fmt: skip
    assert measured == dict.fromkeys(restarts, "ok"), measured


@pytest.mark.slow
@pytest.mark.timeout(1500)
async def test_across_the_change_a_baseline_checkpoint_resumes_where_the_format_allows(tmp_path: Path) -> None:
    """``keyword-calls`` keeps the parameter names: the baseline's checkpoint resumes under it and continues the
    curve. ``fused-qkv`` fuses q/k/v into one weight: the baseline's checkpoint cannot load, named as
    ``checkpoint.across_change`` (and only that), while its own restart holds."""
    verdicts = await verify_candidates(tmp_path, [SAME_FORMAT, GENUINE], verify=_verify(True), timeout_s=1400)
    same = verdicts[SAME_FORMAT]
    assert same.failed_invariants == [], same.failed_invariants
    assert {i.name: i.ok for i in same.invariants}["checkpoint.across_change"] is True
    fused = verdicts[GENUINE]
    assert fused.failed_invariants == ["checkpoint.across_change"], fused.failed_invariants
    rows = {i.name: i for i in fused.invariants}
    assert rows["checkpoint.restart"].ok and "ended crash" in rows["checkpoint.across_change"].detail


HF_RESTART_BUG = "hf-resume-weights-only"
RESTART_AT_5 = {"checkpoint_restart": {"at_step": 5}, "downstream": EXAMPLE_DOWNSTREAM}


async def _restart_verdicts(tmp_path: Path, example: str, planted: str, honest: ev.Candidate
                            ) -> tuple[ev.VerifyCompleted, ev.VerifyCompleted]:
    """(the planted bug's, the honest candidate's) verdicts, verified on the example's contract at a 10-step
    horizon with the restart after 5 steps and its downstream on; the bug must fail ``checkpoint.restart`` alone
    and the honest candidate nothing."""
    contract = example_contract(tmp_path, example, add_patches=[planted], verify=RESTART_AT_5, steps=10)
    bug_candidate = ev.Candidate(patches=[planted])
    verdicts = await run_verification(tmp_path, contract, [bug_candidate, honest], timeout_s=1400)
    assert [v.candidate_key for v in verdicts] == [bug_candidate.key(), honest.key()]
    bug, kept = verdicts
    assert bug.failed_invariants == ["checkpoint.restart"], bug.failed_invariants
    assert kept.failed_invariants == [], kept.failed_invariants
    return bug, kept


@pytest.mark.slow
@pytest.mark.timeout(1500)
async def test_the_hf_trainer_restarts_through_resume_from_checkpoint_and_a_weights_only_resume_is_rejected(
    tmp_path: Path,
) -> None:
    """The Trainer saves ``checkpoint-5`` when the callback asks; the honest candidate (the fused AdamW) resumes
    it through ``trainer.train(resume_from_checkpoint=...)`` and continues the curve; ``hf-resume-weights-only``
    loads the weights and trains from step 0 again: ``checkpoint.restart`` names it. Both are evaluated
    downstream (held-out perplexity of ``save_pretrained`` weights)."""
    bug, fused = await _restart_verdicts(tmp_path, "hf-trainer", HF_RESTART_BUG,
                                         ev.Candidate(knobs={"optim": "adamw_torch_fused"}))
    rows = {i.name: i for i in bug.invariants}
    assert "first step is 0, not 5" in rows["checkpoint.restart"].detail and rows["downstream"].ok
    rows = {i.name: i for i in fused.invariants}
    assert rows["checkpoint.restart"].ok and rows["downstream"].ok and "perplexity" in rows["downstream"].detail


LIGHTNING_RESTART_BUG = "lightning-plain-loader"


@pytest.mark.slow
@pytest.mark.timeout(1500)
async def test_lightning_restarts_through_ckpt_path_and_a_plain_loader_is_rejected(tmp_path: Path) -> None:
    """The callback saves with ``trainer.save_checkpoint`` after 5 steps; the example's ``ResumableLoader`` lets
    ``trainer.fit(ckpt_path=...)`` continue mid-epoch exactly, so the honest candidate (1 data-loader worker)
    holds ``checkpoint.restart``; ``lightning-plain-loader`` restarts the epoch's data on resume (Lightning
    cannot restore a plain loader's position) and leaves the curve by more than ε."""
    bug, workers = await _restart_verdicts(tmp_path, "lightning", LIGHTNING_RESTART_BUG, ev.Candidate(knobs={"num-workers": 1}))
    rows = {i.name: i for i in bug.invariants}
    assert rows["checkpoint.restart"].observed > 1.0 and rows["downstream"].ok and rows["loss"].ok
    rows = {i.name: i for i in workers.invariants}
    assert rows["checkpoint.restart"].ok and rows["downstream"].ok
