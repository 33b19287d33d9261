"""``infrarsi approve`` and ``infrarsi apply``: a human grants approvals; a verified winner goes to a branch.

``approve STUDY CANDIDATE --as ROLE --key KEY`` publishes ``ApprovalGranted`` carrying a statement (study,
candidate, role, approver, the evidence hash, when) signed with the approver's OpenSSH key
(``infrarsi.verdicts.approvals``). ``apply STUDY CANDIDATE`` reads the study's events, refuses unless the candidate
passed verification, the policy's approvals are present — signed by the policy's allowed signers, for this
candidate and this evidence, not expired — and no forbidden window is open, then writes the candidate to
branch ``infrarsi/<study>/<candidate>`` from the golden tag (``workspace.apply_candidate``: never the
current branch, never a merge; the commit signed when a key is configured) and publishes ``PatchPromoted``.

The decisions are pure functions over a list of events (``plan_apply``) so they are tested without NATS;
``run_*`` only read and publish.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TypeVar

import msgspec
import yaml
from pydantic import ValidationError

from infrarsi import events as ev
from infrarsi.bus import subjects
from infrarsi.bus.client import Bus
from infrarsi.commands.study_log import read_study, recording_bus
from infrarsi.errors import EXIT_FAILED, EXIT_REFUSED, Refused, UserError
from infrarsi.study.contract import Contract, PatchIndex, PatchInfo, locked_contract
from infrarsi.trial.workspace import (
    AppliedCandidate,
    BranchExists,
    WorkspaceError,
    apply_candidate,
    branch_exists_remedy,
    candidate_branch,
    git,
    golden_tag,
    launch_changes,
)
from infrarsi.verdicts import approvals as appr
from infrarsi.verdicts import verification as vf
from infrarsi.verdicts.policy import ACTION_CLASSES, Operation, check
from infrarsi.verdicts.signing import SigningError

P = TypeVar("P")

SOURCE_APPROVE = "cli.approve"
SOURCE_APPLY = "cli.apply"
SIGNING_KEY_ENV = "INFRARSI_SIGNING_KEY"

__all__ = [
    "ApplyPlan",
    "ApplyRefused",
    "AppliedCandidate",
    "add_approve_arguments",
    "add_apply_arguments",
    "apply_candidate",
    "execute_apply",
    "plan_apply",
    "run_apply",
    "run_approve",
]


class ApplyRefused(Refused):
    """Apply may not go ahead; ``reasons`` says why (one line each)."""


@dataclass(frozen=True)
class ApplyPlan:
    """Everything ``execute_apply`` needs, decided from the study's events."""

    study_id: str
    created: ev.StudyCreated
    contract: Contract
    verification: ev.VerifyCompleted
    approvals: list[ev.ApprovalGranted]
    """The approvals that count (signatures verified when the policy names signers)."""
    notes: list[str]
    """What apply left out, one line each: approvals that do not count (with the reason), events whose
    publisher may not own them, a ``PatchPromoted`` with no branch behind it."""
    action_classes: list[str]
    launch_changes: dict[str, ev.KnobValue]
    patch_texts: dict[str, str]
    """Patch id → diff, read from the golden commit (what the trials ran), in the candidate's order."""
    branch: str


def _payloads(events: Sequence[ev.Event], kind: type[P]) -> list[P]:
    return [e.payload for e in events if isinstance(e.payload, kind)]


def resolve_candidate_key(events: Sequence[ev.Event], key_or_prefix: str) -> str:
    """A full candidate key from a unique prefix (as printed in reports), among verified candidates."""
    keys = {p.candidate_key for p in _payloads(events, ev.VerifyCompleted)}
    keys |= {p.candidate_key for p in _payloads(events, ev.TrialProposed)}
    if key_or_prefix in keys:
        return key_or_prefix
    matches = sorted(k for k in keys if k.startswith(key_or_prefix))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ApplyRefused([f"candidate {key_or_prefix} is unknown in this study"])
    raise ApplyRefused([f"candidate prefix {key_or_prefix} is ambiguous: {', '.join(matches)}"])


def plan_apply(
    events: Sequence[ev.Event],
    study_id: str,
    candidate: str,
    now: datetime,
    *,
    operation: Operation = "apply",
) -> ApplyPlan:
    """Decide whether a candidate may be applied now; raises ``ApplyRefused`` with every reason if not.

    Only events whose ``source`` may publish their type (``subjects.ROUTES``) count; the verification is
    re-derived from the measured trials (``measured_verification``), and "already applied" is the
    repository's branch, not an event's word.
    """
    notes = [
        f"ignored {e.type} {e.event_id} from {e.source!r}: not a publisher of {e.type}"
        for e in events
        if e.source not in subjects.route(e.type).publishers
    ]
    events = [e for e in events if e.source in subjects.route(e.type).publishers]
    created_list = _payloads(events, ev.StudyCreated)
    if not created_list:
        raise ApplyRefused([f"study {study_id} not found (no StudyCreated)"])
    created: ev.StudyCreated = created_list[0]
    contract = locked_contract(created)
    try:
        key = resolve_candidate_key(events, candidate)
    except ApplyRefused as exc:
        raise ApplyRefused(exc.reasons + notes) from None

    verifications = [v for v in _payloads(events, ev.VerifyCompleted) if v.candidate_key == key]
    promotable = [v for v in verifications if v.promotable]
    if not promotable:
        detail = (
            f"{len(verifications)} verification(s), none promotable" if verifications else "never verified"
        )
        raise ApplyRefused([f"candidate {key} has not passed verification ({detail})", *notes])
    verification = measured_verification(events, promotable[-1], contract)
    repo = Path(created.workload_dir)
    branch = candidate_branch(study_id, key)
    existing = git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}", check=False)
    if existing.returncode == 0:
        raise ApplyRefused([
            f"candidate {key} was already applied to {branch} ({existing.stdout.strip()[:12]}) in {repo}; "
            + branch_exists_remedy(repo, branch)
        ])
    notes += [
        f"a PatchPromoted names {p.branch} ({p.commit[:12]}), but {repo} has no branch {branch}: applying"
        for p in _payloads(events, ev.PatchPromoted)
        if p.candidate_key == key
    ]

    patch_ids = verification.candidate.patches
    # The agent's diffs are patches of the study recorded in its log (AgentAnswered), not files of the library;
    # they count as code patches for the policy and are checked again when the branch is written.
    agent = {p.patch_id: p.diff for a in _payloads(events, ev.AgentAnswered) for p in a.patches}
    library, texts = _golden_patches(repo, created.baseline_ref, contract.workload.patch_dir,
                                     [p for p in patch_ids if p not in agent])
    texts = {p: agent[p] if p in agent else texts[p] for p in patch_ids}
    if contract.workload.launch_file is not None:
        baseline = yaml.safe_load(_golden_file(repo, created.baseline_ref, contract.workload.launch_file)) or {}
    else:  # flags, overrides or variables: the golden values are in the locked contract itself
        baseline = contract.golden_values()
    changes = launch_changes(baseline, verification.candidate.knobs)
    classes = contract.action_classes(changes, verification.candidate.patches, library)
    granted = [a for a in _payloads(events, ev.ApprovalGranted) if a.candidate_key == key]
    policy = contract.apply_policy
    counted = appr.count(
        granted,
        policy=policy,
        study_id=study_id,
        candidate_key=key,
        evidence=appr.evidence_sha256(created, verification),
        now=now,
    )
    reasons = check(policy, classes, counted.approvals, now, operation=operation)
    if reasons:
        raise ApplyRefused(reasons + counted.not_counted + notes)
    return ApplyPlan(
        study_id=study_id,
        created=created,
        contract=contract,
        verification=verification,
        approvals=counted.approvals,
        notes=counted.not_counted + notes,
        action_classes=classes,
        launch_changes=changes,
        patch_texts=texts,
        branch=branch,
    )


def measured_verification(
    events: Sequence[ev.Event], published: ev.VerifyCompleted, contract: Contract
) -> ev.VerifyCompleted:
    """``published`` re-derived from the measured trials: every round of its verification decided again
    (``verification.decide``) from the ``TrialMeasured`` (or failed ``TrialFinished``) of the trials the
    verifier's plan names. Refuses when a trial is missing or the numbers differ from what was published,
    so a forged ``VerifyCompleted`` promotes nothing even where the bus cannot tell who published it.
    """
    rounds = [
        v
        for v in _payloads(events, ev.VerifyCompleted)
        if v.verify_id == published.verify_id and v.candidate_key == published.candidate_key
    ]
    rounds = rounds[: rounds.index(published) + 1]
    results = {
        e.trial_id: e.payload
        for e in events
        if isinstance(e.payload, ev.TrialMeasured)
        or (isinstance(e.payload, ev.TrialFinished) and e.payload.status != "ok")
    }
    rule = vf.loss_rule_of(contract.invariants)
    derived, passes = published, 0
    for round_no, done in enumerate(rounds, start=1):
        repeats = max(1, len(done.trial_ids) // 2)
        plan = vf.plan_round(done.verify_id, done.candidate, round_no=round_no, repeats=repeats, steps=None)
        if sorted(p.trial_id for p in plan) != sorted(done.trial_ids):
            raise ApplyRefused([f"verification {done.verify_id} round {round_no} names trials the verifier never planned"])
        round_ = vf.Round(done.verify_id, done.candidate, round_no, repeats)
        for p in plan:
            match results.get(p.trial_id):
                case ev.TrialMeasured() as m:
                    round_.runs[p.trial_id] = vf.RunMeasurement.from_measured(p.trial_id, p.arm, p.pair, m)
                case ev.TrialFinished() as f:
                    round_.runs[p.trial_id] = vf.RunMeasurement.from_finished(p.trial_id, p.arm, p.pair, f)
                case _:
                    raise ApplyRefused([f"verification {done.verify_id}: trial {p.trial_id} was never measured"])
        derived = vf.decide(round_, passes_before=passes, passes_required=contract.verify.passes_required, loss_rule=rule)
        passes = derived.passes
        if derived != done:
            raise ApplyRefused([
                f"verification {done.verify_id} round {round_no} does not match its measured trials "
                f"(published: speed-up {done.speedup:.3f}, promotable {done.promotable}; "
                f"measured: speed-up {derived.speedup:.3f}, promotable {derived.promotable})"
            ])
    return derived


def _golden_file(repo: Path, ref: str, rel: str) -> str:
    """A file as it is in the golden commit (the user may have changed the working copy since init)."""
    result = git(repo, "show", f"{ref}:{PurePosixPath(rel).as_posix()}", check=False)
    if result.returncode != 0:
        raise ApplyRefused([f"{rel} is not in the golden baseline {ref[:12]} of {repo}"])
    return result.stdout


def _golden_patches(
    repo: Path, ref: str, patch_dir: str, patch_ids: Sequence[str]
) -> tuple[dict[str, PatchInfo], dict[str, str]]:
    if not patch_ids:
        return {}, {}
    index_path = f"{patch_dir}/index.yaml"
    try:
        index = PatchIndex.model_validate(yaml.safe_load(_golden_file(repo, ref, index_path)))
    except (ValidationError, yaml.YAMLError) as exc:
        raise ApplyRefused([f"{index_path} in the golden baseline is invalid: {exc}"]) from None
    library = {info.id: info for info in index.patches}
    missing = [p for p in patch_ids if p not in library]
    if missing:
        raise ApplyRefused([f"patches {missing} are not in the golden patch library {index_path}"])
    texts = {}
    for patch_id in patch_ids:
        names = library[patch_id].diff_candidates()
        for name in names:
            result = git(repo, "show", f"{ref}:{PurePosixPath(patch_dir, name).as_posix()}", check=False)
            if result.returncode == 0:
                texts[patch_id] = result.stdout
                break
        else:
            raise ApplyRefused(
                [f"diff {' or '.join(names)} of patch {patch_id} is not in the golden baseline"]
            )
    return library, texts


def evidence_text(plan: ApplyPlan) -> str:
    """The commit message body: why this change is safe to review (numbers from VerifyCompleted)."""
    v = plan.verification
    held = "all held" if not v.failed_invariants else f"FAILED: {', '.join(v.failed_invariants)}"
    if v.unchecked_invariants:
        held += f"; UNCHECKED (coarse measurement, no probe): {', '.join(v.unchecked_invariants)}"
    mfu = ""
    if v.mfu_before is not None and v.mfu_after is not None:
        mfu = f"MFU {v.mfu_before:.3f} -> {v.mfu_after:.3f}\n"
    approvals = ", ".join(sorted({f"{a.role}:{a.approver}" for a in plan.approvals})) or "none required"
    return (
        f"InfraRSI study {plan.study_id} ({plan.created.name}), verification {v.verify_id}\n"
        f"Speed-up {v.speedup:.3f}x (CI {v.ci_low:.3f}-{v.ci_high:.3f}), {v.passes} passing verification run(s)\n"
        f"Step time {v.baseline_step_s:.4f} s -> {v.candidate_step_s:.4f} s\n"
        f"{mfu}"
        f"Invariants: {held}\n"
        f"Action classes: {', '.join(plan.action_classes) or 'none'}\n"
        f"Approved by: {approvals}\n"
        f"Golden baseline: {golden_tag(plan.study_id)} ({plan.created.baseline_ref})\n"
        f"Contract sha256: {plan.created.contract_sha256}\n"
        f"Trials: {', '.join(v.trial_ids)}"
    )


def execute_apply(plan: ApplyPlan, signing_key: Path | None = None) -> ev.PatchPromoted:
    """Write the planned candidate to its branch; the scope is checked again against the locked hashes.

    ``signing_key`` signs the branch commit (OpenSSH key, git's ``gpg.format=ssh``)."""
    with tempfile.TemporaryDirectory(prefix="infrarsi-patches-") as scratch:
        paths = []
        for patch_id, text in plan.patch_texts.items():
            path = Path(scratch) / f"{patch_id}.patch"
            path.write_text(text)
            paths.append(path)
        applied = apply_candidate(
            Path(plan.created.workload_dir),
            plan.created.baseline_ref,
            plan.verification.candidate,
            paths,
            plan.contract.workload.launch_file,
            evidence_text(plan),
            plan.branch,
            editable=plan.contract.editable,
            locked=plan.created.locked_files,
            golden_values=plan.contract.golden_values() if plan.contract.workload.launch_file is None else None,
            signing_key=signing_key,
        )
    return ev.PatchPromoted(
        candidate_key=plan.verification.candidate_key,
        repo=plan.created.workload_dir,
        branch=applied.branch,
        commit=applied.commit,
        files_changed=applied.files_changed,
        launch_changes=plan.launch_changes,
    )


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="study id")
    parser.add_argument("candidate", help="candidate key (or a unique prefix)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def add_approve_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("--as", dest="role", required=True, help="the role you approve as (see the policy)")
    parser.add_argument("--approver", default=None, help="your name (default: the login name)")
    parser.add_argument(
        "--action-class",
        dest="action_classes",
        action="append",
        choices=ACTION_CLASSES,
        default=[],
        help="limit the approval to these classes of change (repeatable; default: all)",
    )
    parser.add_argument("--note", default="", help="free text kept with the approval")
    _key_argument(parser, "your OpenSSH private key to sign the approval with")


def _key_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument(
        "--key",
        type=Path,
        default=os.environ.get(SIGNING_KEY_ENV) or None,
        help=f"{help_text} (default: ${SIGNING_KEY_ENV}; none: unsigned)",
    )


def add_apply_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    _key_argument(parser, "OpenSSH private key to sign the branch commit with (git's gpg.format=ssh)")


add_arguments = add_apply_arguments
"""``infrarsi apply``'s arguments (the module serves two verbs; ``approve`` uses ``add_approve_arguments``)."""


async def load_study_events(bus: Bus, study_id: str) -> list[ev.Event]:
    """Every lifecycle event of one study that its publisher may own, in stream order (an event on another
    type's subject, or from a source the subjects table does not list for its type, is left out)."""
    return (await read_study(bus, study_id, owned_only=True))[0]


def approval_for(
    events: Sequence[ev.Event], args: argparse.Namespace, approver: str, now: datetime
) -> ev.ApprovalGranted:
    """The approval ``infrarsi approve`` publishes: signed over the candidate's current evidence.

    Raises ``ApplyRefused`` when there is nothing to approve yet, or when the policy asks for signatures
    and this one would not count (no key, a key not listed for ``approver``), so the approver learns it
    now rather than at apply.
    """
    created_list = _payloads(events, ev.StudyCreated)
    if not created_list:
        raise ApplyRefused([f"study {args.study} not found"])
    created: ev.StudyCreated = created_list[0]
    key = resolve_candidate_key(events, args.candidate)
    promotable = [v for v in _payloads(events, ev.VerifyCompleted) if v.candidate_key == key and v.promotable]
    if not promotable:
        raise ApplyRefused([f"candidate {key} has not passed verification: there is no evidence to approve"])
    statement = appr.Statement(
        study_id=args.study,
        candidate_key=key,
        role=args.role,
        approver=approver,
        action_classes=tuple(sorted(set(args.action_classes))),
        evidence_sha256=appr.evidence_sha256(created, promotable[-1]),
        signed_at=now,
    )
    policy = locked_contract(created).apply_policy
    signing_key = getattr(args, "key", None)
    if policy.allowed_signers is not None and signing_key is None:
        raise ApplyRefused(
            [f"this study's policy counts only signed approvals: pass --key or set {SIGNING_KEY_ENV}"]
        )
    granted = appr.signed_approval(statement, signing_key, note=args.note)
    reason = appr.refusal(
        granted,
        policy=policy,
        study_id=args.study,
        candidate_key=key,
        evidence=statement.evidence_sha256,
        now=now,
    )
    if reason is not None:
        raise ApplyRefused([f"this approval would not count: {reason}"])
    return granted


async def run_approve(args: argparse.Namespace, *, now: datetime | None = None) -> int:
    approver = args.approver or os.environ.get("USER") or getpass.getuser()
    async with recording_bus(args, SOURCE_APPROVE) as bus:
        events = await load_study_events(bus, args.study)
        try:
            granted = approval_for(events, args, approver, now or datetime.now(UTC))
        except (ApplyRefused, SigningError) as exc:
            raise UserError(str(exc)) from None
        event = ev.make_event(
            granted,
            study_id=args.study,
            source=SOURCE_APPROVE,
            cluster_id=_payloads(events, ev.StudyCreated)[0].cluster.cluster_id,
        )
        await bus.publish(event)
    key, signed = granted.candidate_key, bool(granted.signature)
    if args.json:
        fields = {"event_id": event.event_id, "candidate_key": key, "role": args.role, "approver": approver}
        print(json.dumps({**fields, "signed": signed, "evidence_sha256": granted.evidence_sha256}))
    else:
        print(f"approved {key} as {args.role} ({approver}, {'signed' if signed else 'unsigned'})")
    return 0


async def run_apply(args: argparse.Namespace, *, now: datetime | None = None) -> int:
    async with recording_bus(args, SOURCE_APPLY) as bus:
        events = await load_study_events(bus, args.study)
        try:
            plan = plan_apply(events, args.study, args.candidate, now or datetime.now(UTC))
            for line in plan.notes:
                print(f"note: {line}", file=sys.stderr)
            if plan.contract.apply_policy.allowed_signers is None and plan.approvals:
                print("note: the policy names no allowed_signers, so approvals were taken on their word", file=sys.stderr)
            promoted = execute_apply(plan, getattr(args, "key", None))
        except ApplyRefused as exc:
            raise UserError(f"{args.candidate}: not applied", EXIT_REFUSED,
                            details=[f"refused: {reason}" for reason in exc.reasons]) from None
        except BranchExists as exc:  # written between the plan's check and now: refused all the same
            raise UserError(f"{args.candidate}: not applied", EXIT_REFUSED, details=[f"refused: {exc}"]) from None
        except WorkspaceError as exc:
            raise UserError(str(exc), EXIT_FAILED) from None
        event = ev.make_event(
            promoted,
            study_id=args.study,
            source=SOURCE_APPLY,
            cluster_id=plan.created.cluster.cluster_id,
            event_id=ev.derived_id(args.study, promoted.candidate_key, "PatchPromoted"),
        )
        await bus.publish(event)
    if args.json:
        print(json.dumps(msgspec.to_builtins(promoted)))
    else:
        print(f"{promoted.branch} {promoted.commit}")
        for path in promoted.files_changed:
            print(f"  {path}")
    return 0


run = run_apply
"""``infrarsi apply`` (``infrarsi approve`` is ``run_approve``)."""
