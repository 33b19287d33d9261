"""The verifier's state machine: events in, events to publish out. No I/O.

``VerifierLogic.apply(event)`` takes every event the verifier consumes and returns the ``Emission`` s
the service publishes for it, so ``services/verifier/service.py`` is a thin wrapper:

    consumes = (StudyCreated, VerifyRequested, TrialMeasured, TrialFinished, StudyCancelled)

    async def start(self):                       # rebuild the read model
        async for event in self.replay():
            self.logic.apply(event)           # outputs discarded: they were published in a past life

    async def handle(self, event, out):
        for e in self.logic.apply(event):
            await out.emit(e.payload, study_id=e.study_id, trial_id=e.trial_id, key=e.key)

Determinism is what makes that safe: the same events in the same order give the same state and the same
emissions with the same keys, and ``Outbox`` derives event ids from (cause, type, key), so re-publishing
after a crash (an unacked event redelivered) is dropped by JetStream as a duplicate. An event seen twice
returns the emissions of its first handling again, without changing the state.

Flow per candidate of a ``VerifyRequested``: round 1's interleaved plan (``verification.plan_round``) →
collect a ``TrialMeasured`` (or a failed ``TrialFinished``) per planned trial → ``verification.decide`` →
``VerifyCompleted`` (one per round) → if the round passed and fewer than ``passes_required`` rounds have
passed, plan the next round; a failed round ends the verification (pass twice *in a row* to be promotable).
Under ``verify.checkpoint_restart`` the round also plans its restart trials once both runs of its first pair
are in (``verification.plan_restarts``: ``TrialProposed.resume_from``) and is decided only when they are in too.
Under ``verify.downstream`` the metric of each ok run comes from its ``TrialFinished`` (kept until its
``TrialMeasured``, which follows it on the stream).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
from infrarsi import events as ev
from infrarsi.runtime.logs import get_logger
from infrarsi.runtime.service import Emission, Fold
from infrarsi.study.contract import (
    CheckpointRestartSpec,
    Contract,
    ContractError,
    DownstreamSpec,
    VerifySpec,
    locked_contract,
)
from infrarsi.verdicts import verification as vf

log = get_logger(__name__)

_VERIFY_DEFAULTS = VerifySpec()
"""The contract's own defaults, for a request about a study whose contract this verifier cannot read."""


@dataclass(frozen=True)
class StudyRules:
    """What the verifier needs of a study's contract."""

    passes_required: int = _VERIFY_DEFAULTS.passes_required
    repeats: int = _VERIFY_DEFAULTS.repeats
    verify_steps: int | None = None
    loss_rule: vf.LossRule = vf.LossRule()
    restart: CheckpointRestartSpec | None = None
    downstream: DownstreamSpec | None = None

    @classmethod
    def from_contract(cls, contract: Contract) -> StudyRules:
        return cls(
            passes_required=contract.verify.passes_required,
            repeats=contract.verify.repeats,
            verify_steps=contract.workload.verify_steps,
            loss_rule=vf.loss_rule_of(contract.invariants),
            restart=contract.verify.checkpoint_restart,
            downstream=contract.verify.downstream,
        )

    def checks_at(self, steps: int | None) -> vf.ExtraChecks:
        """The restart and downstream checks of a verification at horizon ``steps`` (the launcher saves the
        checkpoint at the same step: ``CheckpointRestartSpec.step_for`` of the run's horizon)."""
        restart_at = None
        if self.restart is not None and steps is not None and self.restart.step_for(steps) < steps:
            restart_at = self.restart.step_for(steps)
        across = self.restart is not None and self.restart.across_change
        return vf.ExtraChecks(restart_at=restart_at, across_change=across, downstream=self.downstream)


@dataclass
class Verification:
    """One candidate's verification across rounds."""

    study_id: str
    verify_id: str
    candidate: ev.Candidate
    repeats: int
    steps: int | None
    rules: StudyRules
    round: vf.Round
    checks: vf.ExtraChecks = vf.ExtraChecks()
    plan: dict[str, vf.PlannedTrial] = field(default_factory=dict)
    """Planned trials of the current round, by trial id."""
    passes: int = 0
    done: bool = False
    history: list[ev.VerifyCompleted] = field(default_factory=list)
    cancelled: bool = False
    """Ended by ``StudyCancelled`` before its final verdict."""


class VerifierLogic(Fold):
    """The verifier's read model and reactions."""

    def __init__(self) -> None:
        super().__init__()
        self.rules: dict[str, StudyRules] = {}
        self.verifications: dict[str, Verification] = {}
        self._trial_to_verify: dict[str, str] = {}
        self._downstream: dict[str, ev.DownstreamResult] = {}
        """Downstream results of ok verify runs, from their ``TrialFinished`` (which precedes ``TrialMeasured``)."""

    # ---------------------------------------------------------------- entry point

    def _apply(self, event: ev.Event) -> list[Emission]:
        match event.payload:
            case ev.StudyCreated() as created:
                try:
                    self.rules[event.study_id] = StudyRules.from_contract(locked_contract(created))
                except ContractError as exc:  # the launcher refuses its trials too; requests get the defaults
                    log.error("unusable contract in StudyCreated", study_id=event.study_id, error=str(exc))
                out: list[Emission] = []
            case ev.VerifyRequested() as request:
                out = self._on_request(event, request)
            case ev.TrialMeasured() as measured:
                downstream = self._downstream.get(event.trial_id or "")
                out = self._on_result(event, lambda t, a, p: dataclasses.replace(
                    vf.RunMeasurement.from_measured(t, a, p, measured), downstream=downstream))
            case ev.StudyCancelled():
                out = self._on_cancelled(event.study_id)
            case ev.TrialFinished(status=status, infrastructure=True) as finished if status != "ok" and self._rerun_is_due(event):
                out = self._rerun(event, finished)
            case ev.TrialFinished(status=status) as finished if status != "ok":
                # A run that died has no TrialMeasured (or a late one); its failure is the result.
                out = self._on_result(event, lambda t, a, p: vf.RunMeasurement.from_finished(t, a, p, finished))
            case ev.TrialFinished(downstream=downstream) if downstream is not None and event.trial_id:
                self._downstream[event.trial_id] = downstream  # telemetry's TrialMeasured of this run comes next
                out = []
            case _:
                out = []
        return out

    # ---------------------------------------------------------------- reactions

    def _on_request(self, event: ev.Event, request: ev.VerifyRequested) -> list[Emission]:
        rules = self.rules.get(event.study_id, StudyRules())
        repeats = request.repeats or rules.repeats
        steps = request.steps if request.steps is not None else rules.verify_steps
        out = []
        for candidate in request.candidates:
            verify_id = vf.verify_id_for(event.event_id, candidate.key())
            if verify_id in self.verifications:
                continue  # the same candidate twice in one request
            verification = Verification(
                study_id=event.study_id,
                verify_id=verify_id,
                candidate=candidate,
                repeats=repeats,
                steps=steps,
                rules=rules,
                round=vf.Round(verify_id, candidate, 1, repeats),
                checks=rules.checks_at(steps),
            )
            self.verifications[verify_id] = verification
            out += self._plan(verification, 1)
        return out

    def _plan(self, verification: Verification, round_no: int) -> list[Emission]:
        verification.round = vf.Round(verification.verify_id, verification.candidate, round_no, verification.repeats)
        plan = vf.plan_round(
            verification.verify_id,
            verification.candidate,
            round_no=round_no,
            repeats=verification.repeats,
            steps=verification.steps,
        )
        verification.plan = {p.trial_id: p for p in plan}
        for planned in plan:
            self._trial_to_verify[planned.trial_id] = verification.verify_id
        return [Emission(p.payload, verification.study_id, p.trial_id, p.trial_id) for p in plan]

    def _on_result(self, event: ev.Event, make: Callable[[str, vf.Arm, int], vf.RunMeasurement]) -> list[Emission]:
        trial_id = event.trial_id
        verify_id = self._trial_to_verify.get(trial_id or "")
        if verify_id is None or trial_id is None:
            return []  # not a verify run
        verification = self.verifications[verify_id]
        planned = verification.plan.get(trial_id)
        round_ = verification.round
        if verification.done or planned is None or trial_id in round_.runs:
            return []  # late (round already decided) or a second report of the same run
        out: list[Emission] = []
        if planned.resumes is not None:
            if planned.resumes in round_.restarts:
                return []
            round_.restarts[planned.resumes] = make(trial_id, planned.arm, planned.pair)
        else:
            round_.runs[trial_id] = make(trial_id, planned.arm, planned.pair)
            out += self._plan_restarts(verification)
        if not round_.complete():
            return out
        done = vf.decide(
            round_,
            passes_before=verification.passes,
            passes_required=verification.rules.passes_required,
            loss_rule=verification.rules.loss_rule,
            checks=verification.checks,
        )
        verification.history.append(done)
        verification.passes = done.passes
        out += [Emission(done, verification.study_id, None, f"{verify_id}:round{verification.round.round_no}")]
        if vf.is_final(done):
            verification.done = True
        else:
            out += self._plan(verification, verification.round.round_no + 1)
        return out

    def _rerun_is_due(self, event: ev.Event) -> bool:
        """A run of an open round that the harness lost (the stack killed under it: the restarted launcher reports
        it ``cancelled``, ``infrastructure``), and not itself a re-run: it says nothing about the candidate."""
        verify_id = self._trial_to_verify.get(event.trial_id or "")
        if verify_id is None:
            return False
        verification = self.verifications[verify_id]
        planned = verification.plan.get(event.trial_id or "")
        return (not verification.done and planned is not None and planned.payload.retry_of is None
                and event.trial_id not in verification.round.runs)

    def _rerun(self, event: ev.Event, finished: ev.TrialFinished) -> list[Emission]:
        """The lost run once more, in its place in the plan (same arm, pair, steps): the round waits for the
        re-run's result instead of failing on a crash of InfraRSI's own (a second loss counts as the failure)."""
        trial_id = event.trial_id or ""
        verification = self.verifications[self._trial_to_verify[trial_id]]
        planned = verification.plan.pop(trial_id)
        again = ev.derived_id(trial_id, "rerun")
        payload = dataclasses.replace(planned, trial_id=again, payload=msgspec.structs.replace(
            planned.payload, retry_of=trial_id, reason=f"{planned.payload.reason}; re-run of {trial_id} ({finished.reason[:160]})"))
        verification.plan[again] = payload
        self._trial_to_verify[again] = verification.verify_id
        log.info("verify run lost by the harness: run again", trial_id=trial_id, rerun=again, reason=finished.reason[:200])
        return [Emission(payload.payload, verification.study_id, again, again)]

    def _on_cancelled(self, study_id: str) -> list[Emission]:
        """A cancelled study's verifications end where they are, without a verdict: no further round is planned
        and the runs the cancel stopped decide nothing (a resume asks for a fresh verification)."""
        for verification in self.verifications.values():
            if verification.study_id == study_id and not verification.done:
                verification.done = verification.cancelled = True
        return []

    def _plan_restarts(self, verification: Verification) -> list[Emission]:
        """Once both runs of the round's first pair are in: a restart trial per checkpoint to resume (the
        candidate's own; the baseline's too under ``across_change``) whose source run finished ok."""
        round_ = verification.round
        sources = verification.checks.restart_sources()
        first = round_.first_pair()
        if not sources or round_.restarts_expected or len(first) < 2:
            return []
        from_trials = {source: first[source].trial_id for source in sources if first[source].status == "ok"}
        if not from_trials:
            return []
        plan = vf.plan_restarts(verification.verify_id, verification.candidate, round_no=round_.round_no,
                                sources=from_trials, steps=verification.steps)  # fmt: skip
        round_.restarts_expected = len(plan)
        for planned in plan:
            verification.plan[planned.trial_id] = planned
            self._trial_to_verify[planned.trial_id] = verification.verify_id
        return [Emission(p.payload, verification.study_id, p.trial_id, p.trial_id) for p in plan]

    # ---------------------------------------------------------------- status

    def status(self) -> dict[str, object]:
        active = [v for v in self.verifications.values() if not v.done]
        return {
            "verifications": len(self.verifications),
            "active": len(active),
            "promotable": sum(1 for v in self.verifications.values() if v.history and v.history[-1].promotable),
        }
