"""A REAL search space for bench/search_vs_peers.py: the dense-1node GPT contract, every trial a real training job
on this CPU host.

Owns ``dense_1node_cpu()`` / ``bench_space()`` (a ``BenchSpace``) and ``RealTrials``, which runs the candidates a
tuner asks for. The search space, baseline, priors and capacity are what InfraRSI itself builds from the contract
(``init``'s ``prepare_study`` → ``study.space.load_study_space``). A trial goes the way ``infrarsi trial`` sends
it, minus NATS: the launcher service (scope checks, a git worktree of the golden baseline with the patches applied, the local
backend with its emulated-capacity watchdog, timeout, cost accounting) and the telemetry service (warm-up,
steady-state step time, invariants against the study's baseline) run in this process, and an in-memory bus
hands each one the events it consumes, in publish order. ``study.ledger.TrialLedger`` then pairs the
``TrialFinished`` with its ``TrialMeasured`` into the outcome the modeler would see:

- ``ok``: exited 0 and every invariant held; ``step_time_s`` is telemetry's steady-state median;
- ``oom``: the watchdog killed it above the emulated 1 GiB; ``peak_bytes`` is the censoring bound;
- failed: ``crash``, ``timeout``, ``scope_violation`` (a refused or conflicting patch set) or
  ``invariant_violation`` — a math-changing patch or a reward hack ends here (loss, work and timing are checked
  against the untouched baseline, run once per ``RealTrials`` before the first candidate), not as a fast trial.

Every candidate is measured ONCE per ``RealTrials`` (per bench process): a repeat — the same tuner, another
seed or another tuner asking again — gets the cached measurement back, cost included, so every tuner pays for
it as it would in a study, but the host runs it once. The horizon is shorter than the contract's 30 steps
(``steps``, default 12: one eval at step 10 and one after the last step).

Must not: publish to a real bus, or change the workload checkout (trials run in worktrees of a snapshot repo
under a temporary directory, removed by ``close``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from _common import BenchSpace
from infrarsi import events as ev
from infrarsi.commands.init import prepare_study
from infrarsi.modeling.pool import CandidatePool
from infrarsi.modeling.space import Candidate
from infrarsi.runtime.logs import setup_logging
from infrarsi.runtime.service import Outbox, Service
from infrarsi.sim.scenarios import SimOutcome
from infrarsi.study.ledger import TrialLedger
from infrarsi.study.space import StudySpace, load_study_space
from infrarsi_services.launcher.service import LauncherService
from infrarsi_services.telemetry.service import TelemetryService

log = logging.getLogger("bench.real")

REPO = Path(__file__).resolve().parents[1]
DENSE_1NODE = REPO / "workloads" / "gpt" / "contracts" / "dense-1node.yaml"

DEFAULT_STEPS = 12
"""Trial horizon: shorter than the contract's 30 so a tuner's budget fits on 2 cores; with ``eval_every: 10``
the loss invariant still has two checkpoints (after steps 10 and 12)."""
DEFAULT_TIMEOUT_S = 300.0
"""Per trial (the contract allows 600 s): a 12-step trial takes seconds, ``torch.compile`` tens of seconds."""


# --------------------------------------------------------------------------------------------------
# The in-memory bus
# --------------------------------------------------------------------------------------------------


class _MemoryBus:
    """Stands in for ``infrarsi.bus.client.Bus``: keeps what is published and delivers it, in order, to every service
    that consumes its type (what ``service.Runner`` does with durable consumers)."""

    def __init__(self, services: list[Service]) -> None:
        self.services = services
        self.queue: deque[ev.Event] = deque()
        self.log: list[ev.Event] = []
        for service in services:
            service.bus = self  # type: ignore[assignment]

    async def publish(self, event: ev.Event) -> None:
        self.queue.append(event)
        self.log.append(event)

    async def publish_raw(self, subject: str, data: bytes, msg_id: str | None = None, stream: str | None = None
                          ) -> None:
        """The launcher re-publishes the probe's records with ``publish_raw``: decoded onto the same queue (a
        torn or foreign line is dropped, as the telemetry service's decoder would dead-letter it)."""
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            await self.publish(ev.decode(data))

    async def drain(self) -> None:
        while self.queue:
            event = self.queue.popleft()
            for service in self.services:
                if isinstance(event.payload, service.consumes):
                    await service.handle(event, Outbox(bus=self, source=service.name, cause=event))  # type: ignore[arg-type]


class _DetachedLauncher(LauncherService):
    """The launcher without a NATS server: the probe gets no URL, so it writes only its JSONL file (which the
    launcher re-publishes onto the in-memory bus when the job ends)."""

    def nats_url(self) -> str:
        return ""


# --------------------------------------------------------------------------------------------------
# Real trials
# --------------------------------------------------------------------------------------------------


class RealTrials:
    """Real trials of one contract, measured once per candidate. ``close`` removes everything it made."""

    def __init__(self, contract_path: Path | str = DENSE_1NODE, *, steps: int = DEFAULT_STEPS,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        # the services' own log lines (JSON on stderr, one per trial event) only when asked for: the bench logs
        # one line per trial itself
        setup_logging("bench.real", level=os.environ.get("INFRARSI_LOG_LEVEL", "warning"))
        self.steps = steps
        self.data_dir = Path(tempfile.mkdtemp(prefix="infrarsi-bench-real-"))
        try:
            prepared = prepare_study(contract_path, self.data_dir)
            contract = dict(prepared.created.contract)
            contract["backend"] = {**contract["backend"], "timeout_s": timeout_s}
            self.created = msgspec.structs.replace(prepared.created, contract=contract)
            self.study_id = prepared.study_id
            self.study: StudySpace = load_study_space(self.created)
        except BaseException:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            raise
        self.launcher = _DetachedLauncher(self.data_dir)
        self.telemetry = TelemetryService()
        self.bus = _MemoryBus([self.launcher, self.telemetry])
        self.ledger = TrialLedger()
        self.cache: dict[str, SimOutcome] = {}
        self.baseline: SimOutcome | None = None
        self.trials_run = 0
        self.cache_hits = 0
        self.trial_wall_s: list[float] = []
        """Wall seconds of each real trial, end to end (worktree, job, measurement)."""
        self._started = False

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Open the study on the in-memory bus and run the untouched baseline (the invariants' reference).
        Idempotent; the first ``measure`` calls it."""
        if self._started:
            return
        self._started = True
        self._publish(ev.make_event(self.created, study_id=self.study_id, source="bench",
                                    cluster_id=self.created.cluster.cluster_id))
        baseline = ev.Candidate()
        self.baseline = self._run(baseline, kind="baseline")
        if self.baseline.status != "ok":
            raise RuntimeError(f"the untouched baseline did not run ok ({self.baseline.status}: "
                               f"{self.baseline.detail}); the real space cannot be scored")
        self.cache[baseline.key()] = self.baseline
        log.info("real baseline: %.1f ms/step, peak %.0f MiB, %.1f s", 1e3 * (self.baseline.step_time_s or 0),
                 (self.baseline.peak_bytes or 0) / 2**20, self.baseline.cost_seconds)

    def close(self) -> None:
        """Stop whatever job still runs (the launcher's backends), then remove the snapshot repo and trial dirs."""
        try:
            asyncio.run(self.launcher.stop())
        finally:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def info(self) -> dict[str, Any]:
        """What the JSON reports about the real space (read after the run)."""
        walls = self.trial_wall_s
        return {
            "horizon_steps": self.steps,
            "baseline_step_time_s": self.baseline.step_time_s if self.baseline else None,
            "real_trials_run": self.trials_run,
            "cache_hits": self.cache_hits,
            "trial_wall_seconds_median": float(np.median(walls)) if walls else None,
            "trial_wall_seconds_total": float(sum(walls)),
            "statuses": {s: sum(o.status == s for o in self.cache.values())
                         for s in sorted({o.status for o in self.cache.values()})},
        }

    # ---------------------------------------------------------------- trials

    def measure(self, candidate: Candidate) -> SimOutcome:
        """The candidate's outcome: measured now, or the earlier measurement of the same candidate."""
        self.start()
        key = self.study.event_key(candidate)
        if key in self.cache:
            self.cache_hits += 1
            return self.cache[key]
        outcome = self._run(self.study.to_event(candidate), kind="search")
        self.cache[key] = outcome
        return outcome

    def _run(self, candidate: ev.Candidate, *, kind: ev.TrialKind) -> SimOutcome:
        trial_id = ev.new_id()
        proposed = ev.TrialProposed(candidate=candidate, candidate_key=candidate.key(), kind=kind,
                                    origin="baseline" if kind == "baseline" else "manual",
                                    reason="bench/search_vs_peers.py", steps=self.steps)
        self.ledger.proposed(trial_id, proposed)
        first = len(self.bus.log)
        t0 = time.perf_counter()
        self._publish(ev.make_event(proposed, study_id=self.study_id, trial_id=trial_id, source="bench",
                                    cluster_id=self.created.cluster.cluster_id))
        wall = time.perf_counter() - t0
        self.trials_run += 1
        self.trial_wall_s.append(wall)
        outcome = None
        for event in self.bus.log[first:]:
            if event.trial_id != trial_id:
                continue
            match event.payload:
                case ev.TrialFinished() as finished:
                    outcome = self.ledger.finished(trial_id, finished) or outcome
                case ev.TrialMeasured() as measured:
                    outcome = self.ledger.measured(trial_id, measured) or outcome
        if outcome is None:
            raise RuntimeError(f"trial {trial_id} of {candidate} produced no outcome")
        result = SimOutcome(outcome.status, outcome.step_time_s, outcome.peak_bytes,  # type: ignore[arg-type]
                            outcome.accelerator_s, simulated=False, detail=outcome.detail)
        log.info("real trial %d (%s, %.1f s): %s %s", self.trials_run, kind, wall, result.status,
                 f"{1e3 * result.step_time_s:.1f} ms/step" if result.step_time_s else result.detail[:120])
        return result

    def _publish(self, event: ev.Event) -> None:
        async def deliver() -> None:
            await self.bus.publish(event)
            await self.bus.drain()

        asyncio.run(deliver())


# --------------------------------------------------------------------------------------------------
# The bench space
# --------------------------------------------------------------------------------------------------


def bench_space(trials: RealTrials, name: str) -> BenchSpace:
    """A ``BenchSpace`` over ``trials``' contract: InfraRSI's own search space, baseline, priors and capacity for it;
    ``evaluate`` is ``trials.measure`` (the rng is unused: the host supplies the noise). No oracle. Runs the
    baseline now, so no tuner's wall time includes it."""
    study = trials.study
    try:
        trials.start()
    except BaseException:
        trials.close()
        raise

    def evaluate(c: Candidate, _rng: np.random.Generator) -> SimOutcome:
        return trials.measure(c)

    return BenchSpace(
        name=name,
        space=study.space,
        capacity_bytes=study.capacity_bytes,
        evaluate=evaluate,
        true_time=None,
        oracle_time=None,
        meta=study.meta,
        pool=CandidatePool.build(study.space, study.meta),
        kind="real, CPU",
        kb=study.kb,
        baseline=study.baseline,
        info=trials.info,
        close=trials.close,
    )


def dense_1node_cpu(steps: int = DEFAULT_STEPS, timeout_s: float = DEFAULT_TIMEOUT_S):  # -> BenchSpace
    """The dense-1node contract's space on this CPU host (1 GiB emulated per rank), real trials of ``steps``
    steps. The bench scores it against the best step time any tuner measured; ``close`` it after."""
    return bench_space(RealTrials(DENSE_1NODE, steps=steps, timeout_s=timeout_s), "dense-1node (real, CPU)")
