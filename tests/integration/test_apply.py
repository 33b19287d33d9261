"""init → approve → apply with real git: the policy gates apply, and the branch holds exactly the candidate."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import msgspec
import pytest
import yaml
from infrarsi import cli
from infrarsi import events as ev
from infrarsi.commands.approve_apply import ApplyRefused, evidence_text, execute_apply, plan_apply
from infrarsi.commands.init import prepare_study
from infrarsi.trial.workspace import BranchExists, WorkspaceError, git
from support import verified_study
from support.small_workload import WORKLOAD_SECTION, numbered_lines, write_workload

FRIDAY = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)
MONDAY = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)

MODEL = numbered_lines(10)
FUSED = MODEL.replace("line 5\n", "line 5 (fused)\n")
FUSED_PATCH = """\
diff --git a/model.py b/model.py
--- a/model.py
+++ b/model.py
@@ -3,5 +3,5 @@
 line 3
 line 4
-line 5
+line 5 (fused)
 line 6
 line 7
"""


def contract_dict() -> dict:
    return {
        "name": "apply-test",
        "goal": "faster",
        "workload": {"repo": "wl", **WORKLOAD_SECTION},
        "cluster": {"id": "local-cpu", "accelerator": "cpu", "memory_capacity_bytes": 10**9},
        "scope": {
            "files": ["model.py"],
            "launch_keys": ["knobs.micro_batch_size", "knobs.attention", "knobs.compile"],
        },
        "search_space": {
            "knobs": {
                "knobs.micro_batch_size": {"type": "int", "choices": [2, 4, 8]},
                "knobs.attention": {"type": "choice", "choices": ["manual", "sdpa"]},
                "knobs.compile": {"type": "bool"},
            },
            "constraints": {
                "global_batch": {
                    "size": 32,
                    "micro_batch_key": "knobs.micro_batch_size",
                    "size_key": "run.global_batch_size",
                }
            },
            "patches": ["fused"],
        },
        "invariants": {"loss": {"tolerance": 0.02}},
        "budget": {"trials": 4, "accelerator_hours": 1},
        "policy": {
            "actions": {
                "code_patch": {"owner": "ml-lead", "approvals": 1},
                "launch_keys": {"owner": "ml-lead", "approvals": 0},
            },
            "forbidden_windows": [
                {
                    "days": ["fri"],
                    "from": "00:00",
                    "to": "23:59",
                    "actions": ["apply"],
                    "reason": "no Friday changes",
                }
            ],
        },
    }


def make_workload(wl: Path, *, as_git: bool) -> None:
    write_workload(wl, MODEL, [{"id": "fused", "description": "fuse", "files": ["model.py"], "kind": "speedup"}],
                   {"patches/fused.patch": FUSED_PATCH})
    if as_git:
        git(wl, "init", "-q", "--initial-branch=main")
        git(wl, "add", "-A")
        git(wl, "commit", "-q", "-m", "initial", commit=True)


def study(tmp_path: Path, *, as_git: bool = False, study_id: str = "s1"):
    make_workload(tmp_path / "wl", as_git=as_git)
    path = tmp_path / "contract.yaml"
    path.write_text(yaml.safe_dump(contract_dict(), sort_keys=False))
    prepared = prepare_study(path, tmp_path / "data", study_id=study_id)
    return prepared


CANDIDATE = ev.Candidate(knobs={"knobs.micro_batch_size": 8, "knobs.attention": "manual"}, patches=["fused"])


def verified(candidate: ev.Candidate = CANDIDATE, promotable: bool = True) -> list[verified_study.Piece]:
    """A whole verification (measured trials and the verifier's rounds); not promotable: one failed round."""
    if promotable:
        return verified_study.verification(candidate)
    return verified_study.verification(candidate, candidate_s=0.6, rounds=1)


def approval(role: str = "ml-lead", approver: str = "ana") -> ev.ApprovalGranted:
    return ev.ApprovalGranted(candidate_key=CANDIDATE.key(), role=role, approver=approver, action_classes=[])


def log(prepared, *items) -> list[ev.Event]:
    """The study's events: payloads, or lists of (payload, trial id) such as ``verified()``, each from its
    type's publisher."""
    pieces = [(prepared.created, None)]
    for item in items:
        pieces += item if isinstance(item, list) else [(item, None)]
    return [verified_study.owned_event(p, study_id=prepared.study_id, trial_id=t) for p, t in pieces]


# ------------------------------------------------------------------------------------------ init


def test_prepare_study_builds_study_created(tmp_path: Path) -> None:
    prepared = study(tmp_path)
    created = prepared.created
    assert prepared.study_id == "s1"
    assert created.name == "apply-test"
    assert created.workload_dir == str(tmp_path.resolve() / "data" / "studies" / "s1" / "workload")
    assert (
        git(created.workload_dir, "rev-parse", "infrarsi/s1/golden^{commit}").stdout.strip()
        == created.baseline_ref
    )
    assert set(created.locked_files) == {
        "train.py",
        "launch/dense.yaml",
        "patches/fused.patch",
        "patches/index.yaml",
    }
    assert created.cluster.cluster_id == "local-cpu"
    assert created.contract["policy"]["actions"]["code_patch"]["owner"] == "ml-lead"
    assert len(created.contract_sha256) == 64
    # the event round-trips through the wire format
    event = ev.make_event(created, study_id="s1", source="test")
    assert ev.decode(ev.encode(event)).payload == created


async def test_init_refuses_invalid_contract_and_publishes_nothing(tmp_path: Path, capsys) -> None:
    from infrarsi.commands import init

    make_workload(tmp_path / "wl", as_git=False)
    data = contract_dict()
    data["search_space"]["patches"] = ["nope"]
    path = tmp_path / "contract.yaml"
    path.write_text(yaml.safe_dump(data))
    args = argparse.Namespace(
        contract=path, json=False, data_dir=tmp_path / "data", nats_url="nats://127.0.0.1:1"
    )
    assert await cli.invoke(init.run, args) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"error: {path}: search_space.patches[0]: unknown patch id 'nope' (not in patches/index.yaml)\n"
    )
    assert not (tmp_path / "data").exists()  # no server started, no workspace made


# ------------------------------------------------------------------------------------------ policy gates


def test_apply_refuses_without_approval(tmp_path: Path) -> None:
    prepared = study(tmp_path)
    with pytest.raises(ApplyRefused) as info:
        plan_apply(log(prepared, verified()), "s1", CANDIDATE.key(), MONDAY)
    assert info.value.reasons == ["code_patch: needs 1 approval(s) by role 'ml-lead', has 0"]
    with pytest.raises(ApplyRefused):  # an approval under another role does not count
        plan_apply(log(prepared, verified(), approval(role="intern")), "s1", CANDIDATE.key(), MONDAY)


def test_apply_obeys_forbidden_window(tmp_path: Path) -> None:
    prepared = study(tmp_path)
    events = log(prepared, verified(), approval())
    with pytest.raises(ApplyRefused) as info:
        plan_apply(events, "s1", CANDIDATE.key(), FRIDAY)
    assert info.value.reasons == [
        "forbidden window (no Friday changes): no apply at 2026-01-02T12:00:00+00:00"
    ]
    plan = plan_apply(events, "s1", CANDIDATE.key()[:6], MONDAY)  # a unique prefix is enough
    assert plan.action_classes == ["code_patch", "launch_keys"]
    assert plan.launch_changes == {"knobs.micro_batch_size": 8}  # attention restates the golden value


def test_launch_only_candidate_needs_no_approval(tmp_path: Path) -> None:
    prepared = study(tmp_path)
    launch_only = ev.Candidate(knobs={"knobs.compile": True})
    plan = plan_apply(log(prepared, verified(launch_only)), "s1", launch_only.key(), MONDAY)
    assert plan.action_classes == ["launch_keys"] and plan.patch_texts == {}


def test_apply_refuses_unverified_unknown_and_reapplied(tmp_path: Path) -> None:
    prepared = study(tmp_path)
    with pytest.raises(ApplyRefused, match="has not passed verification"):
        plan_apply(log(prepared, verified(promotable=False), approval()), "s1", CANDIDATE.key(), MONDAY)
    with pytest.raises(ApplyRefused, match="unknown in this study"):
        plan_apply(log(prepared, verified()), "s1", "ffff", MONDAY)
    with pytest.raises(ApplyRefused, match="not found"):
        plan_apply([], "s1", "ffff", MONDAY)
    # Applied once for real: the branch in the repository is what says so.
    execute_apply(plan_apply(log(prepared, verified(), approval()), "s1", CANDIDATE.key(), MONDAY))
    with pytest.raises(ApplyRefused, match=f"already applied to infrarsi/s1/{CANDIDATE.key()}"):
        plan_apply(log(prepared, verified(), approval()), "s1", CANDIDATE.key(), MONDAY)


def test_forged_patch_promoted_does_not_block_apply(tmp_path: Path) -> None:
    """Issue 16: a PatchPromoted with no branch behind it made apply refuse with "already applied"."""
    prepared = study(tmp_path)
    forged = ev.PatchPromoted(
        candidate_key=CANDIDATE.key(), repo="r", branch="b", commit="c" * 40, files_changed=[], launch_changes={}
    )
    plan = plan_apply(log(prepared, verified(), approval(), forged), "s1", CANDIDATE.key(), MONDAY)
    assert plan.notes == [
        f"a PatchPromoted names b (cccccccccccc), but {prepared.created.workload_dir} has no branch "
        f"infrarsi/s1/{CANDIDATE.key()}: applying"
    ]
    assert execute_apply(plan).branch == f"infrarsi/s1/{CANDIDATE.key()}"


def test_forged_verification_and_approval_refused(tmp_path: Path) -> None:
    """Issue 16: a forged VerifyCompleted + ApprovalGranted made apply exit 0 with the forged evidence.

    Apply counts an event only from a publisher the subjects table lists for its type, and re-derives the
    verification from the measured trials, so neither an outsider's events nor numbers the trials do not
    support promote anything."""
    prepared = study(tmp_path)
    real = verified_study.final(verified())
    forged = msgspec.structs.replace(real, speedup=9.0, ci_low=8.5, ci_high=9.5)
    outsider = [
        ev.make_event(p, study_id="s1", source="mallory") for p in (real, approval())
    ]
    with pytest.raises(ApplyRefused) as info:
        plan_apply([*log(prepared), *outsider], "s1", CANDIDATE.key(), MONDAY)
    assert info.value.reasons[0] == f"candidate {CANDIDATE.key()} is unknown in this study"
    assert any("from 'mallory': not a publisher of VerifyCompleted" in r for r in info.value.reasons)
    # under the verifier's name: a lone final round, or every round but no trial measured
    with pytest.raises(ApplyRefused, match="round 1 names trials the verifier never planned"):
        plan_apply(log(prepared, real, approval()), "s1", CANDIDATE.key(), MONDAY)
    pieces = verified()
    rounds_only = [(p, t) for p, t in pieces if isinstance(p, ev.VerifyCompleted)]
    with pytest.raises(ApplyRefused, match="trial .* was never measured"):
        plan_apply(log(prepared, rounds_only, approval()), "s1", CANDIDATE.key(), MONDAY)
    # the trials were measured, but not at the published numbers
    doctored = [(forged if p == real else p, t) for p, t in pieces]
    with pytest.raises(ApplyRefused, match="does not match its measured trials .*published: speed-up 9.000"):
        plan_apply(log(prepared, doctored, approval()), "s1", CANDIDATE.key(), MONDAY)


# ------------------------------------------------------------------------------------------ the branch


def _diff(repo: str, a: str, b: str) -> str:
    return git(repo, "diff", "--no-color", "-U0", a, b).stdout


@pytest.mark.parametrize("as_git", [False, True], ids=["snapshot", "user-repo"])
def test_apply_writes_exactly_the_candidate_to_a_branch(tmp_path: Path, as_git: bool) -> None:
    prepared = study(tmp_path, as_git=as_git)
    repo = prepared.created.workload_dir
    head_before = git(repo, "rev-parse", "HEAD").stdout.strip()
    branch_before = git(repo, "symbolic-ref", "--short", "HEAD").stdout.strip()

    plan = plan_apply(log(prepared, verified(), approval()), "s1", CANDIDATE.key(), MONDAY)
    promoted = execute_apply(plan)

    assert promoted.branch == f"infrarsi/s1/{CANDIDATE.key()}"
    assert promoted.files_changed == ["launch/dense.yaml", "model.py"]
    assert promoted.launch_changes == {"knobs.micro_batch_size": 8}
    assert git(repo, "rev-parse", promoted.branch).stdout.strip() == promoted.commit
    # parent is the golden tag: one commit, nothing else
    assert git(repo, "rev-parse", f"{promoted.commit}^").stdout.strip() == prepared.created.baseline_ref
    # the model change is exactly the patch …
    assert git(repo, "show", f"{promoted.commit}:model.py").stdout == FUSED
    # … and the launch change is exactly one line, comment kept
    launch_diff = _diff(repo, "infrarsi/s1/golden", promoted.commit).split("diff --git a/model.py")[0]
    changed = [
        line for line in launch_diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changed == [
        "-  micro_batch_size: 4   # sequences per forward",
        "+  micro_batch_size: 8   # sequences per forward",
    ]
    # the evidence is in the commit message
    message = git(repo, "log", "-1", "--format=%B", promoted.commit).stdout
    assert "Speed-up 1.250x (CI 1.250-1.250)" in message and "Approved by: ml-lead:ana" in message
    assert message.startswith(f"infrarsi: candidate {CANDIDATE.key()}")
    assert (
        git(repo, "log", "-1", "--format=%an <%ae>", promoted.commit).stdout.strip()
        == "infrarsi <infrarsi@localhost>"
    )
    # the user's checkout is untouched and nothing was merged
    assert git(repo, "rev-parse", "HEAD").stdout.strip() == head_before
    assert git(repo, "symbolic-ref", "--short", "HEAD").stdout.strip() == branch_before
    assert git(repo, "status", "--porcelain").stdout == ""
    assert git(repo, "merge-base", "--is-ancestor", promoted.commit, "HEAD", check=False).returncode == 1
    assert git(repo, "worktree", "list", "--porcelain").stdout.count("worktree ") == 1
    # applying again is refused by git (the branch exists) even without the PatchPromoted event: a refusal
    # (BranchExists, which apply exits 3 for) that says what to do
    remedy = f"already exists in {repo}; review it, or delete it to apply again: git -C {repo} branch -D {promoted.branch}"
    with pytest.raises(BranchExists, match=re.escape(remedy)):
        execute_apply(plan)


def test_apply_uses_golden_patch_not_later_edits(tmp_path: Path) -> None:
    """The user edits the patch library on their branch after init: apply still uses what trials ran."""
    prepared = study(tmp_path, as_git=True)
    repo = Path(prepared.created.workload_dir)
    (repo / "patches" / "fused.patch").write_text(FUSED_PATCH.replace("line 5 (fused)", "line 5 (evil)"))
    git(repo, "commit", "-q", "-am", "later edit", commit=True)
    promoted = execute_apply(plan_apply(log(prepared, verified(), approval()), "s1", CANDIDATE.key(), MONDAY))
    assert git(repo, "show", f"{promoted.commit}:model.py").stdout == FUSED


def test_apply_rechecks_scope(tmp_path: Path) -> None:
    """A patch library entry that touches a locked file is refused at apply too, and leaves no branch."""
    prepared = study(tmp_path)
    repo = prepared.created.workload_dir
    plan = plan_apply(log(prepared, verified(), approval()), "s1", CANDIDATE.key(), MONDAY)
    evil = FUSED_PATCH.replace("model.py", "train.py")
    bad = type(plan)(**{**plan.__dict__, "patch_texts": {"fused": evil}})
    with pytest.raises(WorkspaceError, match="scope_violation: fused: train.py is not editable"):
        execute_apply(bad)
    assert git(repo, "branch", "--list", "infrarsi/*").stdout == ""


def test_evidence_text_mentions_everything(tmp_path: Path) -> None:
    prepared = study(tmp_path)
    text = evidence_text(plan_apply(log(prepared, verified(), approval()), "s1", CANDIDATE.key(), MONDAY))
    for needle in [
        "study s1 (apply-test)",
        "verification v1",
        "Step time 0.5000 s -> 0.4000 s",
        "Invariants: all held",
        "Action classes: code_patch, launch_keys",
        f"Trials: {', '.join(verified_study.final(verified()).trial_ids)}",
        prepared.created.baseline_ref,
    ]:
        assert needle in text


# ------------------------------------------------------------------------------------------ over a real bus


@pytest.mark.integration
async def test_init_approve_apply_over_nats(tmp_path: Path, capsys) -> None:
    import json

    from infrarsi.bus.client import Bus
    from infrarsi.bus.embedded import EmbeddedServer
    from infrarsi.commands import approve_apply, init

    make_workload(tmp_path / "wl", as_git=False)
    path = tmp_path / "contract.yaml"
    path.write_text(yaml.safe_dump(contract_dict(), sort_keys=False))
    with EmbeddedServer.start(tmp_path / "nats") as server:
        common = {"data_dir": tmp_path / "data", "nats_url": server.url, "json": True}
        assert await init.run(argparse.Namespace(contract=path, **common)) == 0
        out = json.loads(capsys.readouterr().out)
        study_id = out["study_id"]
        assert out["golden_tag"] == f"infrarsi/{study_id}/golden" and out["snapshot"] is True

        bus = await Bus.connect(server.url, service="test")
        try:
            for payload, trial_id in verified():
                await bus.publish(verified_study.owned_event(payload, study_id=study_id, trial_id=trial_id))
            args = argparse.Namespace(study=study_id, candidate=CANDIDATE.key()[:8], **common)
            assert await cli.invoke(partial(approve_apply.run_apply, now=MONDAY), args) == 3
            assert (
                "refused: code_patch: needs 1 approval(s) by role 'ml-lead', has 0" in capsys.readouterr().err
            )

            approve = argparse.Namespace(
                role="ml-lead", approver="ana", action_classes=[], note="", **vars(args)
            )
            assert await approve_apply.run_approve(approve) == 0
            capsys.readouterr()
            assert await approve_apply.run_apply(args, now=MONDAY) == 0
            promoted = json.loads(capsys.readouterr().out)
            assert promoted["branch"] == f"infrarsi/{study_id}/{CANDIDATE.key()}"
            # again: refused (3, as a policy refusal), naming the branch and what to do about it
            assert await cli.invoke(partial(approve_apply.run_apply, now=MONDAY), args) == 3
            err = capsys.readouterr().err
            assert f"already applied to {promoted['branch']}" in err
            assert f"branch -D {promoted['branch']}" in err

            events = await approve_apply.load_study_events(bus, study_id)
            assert [e.type for e in events if e.type != "TrialMeasured"] == [
                "StudyCreated",
                "VerifyCompleted",
                "VerifyCompleted",
                "ApprovalGranted",
                "PatchPromoted",
            ]
            assert events[0].cluster_id == "local-cpu"
            assert events[-1].payload.files_changed == ["launch/dense.yaml", "model.py"]
        finally:
            await bus.close()


def test_apply_of_an_argv_candidate_names_the_flags_in_the_commit(tmp_path: Path) -> None:
    """Knobs delivered as flags live in no file: the review commit carries them in its message."""
    make_workload(tmp_path / "wl", as_git=False)
    data = contract_dict()
    data["workload"].update(
        command=["{python}", "train.py", "--micro_batch_size", "4", "--compile", "0", "--steps", "30"],
        knobs_via="argv", steps_key="--steps",
    )  # fmt: skip
    del data["workload"]["launch_file"]
    data["scope"]["launch_keys"] = ["micro_batch_size", "compile"]
    data["search_space"] = {
        "knobs": {"micro_batch_size": {"type": "int", "choices": [2, 4, 8]}, "compile": {"type": "bool"}},
        "constraints": {"global_batch": {"size": 32, "micro_batch_key": "micro_batch_size"}},
    }
    path = tmp_path / "contract.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    prepared = prepare_study(path, tmp_path / "data", study_id="s1")
    candidate = ev.Candidate(knobs={"micro_batch_size": 8, "compile": False})
    plan = plan_apply(log(prepared, verified(candidate)), "s1", candidate.key(), MONDAY)
    assert plan.launch_changes == {"micro_batch_size": 8}  # compile is false in the golden command already
    promoted = execute_apply(plan)
    repo = prepared.created.workload_dir
    assert promoted.files_changed == []
    message = git(repo, "log", "-1", "--format=%B", promoted.commit).stdout
    assert "Launch changes (the command line or environment): micro_batch_size=8" in message
