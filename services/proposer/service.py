"""The proposer service: owns each study's budget, its in-flight trial slots and candidate dedup.

A thin wrapper: the behaviour is ``ProposerState`` (logic.py), a pure fold over the events below that
the runner rebuilds by replay on start. It proposes search trials (TrialProposed, with origin, reason and
the models' prediction), asks for verification of the best (VerifyRequested) and ends the study
(StudyFinished). It must not launch trials or read another service's state.
"""

from __future__ import annotations

from infrarsi.events import (
    DoctorCompleted,
    RunRequested,
    StudyCreated,
    TrialFinished,
    TrialMeasured,
    TrialProposed,
    VerifyCompleted,
)
from infrarsi.service import ReactiveService

from .logic import ProposerState


class ProposerService(ReactiveService):
    name = "proposer"
    consumes = (
        StudyCreated,
        DoctorCompleted,
        RunRequested,
        TrialProposed,
        TrialFinished,
        TrialMeasured,
        VerifyCompleted,
    )

    def make_state(self) -> ProposerState:
        return ProposerState()
