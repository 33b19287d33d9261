"""The apply policy: approvals counted per class and role, forbidden windows by day, time and zone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from infrarsi.events import ApprovalGranted
from infrarsi.verdicts.policy import Approval, ForbiddenWindow, Policy, check, data_change_refusal
from pydantic import ValidationError

# 2026-01-02 is a Friday, 2026-01-03 a Saturday, 2026-01-05 a Monday.
FRIDAY_NOON = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)
MONDAY_NOON = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)

POLICY = Policy.model_validate(
    {
        "actions": {
            "code_patch": {"owner": "ml-lead", "approvals": 1},
            "kernel_patch": {"owner": "perf", "approvals": 2},
            "launch_keys": {"owner": "ml-lead", "approvals": False},
            "data_change": {"allowed": False},
        },
        "forbidden_windows": [
            {
                "days": ["fri"],
                "from": "00:00",
                "to": "23:59",
                "tz": "UTC",
                "actions": ["auto_apply"],
                "reason": "no Friday auto-apply",
            }
        ],
    }
)


def test_defaults_fill_every_class() -> None:
    policy = Policy()
    assert set(policy.actions) == {"code_patch", "kernel_patch", "comm_env", "launch_keys", "data_change"}
    assert check(policy, ["code_patch"], [], MONDAY_NOON) == [
        "code_patch: needs 1 approval(s) by role 'owner', has 0"
    ]
    assert check(policy, ["code_patch"], [Approval("owner", "ana")], MONDAY_NOON) == []
    # an explicit partial policy keeps defaults for classes it does not mention
    assert POLICY.actions["comm_env"].approvals == 1 and POLICY.actions["comm_env"].owner == "owner"


def test_approvals_true_means_one_false_means_none() -> None:
    policy = Policy.model_validate(
        {"actions": {"code_patch": {"approvals": True}, "comm_env": {"approvals": False}}}
    )
    assert policy.actions["code_patch"].approvals == 1
    assert policy.actions["comm_env"].approvals == 0


def test_launch_only_candidate_needs_nothing() -> None:
    assert check(POLICY, ["launch_keys"], [], MONDAY_NOON) == []


def test_code_patch_needs_owner_role() -> None:
    assert check(POLICY, ["code_patch"], [], MONDAY_NOON) == [
        "code_patch: needs 1 approval(s) by role 'ml-lead', has 0"
    ]
    wrong_role = [Approval("perf", "bo")]
    assert check(POLICY, ["code_patch"], wrong_role, MONDAY_NOON) == [
        "code_patch: needs 1 approval(s) by role 'ml-lead', has 0"
    ]
    assert check(POLICY, ["code_patch", "launch_keys"], [Approval("ml-lead", "ana")], MONDAY_NOON) == []


def test_two_distinct_approvers_for_kernels() -> None:
    twice_same = [Approval("perf", "bo"), Approval("perf", "bo")]
    assert check(POLICY, ["kernel_patch"], twice_same, MONDAY_NOON) == [
        "kernel_patch: needs 2 approval(s) by role 'perf', has 1"
    ]
    assert (
        check(POLICY, ["kernel_patch"], [Approval("perf", "bo"), Approval("perf", "cy")], MONDAY_NOON) == []
    )


def test_approval_scoped_to_classes() -> None:
    scoped = [Approval("ml-lead", "ana", action_classes=["launch_keys"])]
    assert check(POLICY, ["code_patch"], scoped, MONDAY_NOON) == [
        "code_patch: needs 1 approval(s) by role 'ml-lead', has 0"
    ]


def test_accepts_approval_granted_events() -> None:
    granted = ApprovalGranted(candidate_key="abc", role="ml-lead", approver="ana", action_classes=[])
    assert check(POLICY, ["code_patch"], [granted], MONDAY_NOON) == []


def test_disallowed_class_and_unknown_class() -> None:
    assert check(POLICY, ["data_change"], [Approval("owner", "x")], MONDAY_NOON) == [
        "data_change: the policy never allows applying this class of change"
    ]
    assert check(POLICY, ["rocket_fuel"], [], MONDAY_NOON) == ["rocket_fuel: unknown action class"]


def test_members_pin_who_may_claim_a_role() -> None:
    policy = Policy.model_validate(
        {"actions": {"code_patch": {"owner": "ml-lead"}}, "members": {"ml-lead": ["ana"]}}
    )
    assert check(policy, ["code_patch"], [Approval("ml-lead", "mallory")], MONDAY_NOON) == [
        "code_patch: needs 1 approval(s) by role 'ml-lead', has 0"
    ]
    assert check(policy, ["code_patch"], [Approval("ml-lead", "ana")], MONDAY_NOON) == []


def test_no_friday_auto_apply() -> None:
    approved = [Approval("ml-lead", "ana")]
    assert check(POLICY, ["code_patch"], approved, FRIDAY_NOON, operation="auto_apply") == [
        "forbidden window (no Friday auto-apply): no auto_apply at 2026-01-02T12:00:00+00:00"
    ]
    # a person may still apply on Friday; auto-apply is fine on Monday
    assert check(POLICY, ["code_patch"], approved, FRIDAY_NOON, operation="apply") == []
    assert check(POLICY, ["code_patch"], approved, MONDAY_NOON, operation="auto_apply") == []
    # both ends of the day are inside the window, Thursday 23:59 and Saturday 00:00 are not
    assert check(POLICY, ["launch_keys"], [], datetime(2026, 1, 2, 0, 0, tzinfo=UTC), operation="auto_apply")
    assert check(
        POLICY, ["launch_keys"], [], datetime(2026, 1, 2, 23, 59, 59, tzinfo=UTC), operation="auto_apply"
    )
    assert not check(
        POLICY, ["launch_keys"], [], datetime(2026, 1, 1, 23, 59, tzinfo=UTC), operation="auto_apply"
    )
    assert not check(
        POLICY, ["launch_keys"], [], datetime(2026, 1, 3, 0, 0, tzinfo=UTC), operation="auto_apply"
    )


def test_window_in_another_zone() -> None:
    # Friday in Tokyo (UTC+9) starts at Thursday 15:00 UTC.
    window = ForbiddenWindow.model_validate(
        {"days": ["Friday"], "from": "00:00", "to": "23:59", "tz": "Asia/Tokyo"}
    )
    assert window.days == ["fri"]
    assert window.contains(datetime(2026, 1, 1, 15, 0, tzinfo=UTC))
    assert not window.contains(datetime(2026, 1, 1, 14, 59, tzinfo=UTC))
    assert not window.contains(datetime(2026, 1, 2, 15, 0, tzinfo=UTC))
    # a non-UTC aware "now" is converted, not read as wall-clock
    assert window.contains(datetime(2026, 1, 1, 10, 0, tzinfo=timezone(timedelta(hours=-5))))
    with pytest.raises(ValueError, match="timezone-aware"):
        window.contains(datetime(2026, 1, 2, 12, 0))


def test_overnight_window_wraps_midnight() -> None:
    window = ForbiddenWindow.model_validate({"days": ["fri"], "from": "22:00", "to": "06:00"})
    assert window.contains(datetime(2026, 1, 2, 22, 0, tzinfo=UTC))  # Friday night
    assert window.contains(datetime(2026, 1, 3, 5, 59, tzinfo=UTC))  # Saturday early morning
    assert not window.contains(datetime(2026, 1, 3, 6, 1, tzinfo=UTC))
    assert not window.contains(datetime(2026, 1, 2, 5, 0, tzinfo=UTC))  # Friday early = Thursday's window
    assert not window.contains(datetime(2026, 1, 2, 21, 59, tzinfo=UTC))


def test_window_by_action_class_and_default_apply() -> None:
    policy = Policy.model_validate(
        {
            "actions": {"kernel_patch": {"approvals": 0}, "code_patch": {"approvals": 0}},
            "forbidden_windows": [
                {"days": ["mon"], "from": "09:00", "to": "17:00", "actions": ["kernel_patch"]},
                {"days": ["sat", "sun"]},  # default: every apply, all day
            ],
        }
    )
    assert check(policy, ["code_patch"], [], MONDAY_NOON) == []
    assert check(policy, ["kernel_patch"], [], MONDAY_NOON) == [
        "forbidden window (mon 09:00-17:00 UTC): no kernel_patch at 2026-01-05T12:00:00+00:00"
    ]
    sunday = datetime(2026, 1, 4, 12, 0, tzinfo=UTC)
    assert check(policy, ["code_patch"], [], sunday) == [
        "forbidden window (sat,sun 00:00-23:59 UTC): no apply at 2026-01-04T12:00:00+00:00"
    ]
    assert check(policy, ["code_patch"], [], sunday, operation="auto_apply") != []


def test_policy_validation_errors() -> None:
    with pytest.raises(ValidationError, match="unknown time zone"):
        ForbiddenWindow.model_validate({"tz": "Mars/Olympus"})
    with pytest.raises(ValidationError, match="quoted"):
        ForbiddenWindow.model_validate({"from": 1439})
    with pytest.raises(ValidationError):
        Policy.model_validate({"actions": {"rocket_fuel": {}}})
    with pytest.raises(ValidationError):
        Policy.model_validate({"forbidden_windows": [{"days": ["someday"]}]})
    with pytest.raises(ValidationError):
        Policy.model_validate({"forbidden_windows": [{"actions": ["deploy"]}]})
    with pytest.raises(ValidationError):
        Policy.model_validate({"actions": {"code_patch": {"aprovals": 1}}})


CHANGED = ["data/train.bin changed (sha256:aa → sha256:bb)"]


def test_a_change_of_data_is_refused_as_the_policys_data_change_class_says() -> None:
    forbidden = data_change_refusal(POLICY, CHANGED, MONDAY_NOON)
    assert forbidden.startswith("data_change: the job's inputs changed since init (data/train.bin changed")
    assert "policy: data_change: the policy never allows applying this class of change" in forbidden
    owned = Policy.model_validate({"actions": {"data_change": {"owner": "data-platform", "approvals": 2}},
                                   "forbidden_windows": [{"days": ["mon"], "actions": ["data_change"], "reason": "freeze"}]})
    reason = data_change_refusal(owned, CHANGED, MONDAY_NOON)
    assert "data_change: needs 2 approval(s) by role 'data-platform', has 0" in reason
    assert "forbidden window (freeze)" in reason  # every rule of the class is consulted
    # whatever the rule, the loss must be re-verified on the new data, which the study's baseline cannot do
    free = Policy.model_validate({"actions": {"data_change": {"owner": "data-platform", "approvals": 0}}})
    reason = data_change_refusal(free, CHANGED, MONDAY_NOON)
    assert "lets role 'data-platform' change data without approval" in reason
    assert "requires the loss re-verified" in reason and "new study" in reason
