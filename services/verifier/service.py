"""The verifier service: owns verification plans and decisions.

A thin wrapper around ``VerifierLogic`` (logic.py): for each VerifyRequested it proposes interleaved
baseline/candidate runs (TrialProposed kind=verify) at the contract's longer horizon, reads their
TrialMeasured/TrialFinished, and publishes one VerifyCompleted per round (speed-up with a bootstrap CI,
every invariant on every run; promotable after the required number of passed rounds).
"""

from __future__ import annotations

from infrarsi.events import StudyCancelled, StudyCreated, TrialFinished, TrialMeasured, VerifyRequested
from infrarsi.runtime.service import ReactiveService

from .logic import VerifierLogic


class VerifierService(ReactiveService):
    name = "verifier"
    consumes = (StudyCreated, VerifyRequested, TrialMeasured, TrialFinished, StudyCancelled)

    def make_state(self) -> VerifierLogic:
        return VerifierLogic()
