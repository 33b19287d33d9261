"""``infrarsi doctor STUDY``: run the untouched baseline k times and publish its noise floor.

Design (docs/stages.md): the command itself owns the doctor stage on the bus — no service consumes
``DoctorRequested``. It

1. reads the study's ``StudyCreated`` (contract: ``doctor.repeats``, cluster, workload env);
2. publishes ``DoctorRequested`` and k ``TrialProposed(kind="doctor", origin="baseline")`` of the empty
   candidate (repeat i), which the launcher runs like any trial and telemetry measures;
3. waits for each trial's ``TrialMeasured`` (or a failed ``TrialFinished``), reads their per-step samples
   (``TrialStep``) back from the telemetry stream, computes the report with ``infrarsi.verdicts.doctor``;
4. publishes ``DoctorCompleted`` (the proposer starts the search from it) and prints a summary (``--json``).

Every id is derived from the ``DoctorRequested`` event id, and an unfinished request (a ``DoctorRequested``
with no ``DoctorCompleted`` after it) is resumed rather than re-run, so a command killed half way is simply
started again.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Iterable

import msgspec
import numpy as np

from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.commands.study_log import OpenStudy, follow_study, read_steps, study_verb, trial_results
from infrarsi.errors import EXIT_FAILED, UserError
from infrarsi.study.contract import Contract
from infrarsi.verdicts import doctor

SOURCE = "cli.doctor"


# --------------------------------------------------------------------------------------------------
# From bus data to the pure analysis
# --------------------------------------------------------------------------------------------------


def run_series(trial_id: str, steps: Iterable[ev.TrialStep], measured: ev.TrialMeasured) -> doctor.RunSeries:
    """Per-rank step series of one run; if telemetry retention dropped the samples, a flat series at the
    measured per-rank medians (run-to-run noise stays exact; step-to-step noise then reads 0)."""
    by_rank: dict[int, dict[int, ev.TrialStep]] = {}
    for s in steps:
        by_rank.setdefault(s.rank, {})[s.step] = s  # a re-sent sample replaces the first
    if not by_rank:
        n = max(measured.steps, 1)
        return doctor.RunSeries.from_lists(trial_id, {r: [t] * n for r, t in enumerate(measured.per_rank_step_s or [measured.step_time_s])})
    step_s, phases = {}, {}
    for rank, samples in by_rank.items():
        ordered = [samples[k] for k in sorted(samples)]
        step_s[rank] = [s.step_time_s for s in ordered]
        names = sorted({name for s in ordered for name in s.phases})
        phases[rank] = {name: [s.phases.get(name, 0.0) for s in ordered] for name in names}
    return doctor.RunSeries.from_lists(trial_id, step_s, phases)


def median_loss_curve(curves: list[list[ev.LossPoint]]) -> list[ev.LossPoint]:
    """Pointwise median over runs at the checkpoints every run has: the reference curve of the baseline."""
    if not curves:
        return []
    common = set.intersection(*({p.step for p in c} for c in curves))
    by_step = [{p.step: p.loss for p in c} for c in curves]
    return [ev.LossPoint(step, float(np.median([c[step] for c in by_step]))) for step in sorted(common)]


def cpu_threads(contract: Contract) -> int:
    env = contract.workload.env
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if str(env.get(key, "")).isdigit():
            return int(env[key])
    return os.cpu_count() or 1


def finished_runs(events: Iterable[ev.Event], trial_ids: set[str]) -> dict[str, ev.TrialFinished]:
    """Each of ``trial_ids``' ``TrialFinished`` (the launcher's facts: wall time, the harness's CPU)."""
    return {e.trial_id: e.payload for e in events
            if e.trial_id in trial_ids and isinstance(e.payload, ev.TrialFinished)}  # fmt: skip


def harness_share(finished: Iterable[ev.TrialFinished], cores: int) -> float | None:
    """Mean share of the host's CPU (``cores`` × wall time) the harness used during each run; ``None`` when no
    run measured it."""
    shares = [f.harness_cpu_s / (f.wall_s * cores) for f in finished if f.harness_cpu_s is not None and f.wall_s > 0]
    return float(np.mean(shares)) if shares else None


def inconsistent_work(runs: dict[str, ev.TrialMeasured]) -> str | None:
    """Why the untouched baseline's runs disagree on the work they did (optimiser steps, tokens), or ``None``.

    The golden baseline defines the work every candidate is held to, so runs of the same untouched job
    that count different work are reported plainly: the first run's counts stay the reference."""
    problems = []
    for what, counts in (("optimiser steps", {t: m.optimizer_steps for t, m in runs.items()}),
                         ("tokens", {t: m.tokens for t, m in runs.items() if m.tokens})):  # fmt: skip
        if len(set(counts.values())) > 1:
            problems.append(f"{what} " + ", ".join(f"{n} ({t})" for t, n in counts.items()))
    if not problems:
        return None
    return ("the untouched baseline is inconsistent across runs: " + "; ".join(problems) + ". Candidates are "
            "held to the first run's counts; a job whose work varies run to run (a data race, a time limit, "
            "a random horizon) cannot be compared reliably — make its work deterministic")  # fmt: skip


def summary_lines(done: ev.DoctorCompleted, report: doctor.DoctorReport, failed: dict[str, str]) -> list[str]:
    lines = [
        f"baseline step time   {done.step_time_s * 1e3:.2f} ms  (median of {len(done.baseline_trial_ids)} runs)",
        f"warm-up              {done.warmup_steps} steps",
        f"run-to-run CV        {done.run_to_run_cv:.2%}   (σ log = {report.sigma_log:.4f})",
        f"step-to-step CV      {done.step_to_step_cv:.2%}",
        f"min detectable       ×{done.min_detectable_speedup:.3f} at {done.repeats_per_trial} repeats per arm (α=0.05, power 0.8)",
        "repeats for effect   " + ", ".join(f"×{k}: {v}" for k, v in done.repeats_for_effect.items()),
        f"recommended repeats  {done.repeats_per_trial} per search trial",
    ]
    if done.phase_fractions:
        lines.append("phases               " + ", ".join(f"{k} {v:.0%}" for k, v in done.phase_fractions.items()))
    if len(done.per_rank_step_s) > 1:
        lines.append("per rank             " + ", ".join(f"r{i} {t * 1e3:.2f}ms" for i, t in enumerate(done.per_rank_step_s)))
    lines.append(f"stragglers           {done.stragglers or 'none'}")
    for i in done.interfered_runs:
        run = report.runs[i]
        lines.append(f"interfered run       {run.trial_id}: {run.step_time_s * 1e3:.2f} ms/step, ≥ ×{doctor.INTERFERENCE_RATIO}"
                     " off the other runs — left out of the noise estimate (another job on the host?)")
    if done.harness_cpu_share is not None:
        lines.append(f"harness CPU          {done.harness_cpu_share:.1%} of the host's cores while the baseline ran "
                     "(InfraRSI's services, bus and CLI)")
    if done.host_native_dtypes:
        lines.append(f"native matmul dtypes {', '.join(done.host_native_dtypes)} (the search's priors start from it)")
    if done.peak_flops_measured:
        lines.append(f"peak FLOP/s          {done.peak_flops_measured:.3g} (measured)")
    if done.mfu is not None:
        lines.append(f"MFU                  {done.mfu:.2%}")
    for trial_id, why in failed.items():
        lines.append(f"failed run           {trial_id}: {why}")
    return lines


# --------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="study id")
    parser.add_argument("--repeats", type=int, default=None, help="baseline runs (default: contract doctor.repeats)")
    parser.add_argument("--steps", type=int, default=None, help="horizon of each run (default: the contract's)")
    parser.add_argument("--target-speedup", type=float, default=1.05, help="speed-up the recommended repeats should detect")
    parser.add_argument("--no-peak", action="store_true", help="do not measure the CPU matmul peak")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the runs")
    parser.add_argument("--json", action="store_true", help="print DoctorCompleted as JSON")


async def _doctor(bus: Bus, args: argparse.Namespace, study: OpenStudy) -> int:
    study_id, events, created, contract = args.study, study.events, study.created, study.contract
    cluster_id = created.cluster.cluster_id

    pending: tuple[ev.Event, ev.DoctorRequested] | None = None
    for event in events:
        match event.payload:
            case ev.DoctorRequested() as asked:
                pending = (event, asked)
            case ev.DoctorCompleted():
                pending = None
    if pending is not None and args.repeats in (None, pending[1].repeats):
        request, asked = pending
        print(f"resuming doctor request {request.event_id}", file=sys.stderr)
    else:
        asked = ev.DoctorRequested(repeats=args.repeats or contract.doctor.repeats, steps=args.steps)
        request = ev.make_event(asked, study_id=study_id, source=SOURCE, cluster_id=cluster_id)
    repeats = asked.repeats
    trial_ids = [ev.derived_id(request.event_id, "doctor", str(i)) for i in range(repeats)]
    baseline = ev.Candidate()
    proposals = [
        ev.make_event(
            ev.TrialProposed(
                candidate=baseline, candidate_key=baseline.key(), kind="doctor", origin="baseline",
                reason=f"doctor baseline repeat {i + 1}/{repeats}", repeat=i, steps=asked.steps,
            ),
            study_id=study_id, source=SOURCE, trial_id=trial_ids[i], cluster_id=cluster_id,
            event_id=ev.derived_id(request.event_id, "TrialProposed", str(i)),
        )
        for i in range(repeats)
    ]
    await bus.publish_many([request, *proposals])  # duplicates of a resumed request are dropped by id

    wanted = set(trial_ids)
    results = trial_results(events, wanted)
    finished = finished_runs(events, wanted)
    reported = -1
    if len(results) < repeats:
        async for new in follow_study(bus, study_id, study.next_seq, timeout_s=args.timeout,
                                      unfinished=lambda: f"{repeats - len(results)} doctor runs not finished"):
            if len(results) != reported:
                print(f"doctor: {len(results)}/{repeats} baseline runs done", file=sys.stderr)
                reported = len(results)
            results.update(trial_results(new, wanted))
            finished.update(finished_runs(new, wanted))
            if len(results) >= repeats:
                break

    ok = {t: r for t, r in results.items() if isinstance(r, ev.TrialMeasured) and r.status == "ok"}
    failed = {t: f"{r.status} {getattr(r, 'reason', '')}".strip() for t, r in results.items() if t not in ok}
    ordered_ok = [t for t in trial_ids if t in ok]
    if len(ordered_ok) < 2:
        raise UserError(f"only {len(ordered_ok)} of {repeats} baseline runs succeeded; doctor needs 2", EXIT_FAILED,
                        details=[f"  {trial_id}: {why}" for trial_id, why in failed.items()])

    inconsistent = inconsistent_work({t: ok[t] for t in ordered_ok})
    if inconsistent is not None:
        print(f"doctor: WARNING: {inconsistent}", file=sys.stderr)
    samples = await read_steps(bus, study_id, ordered_ok)
    series = [run_series(t, samples[t], ok[t]) for t in ordered_ok]
    peak = created.cluster.peak_flops
    measured_peak = None
    native: list[str] = []
    if created.cluster.accelerator == "cpu" and contract.backend.kind == "local":
        # the trials run on this host, in the contract's environment: what it multiplies natively is a fact the
        # search starts from (``DoctorCompleted.host_native_dtypes``)
        native = list(doctor.native_matmul_dtypes(env={**os.environ, **contract.workload.env})[0])
    if peak is None and created.cluster.accelerator == "cpu" and not args.no_peak:
        measured_peak = await asyncio.to_thread(doctor.measure_cpu_peak_flops, cpu_threads(contract),
                                                dtypes=native or None)
        peak = measured_peak
    flops = [m.flops_per_step for m in ok.values() if m.flops_per_step]
    report = doctor.analyse(
        series,
        target_speedup=args.target_speedup,
        flops_per_step=float(np.median(flops)) if flops else None,
        peak_flops=peak,
        devices=max(1, len(series[0].step_s)),
    )
    done = msgspec.structs.replace(
        report.completed,
        peak_flops_measured=measured_peak,
        host_native_dtypes=native,
        harness_cpu_share=harness_share([finished[t] for t in ordered_ok if t in finished],
                                        os.cpu_count() or 1),
        baseline_loss_curve=median_loss_curve([list(ok[t].loss_curve) for t in ordered_ok]),
    )
    await bus.publish(
        ev.make_event(done, study_id=study_id, source=SOURCE, cluster_id=cluster_id,
                      event_id=ev.derived_id(request.event_id, "DoctorCompleted"))
    )
    if args.json:
        print(msgspec.json.encode(done).decode())
    else:
        print("\n".join(summary_lines(done, report, failed)))
        if inconsistent is not None:
            print(f"WORK INCONSISTENT    {inconsistent}")
    return 0


run = study_verb(SOURCE, _doctor)
"""``infrarsi doctor STUDY``."""
