"""The apply policy: who must approve which kind of change, and when changes may not be applied.

Owns the policy's pydantic models (part of the contract, validated with it at ``init``) and one pure
function, ``check``, that says why a candidate may not be applied now. ``check`` does no I/O: the caller
(``infrarsi apply``, the reporter) gathers approvals from the event log, keeps those whose signatures
verify (``infrarsi.verdicts.approvals``) and passes the clock in. The only I/O is at validation, where a policy's
``allowed_signers`` given as a file path is read so that ``init`` locks the signers with the contract.

Action classes say what kind of change a candidate makes:

- ``code_patch``   a patch to the workload's Python code
- ``kernel_patch`` a patch that adds or swaps compute kernels (Triton, CUDA, compiled extensions)
- ``comm_env``     communication settings passed through the environment (NCCL_*, …)
- ``launch_keys``  launch-file settings (micro-batch, attention implementation, …)
- ``data_change``  anything that touches the data pipeline

A change of the job's data is the ``data_change`` class wherever it happens: a candidate's knob or patch of that
class at ``apply``, and the inputs outside git changing after ``init`` (``data_change_refusal``: the launcher
refuses the trial with the policy's verdict on the class, since the golden baseline's loss was measured on the
locked data and must be re-verified on new data, by a new study).

Operations are what is being done with a candidate: ``apply`` (a person runs ``infrarsi apply``)
and ``auto_apply`` (a service applies a winner on its own). A forbidden window that lists ``apply``
blocks both; one that lists ``auto_apply`` blocks only the unattended path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from pathlib import Path
from typing import Literal, Protocol, TypeGuard, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

ActionClass = Literal["code_patch", "kernel_patch", "comm_env", "launch_keys", "data_change"]
ACTION_CLASSES: tuple[ActionClass, ...] = get_args(ActionClass)

Operation = Literal["apply", "auto_apply"]
Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
_WEEKDAYS: tuple[Weekday, ...] = get_args(Weekday)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ActionRule(_Model):
    """What applying one class of change requires."""

    owner: str = "owner"
    """Role that owns this class of change; only approvals granted under this role count."""
    approvals: int = Field(
        default=1, ge=0, json_schema_extra={"anyOf": [{"type": "integer"}, {"type": "boolean"}]}
    )
    """Distinct approvers (with the owner role) needed; ``true`` means 1, ``false`` or 0 means none."""
    allowed: bool = True
    """``false``: InfraRSI never applies this class of change, approvals or not."""

    @field_validator("approvals", mode="before")
    @classmethod
    def _bool_means_one(cls, value: object) -> object:
        # ``approval: true`` reads naturally in YAML; bool is an int subclass, so map it explicitly.
        if isinstance(value, bool):
            return 1 if value else 0
        return value


def _default_actions() -> dict[ActionClass, ActionRule]:
    return {name: ActionRule() for name in ACTION_CLASSES}


def _apply_only() -> list[Operation | ActionClass]:
    return ["apply"]


class ForbiddenWindow(_Model):
    """A recurring time window in which some operations or action classes are not applied.

    ``from`` later than ``to`` is an overnight window: it starts on each listed day and ends the next day.
    Both ends are inclusive to the minute (``to: "23:59"`` covers 23:59:59).
    """

    model_config = ConfigDict(populate_by_name=True)

    days: list[Weekday] = Field(default_factory=lambda: list(_WEEKDAYS), min_length=1)
    """Days the window starts on, in the window's time zone."""
    start: time = Field(default=time(0, 0), alias="from")
    """Start time of day (``HH:MM``), written ``from`` in YAML."""
    end: time = Field(default=time(23, 59), alias="to")
    """End time of day (``HH:MM``, inclusive to the minute), written ``to`` in YAML."""
    tz: str = "UTC"
    """IANA time zone name the days and times are in, e.g. ``Europe/Berlin``."""
    actions: list[Operation | ActionClass] = Field(default_factory=_apply_only, min_length=1)
    """What is forbidden inside the window: operations (``apply``, ``auto_apply``) and/or action classes."""
    reason: str = ""
    """Shown when the window blocks an apply (e.g. ``no Friday deploys``)."""

    @field_validator("tz")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r}") from None
        return value

    @field_validator("start", "end", mode="before")
    @classmethod
    def _quoted_times(cls, value: object) -> object:
        # Unquoted 23:59 is a YAML 1.1 base-60 integer (1439); refuse it rather than read 00:23:59.
        if isinstance(value, int):
            raise ValueError('write times as quoted "HH:MM" strings (unquoted 23:59 is a YAML number)')
        return value

    @field_validator("days", mode="before")
    @classmethod
    def _lower_days(cls, value: object) -> object:
        if isinstance(value, list):
            return [v.lower()[:3] if isinstance(v, str) else v for v in value]
        return value

    def contains(self, now: datetime) -> bool:
        """Whether the aware datetime ``now`` falls inside this window."""
        if now.tzinfo is None:
            raise ValueError("now must be timezone-aware")
        local = now.astimezone(ZoneInfo(self.tz))
        minute = local.time().replace(second=0, microsecond=0)
        today = _WEEKDAYS[local.weekday()]
        yesterday = _WEEKDAYS[(local - timedelta(days=1)).weekday()]
        if self.start <= self.end:
            return today in self.days and self.start <= minute <= self.end
        # Overnight: the part after midnight belongs to the window that started the day before.
        return (today in self.days and minute >= self.start) or (
            yesterday in self.days and minute <= self.end
        )

    def blocks(self, operation: Operation, action_classes: Iterable[str]) -> bool:
        listed = set(self.actions)
        if "apply" in listed or operation in listed:
            return True
        return bool(listed & set(action_classes))


class Policy(_Model):
    """The apply policy of a study (``policy:`` in the contract, inline or in its own file)."""

    actions: dict[ActionClass, ActionRule] = Field(default_factory=_default_actions)
    """Rule per action class; a class left out requires one approval by role ``owner``."""
    forbidden_windows: list[ForbiddenWindow] = []
    """Times when listed operations or action classes are never applied."""
    members: dict[str, list[str]] = {}
    """Optional role → approver names. When a role is listed here, approvals under it by anyone else do
    not count. With ``allowed_signers`` the names are signers' principals, so a role is bound to keys."""
    allowed_signers: list[str] | None = None
    """OpenSSH allowed-signers lines (``principal key``, as git's ``gpg.ssh.allowedSignersFile``) — in
    YAML a list of lines or a path to such a file, relative to the contract; read and locked at ``init``.
    When set, only approvals signed by the approver's listed key count (``infrarsi approve --key``)."""
    approval_valid_hours: float = Field(default=168.0, gt=0)
    """How long a signed approval stays valid after it was signed."""

    @field_validator("allowed_signers", mode="before")
    @classmethod
    def _read_signers_file(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, str):
            path = Path((info.context or {}).get("base_dir") or ".") / value
            try:
                value = path.read_text(errors="strict").splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"allowed_signers file {path}: {exc}") from None
        if isinstance(value, list):
            value = [v.strip() for v in value if not isinstance(v, str) or v.strip() and not v.lstrip().startswith("#")]
            if not value:
                raise ValueError("allowed_signers names no signer")
        return value

    @field_validator("actions")
    @classmethod
    def _fill_defaults(cls, value: dict[ActionClass, ActionRule]) -> dict[ActionClass, ActionRule]:
        return {name: value.get(name, ActionRule()) for name in ACTION_CLASSES}

    def rule(self, action_class: ActionClass) -> ActionRule:
        return self.actions.get(action_class, ActionRule())


def is_action_class(name: str) -> TypeGuard[ActionClass]:
    return name in ACTION_CLASSES


class ApprovalLike(Protocol):
    """What ``check`` reads of an approval: an ``Approval`` or an ``events.ApprovalGranted`` payload."""

    @property
    def role(self) -> str: ...
    @property
    def approver(self) -> str: ...
    @property
    def action_classes(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class Approval:
    """One approval of one candidate (the fields of ``events.ApprovalGranted`` that matter here)."""

    role: str
    approver: str
    action_classes: Sequence[str] = ()
    """Classes the approval covers; empty = all of the candidate's classes."""


def check(
    policy: Policy,
    candidate_actions: Iterable[str],
    approvals: Iterable[ApprovalLike],
    now: datetime,
    *,
    operation: Operation = "apply",
) -> list[str]:
    """Reasons the candidate may not be applied at ``now``; an empty list means it may.

    ``candidate_actions`` are the action classes the candidate's change falls into; ``approvals`` are all
    approvals granted for this candidate (objects with ``role``, ``approver``, ``action_classes`` — e.g.
    ``ApprovalGranted`` payloads). An approver counts once per class however often they approve.
    """
    classes = sorted(set(candidate_actions))
    approvals = list(approvals)
    reasons: list[str] = []
    for name in classes:
        if not is_action_class(name):
            reasons.append(f"{name}: unknown action class")
            continue
        rule = policy.rule(name)
        if not rule.allowed:
            reasons.append(f"{name}: the policy never allows applying this class of change")
            continue
        approvers = {
            a.approver
            for a in approvals
            if a.role == rule.owner
            and (not a.action_classes or name in a.action_classes)
            and (rule.owner not in policy.members or a.approver in policy.members[rule.owner])
        }
        if len(approvers) < rule.approvals:
            reasons.append(
                f"{name}: needs {rule.approvals} approval(s) by role {rule.owner!r}, has {len(approvers)}"
            )
    for window in policy.forbidden_windows:
        if window.contains(now) and window.blocks(operation, classes):
            label = window.reason or (
                f"{','.join(window.days)} {window.start:%H:%M}-{window.end:%H:%M} {window.tz}"
            )
            reasons.append(
                f"forbidden window ({label}): no {' / '.join(window.actions)} at {now.isoformat()}"
            )
    return reasons


DATA_CHANGE: ActionClass = "data_change"


def data_change_refusal(policy: Policy, changes: Sequence[str], now: datetime) -> str:
    """Why a trial whose inputs outside git changed since ``init`` (``changes``: one line per input) is not run,
    as the policy's ``data_change`` class decides it at ``now``: never allowed, or whose approval a change of
    data needs — and, whatever the rule, the loss re-verified on the new data, which this study cannot do (its
    golden baseline was measured on the locked data): a new study locks the new data and measures its baseline.
    """
    verdict = check(policy, [DATA_CHANGE], [], now)
    if not verdict:
        verdict = [f"{DATA_CHANGE}: the policy lets role {policy.rule(DATA_CHANGE).owner!r} change data without approval"]
    return (f"{DATA_CHANGE}: the job's inputs changed since init ({'; '.join(changes[:5])}); policy: {'; '.join(verdict)}; "
            "a change of data requires the loss re-verified on the new data, and this study's golden baseline was "
            "measured on the locked data: start a new study (`infrarsi init` locks the new data)")
