"""The proposer's agent role: when to ask the study's language model, and what its checked answers change.

Pure, like the rest of the proposer's fold: the role emits ``AgentAsked`` (the prompt, built from the study's
state) and learns only from ``AgentAnswered`` — published by the proposer service after the HTTP exchange and
the gates (``infrarsi.agent.role.answer``), and read back from the log on replay, so a replay never calls the
model and reproduces the same proposals.

**When it asks.** Only when the contract gives the agent tokens (``budget.llm_tokens`` > 0) and the service has
an endpoint: when the search starts, then again after ``agent.ask_every`` finished trials, one exchange at a
time, at most ``agent.max_asks`` times, while tokens are left.

**What an answer changes.** Accepted diffs become patches of the study (``StudySpace.with_agent``: searched
like any library patch, their prior the model's expected effect with its stated std); priors become
knowledge-base overrides whose std is widened by ``agent.prior_weight`` (measurements overrule them); the
candidates (and each new patch on the baseline, if no candidate tries it) join the agent's queue.

**Measurements overrule it.** The model's priors (its own, and its patches' expected effects) start on
probation: while they are, every other searcher proposal comes from a hedge — a searcher over the same outcomes
without them (``probation_space``), the knowledge base's own best guess first. The hedge bounds what wrong
priors cost, and it gives the check contrast: the model's own picks all look alike to it. After each finished
trial the role compares how well the measured step times are explained with and without the model's priors
(``infrarsi.agent.prior_check.judge``): once the data prefer the study without them (log Bayes factor >
``DROP_LOG_BF``) its priors are dropped for good — its patches stay, with flat priors — and the search goes on
over every outcome without them; once the data prefer them (< −``DROP_LOG_BF``) they are trusted and the hedge
ends.

**The mix rule.** At most ``floor(agent.share × trials)`` of the study's search trials (at least one when
``share`` > 0) come from the queue, origin ``llm``; when a slot frees and the queue holds a candidate not yet
proposed, it goes first; otherwise the searcher fills the slot. A queued candidate still passes the contract
check and the dedup of every proposal. **The first answer is waited for**: while the question asked when the
search starts is unanswered, the agent's share of the free slots (``held_slots``) stays empty — with one slot
in parallel, the search's first trial is the agent's, not the searcher's. The wait is bounded: the service
records a failed exchange (``timeout``) once ``agent.role.exchange_bound_s`` has passed, and a failed answer
frees the slots for the searcher. Later questions are not waited for (the search goes on; their candidates
take the next free slots).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from infrarsi import events as ev
from infrarsi.agent.prior_check import TIMED, judge
from infrarsi.agent.prompts import proposal_messages, trial_row
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.time_model import TimeModel
from infrarsi.study.ledger import TrialLedger, TrialOutcome
from infrarsi.study.model import setting_effects
from infrarsi.study.space import StudySpace


@dataclass
class AgentRole:
    """One study's exchanges with its model."""

    files: dict[str, str]
    """The editable files at the golden baseline (what the model may diff against)."""
    asked: list[ev.AgentAsked] = field(default_factory=list)
    answers: dict[str, ev.AgentAnswered] = field(default_factory=dict)
    outcomes_at_last_ask: int = 0
    queue: list[tuple[ev.Candidate, str]] = field(default_factory=list)
    """Checked candidates of the answers, with the model's reason, in answer order."""
    proposed: int = 0
    """Search trials proposed from the queue (origin ``llm``)."""
    patches: list[ev.AgentPatch] = field(default_factory=list)
    priors: list[ev.AgentPrior] = field(default_factory=list)
    distrusted_at: int | None = None
    """Finished trials when the measurements overruled the model's priors (``None``: not overruled)."""
    trusted_at: int | None = None
    """Finished trials when the measurements confirmed the model's priors (``None``: not confirmed)."""
    log_bayes_factor: float = 0.0
    """The last check's log Bayes factor (without / with the model's priors)."""

    def space(self, base: StudySpace) -> StudySpace:
        """The study as the search sees it: ``base`` with the accepted patches, and the model's priors while
        they are trusted."""
        return base.with_agent(self.patches, self.priors, trust_model=self.distrusted_at is None)

    @property
    def on_probation(self) -> bool:
        """The model gave priors (its own, or its patches' expected effects) and the measurements have not yet
        decided on them."""
        return bool(self.priors or self.patches) and self.distrusted_at is None and self.trusted_at is None

    def probation_space(self, base: StudySpace) -> StudySpace:
        """The study without the model's priors: its patches stay, with flat priors (the hedge's, and the
        study's once the priors are dropped)."""
        return base.with_agent(self.patches, trust_model=False)

    def check_priors(self, base: StudySpace, outcomes: list[TrialOutcome], noise_std: float) -> bool:
        """Whether the measurements just overruled the model's priors (then ``space`` drops them); confirmed
        priors end the probation."""
        if not self.on_probation:
            return False
        trusted, without = self.space(base), self.probation_space(base)
        measured = []
        for o in outcomes:
            if o.status in TIMED and o.step_time_s and o.candidate is not None:
                try:
                    measured.append((trusted.from_event(o.candidate), o.step_time_s))
                except ValueError:
                    continue
        verdict, self.log_bayes_factor = judge(TimeModel(trusted.space, trusted.kb),
                                               TimeModel(without.space, without.kb), measured, noise_std)
        if verdict == "trusted":
            self.trusted_at = len(outcomes)
        if verdict == "dropped":
            self.distrusted_at = len(outcomes)
        return verdict == "dropped"

    @property
    def tokens_spent(self) -> int:
        return sum(a.tokens for a in self.answers.values())

    @property
    def pending(self) -> ev.AgentAsked | None:
        """The exchange asked but not yet answered (one at a time)."""
        return next((a for a in self.asked if a.ask_id not in self.answers), None)

    def quota(self, study: StudySpace, target_trials: int) -> int:
        share = study.contract.agent.share
        return max(1, math.floor(share * target_trials)) if share > 0 else 0

    def held_slots(self, study: StudySpace, target_trials: int) -> int:
        """Free slots kept for the agent: its share not yet proposed, while the first question is unanswered."""
        if self.answers or self.pending is None:
            return 0
        return max(0, self.quota(study, target_trials) - self.proposed)

    def maybe_ask(self, study_id: str, study: StudySpace, outcomes: list[TrialOutcome], ledger: TrialLedger,
                  searcher: Searcher) -> ev.AgentAsked | None:
        """The next question, when it is time for one (see the module docstring)."""
        agent, budget = study.contract.agent, study.contract.budget
        if self.pending is not None or len(self.asked) >= agent.max_asks:
            return None
        if budget.llm_tokens - self.tokens_spent <= 0:
            return None
        if self.asked and len(outcomes) - self.outcomes_at_last_ask < agent.ask_every:
            return None
        self.outcomes_at_last_ask = len(outcomes)
        time_effects, _memory = setting_effects(study, searcher)
        features = [s.name for s in searcher.time_model.encoder.specs if s.kind not in ("intercept", "interaction")]
        rows = [trial_row(o.status, o.candidate, _origin(ledger, o.trial_id), o.step_time_s, o.peak_bytes, o.detail)
                for o in outcomes if o.candidate is not None]
        library = [p.id for p in study.space.patches]
        messages = proposal_messages(study.contract, self.files, rows, time_effects, features, library)
        asked = ev.AgentAsked(
            ask_id=ev.derived_id(study_id, "agent", str(len(self.asked))), purpose="proposals",
            model=agent.model or "", endpoint=agent.base_url or "", messages=messages,
            max_tokens=min(agent.max_tokens, budget.llm_tokens - self.tokens_spent),
            tokens_spent_before=self.tokens_spent,
        )
        self.asked.append(asked)
        return asked

    def on_answer(self, answered: ev.AgentAnswered) -> bool:
        """Record an answer; whether it changed the study (new patches or priors: ``space`` again)."""
        if answered.ask_id in self.answers or all(a.ask_id != answered.ask_id for a in self.asked):
            return False
        self.answers[answered.ask_id] = answered
        if not answered.ok:
            return False
        self.patches += answered.patches
        self.priors += answered.priors
        tried = {p for c in answered.candidates for p in c.candidate.patches}
        self.queue += [(c.candidate, c.reason) for c in answered.candidates]
        self.queue += [(ev.Candidate(patches=[p.patch_id]), f"{p.description} — {p.reason}".strip(" —"))
                       for p in answered.patches if p.patch_id not in tried]
        return bool(answered.patches or answered.priors)

    def next_candidate(self, study: StudySpace, target_trials: int, proposed_keys: set[str]
                       ) -> tuple[ev.Candidate, str] | None:
        """The next queued candidate within the share, as this study's canonical event candidate."""
        if self.proposed >= self.quota(study, target_trials):
            return None
        while self.queue:
            candidate, reason = self.queue.pop(0)
            try:
                model = study.from_event(candidate)
            except ValueError:
                continue
            event = study.to_event(model)
            if event.key() in proposed_keys or study.contract_problems(model) or not study.space.is_feasible(model):
                continue
            return event, reason
        return None


def _origin(ledger: TrialLedger, trial_id: str) -> str:
    trial = ledger.trials.get(trial_id)
    return trial.proposed.origin if trial is not None and trial.proposed is not None else "unknown"
