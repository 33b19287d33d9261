"""The trial ledger: pairing each trial's ``TrialFinished`` with its ``TrialMeasured`` into one outcome.

Owns ``TrialLedger`` (per study: every trial's facts, each trial's ``TrialOutcome`` once its facts are complete,
the accelerator-seconds spent) and the mapping from the event catalog's trial statuses to the modeling
package's. Pure and idempotent: a repeated fact changes nothing. Must not: know the search space or the models
(``study.model`` turns an outcome into an observation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from infrarsi import events as ev

if TYPE_CHECKING:
    from infrarsi.modeling.observations import Status

_FAILED_STATUS: dict[str, Status] = {
    # events.TrialStatus (not ok) → modeling.observations.Status
    "oom": "oom",
    "crash": "crash",
    "cancelled": "crash",
    "timeout": "timeout",
    "stopped_slow": "stopped_slow",
    "scope_violation": "scope_violation",
    "patch_conflict": "scope_violation",
    "invariant_violation": "invariant_violation",
}


@dataclass(frozen=True)
class TrialOutcome:
    """One trial as the models see it, once its facts are complete."""

    trial_id: str
    candidate: ev.Candidate | None
    """``None`` when no ``TrialProposed`` or known candidate key names it."""
    kind: str
    status: Status
    """A ``modeling.observations.Status``: ok | oom | crash | timeout | stopped_slow | scope_violation |
    invariant_violation."""
    step_time_s: float | None
    """Measured (for ``stopped_slow``: over the steps it ran); for a timeout the censoring bound (the step time
    is at least this), ``None`` if no step showed."""
    peak_bytes: float | None
    """Max over ranks; for an OOM the censoring bound (the peak seen before the kill)."""
    accelerator_s: float
    detail: str = ""
    infrastructure: bool = False
    """Failed because of the harness (``TrialFinished.infrastructure``, or a timing verdict taken under
    interference, ``TrialMeasured.interfered``): no evidence about the candidate."""


@dataclass
class _Trial:
    proposed: ev.TrialProposed | None = None
    finished: ev.TrialFinished | None = None
    measured: ev.TrialMeasured | None = None
    outcome: TrialOutcome | None = None


class TrialLedger:
    """Per study: every trial's facts, and its outcome once complete — a failed ``TrialFinished`` alone, or an
    ok or ``stopped_slow`` ``TrialFinished`` together with its ``TrialMeasured`` (in either order). Idempotent per trial: a repeated
    fact changes nothing. Accelerator-seconds are summed over every finished trial (failed ones included)."""

    def __init__(self) -> None:
        self.trials: dict[str, _Trial] = {}
        self.by_key: dict[str, ev.Candidate] = {ev.Candidate().key(): ev.Candidate()}
        self.accelerator_s = 0.0

    def _trial(self, trial_id: str) -> _Trial:
        return self.trials.setdefault(trial_id, _Trial())

    def proposed(self, trial_id: str, p: ev.TrialProposed) -> None:
        t = self._trial(trial_id)
        if t.proposed is None:
            t.proposed = p
            self.by_key.setdefault(p.candidate.key(), p.candidate)

    def finished(self, trial_id: str, f: ev.TrialFinished) -> TrialOutcome | None:
        t = self._trial(trial_id)
        if t.finished is not None:
            return None
        t.finished = f
        self.accelerator_s += f.accelerator_s
        return self._resolve(trial_id, t)

    def measured(self, trial_id: str, m: ev.TrialMeasured) -> TrialOutcome | None:
        t = self._trial(trial_id)
        if t.measured is not None:
            return None
        t.measured = m
        return self._resolve(trial_id, t)

    def outcome(self, trial_id: str) -> TrialOutcome | None:
        t = self.trials.get(trial_id)
        return t.outcome if t is not None else None

    def _resolve(self, trial_id: str, t: _Trial) -> TrialOutcome | None:
        if t.outcome is not None or t.finished is None:
            return None
        f, m = t.finished, t.measured
        candidate = t.proposed.candidate if t.proposed is not None else (
            self.by_key.get(m.candidate_key) if m is not None else None)
        kind = t.proposed.kind if t.proposed is not None else (m.kind if m is not None else "search")
        if f.status not in ("ok", "stopped_slow"):  # stopped_slow: its steps are a measurement, wait for it
            peak = f.censored_peak_bytes if f.status == "oom" else None
            if f.status == "oom" and not peak:
                peak = f.peak_memory_bytes or None
            at_least = timeout_step_bound(f) if f.status == "timeout" else None
            t.outcome = TrialOutcome(trial_id, candidate, kind, _FAILED_STATUS[f.status], at_least,
                                     float(peak) if peak else None, f.accelerator_s, f.reason, f.infrastructure)
        elif m is None:
            return None
        else:
            status: Status
            if m.status == "ok":
                status = "ok" if m.invariants_ok else "invariant_violation"
            else:
                status = _FAILED_STATUS[m.status]
            failed = ", ".join(i.name for i in m.invariants if not i.ok)
            if m.interfered:
                t.outcome = TrialOutcome(trial_id, candidate, kind, "crash", None, None, f.accelerator_s,
                                         f"measured under interference ({failed} failed): re-run", True)
                return t.outcome
            peak = max(m.peak_memory_bytes) if m.peak_memory_bytes else (f.peak_memory_bytes or None)
            detail = f.reason if status == "stopped_slow" else f"failed invariants: {failed}" if failed else ""
            t.outcome = TrialOutcome(trial_id, candidate, kind, status,
                                     m.step_time_s if m.step_time_s > 0 else None,
                                     float(peak) if peak else None, f.accelerator_s, detail)
        return t.outcome


def timeout_step_bound(f: ev.TrialFinished) -> float | None:
    """A timed-out trial's step time is at least this: the launcher's clock from the first step it saw to the
    kill, over the steps begun in that span (the last one unfinished). ``None`` when no step was seen."""
    seen = f.step_seen_s
    if not seen or f.wall_s <= seen[0]:
        return None
    return (f.wall_s - seen[0]) / len(seen)
