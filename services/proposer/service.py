"""The proposer service: owns each study's budget, its in-flight trial slots and candidate dedup.

A thin wrapper: the behaviour is ``ProposerState`` (logic.py), a pure fold over the events below that
the runner rebuilds by replay on start. It proposes search trials (TrialProposed, with origin, reason and
the models' prediction), asks for verification of the best (VerifyRequested) and ends the study
(StudyFinished). It must not launch trials or read another service's state.

The agent role's one piece of I/O lives here: an ``AgentAsked`` the fold emitted comes back to this service
as an event, and its handler asks the model and checks the answer (``infrarsi.agent.role.answer``, in a
thread) and publishes ``AgentAnswered`` — unless the log already holds that answer (a redelivery after a
restart), so a model is asked at most once per question and a replay never asks it. The handler holds the
proposer's single slot while the model answers, within a hard bound (``agent.role.exchange_bound_s``: the
timeouts of every attempt, the backoff, the gates; past it the exchange is a ``timeout``): trials keep
running meanwhile, only the next proposal waits.
"""

from __future__ import annotations

from infrarsi.agent.answers import GoldenRepo
from infrarsi.agent.client import AgentError, AgentUnconfigured, resolve_endpoint
from infrarsi.agent.role import answer_within
from infrarsi.events import (
    AgentAnswered,
    AgentAsked,
    DoctorCompleted,
    Event,
    RunRequested,
    StudyCancelled,
    StudyCreated,
    StudyResumed,
    TrialFinished,
    TrialMeasured,
    TrialProposed,
    VerifyCompleted,
)
from infrarsi.runtime.service import Outbox, ReactiveService
from infrarsi.study.contract import Contract

from .logic import ProposerState


def agent_available(contract: Contract) -> bool:
    """Whether this process can ask a model for a study: an endpoint and model in the contract or the env."""
    try:
        resolve_endpoint(contract.agent)
    except AgentUnconfigured:
        return False
    except AgentError:
        return True  # configured but broken (an unreadable key file): asked, and the failure recorded by name
    return True


class ProposerService(ReactiveService):
    name = "proposer"
    consumes = (
        StudyCreated,
        DoctorCompleted,
        RunRequested,
        TrialProposed,
        TrialFinished,
        TrialMeasured,
        VerifyCompleted,
        AgentAsked,
        AgentAnswered,
        StudyCancelled,
        StudyResumed,
    )

    def make_state(self) -> ProposerState:
        return ProposerState(agent_available=agent_available)

    async def handle(self, event: Event, out: Outbox) -> None:
        await super().handle(event, out)
        match event.payload:
            case AgentAsked() as asked:
                await self._answer(event, asked, out)
            case _:
                pass

    async def _answer(self, event: Event, asked: AgentAsked, out: Outbox) -> None:
        state = self.state
        assert isinstance(state, ProposerState)
        study = state.studies.get(event.study_id)
        if study is None or study.agent is None or study.space is None:
            return
        pending = study.agent.pending
        if pending is None or pending.ask_id != asked.ask_id:
            return  # answered already (the answer is in the log), or not this study's open question
        answered = await answer_within(asked, study.space, GoldenRepo.of(study.created))
        await out.emit(answered, key=f"answer:{asked.ask_id}")
