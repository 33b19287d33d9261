"""The modeler: owns the time and memory models of every study, their priors and posteriors.

Consumes ``TrialMeasured`` and ``TrialFinished`` (lifecycle stream) and ``BankEntry`` (bank stream); it is
the service that will produce ``ModelUpdated`` once the models land (``infrarsi.modeling``). Today it keeps
the observations the fit will use — per study, the measured step times and peaks of completed trials and
the *censored* observations of OOM trials (peak > the bound the launcher saw; never dropped) — and the
bank entries that can seed priors, and logs every change. It emits nothing yet: a model summary made
without a fit would be a fake one.

It must not propose candidates or decide verifications; it learns everything from the bus and rebuilds
its read model by replaying the streams on start.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from infrarsi import events as ev
from infrarsi.events import BankEntry, TrialFinished, TrialMeasured
from infrarsi.logs import get_logger
from infrarsi.service import Outbox, Service

log = get_logger(__name__)

STATUS_STUDIES = 20
"""Studies listed in a ping reply (the most recently seen); the count covers all."""


@dataclass(frozen=True)
class Observation:
    """One measured trial, as the time and memory models will see it."""

    trial_id: str
    candidate_key: str
    step_time_s: float
    peak_memory_bytes: int
    """Largest over ranks."""
    invariants_ok: bool


@dataclass(frozen=True)
class CensoredPeak:
    """An OOM trial: its true peak is above ``bound_bytes`` (right-censored), capacity was ``capacity_bytes``."""

    trial_id: str
    bound_bytes: int
    capacity_bytes: int


@dataclass
class StudyObservations:
    study_id: str
    measured: dict[str, Observation] = field(default_factory=dict)
    """By trial id."""
    censored: dict[str, CensoredPeak] = field(default_factory=dict)
    """OOM trials, by trial id."""
    finished: Counter[str] = field(default_factory=Counter)
    """TrialFinished statuses."""

    def summary(self) -> dict[str, object]:
        return {"measured": len(self.measured), "censored_oom": len(self.censored), "finished": dict(self.finished)}


class ModelerService(Service):
    name = "modeler"
    consumes = (TrialMeasured, TrialFinished, BankEntry)

    def __init__(self) -> None:
        self.studies: dict[str, StudyObservations] = {}
        self.bank: dict[str, BankEntry] = {}
        """Bank entries by entry id: the candidate prior sources for new studies."""
        self._applied: set[str] = set()

    async def start(self) -> None:
        async for event in self.replay():
            self.apply(event, live=False)
        log.info("read model rebuilt", studies=len(self.studies), bank_entries=len(self.bank))

    async def handle(self, event: ev.Event, out: Outbox) -> None:
        self.apply(event, live=True)

    def _study(self, study_id: str) -> StudyObservations:
        study = self.studies.get(study_id)
        if study is None:
            study = self.studies[study_id] = StudyObservations(study_id)
        return study

    def apply(self, event: ev.Event, *, live: bool) -> None:
        """Fold one event into the read model; a repeated event id changes nothing."""
        if event.event_id in self._applied:
            return
        self._applied.add(event.event_id)
        trial_id = event.trial_id or event.event_id
        match event.payload:
            case TrialMeasured(status="ok") as measured:
                observation = Observation(
                    trial_id=trial_id,
                    candidate_key=measured.candidate_key,
                    step_time_s=measured.step_time_s,
                    peak_memory_bytes=max(measured.peak_memory_bytes, default=0),
                    invariants_ok=measured.invariants_ok,
                )
                self._study(event.study_id).measured[trial_id] = observation
                if live:
                    log.info(
                        "observation added",
                        candidate_key=observation.candidate_key,
                        step_time_s=observation.step_time_s,
                        peak_memory_bytes=observation.peak_memory_bytes,
                    )
            case TrialMeasured(status=status):
                if live:
                    log.info("measurement of a failed trial ignored by the time model", status=status)
            case TrialFinished(status=status) as finished:
                study = self._study(event.study_id)
                study.finished[status] += 1
                if status == "oom":
                    bound = finished.censored_peak_bytes or finished.peak_memory_bytes
                    study.censored[trial_id] = CensoredPeak(trial_id, bound, finished.memory_capacity_bytes)
                if live:
                    log.info("trial finished", status=status, censored=status == "oom")
            case BankEntry(entry_id=entry_id, meta=meta) as entry:
                self.bank[entry_id] = entry
                if live:
                    log.info("bank entry stored", entry_id=entry_id, accelerator=meta.accelerator)
            case _:
                log.warning("unexpected event type", event_type=event.type)

    def status(self) -> dict[str, object]:
        recent = list(self.studies.values())[-STATUS_STUDIES:]
        return {
            "studies": len(self.studies),
            "bank_entries": len(self.bank),
            "recent_studies": {s.study_id: s.summary() for s in recent},
        }
