"""Studies as things a user manages: what each study's log says about where it stands.

Owns the read side that ``infrarsi studies``, ``cancel``, ``resume`` and ``verify`` (its refusal of a second
verification) share, and that a dashboard can call as well: ``summarize`` folds lifecycle events (from the bus,
or decoded from the analyst DB's ``events`` table) into one ``StudySummary`` per study — stage, trials by
outcome, in flight, best verified speed-up, accelerator cost, cancellation, promotions —, and
``open_verification`` names a verification still running. Pure: no I/O, no clock; the same events give the same
summaries. Must not decide anything for the services (the proposer's and the verifier's folds own that).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from infrarsi import events as ev
from infrarsi.verdicts import verification as vf

Stage = Literal["created", "doctor", "searching", "verifying", "finished", "cancelled"]
"""Where a study stands: ``created`` (locked, nothing run), ``doctor`` (baseline runs, or doctored and not
searched), ``searching`` (``RunRequested`` and no ``VerifyRequested`` after it), ``verifying`` (a verification
without its final verdict), ``finished`` (``StudyFinished``), ``cancelled`` (``StudyCancelled``, not resumed)."""

STAGES: tuple[Stage, ...] = ("created", "doctor", "searching", "verifying", "finished", "cancelled")


@dataclass
class OpenVerification:
    """A ``VerifyRequested`` whose candidates have not all had their final ``VerifyCompleted``."""

    request_event_id: str
    requested_by: str
    """The event's source: ``proposer`` (the search ended) or ``cli.verify``."""
    requested_at: datetime
    pending: list[str]
    """Candidate keys still without a final verdict."""
    candidates: int


@dataclass
class StudySummary:
    """One study as the log tells it (``summarize``)."""

    study_id: str
    name: str = ""
    created_at: datetime | None = None
    last_event_at: datetime | None = None
    stage: Stage = "created"
    trials: int = 0
    """Trials proposed, every kind (baseline, doctor, search, verify)."""
    search_trials: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    """``TrialFinished`` status → trials."""
    in_flight: int = 0
    """Proposed and not finished."""
    accelerator_s: float = 0.0
    """Every ``TrialFinished.accelerator_s`` of the study: failed and cancelled trials included."""
    failed_accelerator_s: float = 0.0
    """Of which trials that did not end ``ok``."""
    best_speedup: float | None = None
    """Highest speed-up of a promotable verification (``VerifyCompleted.promotable``)."""
    best_ci: tuple[float, float] | None = None
    best_candidate_key: str | None = None
    cancelled_reason: str | None = None
    """The last ``StudyCancelled``'s reason while the study stays cancelled."""
    cancelled_by: str | None = None
    resumed: int = 0
    finish_reason: str | None = None
    promoted: list[str] = field(default_factory=list)
    """Branches ``apply`` wrote (``PatchPromoted``)."""
    promotion_states: dict[str, str] = field(default_factory=dict)
    """Branch → its last followed state (``PromotionFollowed``: open, merged, reverted, gone)."""
    verification: OpenVerification | None = None
    """The verification running now, if any."""
    _before_cancel: Stage = "created"
    _open: dict[str, OpenVerification] = field(default_factory=dict)
    _verify_of: dict[str, tuple[str, str]] = field(default_factory=dict)
    """verify id → (request event id, candidate key)."""
    _finished: set[str] = field(default_factory=set)

    def as_json(self) -> dict[str, object]:
        """The summary as ``infrarsi studies --json`` prints it (one object per line)."""
        return {
            "study_id": self.study_id,
            "name": self.name,
            "stage": self.stage,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "last_event_at": self.last_event_at.isoformat() if self.last_event_at else None,
            "trials": self.trials,
            "search_trials": self.search_trials,
            "in_flight": self.in_flight,
            "outcomes": dict(sorted(self.outcomes.items())),
            "accelerator_s": round(self.accelerator_s, 3),
            "failed_accelerator_s": round(self.failed_accelerator_s, 3),
            "best_speedup": self.best_speedup,
            "best_ci": list(self.best_ci) if self.best_ci else None,
            "best_candidate_key": self.best_candidate_key,
            "cancelled_reason": self.cancelled_reason,
            "cancelled_by": self.cancelled_by,
            "resumed": self.resumed,
            "finish_reason": self.finish_reason,
            "promoted": self.promoted,
            "promotion_states": self.promotion_states,
            "verifying": None if self.verification is None else {
                "request": self.verification.request_event_id, "by": self.verification.requested_by,
                "pending": len(self.verification.pending), "candidates": self.verification.candidates},
        }  # fmt: skip

    # ------------------------------------------------------------------------------------ the fold

    def apply(self, event: ev.Event) -> None:
        """Fold one lifecycle event of this study."""
        self.last_event_at = event.ts
        match event.payload:
            case ev.StudyCreated(name=name):
                self.name, self.created_at = name, event.ts
            case ev.DoctorRequested():
                self._advance("doctor")
            case ev.TrialProposed(kind=kind) if event.trial_id:
                self.trials += 1
                self.search_trials += kind == "search"
                self.in_flight += 1
                if kind in ("baseline", "doctor"):
                    self._advance("doctor")
            case ev.TrialFinished() as finished if event.trial_id and event.trial_id not in self._finished:
                self._finished.add(event.trial_id)
                self.in_flight = max(0, self.in_flight - 1)
                self.outcomes[finished.status] = self.outcomes.get(finished.status, 0) + 1
                self.accelerator_s += finished.accelerator_s
                if finished.status != "ok":
                    self.failed_accelerator_s += finished.accelerator_s
            case ev.DoctorCompleted():
                self._advance("doctor")
            case ev.RunRequested():
                self._set("searching")
            case ev.VerifyRequested() as request:
                self._on_verify_requested(event, request)
            case ev.VerifyCompleted() as done:
                self._on_verified(done)
            case ev.StudyFinished(reason=reason):
                self.finish_reason = reason
                self._set("finished")
            case ev.StudyCancelled(reason=reason, by=by):
                if self.stage != "cancelled":
                    self._before_cancel = self.stage
                self.stage, self.cancelled_reason, self.cancelled_by = "cancelled", reason, by
                self._open.clear()  # the verifier plans no further round of a cancelled study
                self.verification = None
            case ev.StudyResumed():
                self.resumed += 1
                if self.stage == "cancelled":
                    self.stage, self.cancelled_reason, self.cancelled_by = self._before_cancel, None, None
            case ev.PatchPromoted(branch=branch):
                if branch not in self.promoted:
                    self.promoted.append(branch)
            case ev.PromotionFollowed(branch=branch, state=state):
                self.promotion_states[branch] = state
            case _:
                pass

    def _set(self, stage: Stage) -> None:
        if self.stage == "cancelled":
            self._before_cancel = stage  # a late event of a cancelled study moves where resume goes back to
        else:
            self.stage = stage

    def _advance(self, stage: Stage) -> None:
        """Move forward only: a doctor run proposed late does not pull a searched study back to ``doctor``."""
        current = self._before_cancel if self.stage == "cancelled" else self.stage
        if STAGES.index(stage) > STAGES.index(current):
            self._set(stage)

    def _on_verify_requested(self, event: ev.Event, request: ev.VerifyRequested) -> None:
        keys = list(dict.fromkeys(c.key() for c in request.candidates))
        for key in keys:
            self._verify_of[vf.verify_id_for(event.event_id, key)] = (event.event_id, key)
        self._open[event.event_id] = OpenVerification(event.event_id, event.source, event.ts, keys, len(keys))
        self.verification = self._open[event.event_id]
        self._set("verifying")

    def _on_verified(self, done: ev.VerifyCompleted) -> None:
        if done.promotable and (self.best_speedup is None or done.speedup > self.best_speedup):
            self.best_speedup, self.best_ci = done.speedup, (done.ci_low, done.ci_high)
            self.best_candidate_key = done.candidate_key
        if not vf.is_final(done) or done.verify_id not in self._verify_of:
            return
        request_id, key = self._verify_of[done.verify_id]
        open_request = self._open.get(request_id)
        if open_request is None or key not in open_request.pending:
            return
        open_request.pending.remove(key)
        if not open_request.pending:
            del self._open[request_id]
        self.verification = next(reversed(self._open.values()), None)


def summarize(events: Iterable[ev.Event]) -> list[StudySummary]:
    """One summary per study that has a ``StudyCreated`` among ``events``, newest study first.

    ``events`` are lifecycle events in stream order, of any number of studies; events of a study whose
    ``StudyCreated`` is not among them are left out (a study made by a retention-trimmed log)."""
    by_study: dict[str, StudySummary] = {}
    for event in events:
        summary = by_study.get(event.study_id)
        if summary is None:
            if not isinstance(event.payload, ev.StudyCreated):
                continue
            summary = by_study[event.study_id] = StudySummary(event.study_id)
        summary.apply(event)
    return sorted(by_study.values(), key=lambda s: (s.created_at is not None, s.created_at), reverse=True)


def summary_of(events: Iterable[ev.Event], study_id: str) -> StudySummary | None:
    """The summary of one study (``None`` when no ``StudyCreated`` of it is among ``events``)."""
    return next((s for s in summarize(e for e in events if e.study_id == study_id)), None)


def outcome_counts(summaries: Iterable[StudySummary]) -> Counter[str]:
    """Trials by how they ended, over the given studies (what ``infrarsi_trials_total`` counts per outcome)."""
    total: Counter[str] = Counter()
    for summary in summaries:
        total.update(summary.outcomes)
    return total
