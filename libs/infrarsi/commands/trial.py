"""``infrarsi trial CONTRACT [--set KEY=VALUE]… [--patch ID]… [--repeats N] [--steps N] [--json]``.

Runs one candidate through the bus, as the search would: finds (or creates) the study of the contract,
runs the untouched baseline first if the study has none at this horizon (the invariants need it), then
the candidate ``--repeats`` times, and prints each ``TrialMeasured`` (with the launcher's
``TrialFinished``). Starts a stack (NATS + launcher + telemetry) for its own duration when none is running.
While it works it says so on stderr (``Progress``): the study, the host's peak measurement (only the dtypes
the CPU runs natively, within ``--peak-budget`` seconds), each trial's launch, its steps as they come (a
line redrawn in place on a terminal, plain lines otherwise), its end and its measurement.

Exit status: 0 every candidate run ended ``ok`` with every invariant holding; 3 a run did not (refused,
crashed, OOM, timeout, invariant violation — the output says which and why); 1 the command itself failed;
2 bad arguments or contract.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import msgspec
from nats.aio.msg import Msg

from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.bus.subjects import LIFECYCLE_STREAM, lifecycle_subject, telemetry_subject
from infrarsi.commands import UserError, data_dir_of, nats_url_of
from infrarsi.errors import EXIT_OK, EXIT_REFUSED, EXIT_TIMEOUT
from infrarsi.study import userfiles
from infrarsi.study.contract import Contract, load_contract
from infrarsi.trial.workspace import discard_workspace
from infrarsi.verdicts.doctor import measure_cpu_peak, native_matmul_dtypes

SOURCE = "cli.trial"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("contract", type=Path, help="the contract YAML")
    parser.add_argument(
        "--set", dest="knobs", action="append", default=[], metavar="KEY=VALUE",
        help="launch key of the candidate (value parsed as YAML), e.g. knobs.micro_batch_size=8",
    )  # fmt: skip
    parser.add_argument("--patch", dest="patches", action="append", default=[], metavar="ID", help="patch id, in order")
    parser.add_argument("--repeats", type=int, default=1, help="runs of the candidate (default 1)")
    parser.add_argument("--steps", type=int, default=None, help="horizon override (default: the contract's)")
    parser.add_argument(
        "--no-baseline", action="store_true",
        help="do not run a missing baseline first (the loss invariant is then not checked)",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait for each trial's measurement")
    parser.add_argument(
        "--peak-budget", type=float, default=20.0, metavar="S",
        help="at most this many seconds measuring a CPU host's matmul peak for a new study (default 20)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def parse_knobs(items: list[str]) -> dict[str, ev.KnobValue]:
    knobs: dict[str, ev.KnobValue] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r} is not KEY=VALUE")
        value = userfiles.parse_yaml(raw, source=f"--set {item!r}", what="the value")
        if not isinstance(value, bool | int | float | str):
            raise ValueError(f"--set {item!r}: value must be a scalar, got {type(value).__name__}")
        knobs[key.strip()] = value
    return knobs


async def run(args: argparse.Namespace) -> int:
    data_dir = data_dir_of(args).absolute()
    contract = load_contract(args.contract)  # ContractError: EXIT_USAGE
    try:
        knobs = parse_knobs(args.knobs)
        if contract.workload.knobs_via == "argv":  # a flag may be named as written: --set=--bf16=true
            knobs = {key.removeprefix("--"): value for key, value in knobs.items()}
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.repeats < 1 or (args.steps is not None and args.steps < 1):
        raise UserError("--repeats and --steps must be positive")

    from infrarsi.bus.client import Bus
    from infrarsi.runtime.stack import ensure_stack_for_verb

    url, stack = await ensure_stack_for_verb(nats_url_of(args), data_dir, services=("launcher", "telemetry"))
    try:
        bus = await Bus.connect(url, service=SOURCE, data_dir=data_dir)
        try:
            report = await _trial(bus, args, contract, knobs, data_dir)
        finally:
            await bus.close()
    except TimeoutError as exc:
        raise UserError(f"the trial did not finish in time {exc}".rstrip(), EXIT_TIMEOUT) from None
    finally:
        if stack is not None:
            await asyncio.to_thread(stack.stop)
    if args.json:
        print(json.dumps(report))
    else:
        _print_human(report)
    candidate_runs = report["candidate"]
    passed = all(r["measured"] and r["measured"]["status"] == "ok" and r["measured"]["invariants_ok"] for r in candidate_runs)
    return EXIT_OK if passed else EXIT_REFUSED


# --------------------------------------------------------------------------------------------------


class Progress:
    """What ``infrarsi trial`` is doing, on stderr: each phase as a line, and the steps of the running trial as
    they come — redrawn in place on a terminal, as plain lines otherwise (at most one a second, plus the
    first and the last)."""

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None, min_interval_s: float = 1.0) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.min_interval_s = min_interval_s
        self._open_line = False
        self._last_step_at = -math.inf

    def phase(self, text: str) -> None:
        self._end_line()
        self._write(f"[trial] {text}\n")

    def step(self, label: str, step: ev.TrialStep, horizon: int) -> None:
        done = step.step + 1
        now = time.monotonic()
        text = f"[trial] {label}: step {done}/{horizon}  {step.step_time_s * 1000:.0f} ms" + (
            f"  loss {step.loss:.4g}" if step.loss is not None else "")  # fmt: skip
        if self.tty:
            self._write(f"\r{text}\033[K")
            self._open_line = True
        elif done in (1, horizon) or now - self._last_step_at >= self.min_interval_s:
            self._write(text + "\n")
            self._last_step_at = now

    def close(self) -> None:
        self._end_line()

    def _end_line(self) -> None:
        if self._open_line:
            self._write("\n")
            self._open_line = False

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


async def _trial(bus: Bus, args: argparse.Namespace, contract: Contract, knobs: dict[str, ev.KnobValue], data_dir: Path) -> dict[str, Any]:
    progress = Progress()
    try:
        return await _trial_with(bus, args, contract, knobs, data_dir, progress)
    finally:
        progress.close()


async def _trial_with(
    bus: Bus, args: argparse.Namespace, contract: Contract, knobs: dict[str, ev.KnobValue], data_dir: Path,
    progress: Progress,
) -> dict[str, Any]:
    study_id, created_now, peak = await _study(bus, args.contract, contract, data_dir, progress, args.peak_budget)
    horizon = args.steps or contract.workload.steps
    timeout = args.timeout or (contract.backend.timeout_s * 1.5 + 120.0)
    report: dict[str, Any] = {"study_id": study_id, "study_created": created_now, "steps": horizon, "peak_flops": peak}
    baseline_id = await _baseline_at(bus, study_id, horizon)
    if baseline_id is None and args.no_baseline:
        report["baseline"] = {"trial_id": None, "skipped": True}
    elif baseline_id is None:
        baseline = ev.Candidate()
        proposal = ev.TrialProposed(
            candidate=baseline, candidate_key=baseline.key(), kind="baseline", origin="baseline",
            reason="infrarsi trial: the study has no baseline at this horizon", steps=args.steps,
        )  # fmt: skip
        progress.phase(f"baseline: the study has none at {horizon} steps; running the untouched job first")
        report["baseline"] = await _run_one(bus, study_id, contract, proposal, timeout, progress, "baseline", horizon)
    else:
        progress.phase(f"baseline: reusing trial {baseline_id}")
        report["baseline"] = {"trial_id": baseline_id, "reused": True}
    candidate = ev.Candidate(knobs=knobs, patches=list(args.patches))
    report["candidate"] = []
    for repeat in range(args.repeats):
        proposal = ev.TrialProposed(
            candidate=candidate, candidate_key=candidate.key(), kind="search", origin="manual",
            reason="infrarsi trial", repeat=repeat, steps=args.steps,
        )  # fmt: skip
        label = f"candidate {repeat + 1}/{args.repeats}"
        report["candidate"].append(await _run_one(bus, study_id, contract, proposal, timeout, progress, label, horizon))
    return report


async def _run_one(
    bus: Bus, study_id: str, contract: Contract, proposal: ev.TrialProposed, timeout_s: float, progress: Progress,
    label: str, horizon: int,
) -> dict[str, Any]:
    trial_id = ev.new_id()
    got: dict[str, ev.Payload] = {}
    done = asyncio.Event()
    shown_steps: set[int] = set()

    async def on_msg(msg: Msg) -> None:
        event = ev.decode_or_none(msg.data)
        if event is None or event.trial_id != trial_id:
            return
        match event.payload:
            case ev.TrialStep(rank=0, step=step) as sample if step not in shown_steps:
                shown_steps.add(step)  # the probe's publish and the launcher's relay may both arrive
                progress.step(label, sample, horizon)
            case ev.TrialStep():
                pass
            case ev.TrialLaunched(backend=backend, ranks=ranks):
                got[event.type] = event.payload
                progress.phase(f"{label}: running trial {trial_id} ({backend}, {ranks} rank(s), {horizon} steps)")
            case ev.TrialFinished(status=status, wall_s=wall, reason=reason):
                got[event.type] = event.payload
                progress.phase(f"{label}: finished {status} after {wall:.1f} s" + (f" ({reason[:120]})" if reason else "")
                               + "; measuring")  # fmt: skip
            case ev.TrialMeasured(status=status, step_time_s=step_s, coarse=coarse):
                got[event.type] = event.payload
                progress.phase(f"{label}: measured {status}, {step_s * 1000:.1f} ms/step" + (" (coarse)" if coarse else ""))
                done.set()

    subs = [
        await bus.nc.subscribe(lifecycle_subject(study_id, name), cb=on_msg)
        for name in ("TrialLaunched", "TrialFinished", "TrialMeasured")
    ]
    subs.append(await bus.nc.subscribe(telemetry_subject(study_id, trial_id), cb=on_msg))
    started = time.monotonic()
    try:
        await bus.publish(
            ev.make_event(proposal, study_id=study_id, trial_id=trial_id, source=SOURCE, cluster_id=contract.cluster.id)
        )
        await asyncio.wait_for(done.wait(), timeout_s)
    finally:
        for sub in subs:
            await sub.unsubscribe()
    return {
        "trial_id": trial_id,
        "kind": proposal.kind,
        "candidate": msgspec.to_builtins(proposal.candidate),
        "elapsed_s": time.monotonic() - started,
        "finished": msgspec.to_builtins(got["TrialFinished"]) if "TrialFinished" in got else None,
        "measured": msgspec.to_builtins(got["TrialMeasured"]),
    }


async def _study(
    bus: Bus, contract_path: Path, contract: Contract, data_dir: Path, progress: Progress, peak_budget_s: float
) -> tuple[str, bool, float | None]:
    """The latest study of this exact contract, or a new one (with a measured peak on CPU hosts)."""
    sha = contract.sha256()
    found: tuple[str, float | None] | None = None
    async for event in bus.events(LIFECYCLE_STREAM, lifecycle_subject("*", "StudyCreated")):
        if isinstance(event.payload, ev.StudyCreated) and event.payload.contract_sha256 == sha:
            found = (event.study_id, event.payload.cluster.peak_flops)
    if found is not None:
        progress.phase(f"study: reusing {found[0]} (same contract)")
        return found[0], False, found[1]

    from infrarsi.commands.init import prepare_study, publish_study

    progress.phase(f"study: locking the contract and the golden baseline of {contract.workload.repo}")
    prepared = await asyncio.to_thread(prepare_study, contract_path, data_dir)
    created = prepared.created
    peak = created.cluster.peak_flops
    if peak is None and created.cluster.accelerator.lower() == "cpu":
        ranks = contract.workload.launcher.nnodes * contract.workload.launcher.nproc_per_node
        native, _left_out = native_matmul_dtypes()
        progress.phase(f"host: measuring the matmul peak in {', '.join(native)} (the dtypes this CPU runs natively), "
                       f"at most {peak_budget_s:g} s")  # fmt: skip
        try:
            measured = await asyncio.to_thread(measure_cpu_peak, os.cpu_count() or 1, budget_s=peak_budget_s)
        except BaseException:
            discard_workspace(prepared.workspace)
            raise
        progress.phase(f"host: peak {measured.describe()} (took {measured.seconds:.1f} s; per rank ÷{ranks})")
        peak = measured.flops / ranks
        created = msgspec.structs.replace(created, cluster=msgspec.structs.replace(created.cluster, peak_flops=peak))
    await publish_study(bus, prepared, created)
    return prepared.study_id, True, peak


async def _baseline_at(bus: Bus, study_id: str, horizon: int) -> str | None:
    """A trial of the study that measured ``ok`` as a baseline at this horizon, if any."""
    proposed_steps: dict[str, int | None] = {}
    async for event in bus.events(LIFECYCLE_STREAM, lifecycle_subject(study_id, "*")):
        match event.payload:
            case ev.TrialProposed(kind="baseline" | "doctor", steps=steps):
                proposed_steps[event.trial_id or ""] = steps
            # the horizon it was run at, not the steps it counted: the baseline's own count defines the work
            # (a loop running ``max_iters + 1`` iterations counts one more than its horizon)
            case ev.TrialMeasured(status="ok", optimizer_steps=n) if event.trial_id in proposed_steps and (
                    proposed_steps[event.trial_id or ""] == horizon or proposed_steps[event.trial_id or ""] is None
                    and n == horizon):  # fmt: skip
                return event.trial_id
    return None


def _print_human(report: dict[str, Any]) -> None:
    print(f"study {report['study_id']}  horizon {report['steps']} steps")
    base = report["baseline"]
    if base.get("skipped"):
        print("baseline: not run (--no-baseline)")
    elif base.get("reused"):
        print(f"baseline: reusing trial {base['trial_id']}")
    else:
        _print_run("baseline", base)
    for i, run in enumerate(report["candidate"]):
        _print_run(f"candidate #{i}", run)


def _print_run(label: str, run: dict[str, Any]) -> None:
    m, f = run["measured"], run["finished"] or {}
    print(f"{label}: trial {run['trial_id']}  {json.dumps(run['candidate'])}")
    print(f"  status {m['status']}" + (f": {f.get('reason')}" if f.get("reason") else ""))
    if m["steps"]:
        mfu = f"{m['mfu']:.2%}" if m.get("mfu") is not None else "n/a"
        print(
            f"  step {m['step_time_s'] * 1000:.1f} ms (MAD {m['step_time_mad_s'] * 1000:.1f} ms; with warm-up "
            f"{m['step_time_with_warmup_s'] * 1000:.1f} ms; {m['warmup_steps']} warm-up steps)  "
            f"{m['tokens_per_s']:.0f} tokens/s  MFU {mfu}"
        )
        print(f"  steps {m['steps']}  optimiser steps {m['optimizer_steps']}  tokens {m['tokens']}  peak/rank {m['peak_memory_bytes']}")
    if f:
        print(
            f"  cost {f.get('accelerator_s', 0):.1f} accelerator-s (warm-up {f.get('warmup_accelerator_s', 0):.1f}, "
            f"steady {f.get('steady_accelerator_s', 0):.1f})"
            + (f"  censored peak {f['censored_peak_bytes']} B" if f.get("censored_peak_bytes") else "")
        )
    if m.get("coarse"):
        print("  COARSE: measured from outside the job (it reports no steps to the probe): step time is the "
              "launcher's estimate; tokens/s and MFU unknown")  # fmt: skip
    for inv in m["invariants"]:
        mark = "ok  " if inv["ok"] else "FAIL"
        print(f"  [{mark}] {inv['name']}: {inv['detail']}")
    for unchecked in m.get("unchecked_invariants", []):
        print(f"  [----] {unchecked['name']}: UNCHECKED ({unchecked['reason']})")
