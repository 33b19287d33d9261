"""Signed approvals with real OpenSSH keys: apply counts only approvals signed by the policy's signers,
for this study, this candidate and this evidence, not expired; the promoted commit is signed too."""

from __future__ import annotations

import argparse
import subprocess
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest
import yaml
from infrarsi import events as ev
from infrarsi.commands.approve_apply import ApplyRefused, approval_for, execute_apply, plan_apply
from infrarsi.commands.init import prepare_study
from infrarsi.study.contract import ContractError
from infrarsi.trial.workspace import git
from infrarsi.verdicts import approvals as appr
from infrarsi.verdicts.signing import public_key_line
from support import verified_study

from tests.integration.test_apply import CANDIDATE, MONDAY, contract_dict, log, make_workload, verified

OTHER = ev.Candidate(knobs={"knobs.micro_batch_size": 2}, patches=["fused"])


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True)
    return path


@pytest.fixture()
def keys(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "keys").mkdir()
    return {name: keygen(tmp_path / "keys" / name) for name in ("ana", "bo", "mallory")}


def signed_study(tmp_path: Path, keys: dict[str, Path], *, signers_file: bool = True):
    """A study whose policy lets ana (ml-lead) and bo (perf) sign; mallory has a key but is not listed."""
    make_workload(tmp_path / "wl", as_git=False)
    lines = [f"{name} {public_key_line(keys[name])}" for name in ("ana", "bo")]
    data = contract_dict()
    data["policy"]["forbidden_windows"] = []
    data["policy"]["members"] = {"ml-lead": ["ana"], "perf": ["bo"]}
    if signers_file:
        (tmp_path / "allowed_signers").write_text("# team signers\n" + "\n".join(lines) + "\n")
        data["policy"]["allowed_signers"] = "allowed_signers"
    else:
        data["policy"]["allowed_signers"] = lines
    path = tmp_path / "contract.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return prepare_study(path, tmp_path / "data", study_id="s1")


def approve(prepared, key: Path | None, *, approver: str = "ana", role: str = "ml-lead", candidate=CANDIDATE,
            verification: list | None = None, when=MONDAY) -> ev.ApprovalGranted:
    events = log(prepared, verification or verified(candidate))
    args = argparse.Namespace(study="s1", candidate=candidate.key(), role=role, action_classes=[], note="", key=key)
    return approval_for(events, args, approver, when)


def refused(prepared, *payloads, when=MONDAY) -> list[str]:
    with pytest.raises(ApplyRefused) as info:
        plan_apply(log(prepared, verified(), *payloads), "s1", CANDIDATE.key(), when)
    return info.value.reasons


def test_signed_approval_counts_and_the_commit_is_signed(tmp_path: Path, keys) -> None:
    prepared = signed_study(tmp_path, keys)
    assert prepared.created.contract["policy"]["allowed_signers"][0].startswith("ana ssh-ed25519 ")
    granted = approve(prepared, keys["ana"])
    assert granted.signature.startswith("-----BEGIN SSH SIGNATURE-----")
    assert f"candidate: {CANDIDATE.key()}\nrole: ml-lead\napprover: ana\n" in granted.statement
    plan = plan_apply(log(prepared, verified(), granted), "s1", CANDIDATE.key(), MONDAY)
    assert plan.notes == [] and plan.approvals == [granted]

    promoted = execute_apply(plan, signing_key=keys["bo"])
    repo = prepared.created.workload_dir
    signers = tmp_path / "allowed_signers"
    check = git(repo, "-c", f"gpg.ssh.allowedSignersFile={signers}", "verify-commit", promoted.commit, check=False)
    assert check.returncode == 0, check.stderr
    assert 'Good "git" signature for bo' in check.stderr


def test_unsigned_approval_refused(tmp_path: Path, keys) -> None:
    prepared = signed_study(tmp_path, keys, signers_file=False)
    unsigned = ev.ApprovalGranted(candidate_key=CANDIDATE.key(), role="ml-lead", approver="ana", action_classes=[])
    assert refused(prepared, unsigned) == [
        "code_patch: needs 1 approval(s) by role 'ml-lead', has 0",
        "approval by ana as ml-lead not counted: unsigned (the policy requires approvals signed by a key in "
        "its allowed_signers)",
    ]
    with pytest.raises(ApplyRefused, match="counts only signed approvals: pass --key"):
        approve(prepared, None)


def test_forged_approval_refused(tmp_path: Path, keys) -> None:
    """mallory signs a statement naming ana; ana's key for bo's role; a statement edited after signing."""
    prepared = signed_study(tmp_path, keys)
    forged = appr.signed_approval(
        appr.Statement.parse(approve(prepared, keys["ana"]).statement), keys["mallory"]
    )
    reasons = refused(prepared, forged)
    assert reasons[1].startswith("approval by ana as ml-lead not counted: signature does not verify for 'ana'")
    with pytest.raises(ApplyRefused, match="this approval would not count: signature does not verify"):
        approve(prepared, keys["mallory"])

    genuine = approve(prepared, keys["ana"])
    edited = msgspec.structs.replace(genuine, statement=genuine.statement.replace("ml-lead", "perf"), role="perf")
    assert "signature does not verify" in refused(prepared, edited)[1]
    # a valid signature, but the event claims another role than the statement
    claimed = msgspec.structs.replace(genuine, role="perf")
    assert refused(prepared, claimed)[1].endswith("the event's role, approver or classes differ from what was signed")
    # the members table binds the role: bo signs validly, but bo is not an ml-lead
    by_bo = approve(prepared, keys["bo"], approver="bo")
    assert refused(prepared, by_bo) == ["code_patch: needs 1 approval(s) by role 'ml-lead', has 0"]


def test_replayed_approval_refused(tmp_path: Path, keys) -> None:
    prepared = signed_study(tmp_path, keys)
    for_other = approve(prepared, keys["ana"], candidate=OTHER)
    replayed = msgspec.structs.replace(for_other, candidate_key=CANDIDATE.key())
    assert refused(prepared, replayed)[1] == (
        f"approval by ana as ml-lead not counted: signed for candidate {OTHER.key()}, not {CANDIDATE.key()} "
        "(replayed)"
    )


def test_expired_and_stale_evidence_refused(tmp_path: Path, keys) -> None:
    prepared = signed_study(tmp_path, keys)
    granted = approve(prepared, keys["ana"])
    later = MONDAY + timedelta(hours=168, minutes=1)
    assert "not counted: expired: signed 2026-01-05T12:00:00+00:00, valid for 168 h" in refused(
        prepared, granted, when=later
    )[1]
    assert plan_apply(log(prepared, verified(), granted), "s1", CANDIDATE.key(), later - timedelta(minutes=2))
    future = approve(prepared, keys["ana"], when=MONDAY + timedelta(hours=1))
    assert "signed in the future" in refused(prepared, future)[1]
    # approved on other numbers than the verification apply would use
    older = verified_study.verification(CANDIDATE, candidate_s=0.3)
    stale = approve(prepared, keys["ana"], verification=older)
    assert "the candidate's verified evidence is now" in refused(prepared, stale)[1]


def test_allowed_signers_file_checked_at_init(tmp_path: Path, keys) -> None:
    make_workload(tmp_path / "wl", as_git=False)
    data = contract_dict()
    data["policy"]["allowed_signers"] = "missing_signers"
    path = tmp_path / "contract.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ContractError, match="allowed_signers file .*missing_signers"):
        prepare_study(path, tmp_path / "data", study_id="s1")
    (tmp_path / "missing_signers").write_text("# nobody yet\n")
    with pytest.raises(ContractError, match="allowed_signers names no signer"):
        prepare_study(path, tmp_path / "data", study_id="s1")
