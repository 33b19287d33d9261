"""Promoted branches followed to the main line (issue 36, item 4), on real git repositories: open, merged by a
merge commit, fast-forwarded, squashed, reverted, gone (``infrarsi.verdicts.promotions.follow``); then ``infrarsi follow``
recording ``PromotionFollowed`` on a real nats-server only when the state changes, and ``infrarsi smoke`` running
the merged commit of a real PyTorch job (``support.slowed_workload``) against the verified numbers, its verdict a
``SmokeCompleted``."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest
import yaml
from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.cli import invoke
from infrarsi.commands import promotions as promotions_cmd
from infrarsi.commands.init import prepare_study, study_created_event
from infrarsi.commands.study_log import read_study
from infrarsi.errors import EXIT_REFUSED, EXIT_USAGE
from infrarsi.verdicts.promotions import follow
from support import verified_study
from support.slowed_workload import make_slowed_workload

pytestmark = pytest.mark.integration


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def repo_with_main(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "train.py").write_text("".join(f"line {i}\n" for i in range(20)))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "golden")
    return repo


def promote(repo: Path, branch: str, old: str, new: str) -> str:
    """A one-commit branch off main, as ``apply`` writes it."""
    git(repo, "checkout", "-q", "-b", branch, "main")
    path = repo / "train.py"
    path.write_text(path.read_text().replace(old, new))
    git(repo, "commit", "-qam", f"infrarsi: {branch}")
    git(repo, "checkout", "-q", "main")
    return git(repo, "rev-parse", branch)


def on_main(repo: Path, message: str, old: str, new: str) -> str:
    path = repo / "train.py"
    path.write_text(path.read_text().replace(old, new))
    git(repo, "commit", "-qam", message)
    return git(repo, "rev-parse", "HEAD")


def test_follow_tells_open_merged_fast_forwarded_squashed_reverted_and_gone(tmp_path: Path) -> None:
    repo = repo_with_main(tmp_path)
    a = promote(repo, "infrarsi/s/a", "line 3\n", "line 3 fused\n")
    assert follow(repo, "infrarsi/s/a", a, "main").state == "open"

    on_main(repo, "unrelated work", "line 19\n", "line 19 docs\n")  # main moved on: a true merge, not a ff
    git(repo, "merge", "-q", "--no-ff", "-m", "Merge infrarsi/s/a", "infrarsi/s/a")
    merge = git(repo, "rev-parse", "HEAD")
    on_main(repo, "later work", "line 18\n", "line 18 more\n")
    merged = follow(repo, "infrarsi/s/a", a, "main")
    assert (merged.state, merged.merge_commit) == ("merged", merge)

    git(repo, "revert", "--no-edit", "-m", "1", merge)
    revert = git(repo, "rev-parse", "HEAD")
    reverted = follow(repo, "infrarsi/s/a", a, "main")
    assert (reverted.state, reverted.merge_commit, reverted.revert_commit) == ("reverted", merge, revert)

    b = promote(repo, "infrarsi/s/b", "line 5\n", "line 5 sdpa\n")
    git(repo, "merge", "-q", "--ff-only", "infrarsi/s/b")
    assert follow(repo, "infrarsi/s/b", b, "main").merge_commit == b  # fast-forwarded: the commit itself

    c = promote(repo, "infrarsi/s/c", "line 7\n", "line 7 compiled\n")
    on_main(repo, "more unrelated work", "line 17\n", "line 17 x\n")
    git(repo, "merge", "-q", "--squash", "infrarsi/s/c")
    git(repo, "commit", "-qm", "squashed c")
    squash = git(repo, "rev-parse", "HEAD")
    squashed = follow(repo, "infrarsi/s/c", c, "main")
    assert (squashed.state, squashed.merge_commit) == ("merged", squash)
    on_main(repo, "undo c by hand", "line 7 compiled\n", "line 7\n")  # a revert without git revert's message
    assert follow(repo, "infrarsi/s/c", c, "main").state == "reverted"

    d = promote(repo, "infrarsi/s/d", "line 9\n", "line 9 gone\n")
    git(repo, "branch", "-D", "infrarsi/s/d")
    git(repo, "reflog", "expire", "--expire=now", "--all")
    git(repo, "gc", "-q", "--prune=now")
    assert follow(repo, "infrarsi/s/d", d, "main").state == "gone"


def args_for(url: str, data_dir: Path, **fields) -> argparse.Namespace:
    return argparse.Namespace(nats_url=url, data_dir=data_dir, **fields)


async def of_type(bus: Bus, study: str, event_type: type) -> list:
    events, _ = await read_study(bus, study)
    return [e.payload for e in events if isinstance(e.payload, event_type)]


async def test_follow_records_changes_and_smoke_runs_the_merged_commit(tmp_path: Path, capsys, nats_server: str,
                                                                      bus: Bus) -> None:
    contract = make_slowed_workload(tmp_path, bf16_factor=1.0, steps=12, step_s=0.1)
    repo = tmp_path / "workload"
    prepared = prepare_study(contract, tmp_path / "data")
    study = prepared.study_id
    await bus.publish(study_created_event(prepared))
    candidate = ev.Candidate(knobs={"knobs.dataloader_workers": 2})  # 0.8 × the 0.1 s step
    for payload, trial in verified_study.verification(candidate, baseline_s=0.1, candidate_s=0.08, verify_id="v1"):
        await bus.publish(verified_study.owned_event(payload, study_id=study, trial_id=trial))

    branch = f"infrarsi/{study}/{candidate.key()}"  # as apply writes it: the launch file changed, one commit
    main = git(repo, "rev-parse", "--abbrev-ref", "HEAD")
    git(repo, "checkout", "-q", "-b", branch)
    launch = yaml.safe_load((repo / "launch.yaml").read_text())
    launch["knobs"]["dataloader_workers"] = 2
    (repo / "launch.yaml").write_text(yaml.safe_dump(launch))
    git(repo, "commit", "-qam", "infrarsi: dataloader_workers 2")
    commit = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", main)
    await bus.publish(verified_study.owned_event(ev.PatchPromoted(
        candidate_key=candidate.key(), repo=str(repo), branch=branch, commit=commit, files_changed=["launch.yaml"],
        launch_changes={"knobs.dataloader_workers": 2}), study_id=study))

    follow_args = args_for(nats_server, tmp_path / "data", study=study, mainline=None, json=False)
    smoke_args = args_for(nats_server, tmp_path / "data", study=study, steps=None, tolerance=1.0, timeout=300.0,
                          json=False)
    assert await invoke(promotions_cmd.run_smoke, smoke_args) == EXIT_USAGE  # nothing merged on record
    assert "`infrarsi follow" in capsys.readouterr().err

    assert await invoke(promotions_cmd.run_follow, follow_args) == 0
    assert [f.state for f in await of_type(bus, study, ev.PromotionFollowed)] == ["open"]

    git(repo, "merge", "-q", "--no-ff", "-m", "merge the promoted launch change", branch)
    merge = git(repo, "rev-parse", "HEAD")
    assert await invoke(promotions_cmd.run_follow, follow_args) == 0
    assert await invoke(promotions_cmd.run_follow, follow_args) == 0  # nothing changed: nothing recorded
    followed = await of_type(bus, study, ev.PromotionFollowed)
    assert [(f.state, f.merge_commit) for f in followed] == [("open", None), ("merged", merge)]
    assert f"{branch}  merged  merged by {merge[:12]}" in capsys.readouterr().out

    assert await invoke(promotions_cmd.run_smoke, smoke_args) == 0
    [smoke] = await of_type(bus, study, ev.SmokeCompleted)
    assert smoke.passed and smoke.commit == merge and smoke.status == "ok" and smoke.steps == 12
    assert smoke.verified_step_s == pytest.approx(0.08)
    assert smoke.step_time_s is not None and 0.07 < smoke.step_time_s < 0.16  # the merged launch file ran
    assert smoke.verdict.startswith("PASS")

    tight = args_for(nats_server, tmp_path / "data", study=study, steps=6, tolerance=0.0, timeout=300.0, json=False)
    for payload, trial in verified_study.verification(candidate, baseline_s=0.1, candidate_s=0.02, verify_id="v2"):
        await bus.publish(verified_study.owned_event(payload, study_id=study, trial_id=trial))
    assert await invoke(promotions_cmd.run_smoke, tight) == EXIT_REFUSED  # now 4× slower than "verified"
    failed = (await of_type(bus, study, ev.SmokeCompleted))[-1]
    assert not failed.passed and failed.verdict.startswith("FAIL") and "slower than the verified 20.00 ms" in failed.verdict

    git(repo, "revert", "--no-edit", "-m", "1", merge)
    assert await invoke(promotions_cmd.run_follow, follow_args) == 0
    assert (await of_type(bus, study, ev.PromotionFollowed))[-1].state == "reverted"
