"""The ``init --ask`` exchange on its way into the study's log: kept beside the contract, published after
``StudyCreated``.

``init --ask`` asks before any study exists, so its exchange cannot be an event yet. Owns the sidecar file
``CONTRACT.ask.json`` (``exchange_path``): the ``AgentAsked`` (purpose ``contract``, the prompt as sent,
redacted) and the ``AgentAnswered`` (the model's answer, redacted, its usage, the accepted draft) of the draft
the user accepted, with the sha256 of the contract text written from it. ``init`` — with ``--ask`` or later,
by hand — publishes both right after ``StudyCreated`` (``exchange_events``: ids derived from the study, so a
retried publish is deduplicated); when the contract was edited after the draft, the answer says so in its
``detail``. The report shows the request, the model's reason and the tokens. Must not: call the model.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

import msgspec

from infrarsi import events as ev

SOURCE = "cli.init"


class DraftExchange(msgspec.Struct, frozen=True, kw_only=True):
    """What ``CONTRACT.ask.json`` holds."""

    asked: ev.AgentAsked
    answered: ev.AgentAnswered
    contract_sha256: str
    """sha256 of the contract text ``init --ask`` wrote from this draft."""


def exchange_path(contract: Path) -> Path:
    """``contract.yaml`` → ``contract.ask.json`` (beside it)."""
    return contract.with_name(f"{contract.stem}.ask.json")


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def save_exchange(contract: Path, exchange: DraftExchange) -> Path:
    """Write the sidecar whole or not at all (the contract is written first, then this)."""
    path = exchange_path(contract)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as fh:
        fh.write(msgspec.json.format(msgspec.json.encode(exchange)))
    os.replace(tmp, path)
    return path


def load_exchange(contract: Path) -> DraftExchange | None:
    """The sidecar of ``contract``, or ``None`` when there is none (a hand-written contract). A sidecar that does
    not decode raises ``ValueError`` naming the file."""
    path = exchange_path(contract)
    if not path.is_file():
        return None
    try:
        return msgspec.json.decode(path.read_bytes(), type=DraftExchange)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"{path}: not an init --ask exchange ({exc}); move it away to open the study") from None


def exchange_events(study_id: str, cluster_id: str, exchange: DraftExchange, contract_text: str) -> list[ev.Event]:
    """``AgentAsked`` and ``AgentAnswered`` of the draft for the study's log; the answer notes an edit since."""
    answered = exchange.answered
    if text_sha256(contract_text) != exchange.contract_sha256:
        answered = msgspec.structs.replace(answered, detail="the contract was edited after the user accepted this draft")
    return [ev.make_event(payload, study_id=study_id, source=SOURCE, cluster_id=cluster_id,
                          event_id=ev.derived_id(study_id, "init-ask", type(payload).__name__))
            for payload in (exchange.asked, answered)]


REQUEST = re.compile(r"<<<REQUEST\n(.*?)\n>>>END REQUEST", re.S)


def request_of(asked: ev.AgentAsked) -> str:
    """The user's request as the draft's prompt quoted it (``drafts.draft_messages``)."""
    for message in asked.messages:
        found = REQUEST.search(message.content)
        if found:
            return found.group(1)
    return ""
