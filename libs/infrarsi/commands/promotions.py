"""``infrarsi follow STUDY`` and ``infrarsi smoke STUDY``: promoted branches followed to the main line, and a short
run of the merged commit against the last verified numbers.

``follow`` looks up every ``PatchPromoted`` of the study in its repository (``infrarsi.verdicts.promotions.follow``: open,
merged by which commit, reverted, gone) and records ``PromotionFollowed`` for each branch whose state changed
since the last look; the report shows the last one. ``smoke`` takes the last merged promotion, checks its merge
commit out in a scratch worktree, runs the job as it is there (its launch file holds the promoted knobs) for a short
horizon with the probe writing to a file, and judges the median steady step against the step time of the
candidate's last promotable verification: passed when it is no slower than ``--tolerance`` over it, the job exited
0 and took every optimiser step. The verdict is recorded as ``SmokeCompleted``; a failed smoke exits 3.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.commands.study_log import OpenStudy, study_verb
from infrarsi.errors import EXIT_REFUSED, EXIT_USAGE, UserError
from infrarsi.runtime.settings import JobEnv
from infrarsi.trial import workspace
from infrarsi.verdicts import stats
from infrarsi.verdicts.promotions import Followed, FollowError, default_mainline, follow

SMOKE_TOLERANCE = 0.15
"""How much slower than the verified step a merged commit may run and still pass (``--tolerance``)."""
SMOKE_STEPS = 20
"""The smoke run's horizon when the contract's trial horizon is longer (``--steps``)."""


# ---------------------------------------------------------------------------------------------------- follow


def add_follow_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="study id")
    parser.add_argument("--mainline", default=None,
                        help="the branch a promoted change must reach (default: origin/HEAD's, else main, else master)")
    parser.add_argument("--json", action="store_true", help="one JSON object per promoted branch")


def last_followed(events: list[ev.Event]) -> dict[str, ev.PromotionFollowed]:
    """Branch → its last recorded ``PromotionFollowed``."""
    return {e.payload.branch: e.payload for e in events if isinstance(e.payload, ev.PromotionFollowed)}


async def _follow(bus: Bus, args: argparse.Namespace, study: OpenStudy) -> int:
    promoted = [e.payload for e in study.events if isinstance(e.payload, ev.PatchPromoted)]
    if not promoted:
        raise UserError(f"study {args.study} has no promoted branch (`infrarsi apply` writes one)", EXIT_USAGE)
    before = last_followed(study.events)
    for p in promoted:
        repo = Path(p.repo)
        try:
            mainline = args.mainline or default_mainline(repo)
            now = await asyncio.to_thread(follow, repo, p.branch, p.commit, mainline)
        except (FollowError, workspace.WorkspaceError) as exc:
            raise UserError(f"cannot follow {p.branch}: {exc}", EXIT_USAGE) from None
        recorded = ev.PromotionFollowed(
            candidate_key=p.candidate_key, branch=p.branch, commit=p.commit, mainline=now.mainline,
            mainline_head=now.mainline_head, state=now.state, merge_commit=now.merge_commit,
            revert_commit=now.revert_commit, detail=now.detail,
        )  # fmt: skip
        last = before.get(p.branch)
        if last is None or _changed(last, now):
            await bus.publish(ev.make_event(recorded, study_id=args.study, source="cli.follow",
                                            cluster_id=study.created.cluster.cluster_id))
        if args.json:
            print(msgspec.json.encode(recorded).decode())
        else:
            print(f"{p.branch}  {now.state}  {now.detail}")
        if now.state == "merged":
            print(f"`infrarsi smoke {args.study}` runs {now.merge_commit} against the verified numbers",
                  file=sys.stderr)
    return 0


def _changed(last: ev.PromotionFollowed, now: Followed) -> bool:
    return (last.state, last.merge_commit, last.revert_commit, last.mainline) != (
        now.state, now.merge_commit, now.revert_commit, now.mainline)


run_follow = study_verb("cli.follow", _follow)
"""``infrarsi follow STUDY``."""


# ---------------------------------------------------------------------------------------------------- smoke


def add_smoke_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="study id")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"optimiser steps (default: the contract's trial horizon, at most {SMOKE_STEPS})")
    parser.add_argument("--tolerance", type=float, default=SMOKE_TOLERANCE,
                        help="how much slower than the verified step it may run, as a fraction (default 0.15)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds the run may take")
    parser.add_argument("--json", action="store_true", help="print the SmokeCompleted as JSON")


async def _smoke(bus: Bus, args: argparse.Namespace, study: OpenStudy) -> int:
    if args.tolerance < 0 or (args.steps is not None and args.steps < 1):
        raise UserError("--tolerance must be ≥ 0 and --steps ≥ 1", EXIT_USAGE)
    merged = [f for f in last_followed(study.events).values() if f.state == "merged" and f.merge_commit]
    if not merged:
        raise UserError(f"study {args.study} has no merged promotion on record: `infrarsi follow {args.study}` "
                        "looks for one", EXIT_USAGE)
    followed = merged[-1]
    verified = [e.payload for e in study.events if isinstance(e.payload, ev.VerifyCompleted)
                and e.payload.promotable and e.payload.candidate_key == followed.candidate_key]
    if not verified:
        raise UserError(f"no promotable verification of {followed.candidate_key} in the log", EXIT_USAGE)
    promoted = next(e.payload for e in reversed(study.events) if isinstance(e.payload, ev.PatchPromoted)
                    and e.payload.branch == followed.branch)
    steps = args.steps or min(study.contract.workload.steps or SMOKE_STEPS, SMOKE_STEPS)
    assert followed.merge_commit is not None
    print(f"smoke: {followed.merge_commit[:12]} of {promoted.repo}, {steps} steps", file=sys.stderr)
    run = await asyncio.to_thread(smoke_run, study, promoted, followed.merge_commit, steps, args.timeout)
    payload = judge(run, followed, verified[-1], steps, args.tolerance)
    await bus.publish(ev.make_event(payload, study_id=args.study, source="cli.smoke",
                                    cluster_id=study.created.cluster.cluster_id))
    print(msgspec.json.encode(payload).decode() if args.json else payload.verdict)
    return 0 if payload.passed else EXIT_REFUSED


class SmokeRun(msgspec.Struct, frozen=True, kw_only=True):
    """What one smoke run left: exit code, wall time, and the probe's rank-0 steps."""

    exit_code: int | None
    wall_s: float
    steps: list[ev.TrialStep]
    output_tail: str


def smoke_run(study: OpenStudy, promoted: ev.PatchPromoted, commit: str, steps: int, timeout_s: float) -> SmokeRun:
    """The job at ``commit`` in a scratch worktree for ``steps`` steps, the probe writing its file (no bus)."""
    contract = study.contract
    with tempfile.TemporaryDirectory(prefix="infrarsi-smoke-") as scratch:
        root = Path(scratch)
        worktree = workspace.materialise(promoted.repo, commit, root / "worktree")
        try:
            at_merge = contract.model_copy(update={"workload": contract.workload.model_copy(update={"repo": worktree})})
            knobs = {} if contract.workload.launch_file is not None else dict(promoted.launch_changes)
            probe_dir = root / "probe"
            probe_dir.mkdir()
            launch = at_merge.trial_launch(knobs, steps, python=sys.executable, launch_file=str(root / "launch.yaml"),
                                           probe_dir=str(probe_dir))
            if launch.launch_file is not None:
                (root / "launch.yaml").write_text(json.dumps(launch.launch_file))  # YAML reads JSON
            job = JobEnv(study=study.created.name or "smoke", trial=f"smoke-{commit[:12]}", probe_dir=probe_dir)
            env = {k: v for k, v in os.environ.items() if not k.startswith("INFRARSI_")}
            env.update({**launch.env, **job.to_env()})
            started = time.monotonic()
            try:
                proc = subprocess.run(launch.argv, cwd=worktree, env=env, capture_output=True, text=True,
                                      timeout=timeout_s, stdin=subprocess.DEVNULL)
                code, output = proc.returncode, (proc.stdout + proc.stderr)[-4000:]
            except subprocess.TimeoutExpired as exc:
                code, output = None, f"timeout after {timeout_s:g}s: {str(exc.stdout or '')[-2000:]}"
            wall = time.monotonic() - started
            records = [r for path in [probe_dir / "probe-rank0.jsonl"] if path.exists()
                       for r in ev.decode_each(path.read_bytes().splitlines(), (ev.TrialStep,))]
            return SmokeRun(exit_code=code, wall_s=wall, output_tail=output,
                            steps=[r.payload for r in records if isinstance(r.payload, ev.TrialStep)])
        finally:
            workspace.remove(worktree)


def judge(run: SmokeRun, followed: ev.PromotionFollowed, verified: ev.VerifyCompleted, steps: int,
          tolerance: float) -> ev.SmokeCompleted:
    """The verdict of a smoke run against the candidate's verified step time."""
    times = [s.step_time_s for s in run.steps]
    warmup = stats.detect_warmup(times) if len(times) >= 3 else 0
    steady = times[warmup:] or times
    step_s = statistics.median(steady) if steady else None
    optimizer_steps = max((s.optimizer_steps for s in run.steps), default=0)
    limit = verified.candidate_step_s * (1.0 + tolerance)
    status: ev.TrialStatus = "ok" if run.exit_code == 0 else ("timeout" if run.exit_code is None else "crash")
    if status != "ok":
        verdict = f"FAIL: the job at {followed.merge_commit} ended {status} (exit {run.exit_code}): " \
                  f"{run.output_tail.strip().splitlines()[-1] if run.output_tail.strip() else ''}"
    elif step_s is None:
        verdict = "FAIL: the job reported no step (is the probe still in it?)"
    elif optimizer_steps != steps:
        verdict = f"FAIL: {optimizer_steps} optimiser steps taken of {steps}"
    elif step_s > limit:
        verdict = (f"FAIL: {step_s * 1e3:.2f} ms/step, slower than the verified {verified.candidate_step_s * 1e3:.2f} ms "
                   f"by more than {tolerance:.0%} (limit {limit * 1e3:.2f} ms)")
    else:
        verdict = (f"PASS: {step_s * 1e3:.2f} ms/step against the verified {verified.candidate_step_s * 1e3:.2f} ms "
                   f"(limit {limit * 1e3:.2f} ms, ×{verified.baseline_step_s / step_s:.2f} over the baseline's "
                   f"verified {verified.baseline_step_s * 1e3:.2f} ms), {optimizer_steps} steps")
    losses = [s.loss for s in run.steps if s.loss is not None]
    return ev.SmokeCompleted(
        candidate_key=followed.candidate_key, commit=followed.merge_commit or "", passed=verdict.startswith("PASS"),
        verdict=verdict, steps=len(run.steps), step_time_s=step_s, verified_step_s=verified.candidate_step_s,
        tolerance=tolerance, status=status, exit_code=run.exit_code, loss_final=losses[-1] if losses else None,
        accelerator_s=run.wall_s * max(1, study_ranks(run)),
    )  # fmt: skip


def study_ranks(run: SmokeRun) -> int:
    return max((s.world_size for s in run.steps), default=1)


run_smoke = study_verb("cli.smoke", _smoke)
"""``infrarsi smoke STUDY``."""
