"""The modeler service: owns the global time and peak-memory models of every study.

A thin wrapper around ``ModelerState`` (logic.py): on each completed trial — measured, or failed with
OOM as a censored observation — it refits and publishes ModelUpdated (prior vs posterior effect of every
knob setting and patch on time and memory). The proposer refits the same model code from the same events
for its own decisions; ModelUpdated is for people, the report and the experience bank.
"""

from __future__ import annotations

from infrarsi.events import (
    DoctorCompleted,
    Event,
    ModelUpdated,
    StudyCreated,
    TrialFinished,
    TrialMeasured,
    TrialProposed,
)
from infrarsi.runtime.service import Outbox, ReactiveService

from .logic import ModelerState


class ModelerService(ReactiveService):
    name = "modeler"
    consumes = (StudyCreated, DoctorCompleted, TrialProposed, TrialFinished, TrialMeasured)

    def make_state(self) -> ModelerState:
        return ModelerState()

    async def handle(self, event: Event, out: Outbox) -> None:
        await super().handle(event, out)
        for published in out.published:
            match published.payload:
                case ModelUpdated(fit_seconds=fit_s):
                    self.metrics.refit_seconds.labels(self.name).observe(fit_s)
                case _:
                    pass
