"""``infrarsi demo``: the five stages end to end on a reference workload, on the embedded default.

What a new user runs first (``make demo``). It starts the embedded stack (nats-server with JetStream and the
six services, under ``--data-dir``) unless one is already running, then runs the stages exactly as a user
would type them — ``init`` → ``doctor`` → ``run`` (search, then the proposer's VerifyRequested and the
verifier's interleaved rounds) → ``report`` — each through its own command module, and prints the verified
speed-up, MFU before/after and where the report is. It owns no logic of its own beyond that sequence.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from types import ModuleType
from typing import Any, NotRequired, TypedDict

from infrarsi import events as ev
from infrarsi.commands import data_dir_of, nats_url_of
from infrarsi.commands import doctor as doctor_cmd
from infrarsi.commands import report as report_cmd
from infrarsi.commands import run as run_cmd
from infrarsi.commands.init import prepare_study, publish_study
from infrarsi.commands.study_log import read_study
from infrarsi.errors import EXIT_OK, EXIT_REFUSED, UserError

DEFAULT_CONTRACT = Path("workloads/gpt/contracts/dense-1node-carried.yaml")
"""The reference job as carried over from a smaller accelerator (micro-batch 2, full recomputation): headroom on
every CPU, with or without bf16 units (README, "The demo")."""
HACKS_CONTRACT = Path("workloads/gpt/contracts/dense-1node.yaml")
"""The reference contract whose search space holds the patch library's planted reward hacks."""
HACK_STEPS = 12
"""Horizon of the reward-hack stage: two evals (steps 10 and 12), enough for every hack to show."""
SOURCE = "cli.demo"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--contract", type=Path, default=DEFAULT_CONTRACT, help=f"contract (default {DEFAULT_CONTRACT})")
    parser.add_argument(
        "--backend", choices=("local", "slurm"), default=None,
        help="run every trial on this backend instead of the contract's (slurm: the cluster SLURM_CONF names; "
        "`make slurm-up` starts one on this machine)",
    )  # fmt: skip
    parser.add_argument("--trials", type=int, default=10, help="search trials (default 10; capped by the contract)")
    parser.add_argument("--out", type=Path, default=None, help="report directory (default <data-dir>/reports/<study>)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary at the end")
    parser.add_argument("--keep-running", action="store_true", help="leave the embedded stack running afterwards")
    parser.add_argument(
        "--skip-hacks", action="store_true",
        help=f"skip the reward-hack stage (each planted hack of {HACKS_CONTRACT} run once, caught by name)",
    )  # fmt: skip


def with_backend(contract: Path, kind: str, data_dir: Path) -> Path:
    """A copy of ``contract`` (its repo made absolute) whose trials run on backend ``kind``, under ``data_dir``."""
    import shutil
    import subprocess

    import yaml

    if kind == "slurm":
        if shutil.which("sinfo") is None:
            raise UserError("--backend slurm: the Slurm client (sinfo, sbatch) is not installed (make slurm-deps)")
        try:
            probe = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
            problem = probe.stderr.strip()[:200] if probe.returncode != 0 else None
        except subprocess.TimeoutExpired:
            problem = "sinfo did not answer within 10 s"
        if problem is not None:
            raise UserError(
                "--backend slurm: no Slurm cluster answers (start one with `make slurm-up` and "
                f"`export SLURM_CONF=/run/infrarsi-slurm/slurm.conf`): {problem}"
            )
    data = yaml.safe_load(contract.read_text())
    data["workload"]["repo"] = str((contract.parent / data["workload"]["repo"]).resolve())
    data["backend"] = {"kind": kind, "timeout_s": data.get("backend", {}).get("timeout_s", 600)}
    out = data_dir / f"demo-{contract.stem}-{kind}.yaml"
    data_dir.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _stage(name: str, started: float) -> None:
    print(f"\n== {name}  (t+{time.monotonic() - started:.0f}s)", flush=True)


def _stage_args(module: ModuleType, argv: list[str], url: str, data_dir: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"infrarsi {module.__name__.rsplit('.', 1)[-1]}")
    module.add_arguments(parser)
    args = parser.parse_args(argv)
    args.nats_url = url
    args.data_dir = data_dir
    return args


class HackVerdict(TypedDict):
    """One planted reward hack as the demo's hack stage ran it."""

    patch: str
    status: str
    caught_by: list[str]
    """The invariants that failed (empty: not caught — the demo then fails)."""
    trial_id: str


def hack_ids(contract: Path) -> list[str]:
    """The patches of ``contract``'s search space that its patch library marks ``kind: reward_hack``."""
    from infrarsi.study.contract import load_contract, load_patch_library

    c = load_contract(contract)
    library = load_patch_library(contract.parent / c.workload.repo / c.workload.patch_dir)
    return [p for p in c.search_space.patches if p in library and library[p].kind == "reward_hack"]


async def hack_stage(url: str, data_dir: Path, contract: Path = HACKS_CONTRACT) -> list[HackVerdict]:
    """Each planted reward hack run once as a trial of ``contract``'s own study (outside the search and its
    budget), against the untouched baseline at the same horizon, as ``infrarsi trial`` runs a candidate."""
    from infrarsi.bus.client import Bus
    from infrarsi.commands import trial as trial_cmd
    from infrarsi.study.contract import load_contract

    loaded = load_contract(contract)
    verdicts: list[HackVerdict] = []
    bus = await Bus.connect(url, service=SOURCE, data_dir=data_dir)
    try:
        for patch in hack_ids(contract):
            args = _stage_args(trial_cmd, [str(contract), "--patch", patch, "--steps", str(HACK_STEPS),
                                           "--peak-budget", "2"], url, data_dir)
            report = await trial_cmd._trial(bus, args, loaded, {}, data_dir)
            run = report["candidate"][0]
            measured = run["measured"]
            caught = [i["name"] for i in measured["invariants"] if not i["ok"]]
            verdicts.append({"patch": patch, "status": measured["status"], "caught_by": caught,
                             "trial_id": run["trial_id"]})
            print(f"  {patch}: {measured['status']}, caught by {', '.join(caught) or 'NOTHING'}", flush=True)
    finally:
        await bus.close()
    return verdicts


class DemoSummary(TypedDict):
    """What ``infrarsi demo`` prints at the end (``--json``: as is)."""

    baseline_step_s: float | None
    min_detectable_speedup: float | None
    verified: bool
    speedup: float | None
    speedup_ci: list[float] | None
    mfu_before: float | None
    mfu_after: float | None
    winner: dict[str, Any] | None
    failed_invariants: list[str]
    invariants: list[dict[str, Any]]
    unchecked_invariants: list[str]
    failed_trials: dict[str, int]
    accelerator_s: float
    finished: str | None
    report: str
    hacks: NotRequired[list[HackVerdict]]
    """The reward-hack stage: each planted hack and the invariants that caught it."""
    study_id: NotRequired[str]
    """Added by ``run`` (as is ``wall_s``, the demo's seconds)."""
    wall_s: NotRequired[float]


def summarise(events: list[ev.Event], report_dir: Path) -> DemoSummary:
    """The demo's closing facts, all read from the study's log."""
    verdicts = [e.payload for e in events if isinstance(e.payload, ev.VerifyCompleted)]
    promotable = [v for v in verdicts if v.promotable]
    best = max(promotable or verdicts, key=lambda v: v.ci_low, default=None)
    doctor = next((e.payload for e in events if isinstance(e.payload, ev.DoctorCompleted)), None)
    finished = next((e.payload for e in reversed(events) if isinstance(e.payload, ev.StudyFinished)), None)
    failures: dict[str, int] = {}
    spent = 0.0
    for e in events:
        if isinstance(e.payload, ev.TrialFinished):
            spent += e.payload.accelerator_s
            if e.payload.status != "ok":
                failures[e.payload.status] = failures.get(e.payload.status, 0) + 1
    return {
        "baseline_step_s": doctor.step_time_s if doctor else None,
        "min_detectable_speedup": doctor.min_detectable_speedup if doctor else None,
        "verified": bool(promotable),
        "speedup": best.speedup if best else None,
        "speedup_ci": [best.ci_low, best.ci_high] if best else None,
        "mfu_before": best.mfu_before if best else None,
        "mfu_after": best.mfu_after if best else None,
        "winner": {"knobs": best.candidate.knobs, "patches": best.candidate.patches} if best else None,
        "failed_invariants": sorted({i for v in verdicts for i in v.failed_invariants}),
        "invariants": [{"name": i.name, "ok": i.ok, "detail": i.detail} for i in best.invariants] if best else [],
        "unchecked_invariants": list(best.unchecked_invariants) if best else [],
        "failed_trials": failures,
        "accelerator_s": round(spent, 1),
        "finished": finished.reason if finished else None,
        "report": str(report_dir / "report.html"),
    }


def _print_summary(summary: DemoSummary) -> None:
    def pct(x: object) -> str:
        return f"{100 * x:.2f}%" if isinstance(x, float) else "n/a"

    print("\n== result")
    ci = summary["speedup_ci"]  # None exactly when the speed-up is: no verdict
    if summary["speedup"] is None or ci is None:
        print("no candidate reached verification")
    else:
        lo, hi = ci
        state = "verified (promotable)" if summary["verified"] else "NOT verified"
        print(f"speed-up over the golden baseline: {summary['speedup']:.2f}x  95% CI [{lo:.2f}, {hi:.2f}]  {state}")
        print(f"winner: {json.dumps(summary['winner'])}")
        print(f"MFU: {pct(summary['mfu_before'])} -> {pct(summary['mfu_after'])}")
    print(f"trials that failed (kept as data): {summary['failed_trials'] or 'none'}; "
          f"accelerator-seconds spent: {summary['accelerator_s']}")
    print(f"report: {summary['report']}")


async def run(args: argparse.Namespace) -> int:
    from infrarsi.bus.client import Bus
    from infrarsi.runtime.stack import ensure_stack_for_verb

    data_dir = data_dir_of(args)
    if not args.contract.exists():
        raise UserError(f"{args.contract}: no such contract (run from the repository root, or pass --contract)")
    contract = args.contract
    if getattr(args, "backend", None):
        contract = with_backend(args.contract, args.backend, data_dir)
    started = time.monotonic()
    print(f"InfraRSI demo on {contract} (data under {data_dir})", flush=True)
    url, stack = await ensure_stack_for_verb(nats_url_of(args), data_dir)
    print(f"bus: {url} ({'embedded stack started' if stack else 'existing server'})", flush=True)
    try:
        _stage("init: lock the contract", started)
        prepared = prepare_study(contract, data_dir)
        study = prepared.study_id
        bus = await Bus.connect(url, service=SOURCE, data_dir=data_dir)
        try:
            await publish_study(bus, prepared)
        finally:
            await bus.close()
        print(f"study {study}: {len(prepared.created.locked_files)} locked files hashed, "
              f"golden baseline tagged {prepared.workspace.tag}")

        _stage("doctor: baseline phases and noise floor", started)
        rc = await doctor_cmd.run(_stage_args(doctor_cmd, [study], url, data_dir))
        if rc:
            return rc

        _stage(f"run: search {args.trials} trials, then verify the best against the baseline", started)
        rc = await run_cmd.run(_stage_args(run_cmd, [study, "--trials", str(args.trials), "--until", "finished"],
                                           url, data_dir))
        if rc:
            return rc

        hacks: list[HackVerdict] = []
        if not args.skip_hacks:
            _stage(f"reward hacks: each planted hack of {HACKS_CONTRACT.name} run once ({HACK_STEPS} steps), "
                   "outside the search's budget", started)
            hacks_contract = HACKS_CONTRACT
            if getattr(args, "backend", None):
                hacks_contract = with_backend(HACKS_CONTRACT, args.backend, data_dir)
            hacks = await hack_stage(url, data_dir, hacks_contract)

        _stage("report", started)
        out = args.out or data_dir / "reports" / study
        rc = await report_cmd.run(_stage_args(report_cmd, [study, "--out", str(out)], url, data_dir))
        if rc:
            return rc

        bus = await Bus.connect(url, service=SOURCE, ensure=False, data_dir=data_dir)
        try:
            events, _ = await read_study(bus, study)
        finally:
            await bus.close()
        summary = summarise(events, out.resolve())
        summary["study_id"] = study
        summary["hacks"] = hacks
        summary["wall_s"] = round(time.monotonic() - started, 1)
        if args.json:
            print(json.dumps(summary, indent=2))
        else:
            _print_summary(summary)
            print(f"demo took {summary['wall_s']:.0f}s")
        uncaught = [h["patch"] for h in hacks if not h["caught_by"]]
        if uncaught:
            print(f"reward hacks NOT caught: {', '.join(uncaught)}")
        return EXIT_OK if summary["verified"] and not uncaught else EXIT_REFUSED
    finally:
        if stack is not None and not args.keep_running:
            await asyncio.to_thread(stack.stop)
