"""The reporter's second concern: every finished study leaves its lesson in the experience bank.

``BankDistiller`` is a pure fold over the lifecycle events a lesson is made of (``StudyCreated``,
``DoctorCompleted``, ``RunRequested``, ``TrialProposed``, ``TrialFinished``, ``TrialMeasured``,
``ModelUpdated``, ``VerifyCompleted``, ``StudyFinished``). ``apply(event)`` returns the ``BankEntry`` events to publish:

- on ``StudyFinished``: ``bank_event(distil(facts))`` of the study (a later ``StudyFinished``, after a larger
  ``infrarsi run``, publishes a revision);
- on a ``VerifyCompleted`` of a study that has already finished (a verification run after the search): a
  revision with that verdict; likewise on a ``ModelUpdated`` that lands after ``StudyFinished`` (the modeler's
  last refit races the proposer's ``StudyFinished``). Verdicts and models that arrive during the search (a
  ``RunRequested`` reopens it) wait for the study's ``StudyFinished``, so no entry describes a study still
  being searched.

The entry id is derived from the study and the event id from the entry's content (``bank.distil``): publishing
the same facts twice is dropped by JetStream's duplicate window, and readers keep the latest revision anyway.
Like the proposer's and modeler's states, an event id applied a second time returns its first emissions and
changes nothing: the reporter rebuilds the fold by replay on start (outputs discarded) and then re-publishes
for any event the durable consumer redelivers because the last life died before acking it.

Must not: do I/O. The reporter service publishes what this returns, and acks only after.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infrarsi import events as ev
from infrarsi.bank.distil import StudyFacts, TrialFact, bank_event, distil, meta_from_cluster

SOURCE = "reporter"


@dataclass
class _Trial:
    proposed: ev.TrialProposed | None = None
    finished: ev.TrialFinished | None = None
    measured: ev.TrialMeasured | None = None

    def fact(self) -> TrialFact | None:
        """The trial as ``distil`` reads it; ``None`` until its outcome is known (an ok trial needs its
        ``TrialMeasured`` too) or when no ``TrialProposed`` says what it ran."""
        p, f, m = self.proposed, self.finished, self.measured
        if p is None or f is None:
            return None
        if f.status != "ok":
            censored = (f.censored_peak_bytes or f.peak_memory_bytes or None) if f.status == "oom" else None
            return TrialFact(candidate=p.candidate, status=f.status, censored_peak_bytes=censored,
                             memory_capacity_bytes=f.memory_capacity_bytes or None, reason=f.reason, kind=p.kind)
        if m is None:
            return None
        failed = [i.name for i in m.invariants if not i.ok]
        status: ev.TrialStatus = "invariant_violation" if m.status == "ok" and not m.invariants_ok else m.status
        return TrialFact(
            candidate=p.candidate, status=status,
            step_time_s=m.step_time_s if status == "ok" and m.step_time_s > 0 else None,
            peak_memory_bytes=float(max(m.peak_memory_bytes)) if m.peak_memory_bytes else None,
            reason=f"failed invariants: {', '.join(failed)}" if failed else "", kind=p.kind,
        )


@dataclass
class _Study:
    created: ev.StudyCreated
    cluster_id: str
    """Where the study ran (its ``StudyCreated`` envelope): the entry's subject is ``bank.<cluster_id>.<entry>``."""
    trials: dict[str, _Trial] = field(default_factory=dict)
    last_model: ev.ModelUpdated | None = None
    baseline_step_s: float | None = None
    verifications: dict[str, ev.VerifyCompleted] = field(default_factory=dict)
    """The latest verdict per verification."""
    finished: bool = False

    def trial(self, trial_id: str) -> _Trial:
        return self.trials.setdefault(trial_id, _Trial())

    def meta(self) -> ev.BankMeta:
        """What ``init`` recorded; for a study created without the bank, what its cluster alone says."""
        if self.created.bank is not None:
            return self.created.bank.meta
        return meta_from_cluster(self.created.cluster, parallelism={}, model_family="", model_params=0.0,
                                 seq_len=0, global_batch=0, micro_batch=0, precision="")

    def facts(self, study_id: str) -> StudyFacts:
        model = self.last_model
        facts = [f for t in self.trials.values() if (f := t.fact()) is not None]
        return StudyFacts(
            study_id=study_id, meta=self.meta(),
            time_effects=model.time_effects if model is not None else (),
            memory_effects=model.memory_effects if model is not None else (),
            trials=facts, verifications=list(self.verifications.values()), baseline_step_s=self.baseline_step_s,
        )


class BankDistiller:
    """The fold (module docstring). ``consumes`` names the lifecycle events it reads, for the replay."""

    consumes: tuple[type, ...] = (ev.StudyCreated, ev.DoctorCompleted, ev.RunRequested, ev.TrialProposed,
                                  ev.TrialFinished, ev.TrialMeasured, ev.ModelUpdated, ev.VerifyCompleted,
                                  ev.StudyFinished)

    def __init__(self) -> None:
        self.studies: dict[str, _Study] = {}
        self._seen: set[str] = set()
        self._emitted: dict[str, list[ev.Event]] = {}

    def apply(self, event: ev.Event) -> list[ev.Event]:
        if type(event.payload) not in self.consumes:
            return []  # telemetry and the rest: not remembered (the reporter sees every step)
        if event.event_id in self._seen:
            return list(self._emitted.get(event.event_id, []))
        self._seen.add(event.event_id)
        out = self._apply(event)
        if out:
            self._emitted[event.event_id] = out
        return list(out)

    def _apply(self, event: ev.Event) -> list[ev.Event]:
        study = self.studies.get(event.study_id)
        tid = event.trial_id
        match event.payload:
            case ev.StudyCreated() as created:
                if study is None:
                    self.studies[event.study_id] = _Study(created, event.cluster_id)
                return []
            case _ if study is None:
                return []  # a study created before the bank existed on this bus, or another service's test data
            case ev.DoctorCompleted() as done:
                study.baseline_step_s = done.step_time_s if done.step_time_s > 0 else None
            case ev.TrialProposed() as proposed if tid:
                study.trial(tid).proposed = study.trial(tid).proposed or proposed
            case ev.TrialFinished() as finished if tid:
                study.trial(tid).finished = study.trial(tid).finished or finished
            case ev.TrialMeasured() as measured if tid:
                study.trial(tid).measured = study.trial(tid).measured or measured
            case ev.RunRequested():
                study.finished = False
            case ev.ModelUpdated() as update:
                study.last_model = update
                if study.finished:
                    return [self._entry(event.study_id, study)]
            case ev.VerifyCompleted() as verdict:
                study.verifications[verdict.verify_id] = verdict
                if study.finished:
                    return [self._entry(event.study_id, study)]
            case ev.StudyFinished():
                study.finished = True
                return [self._entry(event.study_id, study)]
        return []

    def _entry(self, study_id: str, study: _Study) -> ev.Event:
        return bank_event(distil(study.facts(study_id)), cluster_id=study.cluster_id, source=SOURCE)

    def status(self) -> dict[str, object]:
        return {"bank_studies": len(self.studies), "bank_finished": sum(s.finished for s in self.studies.values())}
