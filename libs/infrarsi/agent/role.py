"""One exchange with the study's model: ``AgentAsked`` in, ``AgentAnswered`` out (the I/O the proposer's fold
must not do).

Owns ``answer``: the budget check (an exchange the budget cannot cover is not sent), the HTTP call
(``client.ChatClient``), the charge (an answer that overran ``budget.llm_tokens`` is counted and refused as
``budget_exceeded``), and the gates of ``answers.check_proposals``. Every failure becomes an
``AgentAnswered`` with ``ok=False`` and its ``error`` by name — never an exception the service would crash
on — so the study goes on and the cost is counted. Must not: publish (the proposer service does).

Owns ``answer_within`` too: the same exchange with a hard bound (``exchange_bound_s``: every attempt's
timeout, the backoff between them, and time for the gates). The client's timeout is per socket operation, so
a server that trickles its answer a byte at a time would never time out; past the bound the exchange is
``timeout`` and the study goes on — the search waits for the first answer (the agent's share is held for it,
services/proposer/agent.py), so that wait must end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TypedDict, Unpack

from infrarsi import events as ev
from infrarsi.agent.answers import GoldenRepo, check_proposals
from infrarsi.agent.client import AgentError, AgentUnconfigured, ChatClient, TokenBudget, exchange_seconds
from infrarsi.study.contract import AgentSpec, Contract
from infrarsi.study.space import StudySpace


def budget_of(contract: Contract, spent_tokens: int = 0) -> TokenBudget:
    return TokenBudget(tokens=contract.budget.llm_tokens, usd=contract.budget.llm_usd,
                       usd_per_1k_tokens=contract.agent.usd_per_1k_tokens, spent_tokens=spent_tokens)


class Usage(TypedDict, total=False):
    """What an answer cost (the ``AgentAnswered`` fields of the same names)."""

    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    attempts: int
    latency_s: float


def failed(asked: ev.AgentAsked, kind: ev.AgentRefusalKind, detail: str, **usage: Unpack[Usage]) -> ev.AgentAnswered:
    return ev.AgentAnswered(ask_id=asked.ask_id, ok=False, error=kind, detail=detail[:1000], **usage)


def answer(asked: ev.AgentAsked, study: StudySpace, golden: GoldenRepo, *,
           env: Mapping[str, str] | None = None, client: ChatClient | None = None) -> ev.AgentAnswered:
    """Ask, charge, check (see the module docstring). Blocking: run it in a thread."""
    contract = study.contract
    budget = budget_of(contract, asked.tokens_spent_before)
    if budget.left() <= 0:
        return failed(asked, "budget_exceeded", f"budget.llm_tokens spent ({budget.spent_tokens} of {budget.tokens})")
    try:
        client = client or ChatClient.for_spec(contract.agent, env)
    except AgentUnconfigured as exc:
        return failed(asked, "http_error", str(exc))
    except AgentError as exc:
        return failed(asked, exc.kind, exc.detail)
    try:
        reply = client.chat(asked.messages, max_tokens=min(asked.max_tokens, budget.left()))
    except AgentError as exc:
        tokens = exc.prompt_tokens + exc.completion_tokens
        budget.charge(tokens)
        return failed(asked, exc.kind, exc.detail, prompt_tokens=exc.prompt_tokens,
                      completion_tokens=exc.completion_tokens, cost_usd=budget.cost(tokens), attempts=exc.attempts)
    tokens = reply.prompt_tokens + reply.completion_tokens
    usage: Usage = {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
             "cost_usd": budget.cost(tokens), "attempts": reply.attempts, "latency_s": round(reply.latency_s, 3)}
    if not budget.charge(tokens):
        return ev.AgentAnswered(ask_id=asked.ask_id, ok=False, text=reply.text, error="budget_exceeded",
                                detail=f"the answer took {tokens} tokens: {budget.spent_tokens} of "
                                       f"{budget.tokens} (budget.llm_tokens) spent; nothing of it is used", **usage)
    checked = check_proposals(reply.text, study, golden, prior_weight=contract.agent.prior_weight,
                              max_patches=contract.agent.max_patches)
    not_json = [r for r in checked.refused if r.kind == "not_json"]
    return ev.AgentAnswered(
        ask_id=asked.ask_id, ok=not not_json, text=reply.text, error="not_json" if not_json else None,
        detail=not_json[0].detail if not_json else "", candidates=checked.candidates, patches=checked.patches,
        priors=checked.priors, refused=checked.refused, **usage,
    )


GATE_ALLOWANCE_S = 120.0
"""What the bound allows the gates after the model has answered (a fresh worktree and ``git apply --check``
per diff)."""


def exchange_bound_s(spec: AgentSpec) -> float:
    """The longest one exchange may take: the client's (``exchange_seconds``: ``timeout_s`` per attempt, the
    backoff between attempts) and ``GATE_ALLOWANCE_S``."""
    return exchange_seconds(spec.timeout_s, spec.retries) + GATE_ALLOWANCE_S


async def answer_within(asked: ev.AgentAsked, study: StudySpace, golden: GoldenRepo, *, bound_s: float | None = None,
                        env: Mapping[str, str] | None = None, client: ChatClient | None = None) -> ev.AgentAnswered:
    """``answer`` in a thread, or a ``timeout`` failure once ``bound_s`` (default ``exchange_bound_s``) has
    passed — whatever the server does. A late answer is dropped (its exchange is already recorded as failed)."""
    bound = exchange_bound_s(study.contract.agent) if bound_s is None else bound_s
    try:
        return await asyncio.wait_for(asyncio.to_thread(answer, asked, study, golden, env=env, client=client), bound)
    except TimeoutError:
        return failed(asked, "timeout", f"no checked answer within {bound:g} s (agent.timeout_s per attempt, the "
                                        "backoff between retries and the gates): the search goes on without it")
