"""Verify, through all six services, on the own-job examples as their frameworks run them (the HF Trainer and
Lightning jobs of ``examples/``, at their contracts' own 40-step verify horizon), rejects a planted candidate for
each check by that check's name alone, and still passes an honest one (the planted checkpoint-restart bugs are
``test_verify_restart_downstream.py``'s):

- ``*-export-weight-average``: a callback copies a long-run weight average (EMA, decay 0.999) into the model when
  training ends, so the final weights are mostly the initial ones. Training, the framework's own evaluation
  and every loss the probe sees are the baseline's; the contract's downstream command (``evaluate.py``: held-out
  perplexity of the final weights) is far worse → ``downstream``.
- ``*-logged-loss-drift``: the training loss the framework logs grows by a detached 1.5e-4 × step share of
  itself (gradients untouched): 0.6 ε at the last of 40 steps, so ``loss`` holds → ``loss.trend``.
- ``*-unseeded-init-jitter``: a 2e-6 jitter of the initial weights from an OS-seeded generator, so no run
  reproduces another: inside ε, no trend, the same perplexity; under ``invariants.parity: bitwise`` (torch's
  deterministic algorithms on in every run) its loss trajectory is not the baseline's → ``loss.parity``.

The honest candidate is one data-loader worker: the same batches in the same order, so the same bits — it holds
every invariant, under ``bitwise`` too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from infrarsi import events as ev
from support.tiny_verify import EXAMPLE_DOWNSTREAM, example_contract, run_verification


@dataclass(frozen=True)
class Planted:
    """An example's planted candidates (patch ids of its library) and its honest one."""

    downstream: str
    drift: str
    unreproducible: str
    honest: ev.Candidate


PLANTED = {
    "hf-trainer": Planted("hf-export-weight-average", "hf-logged-loss-drift", "hf-unseeded-init-jitter",
                          ev.Candidate(knobs={"dataloader_num_workers": 1})),
    "lightning": Planted("lightning-export-weight-average", "lightning-logged-loss-drift",
                         "lightning-unseeded-init-jitter", ev.Candidate(knobs={"num-workers": 1})),
}  # fmt: skip

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


@pytest.fixture(params=sorted(PLANTED))
def example(request: pytest.FixtureRequest) -> str:
    return request.param


def _rows(verdict: ev.VerifyCompleted) -> dict[str, ev.InvariantResult]:
    return {i.name: i for i in verdict.invariants}


async def test_a_stale_export_fails_downstream_and_a_drift_inside_epsilon_fails_the_trend(
    example: str, tmp_path: Path
) -> None:
    planted = PLANTED[example]
    candidates = [ev.Candidate(patches=[planted.downstream]), ev.Candidate(patches=[planted.drift]), planted.honest]
    contract = example_contract(tmp_path, example, add_patches=[planted.downstream, planted.drift],
                                verify={"downstream": EXAMPLE_DOWNSTREAM})  # fmt: skip
    verdicts = await run_verification(tmp_path, contract, candidates, timeout_s=1400)
    assert [v.candidate_key for v in verdicts] == [c.key() for c in candidates]
    stale, drift, honest = verdicts

    assert stale.failed_invariants == ["downstream"], stale.failed_invariants
    rows = _rows(stale)
    assert rows["loss"].ok and rows["loss.trend"].ok, "training and its evaluations are the baseline's"
    assert rows["downstream"].detail.startswith("failed on 1/1 checks; first: pair 1: perplexity ")
    worse, allowed = rows["downstream"].observed, rows["downstream"].tolerance
    assert worse is not None and allowed is not None and worse > 5 * allowed, (worse, allowed)

    assert drift.failed_invariants == ["loss.trend"], drift.failed_invariants
    rows = _rows(drift)
    assert rows["loss"].ok, "every point inside ε: only the trend can catch this drift"
    assert rows["downstream"].ok, "the gradients are untouched: the same model"
    assert rows["loss.trend"].observed is not None and rows["loss.trend"].observed > 1.0
    assert "projected" in rows["loss.trend"].detail

    assert honest.failed_invariants == [], honest.failed_invariants
    rows = _rows(honest)
    assert rows["loss.trend"].ok and rows["downstream"].ok


async def test_bitwise_parity_rejects_a_run_that_cannot_be_reproduced(example: str, tmp_path: Path) -> None:
    planted = PLANTED[example]
    candidates = [ev.Candidate(patches=[planted.unreproducible]), planted.honest]
    contract = example_contract(tmp_path, example, add_patches=[planted.unreproducible],
                                verify={"downstream": EXAMPLE_DOWNSTREAM}, invariants={"parity": "bitwise"})  # fmt: skip
    verdicts = await run_verification(tmp_path, contract, candidates, timeout_s=1400)
    assert [v.candidate_key for v in verdicts] == [c.key() for c in candidates]
    jitter, honest = verdicts

    assert jitter.failed_invariants == ["loss.parity"], jitter.failed_invariants
    rows = _rows(jitter)
    assert rows["loss"].ok and rows["loss.trend"].ok and rows["downstream"].ok, "inside ε, no trend, same model"
    assert rows["parity.deterministic"].ok, "deterministic algorithms were on: the noise is the job's own"
    assert "first out: train step " in rows["loss.parity"].detail, rows["loss.parity"].detail

    assert honest.failed_invariants == [], honest.failed_invariants
    rows = _rows(honest)
    assert rows["loss.parity"].ok and rows["parity.deterministic"].ok
    assert rows["loss.parity"].observed == 0.0
