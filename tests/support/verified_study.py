"""A verification as the services would leave it on the bus: telemetry's ``TrialMeasured`` for every run the
verifier planned, and the verifier's ``VerifyCompleted`` per round decided from them — each event under the
source the subjects table names as its publisher. ``infrarsi apply`` re-derives verifications from exactly
these, so a test of apply needs the whole chain, not a lone ``VerifyCompleted``. ``locked_contract`` is the
contract such a study was created with, its verify rules and loss invariant the test's."""

from __future__ import annotations

from infrarsi import events as ev
from infrarsi.verdicts import verification as vf
from support.owned import owned_event

__all__ = ["Piece", "final", "locked_contract", "owned_event", "verification"]

Piece = tuple[object, str | None]
"""A payload and its trial id (``None`` for study-level events)."""


def locked_contract(*, steps: int, verify_steps: int, verify: dict[str, object], loss: dict[str, object]) -> dict[str, object]:
    """A locked contract (what ``init`` puts in ``StudyCreated``) of a one-file CPU workload: ``steps`` a search
    trial, ``verify_steps`` a verify run, ``verify`` its verify rules and ``loss`` its loss invariant."""
    return {
        "name": "s", "goal": "g",
        "workload": {"repo": "/w", "command": ["{python}", "train.py", "{launch_file}"], "launch_file": "launch.yaml",
                     "steps": steps, "verify_steps": verify_steps},
        "cluster": {"id": "local", "accelerator": "cpu", "memory_capacity_bytes": 2**30}, "scope": {"files": ["model.py"]},
        "budget": {"trials": 4, "accelerator_hours": 1.0},
        "verify": verify,
        "invariants": {"loss": loss},
    }  # fmt: skip


def _measured(candidate_key: str, step_s: float) -> ev.TrialMeasured:
    curve = [ev.LossPoint(step, 3.0 - 0.01 * step) for step in (10, 20, 30)]
    return ev.TrialMeasured(
        candidate_key=candidate_key, kind="verify", status="ok", steps=30, warmup_steps=2,
        step_time_s=step_s, step_time_mad_s=0.001, step_time_with_warmup_s=step_s, tokens_per_s=1000.0,
        mfu=None, flops_per_step=None, phases={}, peak_memory_bytes=[1 << 20], per_rank_step_s=[step_s],
        stragglers=[], loss_curve=curve, eval_curve=[], optimizer_steps=30, tokens=30 * 256,
        invariants=[], invariants_ok=True,
    )  # fmt: skip


def verification(
    candidate: ev.Candidate,
    *,
    baseline_s: float = 0.5,
    candidate_s: float = 0.4,
    rounds: int = 2,
    repeats: int = 2,
    verify_id: str = "v1",
) -> list[Piece]:
    """Every round of one verification (the last ``VerifyCompleted`` is promotable with the defaults)."""
    pieces: list[Piece] = []
    passes = 0
    for round_no in range(1, rounds + 1):
        round_ = vf.Round(verify_id, candidate, round_no, repeats)
        for planned in vf.plan_round(verify_id, candidate, round_no=round_no, repeats=repeats, steps=None):
            base = planned.arm == "baseline"
            measured = _measured(planned.payload.candidate_key, baseline_s if base else candidate_s)
            pieces.append((measured, planned.trial_id))
            round_.runs[planned.trial_id] = vf.RunMeasurement.from_measured(
                planned.trial_id, planned.arm, planned.pair, measured
            )
        done = vf.decide(round_, passes_before=passes, passes_required=rounds, loss_rule=vf.LossRule())
        passes = done.passes
        pieces.append((done, None))
    return pieces


def final(pieces: list[Piece]) -> ev.VerifyCompleted:
    """The last ``VerifyCompleted`` of ``verification``'s pieces."""
    return [p for p, _ in pieces if isinstance(p, ev.VerifyCompleted)][-1]
