"""The proposer's state machine: events in, events to publish out. No I/O beyond loading a study's locked
contract files once (``load_study``, injectable).

``ProposerState.apply(event)`` takes every event the proposer consumes and returns the ``Emission`` s to
publish, so ``services/proposer/service.py`` is only a ``ReactiveService`` naming ``consumes`` and
``make_state``: the base replays the stream into a fresh state on start (outputs discarded: they were published
in a past life) and publishes what ``apply`` returns for each live event.

Determinism makes that safe: the same events in the same order give the same state and the same emissions
with the same keys and trial ids (the ``Searcher`` is a pure function of its seed — the study id — and its
ordered observations), and ``Outbox`` derives event ids from (cause, type, key). An event applied twice
returns its first emissions again without changing the state (a redelivery re-publishes; JetStream drops
the duplicates).

**When the search starts.** On ``RunRequested`` — what ``infrarsi run STUDY --trials N [--parallel K]``
publishes (added to the catalog in ``events.py`` for this). Doctor
is a separate stage: its ``DoctorCompleted`` sets the time model's noise floor and its baseline runs are
observations, but it does not start anything. ``trials`` is the study's *total* of search trials, capped by
the contract's locked ``budget.trials``; a later, larger request extends a finished search.

**The search.** An initial design of ``parallel`` candidates (the experience bank's winners that ``init``
recorded in ``StudyCreated.bank``: origin ``bank``; then the prior's best guess, then space-filling seeds:
origins ``prior``/``seed``; the priors themselves are the bank-adjusted ones, ``StudySpace.with_bank``), then one suggestion per freed slot (origins ``ei``/``pairing``), each
with the model's ``Prediction`` and the searcher's reason. A trial is done when its failed ``TrialFinished``
arrives, or its ok ``TrialFinished`` *and* its ``TrialMeasured`` (``TrialLedger``). A trial that failed
because of the harness (``TrialFinished.infrastructure``: its launcher was killed mid-trial) costs its
accelerator time but not the candidate: it is re-run once, outside the trial budget, and the models never
see the failure. Never proposes a candidate twice otherwise (the searcher excludes observed and pending candidates; ``events.Candidate.key()`` is
checked again here) but for a ``confirm`` proposal — a run of the searcher's race, a challenger within noise of
the incumbent re-run interleaved with it (``SearchConfig.race``; its reason starts ``race:``; the study's trials
left are passed as ``suggest``'s ``left``, so the open race takes the budget's last trials) —, never a candidate
the contract rejects. Stops when the trial budget is proposed, when
the next trial would overrun the accelerator-hours (spent = every ``TrialFinished.accelerator_s`` of the
study, doctor and failed trials included; the next trial's cost is estimated from the search trials so far),
when ``Searcher.should_stop()`` says no more gain is expected, or when the space is exhausted. Once nothing
is in flight it emits ``VerifyRequested`` (the best measured candidates predicted faster than the baseline,
``verify.top_k`` of them) and, when every verification has its final ``VerifyCompleted``, ``StudyFinished``
(best promotable candidate and its speed-up); with nothing to verify, ``StudyFinished`` at once.

**One model code path, two consumers.** The proposer refits its own ``Searcher`` from the same events the
modeler sees instead of waiting for ``ModelUpdated``: proposals never lag a model update, and there is no
second wire format for a posterior. The modeler's ``ModelUpdated`` is for humans, the report and the bank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import msgspec
from infrarsi import events as ev
from infrarsi.agent.answers import golden_editable_files
from infrarsi.events import RunRequested
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import Candidate
from infrarsi.runtime.service import Emission
from infrarsi.study.contract import Contract
from infrarsi.study.ledger import TrialLedger, TrialOutcome
from infrarsi.study.model import StudiesFold, adopt_shape, build_searcher, observation, prediction
from infrarsi.study.space import StudyLoader, StudySpace, load_study_space
from infrarsi.verdicts import verification as vf

from .agent import AgentRole

Phase = Literal["idle", "searching", "verifying", "finished", "cancelled"]


@dataclass(frozen=True)
class Proposal:
    trial_id: str
    candidate: Candidate
    key: str
    """``events.Candidate.key()`` of the proposed candidate."""
    retry_of: str | None = None
    """The trial this one re-runs after an infrastructure failure; a retry does not count against the budget's
    trials (the candidate was not used up), only its accelerator time does."""


@dataclass
class _Study:
    study_id: str
    created: ev.StudyCreated
    space: StudySpace | None
    load_error: str | None
    ledger: TrialLedger = field(default_factory=TrialLedger)
    outcomes: list[TrialOutcome] = field(default_factory=list)
    """Every trial outcome of the study, in the order they completed (the searcher's observation order)."""
    doctor: ev.DoctorCompleted | None = None
    searcher: Searcher | None = None
    phase: Phase = "idle"
    requests: int = 0
    target_trials: int = 0
    parallel: int = 1
    proposals: list[Proposal] = field(default_factory=list)
    proposed_keys: set[str] = field(default_factory=set)
    rejected: list[Candidate] = field(default_factory=list)
    stop_reason: str = ""
    verify_keys: list[str] = field(default_factory=list)
    verdicts: dict[str, ev.VerifyCompleted] = field(default_factory=dict)
    agent: AgentRole | None = None
    """The agent role, when the contract gives it tokens and the service has a model to ask (agent.py)."""
    base_space: StudySpace | None = None
    """The study before the agent's patches and priors (``space`` is ``agent.space(base_space)``)."""
    hedge: Searcher | None = None
    """While the model's priors are on probation: a searcher over the same outcomes without them
    (``AgentRole.probation_space``), the knowledge base's own best guess queued first; every other searcher
    proposal is its."""
    hedge_guess: list[Candidate] = field(default_factory=list)
    """The knowledge base's own best guess (what a search without the model would try first): the hedge's first
    proposal, and the first of the rebuilt search if the model's priors are dropped before it ran."""
    hedge_turn: bool = False
    """Whether the next searcher proposal is the hedge's."""
    phase_before_cancel: Phase = "idle"
    """Where a ``StudyResumed`` takes a cancelled study back to."""
    cut_short: set[str] = field(default_factory=set)
    """Search trials in flight when the study was cancelled: re-run on resume if the cancel ended them."""
    retried: set[str] = field(default_factory=set)
    last_verify_request: ev.VerifyRequested | None = None
    """The proposer's last ``VerifyRequested`` (asked again, for the candidates without a verdict, on resume)."""
    resumes: int = 0
    """Trials already run once more (after an infrastructure failure, or a cancel cut them short)."""
    model_led: set[str] = field(default_factory=set)
    """Trials the model chose while its priors were on probation: its own knob vectors (origin ``llm``) and the
    proposals of the searcher that holds its priors. The hedge does not learn from them, nor does the search
    rebuilt once the priors are dropped: that search goes on as the hedge would, the search without the model.
    A searcher that has seen a few of a wrong model's picks (slow corners of the space, far from anything the
    knowledge base would try) does not retrace the search without the model — on the simulator it needed 10-15
    more trials where a fresh one needs 6 (docs/agent.md)."""

    @property
    def trials_used(self) -> int:
        """Search trials counted against the budget: every proposal but the re-runs of infrastructure failures."""
        return sum(1 for p in self.proposals if p.retry_of is None)


class ProposerState(StudiesFold[_Study]):
    """The proposer's read model and reactions, for every study on the bus."""

    def __init__(self, *, load_study: StudyLoader = load_study_space, config: SearchConfig | None = None,
                 agent_available: Callable[[Contract], bool] = lambda _contract: False,
                 load_files: Callable[[ev.StudyCreated, Contract], dict[str, str]] = golden_editable_files) -> None:
        """``agent_available``: whether a model can be asked for a study with this contract (the service says so
        when an endpoint is configured); ``load_files``: the editable files the model is shown."""
        super().__init__(load_study=load_study, config=config)
        self.agent_available = agent_available
        self.load_files = load_files

    # ------------------------------------------------------------------------------------------- events

    def _apply_to(self, study: _Study, event: ev.Event) -> list[Emission]:
        match event.payload:
            case ev.DoctorCompleted() as done:
                study.doctor = done
                # a search built before it (a second doctor, a run requested first) is rebuilt on demand with the
                # doctor's noise floor and host priors (``build_searcher``)
                study.searcher = study.hedge = None
                return []
            case RunRequested() as request:
                return self._on_run(study, request)
            case ev.TrialProposed() as proposed if event.trial_id:
                study.ledger.proposed(event.trial_id, proposed)
                return []
            case ev.TrialFinished() as finished if event.trial_id:
                return self._on_outcome(study, study.ledger.finished(event.trial_id, finished))
            case ev.TrialMeasured() as measured if event.trial_id:
                if study.space is not None and (shaped := adopt_shape(study.space, measured)) is not None:
                    study.space, study.searcher = shaped, None  # rebuilt on demand with the structural formula
                return self._on_outcome(study, study.ledger.measured(event.trial_id, measured))
            case ev.VerifyCompleted() as done:
                return self._on_verified(study, done)
            case ev.AgentAnswered() as answered:
                return self._on_agent_answer(study, answered)
            case ev.StudyCancelled():
                return self._on_cancelled(study)
            case ev.StudyResumed():
                return self._on_resumed(study)
            case _:
                return []

    def _new_study(self, study_id: str, created: ev.StudyCreated) -> _Study:
        space, error = self.load_space(created)
        agent = None
        if space is not None and space.contract.budget.llm_tokens > 0 and self.agent_available(space.contract):
            agent = AgentRole(files=self.load_files(created, space.contract))
        return _Study(study_id=study_id, created=created, space=space, load_error=error, agent=agent,
                      base_space=space)

    def _on_agent_answer(self, study: _Study, answered: ev.AgentAnswered) -> list[Emission]:
        if study.agent is None or study.base_space is None:
            return []
        if study.agent.on_answer(answered):
            study.space = study.agent.space(study.base_space)
            study.searcher = None  # rebuilt over the new patches and priors, every outcome observed again
        return self._fill(study)

    def _check_agent_priors(self, study: _Study) -> None:
        """Judge the model's priors on the measurements so far (agent.py): dropped ones leave the study (the
        searcher is rebuilt over every outcome without them); a verdict either way ends the hedge."""
        if study.agent is None or study.base_space is None or study.searcher is None:
            return
        study.searcher.refit()
        if study.agent.check_priors(study.base_space, study.outcomes, study.searcher.time_model.noise_std):
            study.space = study.agent.space(study.base_space)
            study.searcher = None
        if not study.agent.on_probation:
            study.hedge = None

    def _on_run(self, study: _Study, request: RunRequested) -> list[Emission]:
        study.requests += 1
        if study.space is None:
            study.phase = "finished"
            return [self._finished(study, f"cannot search this study: {study.load_error}")]
        budget = study.space.contract.budget
        study.target_trials = min(request.trials or budget.trials, budget.trials)
        study.parallel = max(1, request.parallel or study.space.contract.backend.parallel)
        if study.phase in ("idle", "finished"):
            if study.target_trials <= study.trials_used:
                study.phase = "finished"
                return [self._finished(study, f"trial budget already spent ({study.trials_used} search trials)")]
            study.phase = "searching"
            study.stop_reason = ""
            study.verify_keys, study.verdicts = [], {}
        return self._fill(study)

    def _on_outcome(self, study: _Study, outcome: TrialOutcome | None) -> list[Emission]:
        if outcome is None:
            return []
        study.outcomes.append(outcome)
        retry = self._retry(study, outcome)
        if retry is not None:
            return [retry]
        if study.searcher is not None and study.space is not None:
            obs = observation(study.space, outcome)
            if obs is not None:
                study.searcher.observe(obs)
                if study.hedge is not None and outcome.trial_id not in study.model_led:
                    study.hedge.observe(obs)
        self._check_agent_priors(study)
        return self._fill(study)

    def _on_verified(self, study: _Study, done: ev.VerifyCompleted) -> list[Emission]:
        if study.phase != "verifying" or done.candidate_key not in study.verify_keys:
            return []
        if not vf.is_final(done):
            return []
        study.verdicts[done.candidate_key] = done
        if len(study.verdicts) < len(study.verify_keys):
            return []
        study.phase = "finished"
        promotable = [d for d in study.verdicts.values() if d.promotable]
        best = max(promotable, key=lambda d: d.speedup, default=None)
        summary = f"{len(promotable)} of {len(study.verify_keys)} verified candidates promotable"
        return [self._finished(study, f"{study.stop_reason}; {summary}", best)]

    def _on_cancelled(self, study: _Study) -> list[Emission]:
        """Propose nothing more; the launcher stops the trials in flight (they end ``cancelled``, as
        infrastructure failures: not the candidates' doing). A study already finished stays finished."""
        if study.phase in ("finished", "cancelled"):
            return []
        study.phase_before_cancel, study.phase = study.phase, "cancelled"
        study.cut_short = {p.trial_id for p in study.proposals if study.ledger.outcome(p.trial_id) is None}
        return []

    def _on_resumed(self, study: _Study) -> list[Emission]:
        """Back to where the cancel stopped the study: the search re-runs the trials the cancel ended and fills
        its slots; a verification that had no final verdict is asked for again. A study that was not cancelled
        (a stack that crashed under it) only fills its slots again."""
        if study.phase != "cancelled":
            return self._fill(study)
        study.phase = study.phase_before_cancel
        out: list[Emission] = []
        if study.phase == "searching":
            for outcome in list(study.outcomes):
                if outcome.trial_id in study.cut_short and outcome.infrastructure:
                    retry = self._rerun(study, outcome, "resume")
                    if retry is not None:
                        out.append(retry)
            out += self._fill(study)
        elif study.phase == "verifying" and study.space is not None:
            pending = [key for key in study.verify_keys if key not in study.verdicts]
            request = study.last_verify_request
            if request is not None and pending:
                candidates = [c for c in request.candidates if c.key() in pending]
                payload = msgspec.structs.replace(request, candidates=candidates,
                                                  reason=f"resumed after a cancel: {request.reason}")
                study.resumes += 1
                out.append(Emission(payload, study.study_id, None, f"verify:{study.requests}:resume:{study.resumes}"))
        return out

    def _retry(self, study: _Study, outcome: TrialOutcome) -> Emission | None:
        """The same candidate once more after an infrastructure failure of a search trial (not of a retry)."""
        proposal = next((p for p in study.proposals if p.trial_id == outcome.trial_id), None)
        if (not outcome.infrastructure or proposal is None or proposal.retry_of is not None
                or study.phase != "searching"):  # fmt: skip
            return None
        return self._rerun(study, outcome, "retry")

    def _rerun(self, study: _Study, outcome: TrialOutcome, why: Literal["retry", "resume"]) -> Emission | None:
        """The trial's candidate once more, outside the trial budget (its own run said nothing about it)."""
        proposal = next((p for p in study.proposals if p.trial_id == outcome.trial_id), None)
        failed = study.ledger.trials[outcome.trial_id].proposed
        if proposal is None or failed is None or outcome.trial_id in study.retried:
            return None
        study.retried.add(outcome.trial_id)
        trial_id = ev.derived_id(outcome.trial_id, why)
        if outcome.trial_id in study.model_led:
            study.model_led.add(trial_id)
        payload = msgspec.structs.replace(failed, reason=f"re-run of trial {outcome.trial_id} ({outcome.detail[:200]})",
                                          retry_of=outcome.trial_id)  # fmt: skip
        study.proposals.append(Proposal(trial_id, proposal.candidate, proposal.key, retry_of=outcome.trial_id))
        study.ledger.proposed(trial_id, payload)
        return Emission(payload, study.study_id, trial_id, f"{why}:{outcome.trial_id}")

    # ------------------------------------------------------------------------------------------- search

    def _searcher(self, study: _Study) -> Searcher:
        if study.searcher is None:
            assert study.space is not None
            dropped = study.agent is not None and study.agent.distrusted_at is not None
            study.searcher = build_searcher(study.space, study.study_id, doctor=study.doctor,
                                            outcomes=self._hedge_outcomes(study) if dropped else study.outcomes,
                                            bank=study.created.bank, config=self.config)
            if study.agent is not None and study.agent.distrusted_at is not None:
                study.searcher.enqueue(study.hedge_guess, "prior", "the knowledge base's best guess, once the "
                                       "measurements overruled the model's priors")
            study.hedge = None
        return study.searcher

    @staticmethod
    def _hedge_outcomes(study: _Study) -> list[TrialOutcome]:
        """The outcomes the search without the model's priors learns from: all but the model-led trials."""
        return [o for o in study.outcomes if o.trial_id not in study.model_led]

    def _searcher_for_turn(self, study: _Study) -> tuple[Searcher, str]:
        """The searcher whose turn it is — the hedge's every other proposal while the model's priors are on
        probation — and how its proposals' reasons say so."""
        searcher = self._searcher(study)
        if study.agent is None or study.base_space is None or not study.agent.on_probation:
            return searcher, ""
        if study.hedge is None:
            probation = study.agent.probation_space(study.base_space)
            if not study.hedge_guess:
                fresh = build_searcher(probation, study.study_id, doctor=study.doctor, config=self.config)
                study.hedge_guess = [s.candidate for s in fresh.suggest(1)]
            study.hedge = build_searcher(probation, study.study_id, doctor=study.doctor,
                                         outcomes=self._hedge_outcomes(study), config=self.config)
            study.hedge.enqueue(study.hedge_guess, "prior", "the knowledge base's best guess")
        study.hedge_turn = not study.hedge_turn
        if study.hedge_turn:
            return searcher, ""
        return study.hedge, "without the model's priors (they are on probation): "

    def _fill(self, study: _Study) -> list[Emission]:
        """Propose until ``parallel`` trials are in flight, or end the search when it must end."""
        if study.phase != "searching" or study.space is None:
            return []
        contract = study.space.contract
        repeats = contract.budget.repeats_per_trial
        budget_s = contract.budget.accelerator_hours * 3600.0
        out: list[Emission] = []
        while True:
            in_flight = [p for p in study.proposals if study.ledger.outcome(p.trial_id) is None]
            left = study.target_trials - study.trials_used
            spent = study.ledger.accelerator_s
            next_cost = self._cost_estimate(study) * (len(in_flight) + repeats)
            if not study.stop_reason:
                if left <= 0:
                    study.stop_reason = f"trial budget spent ({study.trials_used} search trials)"
                elif spent >= budget_s or (next_cost > 0 and spent + next_cost > budget_s):
                    study.stop_reason = (f"accelerator budget: {spent / 3600:.3g} of {budget_s / 3600:.3g} h spent, "
                                         f"the next trial would overrun it")
            if study.stop_reason:
                if not in_flight:
                    out += self._end_search(study)
                return out
            slots = study.parallel - len(in_flight)
            n = min(slots, left) // repeats
            if n <= 0:
                return out
            searcher = self._searcher(study)
            if study.agent is not None:
                asked = study.agent.maybe_ask(study.study_id, study.space, study.outcomes, study.ledger, searcher)
                if asked is not None:
                    out.append(Emission(asked, study.study_id, None, f"agent-ask:{len(study.agent.asked)}"))
                llm = study.agent.next_candidate(study.space, study.target_trials, study.proposed_keys)
                if llm is not None:
                    study.agent.proposed += 1
                    candidate, reason = llm
                    out += self._propose(study, searcher, study.space.from_event(candidate), "llm", reason,
                                         model_led=study.agent.on_probation)
                    study.hedge_turn = True  # the model had its turn: the hedge's comes next
                    continue
                n = (min(slots, left) - study.agent.held_slots(study.space, study.target_trials)) // repeats
                if n <= 0:
                    return out  # the agent's share waits for its first answer (agent.py, the mix rule)
            pending = [p.candidate for p in in_flight] + study.rejected
            if self._design_done(study, searcher):
                stop, why = searcher.should_stop(pending)
                if stop:
                    study.stop_reason = f"no more expected gain: {why}"
                    continue
            turn, why = self._searcher_for_turn(study)
            # the hedge alternates; the budget's trials left let the open race take the last of them (Searcher)
            suggestions = turn.suggest(n if study.hedge is None else 1, pending=pending, left=left // repeats)
            if not suggestions:
                study.stop_reason = "search space exhausted"
                continue
            for s in suggestions:
                repeat = s.origin == "confirm"  # a run of the open race (Searcher, SearchConfig.race)
                if study.space.contract_problems(s.candidate) or (
                        not repeat and study.space.event_key(s.candidate) in study.proposed_keys):
                    study.rejected.append(s.candidate)
                    continue
                led = study.agent is not None and study.agent.on_probation and turn is not study.hedge
                out += self._propose(study, searcher, s.candidate, s.origin, why + s.reason, model_led=led)

    def _propose(self, study: _Study, searcher: Searcher, candidate: Candidate, origin: ev.Origin,
                 reason: str, *, model_led: bool = False) -> list[Emission]:
        """``TrialProposed`` of a checked candidate, once per repeat (``model_led``: see ``_Study.model_led``)."""
        assert study.space is not None
        event_candidate = study.space.to_event(candidate)
        key = event_candidate.key()
        predicted = prediction(searcher, candidate)
        study.proposed_keys.add(key)
        out = []
        for r in range(study.space.contract.budget.repeats_per_trial):
            # Numbered among the search trials only: the n-th candidate has the same trial id whether or not the
            # host forced re-runs before it (a re-run's id derives from the trial it repeats).
            index = study.trials_used
            trial_id = ev.derived_id(study.study_id, "search", str(index))
            payload = ev.TrialProposed(candidate=event_candidate, candidate_key=key, kind="search",
                                       origin=origin, reason=reason, repeat=r, prediction=predicted)
            study.proposals.append(Proposal(trial_id, candidate, key))
            study.ledger.proposed(trial_id, payload)
            if model_led:
                study.model_led.add(trial_id)
            out.append(Emission(payload, study.study_id, trial_id, f"proposal:{index}"))
        return out

    def _design_done(self, study: _Study, searcher: Searcher) -> bool:
        """``should_stop`` is asked only once the initial design has been measured."""
        config = searcher.config
        done = sum(1 for p in study.proposals if study.ledger.outcome(p.trial_id) is not None)
        return done >= 1 + config.n_seeds and any(o.status == "ok" for o in searcher.observations)

    def _cost_estimate(self, study: _Study) -> float:
        own = {p.trial_id for p in study.proposals}
        costs = [o.accelerator_s for o in study.outcomes if o.trial_id in own and o.accelerator_s > 0]
        if not costs:
            costs = [o.accelerator_s for o in study.outcomes if o.accelerator_s > 0]
        return sum(costs) / len(costs) if costs else 0.0

    def _end_search(self, study: _Study) -> list[Emission]:
        assert study.space is not None
        contract = study.space.contract
        if not any(o.status == "ok" for o in study.outcomes):
            study.phase = "finished"
            return [self._finished(study, f"{study.stop_reason}; no trial kept every invariant")]
        searcher = self._searcher(study)
        if study.model_led and study.agent is not None and study.agent.distrusted_at is not None:
            # the search after a drop learnt without the model's picks; the shortlist ranks every measured trial
            searcher = build_searcher(study.space, study.study_id, doctor=study.doctor, outcomes=study.outcomes,
                                      bank=study.created.bank, config=self.config, pool_from=searcher)
        baseline_s = prediction(searcher, study.space.baseline).step_time_s
        chosen = []
        for c, predicted_s, _sd in searcher.top_candidates(contract.verify.top_k + 1):
            if c != study.space.baseline and predicted_s < baseline_s:
                chosen.append((c, predicted_s))
        chosen = chosen[: contract.verify.top_k]
        if not chosen:
            study.phase = "finished"
            return [self._finished(study, f"{study.stop_reason}; no candidate predicted faster than the baseline")]
        study.phase = "verifying"
        candidates = [study.space.to_event(c) for c, _ in chosen]
        study.verify_keys = [c.key() for c in candidates]
        study.verdicts = {}
        speedups = ", ".join(f"×{baseline_s / t:.3f}" for _, t in chosen)
        payload = ev.VerifyRequested(
            candidates=candidates,
            repeats=contract.verify.repeats,
            steps=contract.workload.verify_steps,
            reason=f"search ended ({study.stop_reason}); predicted speed-ups {speedups} over the baseline",
        )
        study.last_verify_request = payload
        return [Emission(payload, study.study_id, None, f"verify:{study.requests}")]

    def _finished(self, study: _Study, reason: str, best: ev.VerifyCompleted | None = None) -> Emission:
        payload = ev.StudyFinished(
            reason=reason,
            trials=len(study.proposals),
            accelerator_s=study.ledger.accelerator_s,
            best_candidate_key=best.candidate_key if best is not None else None,
            best_speedup=best.speedup if best is not None else None,
        )
        return Emission(payload, study.study_id, None, f"finished:{study.requests}")

    # ------------------------------------------------------------------------------------------- status

    def status(self) -> dict[str, object]:
        """Per study: phase, trials proposed / target, in flight, accelerator-seconds (for ``infrarsi status``)."""
        studies: dict[str, object] = {}
        for sid, s in self.studies.items():
            in_flight = sum(1 for p in s.proposals if s.ledger.outcome(p.trial_id) is None)
            studies[sid] = {"name": s.created.name, "phase": s.phase, "proposed": len(s.proposals),
                            "target": s.target_trials, "in_flight": in_flight,
                            "accelerator_s": round(s.ledger.accelerator_s, 3), "stop_reason": s.stop_reason,
                            "load_error": s.load_error}
        return {"studies": studies}
