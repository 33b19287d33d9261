"""Signed approvals: the statement an approver signs, the evidence it covers, and whether an approval counts.

Owns the approval *statement* — a few ``name: value`` lines naming the study, the candidate, the role,
the approver, the classes of change approved, the evidence hash and when it was signed — and the checks
``infrarsi apply`` makes on every ``ApprovalGranted`` before the policy (``infrarsi.verdicts.policy.check``)
counts it. The statement travels in the event beside its OpenSSH signature, so a refusal can say *what*
was signed (another candidate: a replayed approval; older evidence; an expired one) rather than only "bad
signature". The event's own fields are never trusted: they must restate the signed statement.

The evidence hash covers what the approver looked at: the contract's hash, the golden baseline and the
verification result (``VerifyCompleted``) the candidate is applied on. A new verification changes it, so
an approval of yesterday's numbers does not carry over to today's.

Signing and verifying themselves are ``infrarsi.verdicts.signing`` (``ssh-keygen -Y``). No bus and no clock here:
the caller passes events and ``now``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec

from infrarsi import events as ev
from infrarsi.verdicts import signing
from infrarsi.verdicts.policy import Policy

STATEMENT_HEADER = "infrarsi approval v1"
CLOCK_SKEW = timedelta(minutes=5)
"""How far in the future a statement's ``signed_at`` may lie (the approver's clock may run ahead)."""


def evidence_sha256(created: ev.StudyCreated, verification: ev.VerifyCompleted) -> str:
    """The hash an approval signs: the locked contract, the golden baseline and the verification result."""
    body = {
        "contract_sha256": created.contract_sha256,
        "baseline_ref": created.baseline_ref,
        "verification": msgspec.to_builtins(verification),
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Statement:
    """What an approver signs."""

    study_id: str
    candidate_key: str
    role: str
    approver: str
    action_classes: tuple[str, ...]
    """Empty = every class of the candidate's change."""
    evidence_sha256: str
    signed_at: datetime

    def text(self) -> str:
        return (
            f"{STATEMENT_HEADER}\n"
            f"study: {self.study_id}\n"
            f"candidate: {self.candidate_key}\n"
            f"role: {self.role}\n"
            f"approver: {self.approver}\n"
            f"action_classes: {','.join(self.action_classes)}\n"
            f"evidence: {self.evidence_sha256}\n"
            f"signed_at: {self.signed_at.astimezone(UTC).isoformat()}\n"
        )

    @classmethod
    def parse(cls, text: str) -> Statement:
        """The statement in ``text``; ``ValueError`` naming what is wrong with it."""
        lines = text.splitlines()
        if not lines or lines[0] != STATEMENT_HEADER:
            raise ValueError(f"statement does not start with {STATEMENT_HEADER!r}")
        fields: dict[str, str] = {}
        for line in lines[1:]:
            key, sep, value = line.partition(": ")
            fields[key if sep else line.rstrip(":")] = value
        names = ("study", "candidate", "role", "approver", "action_classes", "evidence", "signed_at")
        missing = [n for n in names if n not in fields]
        if missing or len(fields) != len(names):
            raise ValueError(f"statement fields must be exactly {', '.join(names)}")
        try:
            signed_at = datetime.fromisoformat(fields["signed_at"])
        except ValueError:
            raise ValueError(f"statement signed_at {fields['signed_at']!r} is not an ISO time") from None
        if signed_at.tzinfo is None:
            raise ValueError("statement signed_at has no time zone")
        statement = cls(
            study_id=fields["study"],
            candidate_key=fields["candidate"],
            role=fields["role"],
            approver=fields["approver"],
            action_classes=tuple(c for c in fields["action_classes"].split(",") if c),
            evidence_sha256=fields["evidence"],
            signed_at=signed_at,
        )
        if statement.text() != text:
            raise ValueError("statement is not in canonical form")
        return statement


def signed_approval(
    statement: Statement, key: Path | str | None, note: str = ""
) -> ev.ApprovalGranted:
    """The ``ApprovalGranted`` for ``statement``, signed with ``key`` (unsigned when ``key`` is None)."""
    text = statement.text()
    return ev.ApprovalGranted(
        candidate_key=statement.candidate_key,
        role=statement.role,
        approver=statement.approver,
        action_classes=list(statement.action_classes),
        note=note,
        evidence_sha256=statement.evidence_sha256,
        statement=text,
        signature=signing.sign(text.encode(), key) if key is not None else "",
    )


def refusal(
    granted: ev.ApprovalGranted,
    *,
    policy: Policy,
    study_id: str,
    candidate_key: str,
    evidence: str,
    now: datetime,
) -> str | None:
    """Why ``granted`` does not count for applying ``candidate_key`` now; ``None`` if it counts.

    Without ``policy.allowed_signers`` nothing is verified (the policy asked for none) and every approval
    counts, as before signatures existed.
    """
    if policy.allowed_signers is None:
        return None
    if not granted.signature.strip() or not granted.statement:
        return "unsigned (the policy requires approvals signed by a key in its allowed_signers)"
    try:
        statement = Statement.parse(granted.statement)
    except ValueError as exc:
        return f"malformed statement: {exc}"
    reason = signing.verify(
        granted.statement.encode(), granted.signature, statement.approver, policy.allowed_signers
    )
    if reason is not None:
        return reason
    if statement.study_id != study_id:
        return f"signed for study {statement.study_id}, not {study_id} (replayed)"
    if statement.candidate_key != candidate_key:
        return f"signed for candidate {statement.candidate_key}, not {candidate_key} (replayed)"
    claimed = (granted.role, granted.approver, tuple(granted.action_classes), granted.candidate_key)
    signed = (statement.role, statement.approver, statement.action_classes, statement.candidate_key)
    if claimed != signed:
        return "the event's role, approver or classes differ from what was signed"
    if statement.evidence_sha256 != evidence:
        return (
            f"signed evidence {statement.evidence_sha256[:12]}, but the candidate's verified evidence is now "
            f"{evidence[:12]} (approve the current verification again)"
        )
    valid_for = timedelta(hours=policy.approval_valid_hours)
    if statement.signed_at > now + CLOCK_SKEW:
        return f"signed in the future ({statement.signed_at.isoformat()})"
    if now > statement.signed_at + valid_for:
        return (
            f"expired: signed {statement.signed_at.isoformat()}, valid for {policy.approval_valid_hours:g} h "
            f"(until {(statement.signed_at + valid_for).isoformat()})"
        )
    return None


@dataclass(frozen=True)
class Counted:
    """The approvals that count, and one line per approval that does not (with its reason)."""

    approvals: list[ev.ApprovalGranted]
    not_counted: list[str]


def count(
    granted: Iterable[ev.ApprovalGranted],
    *,
    policy: Policy,
    study_id: str,
    candidate_key: str,
    evidence: str,
    now: datetime,
) -> Counted:
    """Check every approval of one candidate; what ``policy.check`` may count, and why the rest may not."""
    approvals: list[ev.ApprovalGranted] = []
    not_counted: list[str] = []
    for g in granted:
        reason = refusal(
            g, policy=policy, study_id=study_id, candidate_key=candidate_key, evidence=evidence, now=now
        )
        if reason is None:
            approvals.append(g)
        else:
            not_counted.append(f"approval by {g.approver} as {g.role} not counted: {reason}")
    return Counted(approvals, not_counted)


def principals(allowed_signers: Sequence[str]) -> set[str]:
    """Every principal an allowed-signers list names (the first field of each line, comma-separated)."""
    return {p for line in allowed_signers for p in line.split(None, 1)[0].split(",")}
