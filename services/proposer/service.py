"""The proposer: owns each study's budget, its in-flight trial slots and candidate dedup.

Consumes ``StudyCreated``, ``DoctorCompleted``, ``ModelUpdated`` and ``TrialFinished``; it is the service
that will produce ``TrialProposed``, ``VerifyRequested`` and ``StudyFinished`` once the search lands.
Today it keeps the read model the search stands on — the studies, whether their baseline has been
profiled, the latest model summary, which trials have finished and what they cost against the budget —
and logs every change. It emits nothing yet: a proposal made without the search would be a fake one.

It must not launch trials, fit models or read another service's state: it learns everything from the bus,
and rebuilds its read model by replaying the stream on start.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from infrarsi import events as ev
from infrarsi.events import DoctorCompleted, ModelUpdated, StudyCreated, TrialFinished
from infrarsi.logs import get_logger
from infrarsi.service import Outbox, Service

log = get_logger(__name__)

STATUS_STUDIES = 20
"""Studies listed in a ping reply (the most recently seen); the count covers all."""


@dataclass
class StudyBudget:
    """What ``init`` allowed the search to spend, as read from the locked contract."""

    trials: int | None = None
    accelerator_s: float | None = None


@dataclass
class StudyView:
    """The proposer's view of one study."""

    study_id: str
    name: str | None = None
    """``None`` while only later events of the study have been seen (the proposer joined mid-study)."""
    budget: StudyBudget = field(default_factory=StudyBudget)
    doctor_step_time_s: float | None = None
    """The baseline's step time from doctor; the search does not start before it is known."""
    repeats_per_trial: int | None = None
    model_fits: int = 0
    best_candidate_key: str | None = None
    finished_trials: set[str] = field(default_factory=set)
    """Trial ids, so a trial counts once even if its TrialFinished is seen twice."""
    status_counts: Counter[str] = field(default_factory=Counter)
    accelerator_s: float = 0.0
    """Spent so far, failed trials included."""

    def summary(self) -> dict[str, object]:
        return {
            "name": self.name,
            "doctor_done": self.doctor_step_time_s is not None,
            "model_fits": self.model_fits,
            "trials_finished": len(self.finished_trials),
            "statuses": dict(self.status_counts),
            "accelerator_s": round(self.accelerator_s, 3),
            "budget_trials": self.budget.trials,
            "budget_accelerator_s": self.budget.accelerator_s,
        }


def _budget_from_contract(contract: dict[str, object]) -> StudyBudget:
    budget = contract.get("budget")
    if not isinstance(budget, dict):
        return StudyBudget()
    hours = budget.get("accelerator_hours")
    trials = budget.get("trials")
    return StudyBudget(
        trials=int(trials) if isinstance(trials, int) else None,
        accelerator_s=float(hours) * 3600.0 if isinstance(hours, int | float) else None,
    )


class ProposerService(Service):
    name = "proposer"
    consumes = (StudyCreated, DoctorCompleted, ModelUpdated, TrialFinished)

    def __init__(self) -> None:
        self.studies: dict[str, StudyView] = {}
        self._applied: set[str] = set()
        """Event ids already folded into the read model: replay and live delivery overlap on start."""

    async def start(self) -> None:
        async for event in self.replay():
            self.apply(event, live=False)
        log.info("read model rebuilt", studies=len(self.studies), events=len(self._applied))

    async def handle(self, event: ev.Event, out: Outbox) -> None:
        self.apply(event, live=True)

    def apply(self, event: ev.Event, *, live: bool) -> None:
        """Fold one event into the read model; a repeated event id changes nothing."""
        if event.event_id in self._applied:
            return
        self._applied.add(event.event_id)
        study = self.studies.get(event.study_id)
        if study is None:
            study = self.studies[event.study_id] = StudyView(event.study_id)
        match event.payload:
            case StudyCreated(name=name, contract=contract):
                study.name = name
                study.budget = _budget_from_contract(contract)
                if live:
                    log.info(
                        "study registered",
                        name=name,
                        budget_trials=study.budget.trials,
                        budget_accelerator_s=study.budget.accelerator_s,
                    )
            case DoctorCompleted(step_time_s=step_time_s, repeats_per_trial=repeats):
                study.doctor_step_time_s = step_time_s
                study.repeats_per_trial = repeats
                if live:
                    log.info("baseline profiled", step_time_s=step_time_s, repeats_per_trial=repeats)
            case ModelUpdated(n_trials=n_trials, best_candidate_key=best):
                study.model_fits += 1
                study.best_candidate_key = best
                if live:
                    log.info("model updated", n_trials=n_trials, best_candidate_key=best)
            case TrialFinished(status=status, accelerator_s=accelerator_s):
                trial_id = event.trial_id or event.event_id
                if trial_id in study.finished_trials:
                    return
                study.finished_trials.add(trial_id)
                study.status_counts[status] += 1
                study.accelerator_s += accelerator_s
                if live:
                    log.info(
                        "trial finished",
                        status=status,
                        accelerator_s=accelerator_s,
                        spent_accelerator_s=round(study.accelerator_s, 3),
                    )
            case _:
                log.warning("unexpected event type", event_type=event.type)

    def status(self) -> dict[str, object]:
        recent = list(self.studies.values())[-STATUS_STUDIES:]
        return {"studies": len(self.studies), "recent_studies": {v.study_id: v.summary() for v in recent}}
