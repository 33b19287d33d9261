"""The telemetry service: per-trial step series → one ``TrialMeasured`` per trial, invariants included.

Consumes ``TrialStep`` (stream IRSI_TELEMETRY) and ``StudyCreated``, ``TrialProposed``, ``TrialFinished``,
``DoctorCompleted`` (stream IRSI). A trial is measured once its ``TrialFinished`` has arrived and its steps
are complete (rank 0 has ``steps_completed`` records and, for a trial that ended ``ok``, so has every
rank) — or ``COMPLETE_GRACE_S`` after the finish if some never arrive (a trial that died, a lost sample).
Samples are deduplicated by (trial, rank, step), so late, repeated or reordered deliveries change nothing.

The statistics and invariant verdicts are ``infrarsi.verdicts.stats``; this module only keeps the read model:
studies (invariant spec, peak FLOP/s, the baseline series per horizon), trials (proposal, finish, steps),
and which trials are already measured. On start it is rebuilt by replaying the lifecycle stream, then
the telemetry of every not-yet-measured trial and of each study's baseline.

The study's baseline is its first trial of kind ``baseline`` or ``doctor`` that measured ``ok`` (at the
same horizon: the learning-rate schedule depends on it). A baseline trial itself checks only internal
consistency (work against the configuration, timing).

A study whose contract measures coarsely (``workload.measurement.kind: coarse``, a job without a probe) has
no step samples: its trials are measured from ``TrialFinished`` alone (``stats.measure_coarse``) as soon as
it arrives, labelled ``coarse``, with the invariants that cannot be checked named in
``unchecked_invariants``.

Stopping slow trials: on each rank-0 step of a running search trial, ``trial.slow.slow_verdict`` compares
its steady steps with the study's incumbent (the fastest trial measured ``ok`` with every invariant held,
kept from the ``TrialMeasured`` this service publishes) and the doctor's noise; a trial already ruled out
gets one ``TrialStopRequested`` (id derived from the trial, so a replay or a redelivery adds none), which
the launcher acts on. Telemetry decides because it is the service that sees the steps and the measurements.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infrarsi import events as ev
from infrarsi.bus.subjects import TELEMETRY_STREAM, telemetry_subject
from infrarsi.runtime.logs import get_logger
from infrarsi.runtime.service import Outbox, Service
from infrarsi.study.contract import Contract, ContractError, get_dotted, locked_contract
from infrarsi.trial import slow as slow_trials
from infrarsi.verdicts import stats

log = get_logger(__name__)

COMPLETE_GRACE_S = 15.0
"""How long after ``TrialFinished`` to wait for missing steps before measuring what is there."""

BASELINE_KINDS = ("baseline", "doctor")


def defines_work(kind: ev.TrialKind, proposed: ev.TrialProposed | None, *, coarse: bool) -> bool:
    """Whether a trial runs the untouched baseline whose measured work candidates are held to: the baseline
    and the doctor's runs, and for a coarse study also verify's baseline arm (the untouched job at verify's
    horizon, where a coarse count is the job's own numbering and the contract's horizon only a request)."""
    if kind in BASELINE_KINDS:
        return True
    return (coarse and proposed is not None and proposed.origin == "baseline" and not proposed.candidate.knobs
            and not proposed.candidate.patches)  # fmt: skip


def golden_launch(contract: Contract) -> dict[str, Any]:
    """The golden launch values (``Contract.baseline_launch``), or ``{}`` where the launch file is not readable
    here: a trial's knobs alone then say its micro-batch and layout."""
    try:
        return contract.baseline_launch()
    except (OSError, ContractError):
        return {}


def stated_work(contract: Contract, knobs: Mapping[str, Any], golden: Mapping[str, Any] | None = None
                ) -> stats.StatedWork:  # fmt: skip
    """What ``contract`` states of the work of a trial with ``knobs``, for a coarse trial's tokens: the tokens
    per optimiser step (``steps_key_tokens``, or the global batch × ``shape.seq_len``) and per micro-batch
    (the trial's micro-batch × the sequence length × data-parallel ranks; a knob the trial leaves at its
    golden value is read from ``golden``, the study's ``golden_launch``, read here when not given). The
    sequence length is ``shape.seq_len``, else what a token horizon implies (``steps_key_tokens`` / the
    global batch)."""
    workload, gb = contract.workload, contract.search_space.constraints.global_batch
    seq = workload.shape.seq_len if workload.shape is not None else None
    if seq is None and gb is not None and workload.steps_key_tokens and workload.steps_key_tokens % gb.size == 0:
        seq = workload.steps_key_tokens // gb.size
    per_step, how = workload.steps_key_tokens, "workload.steps_key_tokens"
    if per_step is None and gb is not None and seq is not None:
        per_step, how = gb.size * seq, f"global batch {gb.size} × sequence {seq}"
    per_micro_batch, micro_batch_how = None, ""
    if gb is not None and seq is not None:
        if golden is None:
            golden = golden_launch(contract)
        micro_batch = knobs.get(gb.micro_batch_key, get_dotted(golden, gb.micro_batch_key)[1])
        parallel = gb.data_parallel_for({key: knobs.get(key, get_dotted(golden, key)[1]) for key in gb.parallel_keys})
        if isinstance(micro_batch, int) and not isinstance(micro_batch, bool) and micro_batch > 0 and parallel:
            per_micro_batch = micro_batch * seq * parallel
            micro_batch_how = f"micro-batch {micro_batch} × sequence {seq} × {parallel} data-parallel"
    return stats.StatedWork(tokens_per_step=per_step, tokens_per_micro_batch=per_micro_batch, how=how,
                            micro_batch_how=micro_batch_how)  # fmt: skip


@dataclass
class StudyState:
    spec: stats.InvariantSpec
    steps: int
    """The contract's trial horizon."""
    cluster: ev.ClusterInfo
    peak_flops: float | None
    coarse: bool = False
    """The contract measures trials coarsely (the job has no probe): ``stats.measure_coarse``."""
    counts_steps: bool = False
    """Coarse: the contract gives a step pattern, so the launcher counted steps in the output."""
    contract: Contract | None = None
    """Coarse: the locked contract, for what it states of each trial's work (``stated_work``)."""
    golden: dict[str, Any] = field(default_factory=dict)
    """Coarse: the golden launch values (``golden_launch``), read once when the study is created."""
    baselines: dict[int, tuple[str, stats.Series]] = field(default_factory=dict)
    """Horizon → (trial id, series) of the study's first successful baseline at that horizon."""
    coarse_baselines: dict[int, ev.TrialMeasured] = field(default_factory=dict)
    """Coarse: horizon → the study's first successful baseline measurement at that horizon (its counted
    steps and printed loss are what candidates are held to)."""
    stop_slow_factor: float | None = None
    """The contract's ``budget.stop_slow_factor``: ``None`` never stops a trial as slow."""
    noise_cv: float | None = None
    """The doctor's run-to-run CV (widens the stop-as-slow bar on a noisy host)."""
    incumbent: tuple[float, str] | None = None
    """(step time, trial id) of the fastest trial measured ``ok`` with every invariant held."""

    def saw(self, trial_id: str, measured: ev.TrialMeasured) -> None:
        """Keep the incumbent: the fastest clean measurement so far."""
        if measured.status == "ok" and measured.invariants_ok and measured.step_time_s > 0 and not measured.coarse:
            if self.incumbent is None or measured.step_time_s < self.incumbent[0]:
                self.incumbent = (measured.step_time_s, trial_id)


@dataclass
class TrialState:
    study_id: str
    proposed: ev.TrialProposed | None = None
    finished: ev.TrialFinished | None = None
    finished_at: float | None = None
    cluster_id: str | None = None
    steps: dict[tuple[int, int], ev.TrialStep] = field(default_factory=dict)
    rank0_s: dict[int, float] = field(default_factory=dict)
    """Rank 0's step times by step (the stop-as-slow verdict reads them on every new one)."""
    measuring: bool = False
    stop_requested: bool = False


class TelemetryService(Service):
    name = "telemetry"
    consumes = (ev.StudyCreated, ev.TrialProposed, ev.TrialFinished, ev.DoctorCompleted, ev.TrialStep)
    lifecycle_replayed = (ev.StudyCreated, ev.TrialProposed, ev.TrialFinished, ev.DoctorCompleted, ev.TrialMeasured,
                          ev.TrialStopRequested)

    def __init__(self, *, complete_grace_s: float = COMPLETE_GRACE_S) -> None:
        self.complete_grace_s = complete_grace_s
        self.studies: dict[str, StudyState] = {}
        self.trials: dict[str, TrialState] = {}
        self.measured: set[str] = set()
        self._sweeper: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        baseline_measures: list[tuple[str, str, int | None]] = []
        stop_requested: set[str] = set()
        async for event in self.replay(self.lifecycle_replayed):
            match event.payload:
                case ev.TrialStopRequested():
                    stop_requested.add(event.trial_id or "")
                case ev.TrialMeasured() as measured:
                    self.measured.add(event.trial_id or "")
                    replayed = self.trials.pop(event.trial_id or "", None)
                    proposed = replayed.proposed if replayed is not None else None
                    study = self.studies.get(event.study_id)
                    if study is not None:
                        study.saw(event.trial_id or "", measured)
                    if defines_work(measured.kind, proposed, coarse=measured.coarse) and measured.status == "ok":
                        horizon = (proposed.steps if proposed is not None and proposed.steps else None) or (
                            study.steps if study is not None else None)
                        if measured.coarse and study is not None and horizon is not None:
                            study.coarse_baselines.setdefault(horizon, measured)
                        else:
                            baseline_measures.append((event.study_id, event.trial_id or "", horizon))
                case _:
                    self._apply(event)
        # steps of trials still to measure, and of each study's baseline, come back from the telemetry stream
        for trial_id, trial in list(self.trials.items()):
            trial.stop_requested = trial_id in stop_requested
            for step in await self._replay_steps(trial.study_id, trial_id):
                self._add_step(trial, step)
        for study_id, trial_id, horizon in baseline_measures:
            study = self.studies.get(study_id)
            if study is None:
                continue
            series = stats.summarise(await self._replay_steps(study_id, trial_id))
            study.baselines.setdefault(horizon if horizon is not None else series.optimizer_steps, (trial_id, series))
        self._sweeper = asyncio.create_task(self._sweep(), name="telemetry-sweeper")
        log.info("telemetry ready", studies=len(self.studies), pending=len(self.trials), measured=len(self.measured))

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper

    def status(self) -> dict[str, object]:
        return {"pending_trials": len(self.trials), "measured_trials": len(self.measured)}

    async def _replay_steps(self, study_id: str, trial_id: str) -> list[ev.TrialStep]:
        subject = telemetry_subject(study_id, trial_id)
        return [e.payload async for e in self.bus.events(TELEMETRY_STREAM, subject) if isinstance(e.payload, ev.TrialStep)]

    async def _sweep(self) -> None:
        """Measure trials whose missing steps did not arrive within the grace period."""
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for trial_id, trial in list(self.trials.items()):
                if trial.finished_at is not None and now - trial.finished_at > self.complete_grace_s:
                    try:
                        await self._measure(trial_id, trial, forced=True)
                    except Exception:  # noqa: BLE001 — retried at the next sweep
                        log.exception("measuring failed", trial_id=trial_id)

    # ---------------------------------------------------------------- events

    async def handle(self, event: ev.Event, out: Outbox) -> None:
        self._apply(event)
        trial_id = event.trial_id
        if trial_id and trial_id in self.trials:
            if isinstance(event.payload, ev.TrialStep) and event.payload.rank == 0:
                await self._maybe_stop_slow(trial_id)
            await self._maybe_measure(trial_id)

    def _apply(self, event: ev.Event) -> None:
        """Update the read model (also used by the replay)."""
        trial_id = event.trial_id or ""
        match event.payload:
            case ev.StudyCreated(cluster=cluster) as created:
                try:
                    contract = locked_contract(created)
                except ContractError as exc:
                    log.error("unusable contract", study_id=event.study_id, error=str(exc))
                    return
                inv = contract.invariants
                gb = contract.search_space.constraints.global_batch
                prior = self.studies.get(event.study_id)
                self.studies[event.study_id] = StudyState(
                    spec=stats.InvariantSpec(
                        loss_tolerance=inv.loss.tolerance, loss_mode=inv.loss.mode, loss_at=inv.loss.at,
                        steps=inv.steps, tokens=inv.tokens, eval=inv.eval, timing_tolerance=inv.timing_tolerance,
                        global_batch=gb.size if gb is not None else None,
                    ),
                    steps=contract.workload.steps,
                    cluster=cluster,
                    peak_flops=cluster.peak_flops,
                    coarse=contract.workload.measurement.kind == "coarse",
                    counts_steps=contract.workload.measurement.step_regex is not None,
                    contract=contract,
                    golden=golden_launch(contract) if contract.workload.measurement.kind == "coarse" else {},
                    stop_slow_factor=contract.budget.stop_slow_factor,
                    noise_cv=prior.noise_cv if prior is not None else None,
                    incumbent=prior.incumbent if prior is not None else None,
                )  # fmt: skip
            case ev.DoctorCompleted(peak_flops_measured=peak, run_to_run_cv=cv):
                study = self.studies.get(event.study_id)
                if study is not None and peak and not study.cluster.peak_flops:
                    study.peak_flops = peak
                if study is not None and cv > 0:  # the host's measured noise widens the timing allowance
                    study.spec = dataclasses.replace(study.spec, noise_cv=cv)
                    study.noise_cv = cv
            case ev.TrialProposed() as proposed:
                if trial_id not in self.measured:
                    self._trial(event).proposed = proposed
            case ev.TrialFinished() as finished:
                if trial_id not in self.measured:
                    trial = self._trial(event)
                    trial.finished = finished
                    trial.finished_at = time.monotonic()
            case ev.TrialStep() as step:
                if trial_id not in self.measured:
                    self._add_step(self._trial(event), step)

    @staticmethod
    def _add_step(trial: TrialState, step: ev.TrialStep) -> None:
        trial.steps.setdefault((step.rank, step.step), step)
        if step.rank == 0:
            trial.rank0_s.setdefault(step.step, step.step_time_s)

    async def _maybe_stop_slow(self, trial_id: str) -> None:
        """Ask the launcher to stop a running search trial its steps already rule out (module docstring)."""
        trial = self.trials[trial_id]
        proposed = trial.proposed
        if trial.stop_requested or trial.finished is not None or proposed is None:
            return
        study = self.studies.get(trial.study_id)
        if (not slow_trials.may_stop(proposed) or study is None or study.coarse
                or study.stop_slow_factor is None or study.incumbent is None):  # fmt: skip
            return
        times = [trial.rank0_s[k] for k in sorted(trial.rank0_s)]
        verdict = slow_trials.slow_verdict(times, incumbent_s=study.incumbent[0], incumbent_trial=study.incumbent[1],
                                           factor=study.stop_slow_factor, noise_cv=study.noise_cv)  # fmt: skip
        if verdict is None:
            return
        trial.stop_requested = True
        await self.bus.publish(ev.make_event(
            verdict, study_id=trial.study_id, trial_id=trial_id, source=self.name, cluster_id=trial.cluster_id,
            event_id=ev.derived_id(trial_id, self.name, "TrialStopRequested"),
        ))  # fmt: skip
        log.info("asked to stop a slow trial", trial_id=trial_id, reason=verdict.reason)

    def _trial(self, event: ev.Event) -> TrialState:
        trial = self.trials.setdefault(event.trial_id or "", TrialState(study_id=event.study_id))
        trial.cluster_id = event.cluster_id
        return trial

    async def _maybe_measure(self, trial_id: str) -> None:
        trial = self.trials[trial_id]
        if trial.finished is None or trial.proposed is None:
            return
        study = self.studies.get(trial.study_id)
        # a coarse trial has no step samples to wait for: its TrialFinished holds everything known
        if not (study is not None and study.coarse) and not self._complete(trial):
            return
        await self._measure(trial_id, trial, forced=False)

    @staticmethod
    def _complete(trial: TrialState) -> bool:
        finished = trial.finished
        assert finished is not None
        expected = finished.steps_completed
        by_rank: dict[int, int] = {}
        world = finished.ranks
        for rank, _step in trial.steps:
            by_rank[rank] = by_rank.get(rank, 0) + 1
        if by_rank.get(0, 0) < expected:
            return False
        if finished.status == "ok":
            return all(by_rank.get(r, 0) >= expected for r in range(world))
        return True

    async def _measure(self, trial_id: str, trial: TrialState, *, forced: bool) -> None:
        if trial.measuring or trial_id in self.measured:
            return
        study = self.studies.get(trial.study_id)
        if study is None or trial.finished is None:
            return
        trial.measuring = True
        try:
            proposed = trial.proposed
            kind: ev.TrialKind = proposed.kind if proposed else "search"
            horizon = (proposed.steps if proposed and proposed.steps else None) or study.steps
            is_baseline = defines_work(kind, proposed, coarse=study.coarse)
            reference = None if is_baseline else study.baselines.get(horizon, (None, None))[1]
            if proposed is not None and proposed.resume_from is not None and trial.steps:
                # A restart trial (verify.checkpoint_restart) begins at its checkpoint's step: it owes the steps
                # after it, and its curve is the verifier's to judge against the run it continues, not the
                # baseline's from step zero (which it would fail by design, and be counted a violation).
                horizon -= min(step for _rank, step in trial.steps)
                reference = None
            series: stats.Series | None = None
            if study.coarse:
                measured = stats.measure_coarse(
                    trial.finished, candidate_key=proposed.candidate_key if proposed else "", kind=kind,
                    horizon=horizon, spec=study.spec, counts_steps=study.counts_steps, is_baseline=is_baseline,
                    baseline=None if is_baseline else study.coarse_baselines.get(horizon),
                    stated=stats.StatedWork() if study.contract is None else stated_work(
                        study.contract, proposed.candidate.knobs if proposed is not None else {}, study.golden),
                )  # fmt: skip
            else:
                measured, series = stats.measure(
                    trial.steps.values(),
                    trial.finished,
                    candidate_key=proposed.candidate_key if proposed else "",
                    kind=kind,
                    horizon=horizon,
                    spec=study.spec,
                    baseline=reference,
                    peak_flops_per_device=study.peak_flops,
                    is_baseline=is_baseline,
                )
            event = ev.make_event(
                measured,
                study_id=trial.study_id,
                trial_id=trial_id,
                source=self.name,
                cluster_id=trial.cluster_id,
                event_id=ev.derived_id(trial_id, self.name, "TrialMeasured"),
            )
            await self.bus.publish(event)
        finally:
            trial.measuring = False
        self.measured.add(trial_id)
        self.trials.pop(trial_id, None)
        study.saw(trial_id, measured)
        if is_baseline and series is not None and measured.status == "ok" and horizon not in study.baselines:
            study.baselines[horizon] = (trial_id, series)
        if is_baseline and measured.coarse and measured.status == "ok":
            study.coarse_baselines.setdefault(horizon, measured)
        log.info(
            "trial measured", trial_id=trial_id, status=measured.status, step_time_s=round(measured.step_time_s, 4),
            invariants_ok=measured.invariants_ok, forced=forced,
        )  # fmt: skip
