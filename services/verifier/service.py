"""The verifier: owns verification plans and promotability decisions.

Consumes ``VerifyRequested`` and ``TrialMeasured``; it is the service that will produce ``TrialProposed``
(kind ``verify``, interleaved with baseline runs) and ``VerifyCompleted`` once the verification logic
lands. Today it keeps the read model those decisions need — per study, the candidates asked for
verification and the measurements of verify and baseline trials — and logs every change. It emits
nothing yet: a verdict made without the A/B runs would be a fake one.

It must not fit models or propose search candidates; it learns everything from the bus and rebuilds its
read model by replaying the stream on start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infrarsi import events as ev
from infrarsi.events import TrialMeasured, VerifyRequested
from infrarsi.logs import get_logger
from infrarsi.service import Outbox, Service

log = get_logger(__name__)

STATUS_STUDIES = 20
"""Studies listed in a ping reply (the most recently seen); the count covers all."""


@dataclass
class VerifyPlan:
    """One ``VerifyRequested``: what to re-run, how often, for how long."""

    request_id: str
    candidate_keys: list[str]
    repeats: int
    steps: int | None


@dataclass
class StudyVerification:
    study_id: str
    plans: dict[str, VerifyPlan] = field(default_factory=dict)
    """By the requesting event's id."""
    verify_measurements: dict[str, TrialMeasured] = field(default_factory=dict)
    """Measured verify trials, by trial id."""
    baseline_measurements: dict[str, TrialMeasured] = field(default_factory=dict)
    """Measured baseline (and doctor) trials, by trial id: the A of the A/B comparison."""

    def pending_candidates(self) -> set[str]:
        requested = {key for plan in self.plans.values() for key in plan.candidate_keys}
        return requested - {m.candidate_key for m in self.verify_measurements.values()}

    def summary(self) -> dict[str, object]:
        return {
            "verify_requests": len(self.plans),
            "verify_measured": len(self.verify_measurements),
            "baseline_measured": len(self.baseline_measurements),
            "unmeasured_candidates": len(self.pending_candidates()),
        }


class VerifierService(Service):
    name = "verifier"
    consumes = (VerifyRequested, TrialMeasured)

    def __init__(self) -> None:
        self.studies: dict[str, StudyVerification] = {}
        self._applied: set[str] = set()

    async def start(self) -> None:
        async for event in self.replay():
            self.apply(event, live=False)
        log.info("read model rebuilt", studies=len(self.studies))

    async def handle(self, event: ev.Event, out: Outbox) -> None:
        self.apply(event, live=True)

    def _study(self, study_id: str) -> StudyVerification:
        study = self.studies.get(study_id)
        if study is None:
            study = self.studies[study_id] = StudyVerification(study_id)
        return study

    def apply(self, event: ev.Event, *, live: bool) -> None:
        """Fold one event into the read model; a repeated event id changes nothing."""
        if event.event_id in self._applied:
            return
        self._applied.add(event.event_id)
        trial_id = event.trial_id or event.event_id
        match event.payload:
            case VerifyRequested(candidates=candidates, repeats=repeats, steps=steps):
                plan = VerifyPlan(event.event_id, [c.key() for c in candidates], repeats, steps)
                self._study(event.study_id).plans[event.event_id] = plan
                if live:
                    log.info("verification requested", candidates=plan.candidate_keys, repeats=repeats)
            case TrialMeasured(kind="verify") as measured:
                self._study(event.study_id).verify_measurements[trial_id] = measured
                if live:
                    log.info(
                        "verify trial measured",
                        candidate_key=measured.candidate_key,
                        status=measured.status,
                        invariants_ok=measured.invariants_ok,
                    )
            case TrialMeasured(kind="baseline" | "doctor") as measured:
                self._study(event.study_id).baseline_measurements[trial_id] = measured
                if live:
                    log.info("baseline trial measured", status=measured.status, step_time_s=measured.step_time_s)
            case TrialMeasured(kind=kind):
                if live:
                    log.debug("search trial measurement not needed for verification", kind=kind)
            case _:
                log.warning("unexpected event type", event_type=event.type)

    def status(self) -> dict[str, object]:
        recent = list(self.studies.values())[-STATUS_STUDIES:]
        return {"studies": len(self.studies), "recent_studies": {s.study_id: s.summary() for s in recent}}
