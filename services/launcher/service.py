"""The launcher service: turns each ``TrialProposed`` into a run of the workload and one ``TrialFinished``.

Owns trial worktrees, the trial's processes (through a backend), OOM detection and cost accounting.
Per trial, in this order, nothing running before the checks pass:

1. scope: every launch key must be a knob of the contract with a value of the knob's type and range, every
   patch must be in the contract's search space — else ``scope_violation``;
2. a git worktree of the golden baseline (``workspace.materialise``), the patches applied by
   ``workspace.apply_patches`` (path, symlink, binary and locked-file checks → ``scope_violation``;
   ``git apply --check`` of the sequence → ``patch_conflict``);
3. the knob values delivered as the contract says (``Contract.trial_launch``: a launch file written as
   YAML into the trial's state directory, flags or overrides in the argv, environment variables); the
   job's argv is a list (no shell); a value that could become an extra argument is refused
   (``scope_violation``); the environment variables of docs/trials.md;
4. submit → ``TrialLaunched`` → poll (tailing rank 0's probe file for ``step_seen_s``, and for a coarse
   trial rank 0's output for the contract's step pattern: ``output.py``; timeout) → collect;
5. every probe record re-published with the probe's own ``Nats-Msg-Id`` (dedup makes it idempotent);
6. ``TrialFinished`` with the status, cost and evidence; the worktree is removed.

A ``TrialStopRequested`` (telemetry's: the trial's steady steps are already far slower than the incumbent)
is read beside the trial slots (``Service.control``) and cancels the running job; the trial ends
``stopped_slow`` with the cost it ran up and the steps it reported. A request for a trial not running here
(finished already, or a previous life's) changes nothing. A ``StudyCancelled`` (read the same way) cancels
every running trial of the study — each ends ``cancelled`` with the cost it ran up, marked ``infrastructure``:
not the candidate's doing — and its queued trials end ``cancelled`` unrun, until a ``StudyResumed``.

State lives under ``<data_dir>/launcher/trials/<trial>/`` (job.json, pids.json, node logs, probe files,
finished.json). On start the launcher reaps what a previous life left: every tagged process is killed,
every worktree removed, and a trial that was running is marked abandoned; when its ``TrialProposed`` is
redelivered it is reported ``cancelled`` with the cost it had run up (its step ids are already used, so it
cannot be re-run under the same trial id).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import shutil
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import yaml
from infrarsi import events as ev
from infrarsi.backends import Backend, JobHandle, JobResult, JobSpec, SubmitError, backend_class, make_backend
from infrarsi.backends.base import read_json_record
from infrarsi.bus import credentials
from infrarsi.bus.subjects import TELEMETRY_STREAM, telemetry_subject
from infrarsi.runtime import metrics, tracing
from infrarsi.runtime.logs import get_logger
from infrarsi.runtime.service import Outbox, Service
from infrarsi.runtime.settings import PREFIX as SETTINGS_PREFIX
from infrarsi.runtime.settings import JobEnv, Settings, env_var
from infrarsi.study import inputs
from infrarsi.study.contract import (
    BackendSpec,
    Contract,
    ContractError,
    PatchInfo,
    load_patch_library,
    locked_contract,
)
from infrarsi.trial import fswatch, procs, workspace
from infrarsi.trial.checkpoints import CheckpointRequest
from infrarsi.trial.launch import LaunchValueError
from infrarsi.verdicts import policy, stats
from prometheus_client.core import GaugeMetricFamily, Metric

from .downstream import downstream_argv, run_downstream
from .output import GrowingFile, OutputSteps, OutputTail, read_regular
from .relay import StepRelay

log = get_logger(__name__)

POLL_S = 0.05
TAIL_S = 0.005
TAIL_MAX_S = 0.05
WATCH_TIMEOUT_S = 0.25
"""With inotify, a safety net: read the probe file at least this often even if no change was signalled."""
OUTPUT_TAIL_CHARS = 4000
SLOW_PREFIX = "stopped_slow: "
"""The cancel reason of a job stopped at telemetry's ``TrialStopRequested`` (and the start of its ``reason``)."""
CANCEL_PREFIX = "study cancelled: "
"""The start of the reason of a trial a ``StudyCancelled`` stopped (or finished unrun)."""


@dataclass(frozen=True)
class Study:
    """What the launcher keeps of a ``StudyCreated``."""

    contract: Contract
    workload_dir: Path
    baseline_ref: str
    locked_files: dict[str, str]
    cluster: ev.ClusterInfo
    locked_inputs: dict[str, str] = field(default_factory=dict)
    """The fingerprints of the workload's inputs outside git at ``init`` (``infrarsi.study.inputs``)."""
    agent_patches: dict[str, str] = field(default_factory=dict)
    """Diffs the study's language model proposed and the proposer's checks accepted (``AgentAnswered``), by
    patch id: patches of this study beside the library, applied with the same checks."""


def _checkpoint_reads(checkpoints: CheckpointRequest) -> list[str]:
    """The checkpoint a restart trial resumes from (another trial's: read, never written)."""
    return [str(checkpoints.resume_from)] if checkpoints.resume_from is not None else []


def _checkpoint_writes(checkpoints: CheckpointRequest) -> list[str]:
    """The directories a verify run saves into, made now: a sandboxed job sees only what is bound for it."""
    made = [d for d in (checkpoints.save_dir, checkpoints.final_weights_dir) if d is not None]
    for directory in made:
        directory.mkdir(parents=True, exist_ok=True)
    return [str(d) for d in made]


def _input_paths(contract: Contract) -> list[str]:
    """The workload's inputs outside git (``workload.inputs``) where the links in the trial's worktree point:
    bound read-only into a sandboxed job, whose links would otherwise point at nothing."""
    repo = Path(contract.workload.repo)
    return [str((repo / rel).absolute()) for rel in contract.workload.inputs]


class Refused(Exception):
    """A trial refused before anything ran: its status and reason."""

    def __init__(self, status: ev.TrialStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class ProbeTail:
    """Follows a growing probe JSONL file and notes when each complete line became visible."""

    def __init__(self, path: Path, t0: float) -> None:
        self.file = GrowingFile(path, t0, re.compile(rb"\n"))
        self.seen_s: list[float] = []

    def poll(self) -> None:
        lines, now = self.file.read_lines()
        self.seen_s.extend(now for line in lines if line.strip())

    def interval_s(self) -> float:
        """How often to poll: 1/20 of a recent step (the launcher's clock within 5 % of a step), 5–50 ms."""
        recent = self.seen_s[-6:]
        if len(recent) < 2:
            return TAIL_S
        step = (recent[-1] - recent[0]) / (len(recent) - 1)
        return min(max(step / 20.0, TAIL_S), TAIL_MAX_S)


class LauncherService(Service):
    name = "launcher"
    consumes = (ev.StudyCreated, ev.TrialProposed, ev.AgentAnswered, ev.TrialStopRequested, ev.StudyCancelled,
                ev.StudyResumed)
    control = (ev.TrialStopRequested, ev.StudyCancelled, ev.StudyResumed)
    ack_wait_s = Settings().launcher_ack_wait_s
    """A TrialProposed left unacked by a dead launcher is redelivered after this long (``INFRARSI_LAUNCHER_ACK_WAIT_S``)."""

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        slots: int | None = None,
        nats_url: str | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.data_dir = Path(data_dir or self.settings.data_dir).absolute()
        self.state_root = self.data_dir / "launcher" / "trials"
        self.concurrency = slots or self.settings.launcher_slots
        self.ack_wait_s = self.settings.launcher_ack_wait_s
        self._nats_url = nats_url
        self.studies: dict[str, Study] = {}
        self.backends: dict[str, Backend] = {}
        self.running: dict[str, tuple[Backend, JobHandle]] = {}
        self.trial_study: dict[str, str] = {}
        """Trial id → its study, for the trials handled in this life (a cancel stops a study's running ones)."""
        self.cancelled: dict[str, str] = {}
        self.trials_by_outcome: Counter[str] = Counter()
        """Trials this life finished, by status (``infrarsi_trials_total``)."""
        self.accelerator_s_by_outcome: dict[str, float] = defaultdict(float)
        """Their accelerator-seconds, by status (``infrarsi_accelerator_seconds_total``)."""
        """Study id → the reason of its ``StudyCancelled``, while it is not resumed."""
        self.reaped = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> LauncherService:
        return cls(settings=settings)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self.state_root.mkdir(parents=True, exist_ok=True)
        self.reaped = await asyncio.to_thread(self._reap_previous_life)
        async for event in self.replay((ev.StudyCreated, ev.AgentAnswered, ev.StudyCancelled, ev.StudyResumed)):
            self._remember(event)
        log.info("launcher ready", studies=len(self.studies), reaped=self.reaped, slots=self.concurrency)

    async def stop(self) -> None:
        for backend in self.backends.values():
            await asyncio.to_thread(backend.close)

    def metric_families(self) -> Iterable[Metric]:
        yield metrics.counter_by("infrarsi_trials", "Trials finished by this launcher, by how they ended", self.name,
                                 "outcome", {k: float(v) for k, v in self.trials_by_outcome.items()})
        yield metrics.counter_by("infrarsi_accelerator_seconds", "Accelerator-seconds of the trials finished, by "
                                 "how they ended (failed and cancelled trials included)", self.name, "outcome",
                                 dict(self.accelerator_s_by_outcome))
        running = GaugeMetricFamily("infrarsi_running_trials", "Trials running now", labels=["service"])
        running.add_metric([self.name], float(len(self.running)))
        yield running

    def status(self) -> dict[str, object]:
        return {"running_trials": sorted(self.running), "slots": self.concurrency, "reaped_at_start": self.reaped}

    def backend(self, options: BackendSpec) -> Backend:
        """One backend per kind and options (two studies on different Slurm partitions get two)."""
        key = options.model_dump_json(exclude={"parallel", "timeout_s"})
        if key not in self.backends:
            backend = make_backend(options.kind, self.state_root, options, self.settings, data_dir=self.data_dir)
            backend.open()
            self.backends[key] = backend
        return self.backends[key]

    def _reap_previous_life(self) -> int:
        """Kill what a killed launcher left; mark its running trials abandoned; remove every worktree.

        A trial whose job a scheduler holds (``submitted.json`` of a backend that ``survives_launcher``) is
        left alone, worktree and all: its redelivered ``TrialProposed`` re-attaches to the job."""
        killed = self.backend(BackendSpec()).reap()
        for tdir in sorted(p for p in self.state_root.iterdir() if p.is_dir()):
            if (tdir / "finished.json").exists() or (tdir / "abandoned.json").exists():
                with contextlib.suppress(workspace.WorkspaceError, OSError):
                    _remove_worktree(tdir / "worktree")
                continue
            submitted = read_json_record(tdir / "submitted.json")
            if submitted is not None and backend_class(submitted["backend"]["kind"]).survives_launcher:
                continue
            with contextlib.suppress(workspace.WorkspaceError, OSError):
                _remove_worktree(tdir / "worktree")
            job = read_json_record(tdir / "job.json")
            now = time.time()
            if job is not None:  # a process of its own: it ran on, orphaned, until reaped now
                started, ended = float(job.get("started_at", now)), now
            elif submitted is not None:
                # a job that died with the launcher (the simulator's threads): it ran until it last wrote its probe
                started = float(submitted.get("started_at", now))
                ended = max([started, *(p.stat().st_mtime for p in (tdir / "probe").glob("*") if p.is_file())])
            else:
                started = ended = now
            (tdir / "abandoned.json").write_text(
                json.dumps({"wall_s": max(0.0, ended - started), "launched": job is not None or submitted is not None})
            )
        return killed

    # ---------------------------------------------------------------- events

    async def handle(self, event: ev.Event, out: Outbox) -> None:
        match event.payload:
            case ev.TrialProposed() as proposed:
                await self._trial(event, proposed, out)
            case ev.TrialStopRequested(reason=reason):
                await self._stop_slow(event.trial_id or "", reason)
            case ev.StudyCancelled(reason=reason, by=by):
                self.cancelled[event.study_id] = f"{reason} (by {by})" if by else reason
                await self._stop_study(event.study_id)
            case ev.StudyResumed():
                self.cancelled.pop(event.study_id, None)
            case _:
                self._remember(event)

    async def give_up(self, event: ev.Event, out: Outbox, reason: str) -> None:
        """A ``TrialProposed`` whose handling kept failing ends as a crashed trial: nobody waits forever."""
        if not isinstance(event.payload, ev.TrialProposed) or not event.trial_id:
            await super().give_up(event, out, reason)
            return
        study = self.studies.get(event.study_id)
        capacity = study.cluster.memory_capacity_bytes if study is not None else 0
        tdir = self.state_root / event.trial_id
        tdir.mkdir(parents=True, exist_ok=True)
        finished = ev.TrialFinished(status="crash", reason=reason, memory_capacity_bytes=capacity, infrastructure=True)
        await self._finish(out, tdir, finished, republish_from=tdir / "probe", trial_id=event.trial_id,
                           study_id=event.study_id)  # fmt: skip

    async def _stop_slow(self, trial_id: str, reason: str) -> None:
        running = self.running.get(trial_id)
        if running is None:
            log.info("stop request for a trial not running here; nothing to stop", trial_id=trial_id)
            return
        backend, handle = running
        await asyncio.to_thread(backend.cancel, handle, f"{SLOW_PREFIX}{reason}")
        log.info("stopping a slow trial", trial_id=trial_id, reason=reason)

    async def _stop_study(self, study_id: str) -> None:
        """Cancel every running trial of a cancelled study; each ends ``cancelled`` with the cost it ran up."""
        reason = f"{CANCEL_PREFIX}{self.cancelled[study_id]}"
        for trial_id, (backend, handle) in list(self.running.items()):
            if self.trial_study.get(trial_id) == study_id:
                await asyncio.to_thread(backend.cancel, handle, reason)
                log.info("stopping a trial of a cancelled study", trial_id=trial_id, study_id=study_id)

    def _remember(self, event: ev.Event) -> None:
        match event.payload:
            case ev.StudyCancelled(reason=reason, by=by):
                self.cancelled[event.study_id] = f"{reason} (by {by})" if by else reason
            case ev.StudyResumed():
                self.cancelled.pop(event.study_id, None)
            case ev.StudyCreated():
                self._remember_study(event)
            case ev.AgentAnswered(patches=patches) if event.study_id in self.studies:
                self.studies[event.study_id].agent_patches.update({p.patch_id: p.diff for p in patches})
            case _:
                pass

    def _remember_study(self, event: ev.Event) -> None:
        created = event.payload
        assert isinstance(created, ev.StudyCreated)
        try:
            contract = locked_contract(created)
        except ContractError as exc:
            log.error("unusable contract in StudyCreated", study_id=event.study_id, error=str(exc))
            return
        self.studies[event.study_id] = Study(
            contract=contract,
            workload_dir=Path(created.workload_dir),
            baseline_ref=created.baseline_ref,
            locked_files=dict(created.locked_files),
            cluster=created.cluster,
            locked_inputs=dict(created.locked_inputs),
        )

    async def _trial(self, event: ev.Event, proposed: ev.TrialProposed, out: Outbox) -> None:
        trial_id = event.trial_id
        if not trial_id:
            raise ValueError("TrialProposed without a trial id")
        study = self.studies.get(event.study_id)
        if study is None:
            raise LookupError(f"study {event.study_id} unknown to the launcher (no StudyCreated yet)")
        tdir = self.state_root / trial_id
        finished_file = tdir / "finished.json"
        if finished_file.exists():  # redelivered after we published but before the ack
            await out.emit(msgspec.json.decode(finished_file.read_bytes(), type=ev.TrialFinished))
            return
        self.trial_study[trial_id] = event.study_id
        if event.study_id in self.cancelled and not (tdir / "submitted.json").exists():
            tdir.mkdir(parents=True, exist_ok=True)  # queued when the study was cancelled: it never runs
            unrun = ev.TrialFinished(status="cancelled", reason=f"{CANCEL_PREFIX}{self.cancelled[event.study_id]}",
                                     infrastructure=True, memory_capacity_bytes=study.cluster.memory_capacity_bytes)
            await self._finish(out, tdir, unrun, republish_from=tdir / "probe", trial_id=trial_id,
                               study_id=event.study_id)
            return
        launcher = study.contract.workload.launcher
        ranks = launcher.nnodes * launcher.nproc_per_node
        if (submitted := read_json_record(tdir / "submitted.json")) is not None and not (tdir / "abandoned.json").exists():
            finished = await self._reattach(submitted, proposed.candidate, study, tdir)
            if finished is not None:
                with contextlib.suppress(workspace.WorkspaceError, OSError):
                    await asyncio.to_thread(_remove_worktree, tdir / "worktree")
                await self._finish(out, tdir, finished, republish_from=tdir / "probe", trial_id=trial_id, study_id=event.study_id)
                return
        if (abandoned := read_json_record(tdir / "abandoned.json")) is not None:
            wall = float(abandoned.get("wall_s", 0.0))
            await self._finish(
                out, tdir, ev.TrialFinished(
                    status="cancelled", reason="the launcher was stopped or killed mid-trial; its processes were reaped",
                    infrastructure=True, wall_s=wall, ranks=ranks, accelerator_s=ranks * wall, warmup_accelerator_s=ranks * wall,
                    memory_capacity_bytes=study.cluster.memory_capacity_bytes,
                    steps_completed=len(_rank0_records(tdir / "probe")),
                ),
                republish_from=tdir / "probe", trial_id=trial_id, study_id=event.study_id,
            )  # fmt: skip
            return
        tdir.mkdir(parents=True, exist_ok=True)
        try:
            finished = await self._run(event, proposed, study, tdir, out)
        except Refused as refused:
            finished = ev.TrialFinished(
                status=refused.status, reason=refused.reason, ranks=ranks,
                memory_capacity_bytes=study.cluster.memory_capacity_bytes,
            )  # fmt: skip
        except asyncio.CancelledError:
            # The service is stopping: the job dies with us; the next life reports the trial cancelled.
            await asyncio.shield(asyncio.to_thread(self._abort, trial_id, tdir))
            raise
        finally:
            with contextlib.suppress(workspace.WorkspaceError, OSError):
                await asyncio.to_thread(_remove_worktree, tdir / "worktree")
        await self._finish(out, tdir, finished, republish_from=tdir / "probe", trial_id=trial_id, study_id=event.study_id)

    def _abort(self, trial_id: str, tdir: Path) -> None:
        running = self.running.pop(trial_id, None)
        if running is not None:
            backend, handle = running
            backend.cancel(handle, "launcher stopping")
            backend.collect(handle)
        with contextlib.suppress(workspace.WorkspaceError, OSError):
            _remove_worktree(tdir / "worktree")

    async def _finish(
        self, out: Outbox, tdir: Path, finished: ev.TrialFinished, *, republish_from: Path, trial_id: str, study_id: str
    ) -> None:
        await self._republish(republish_from, trial_id, study_id)
        (tdir / "finished.json").write_bytes(msgspec.json.encode(finished))
        await out.emit(finished)
        self.trials_by_outcome[finished.status] += 1
        self.accelerator_s_by_outcome[finished.status] += finished.accelerator_s
        log.info("trial finished", status=finished.status, reason=finished.reason[:200], wall_s=round(finished.wall_s, 2))

    # ---------------------------------------------------------------- one trial

    async def _run(
        self, event: ev.Event, proposed: ev.TrialProposed, study: Study, tdir: Path, out: Outbox
    ) -> ev.TrialFinished:
        contract = study.contract.with_study_patches(study.agent_patches)
        candidate = proposed.candidate
        problems = contract.candidate_problems(candidate.knobs, candidate.patches)
        if proposed.steps is not None and proposed.steps < 1:
            problems.append(f"steps: {proposed.steps} is not a positive horizon")
        if problems:
            raise Refused("scope_violation", "; ".join(problems))

        worktree = tdir / "worktree"
        await asyncio.to_thread(_remove_worktree, worktree)
        await asyncio.to_thread(workspace.materialise, study.workload_dir, study.baseline_ref, worktree)
        patch_paths = await asyncio.to_thread(self._copy_patches, study, worktree, tdir, candidate.patches)
        result = await asyncio.to_thread(
            workspace.apply_patches, worktree, patch_paths, contract.editable, study.locked_files
        )
        if not result.ok:
            raise Refused(result.kind or "scope_violation", f"patch {result.patch or '(set)'}: {result.reason}")
        await asyncio.to_thread(self._place_inputs, study, contract, worktree)

        trial_contract = contract.model_copy(
            update={"workload": contract.workload.model_copy(update={"repo": worktree})}
        )
        # the per-trial copy keeps the golden file's format: a job that reads its JSON config reads JSON
        as_json = (contract.workload.launch_file or "").endswith(".json")
        launch_path = tdir / ("launch.json" if as_json else "launch.yaml")
        probe_dir = tdir / "probe"
        try:
            launch = trial_contract.trial_launch(
                candidate.knobs, proposed.steps, python=sys.executable, launch_file=str(launch_path),
                probe_dir=str(probe_dir),
            )  # fmt: skip
        except (LaunchValueError, OSError) as exc:
            raise Refused("scope_violation", str(exc)) from None
        if launch.launch_file is not None:
            launch_path.write_text(json.dumps(launch.launch_file, indent=2) if as_json
                                   else yaml.safe_dump(launch.launch_file, sort_keys=False))  # fmt: skip
        shutil.rmtree(probe_dir, ignore_errors=True)
        probe_dir.mkdir(parents=True)
        checkpoints = self._verify_checkpoints(proposed, contract, tdir)
        spec = JobSpec(
            name=event.trial_id or "",
            argv=launch.argv,
            workdir=worktree,
            env=self._job_env(event, study, probe_dir, launch.env, retry_of=proposed.retry_of,
                              deterministic=proposed.kind == "verify" and contract.invariants.parity == "bitwise",
                              checkpoints=checkpoints),
            state_dir=tdir,
            launcher=contract.workload.launcher.kind,
            nnodes=contract.workload.launcher.nnodes,
            nproc_per_node=contract.workload.launcher.nproc_per_node,
            memory_capacity_bytes=_emulated_capacity(study.cluster),
            isolation=contract.backend.isolation,
            read_only=[*([str(launch_path)] if launch.launch_file is not None else []), *contract.backend.read_only,
                       *_input_paths(contract), *_checkpoint_reads(checkpoints)],
            writable=[str(probe_dir), *_checkpoint_writes(checkpoints)],
            hidden=[str(self.data_dir)],
        )
        stall_before = procs.cpu_stall_s()
        harness_before = procs.cpu_seconds(self._harness_pids())
        try:
            backend = self.backend(contract.backend)
            handle = await asyncio.to_thread(backend.submit, spec)
        except (OSError, SubmitError) as exc:
            # e.g. a command item that is not an executable (``"{launch_file}; touch x"``: no shell, so one
            # literal path), a scheduler refusing the job, or a backend that cannot open (no kubeconfig):
            # nothing ran, and retrying cannot help.
            raise Refused("crash", f"the job could not be started: {type(exc).__name__}: {exc} (argv {spec.argv[:4]!r})") from None
        (tdir / "submitted.json").write_text(
            json.dumps({"backend": contract.backend.model_dump(mode="json"), "job_id": handle.job_id,
                        "started_at": handle.started_at, "spec": _spec_to_json(spec)})
        )  # fmt: skip
        await out.emit(
            ev.TrialLaunched(
                backend=backend.name, workdir=str(worktree), command=handle.command, nodes=spec.nnodes,
                ranks=spec.ranks, host=handle.host, job_id=handle.job_id, isolation=handle.isolation,
            )
        )  # fmt: skip
        finished = await self._follow_job(backend, handle, time.monotonic(), (stall_before, harness_before), candidate,
                                          study)  # fmt: skip
        written = await asyncio.to_thread(self._inputs_drift, study, contract)
        if written and finished.status not in ("scope_violation", "cancelled"):
            finished = msgspec.structs.replace(finished, status="scope_violation", reason=(
                "the trial changed its read-only inputs: " + "; ".join(written[:5])))  # fmt: skip
        downstream = contract.verify.downstream
        if checkpoints.final_weights_dir is not None and downstream is not None and finished.status == "ok":
            argv = downstream_argv(downstream, python=sys.executable, launch_file=str(launch_path),
                                   weights=checkpoints.final_weights_dir)
            evaluated = await asyncio.to_thread(run_downstream, downstream, argv, cwd=worktree, env=spec.env)
            log.info("downstream evaluated", metric=evaluated.metric, value=evaluated.value,
                     error=evaluated.error[:200])  # fmt: skip
            finished = msgspec.structs.replace(finished, downstream=evaluated)
        return finished

    @staticmethod
    def _inputs_drift(study: Study, contract: Contract) -> list[str]:
        workload = contract.workload
        if not workload.inputs:
            return []
        return inputs.changed(workload.repo, workload.inputs, study.locked_inputs,
                              hash_limit_bytes=workload.inputs_hash_limit_bytes)  # fmt: skip

    def _place_inputs(self, study: Study, contract: Contract, worktree: Path) -> None:
        """The workload's inputs outside git, unchanged since ``init``, linked into the trial's worktree."""
        workload = contract.workload
        if not workload.inputs:
            return
        drift = self._inputs_drift(study, contract)
        if drift:  # the policy's data_change class: its rule says who may change data; the loss needs re-verifying
            raise Refused("scope_violation", policy.data_change_refusal(contract.apply_policy, drift, datetime.now(UTC)))
        try:
            inputs.link_inputs(workload.repo, worktree, workload.inputs)
        except (inputs.InputError, OSError) as exc:
            raise Refused("crash", f"the job's inputs could not be placed in the trial: {exc}") from None

    def _verify_checkpoints(
        self, proposed: ev.TrialProposed, contract: Contract, tdir: Path
    ) -> CheckpointRequest:
        """What a verify run is told to save or resume (``verify.checkpoint_restart``, ``verify.downstream``).

        A run from step zero saves its checkpoint under its state directory (which outlives its worktree), so a
        later restart trial can resume from it; a restart trial resumes from the named trial's checkpoint and
        saves nothing. Only runs from step zero are evaluated downstream."""
        if proposed.kind != "verify":
            return CheckpointRequest()
        restart, downstream = contract.verify.checkpoint_restart, contract.verify.downstream
        if proposed.resume_from is not None:
            source = self.state_root / proposed.resume_from / "checkpoint"
            if restart is None:
                raise Refused("scope_violation", "a restart trial under a contract without verify.checkpoint_restart")
            if not source.is_dir():
                raise Refused("crash", f"trial {proposed.resume_from} left no checkpoint to resume from ({source})")
            return CheckpointRequest(resume_from=source)
        horizon = proposed.steps if proposed.steps is not None else contract.workload.verify_steps
        save = restart is not None and restart.step_for(horizon) < horizon
        final = tdir / "final" if downstream is not None else None
        for made in (tdir / "checkpoint", final):
            if made is not None:
                shutil.rmtree(made, ignore_errors=True)
        return CheckpointRequest(
            save_dir=tdir / "checkpoint" if save else None,
            save_after_steps=restart.step_for(horizon) if save and restart is not None else None,
            final_weights_dir=final,
        )

    async def _reattach(
        self, submitted: dict[str, Any], candidate: ev.Candidate, study: Study, tdir: Path
    ) -> ev.TrialFinished | None:
        """Follow the job a previous life submitted to a scheduler; ``None`` when there is none to follow
        (the trial is then marked abandoned, as a local job would be)."""
        options = BackendSpec.model_validate(submitted["backend"])
        backend = self.backend(options)
        spec = _spec_from_json(submitted["spec"]) if backend.survives_launcher else None
        handle = await asyncio.to_thread(backend.attach, spec) if spec is not None else None
        if spec is None or handle is None:
            started = float(submitted.get("started_at", time.time()))
            (tdir / "abandoned.json").write_text(json.dumps({"wall_s": max(0.0, time.time() - started), "launched": True}))
            return None
        log.info("re-attached to a running job", trial_id=spec.name, job_id=handle.job_id, backend=backend.name)
        # The launcher's clock restarts where the job's submit was; the probe lines already written are seen
        # now (later than they appeared), which only makes the timing invariant stricter for this trial.
        t0 = time.monotonic() - max(0.0, time.time() - handle.started_at)
        before = (procs.cpu_stall_s(), procs.cpu_seconds(self._harness_pids()))
        return await self._follow_job(backend, handle, t0, before, candidate, study)

    async def _follow_job(
        self, backend: Backend, handle: JobHandle, t0: float, before: tuple[float | None, dict[int, float]],
        candidate: ev.Candidate,
        study: Study,
    ) -> ev.TrialFinished:  # fmt: skip
        """Poll the job (timeout, probe tail, output steps) until it ends; collect; account."""
        spec = handle.spec
        timeout_s = study.contract.backend.timeout_s
        self.running[spec.name] = (backend, handle)
        cancelled = self.cancelled.get(self.trial_study.get(spec.name, ""))
        if cancelled is not None:  # the study was cancelled while this trial was being prepared
            await asyncio.to_thread(backend.cancel, handle, f"{CANCEL_PREFIX}{cancelled}")
        try:
            tail = ProbeTail(spec.state_dir / "probe" / "probe-rank0.jsonl", t0)
            tailing = asyncio.create_task(_follow(tail))
            study_id = spec.env.get(env_var("study"), "")
            relaying = asyncio.create_task(self._relay(spec.state_dir / "probe", study_id, spec.name).follow())
            output = _output_tail(study.contract, spec.state_dir, t0)
            # a coarse job's lines are timed as they appear (woken by inotify), not when the loop below polls
            # the job: at a 50 ms poll, 25 ms steps read as bursts and the printed times as 40 % off
            following = asyncio.create_task(_follow_output(output)) if output is not None else None
            try:
                while not await asyncio.to_thread(backend.poll, handle):
                    if time.monotonic() - t0 > timeout_s:
                        await asyncio.to_thread(backend.cancel, handle, f"timeout: still running after {timeout_s:g}s")
                    await asyncio.sleep(POLL_S)
            finally:
                tailing.cancel()
                if following is not None:
                    following.cancel()
                relaying.cancel()
            tail.poll()
            job = await asyncio.to_thread(backend.collect, handle)
        finally:
            self.running.pop(spec.name, None)
        stall_before, harness_before = before
        stall_after = procs.cpu_stall_s()
        harness_after = procs.cpu_seconds(self._harness_pids())
        pressure = None
        if stall_before is not None and stall_after is not None and job.wall_s > 0:
            pressure = min(1.0, max(0.0, (stall_after - stall_before) / job.wall_s))
        # processes that lived through the whole trial: one started or ended inside it would count part of its life
        harness_s = sum(harness_after[pid] - harness_before[pid] for pid in harness_after.keys() & harness_before)
        finished = msgspec.structs.replace(self._account(job, spec, tail, candidate, study), cpu_pressure=pressure,
                                           harness_cpu_s=harness_s if harness_before else None)
        if output is not None:
            finished = _with_output_steps(finished, output, job)
        return finished

    def _harness_pids(self) -> list[int]:
        """The harness's processes on this host, where the embedded stack runs here: the services, the bus and
        the command that started them (``stack.json``, ``nats-server.json`` under the data directory); none
        when the stack runs elsewhere (containers, a cluster)."""
        from infrarsi.bus.embedded import server_state
        from infrarsi.runtime.stack import stack_state

        pids: set[int] = set()
        if (record := stack_state(self.data_dir).read()) is not None:
            pids.add(record["pid"])
            pids.update(int(p) for p in (record.get("services") or {}).values())
        if (server := server_state(self.data_dir).read()) is not None:
            pids.add(server["pid"])
        return sorted(pids)

    def _copy_patches(self, study: Study, worktree: Path, tdir: Path, patch_ids: list[str]) -> list[Path]:
        """The candidate's diffs, copied out of the pristine worktree (the agent's: written from the study's
        ``AgentAnswered``) before anything is applied."""
        if not patch_ids:
            return []
        dest = tdir / "patches"
        dest.mkdir(exist_ok=True)
        library: dict[str, PatchInfo] = {}
        if any(p not in study.agent_patches for p in patch_ids):
            try:
                library = load_patch_library(worktree / study.contract.workload.patch_dir)
            except ContractError as exc:
                raise Refused("patch_conflict", f"patch library unreadable: {exc}") from None
        paths = []
        for patch_id in patch_ids:
            if patch_id in study.agent_patches:
                target = dest / f"{patch_id}.patch"
                target.write_text(study.agent_patches[patch_id], errors="surrogateescape")
                paths.append(target)
                continue
            info = library.get(patch_id)
            if info is None:
                raise Refused("scope_violation", f"patch {patch_id!r} is not in the workload's patch library")
            target = dest / f"{patch_id}.patch"
            shutil.copyfile(info.path, target)
            paths.append(target)
        return paths

    def _job_env(self, event: ev.Event, study: Study, probe_dir: Path, workload_env: dict[str, str], *,
                 retry_of: str | None = None, deterministic: bool = False,
                 checkpoints: CheckpointRequest | None = None) -> dict[str, str]:  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(SETTINGS_PREFIX)}
        if self.settings.log_level is not None:
            env[env_var("log_level")] = self.settings.log_level
        env.update(workload_env)
        # No bus address and no seed: the job's probe writes its files, and the launcher relays its own steps
        # (``relay.StepRelay``). A job holds no secret, whatever backend runs it (docs/security.md).
        job = JobEnv(
            study=event.study_id,
            trial=event.trial_id,
            probe_dir=probe_dir,
            cluster=study.cluster.cluster_id,
            traceparent=tracing.traceparent(),
            peak_flops=float(study.cluster.peak_flops) if study.cluster.peak_flops else None,
            retry_of=retry_of,
            deterministic=True if deterministic else None,
            **(checkpoints or CheckpointRequest()).job_env(),
        )
        env.update(job.to_env())
        if deterministic:  # cuBLAS reads it when it starts, perhaps before the probe can set it
            env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        env["PYTHONUNBUFFERED"] = "1"
        env.pop(credentials.NKEY_FILE_ENV, None)
        return env

    def nats_url(self) -> str:
        if self._nats_url:
            return self._nats_url
        url = self.bus.nc.connected_url
        return url.geturl() if url is not None else self.settings.nats_url or ""

    def _account(
        self, job: JobResult, spec: JobSpec, tail: ProbeTail, candidate: ev.Candidate, study: Study
    ) -> ev.TrialFinished:
        """Status, reason and cost of a finished job (docs/trials.md, "How a trial ends")."""
        records = _rank0_records(spec.state_dir / "probe")
        capacity = study.cluster.memory_capacity_bytes
        censored = None
        cut_short = False  # stopped by the study's cancel: not the candidate's doing either
        if job.infrastructure_failure is not None:
            # marked ``infrastructure`` below: it costs, it says nothing of the candidate, it is run again
            status: ev.TrialStatus = "cancelled"
            reason = f"{job.infrastructure_failure}: not the candidate's doing"
        elif job.oom:
            status = "oom"
            reason = job.oom_detail
            probe_peak = max((r.peak_memory_bytes for r in _all_records(spec.state_dir / "probe")), default=0)
            if spec.memory_capacity_bytes:  # emulated: the watchdog's last sample is the bound
                censored = max(job.peak_memory_bytes, probe_peak)
            else:  # a device OOM: the allocation that failed went past the capacity
                censored = max(capacity, probe_peak)
        elif job.cancelled is not None and job.cancelled.startswith("timeout"):
            status, reason = "timeout", job.cancelled
        elif job.cancelled is not None and job.cancelled.startswith(SLOW_PREFIX):
            status, reason = "stopped_slow", job.cancelled
        elif job.cancelled is not None and job.cancelled.startswith(CANCEL_PREFIX):
            status, reason, cut_short = "cancelled", job.cancelled, True
        elif job.cancelled is not None:
            status, reason = "cancelled", job.cancelled
        elif job.exit_code == 0:
            status, reason = "ok", ""
        else:
            error = _last_error_line(job.output_tail)
            if candidate.patches:
                status = "patch_conflict" if len(candidate.patches) > 1 else "crash"
                prefix = "run-time conflict: " if status == "patch_conflict" else ""
                reason = f"{prefix}patched job ({', '.join(candidate.patches)}) crashed with exit code {job.exit_code}: {error}"
            else:
                status, reason = "crash", f"job crashed with exit code {job.exit_code}: {error}"
        ranks = spec.ranks
        wall = job.wall_s
        seen = tail.seen_s[: len(records)]
        warmup_end = wall
        if records and seen:
            warmup = stats.detect_warmup([r.step_time_s for r in records])
            warmup_end = seen[warmup - 1] if warmup >= 1 else max(0.0, seen[0] - records[0].step_time_s)
            if status != "ok" and len(records) < 3:
                warmup_end = wall
        warmup_end = min(warmup_end, wall)
        # A scheduler's accounting (Slurm's sacct) is the cost when there is one; else ranks × the launcher's clock.
        accelerator_s = job.accelerator_s if job.accelerator_s is not None else ranks * wall
        return ev.TrialFinished(
            status=status,
            reason=reason,
            exit_code=job.exit_code,
            wall_s=wall,
            ranks=ranks,
            accelerator_s=accelerator_s,
            warmup_accelerator_s=accelerator_s * warmup_end / wall if wall > 0 else 0.0,
            steady_accelerator_s=accelerator_s * (wall - warmup_end) / wall if wall > 0 else 0.0,
            peak_memory_bytes=job.peak_memory_bytes,
            censored_peak_bytes=censored,
            memory_capacity_bytes=capacity,
            steps_completed=len(records),
            step_seen_s=seen,
            output_tail=job.output_tail[-OUTPUT_TAIL_CHARS:],
            infrastructure=job.infrastructure_failure is not None or cut_short,
        )

    def _relay(self, probe_dir: Path, study_id: str, trial_id: str) -> StepRelay:
        """The relay of one trial's probe records onto its own telemetry subject (nothing else)."""
        subject = telemetry_subject(study_id, trial_id)

        async def publish(line: bytes, msg_id: str) -> object:
            return await self.bus.publish_raw(subject, line, msg_id=msg_id, stream=TELEMETRY_STREAM)

        return StepRelay(probe_dir, study_id, trial_id, publish)

    async def _republish(self, probe_dir: Path, trial_id: str, study_id: str) -> None:
        """Every probe record of this trial on the bus, with the probe's msg id: what the live relay has sent
        is dropped by JetStream's dedup, steps it missed (a bus hiccup, a record written as the job died)
        arrive now. Records of another study or trial are never published (``relay.own_step``)."""
        relay = self._relay(probe_dir, study_id, trial_id)
        await relay.poll()
        if relay.refused:
            log.warning("probe records not this trial's steps were not published", trial_id=trial_id,
                        refused=relay.refused)  # fmt: skip


def _output_tail(contract: Contract, tdir: Path, t0: float) -> OutputTail | None:
    """For a coarse trial: a tail of rank 0's output (the backend's ``node0.log``), counting steps by the
    contract's step pattern and reading the losses and step times the job prints."""
    measurement = contract.workload.measurement
    if measurement.kind != "coarse":
        return None
    return OutputTail(tdir / "node0.log", t0, OutputSteps(measurement.step_regex, measurement.log_patterns()))


def _with_output_steps(finished: ev.TrialFinished, output: OutputTail, job: JobResult) -> ev.TrialFinished:
    """A coarse trial's ``TrialFinished``: the steps its output showed, and the cost split at the first one."""
    output.poll(final=True)
    if not output.read_any:  # a backend that keeps no node log here: the output's tail, without times
        output.counter.feed_text(job.output_tail, -1.0)
    seen = output.counter.seen
    first = next((s.seen_s for s in seen if s.seen_s >= 0), None)
    warmup_end = min(first, finished.wall_s) if first is not None else finished.wall_s
    return msgspec.structs.replace(
        finished,
        steps_completed=output.counter.steps_done,
        output_steps=list(seen),
        output_losses=output.counter.loss_curve(),
        output_eval_losses=output.counter.eval_curve(),
        output_step_times=list(output.counter.step_times),
        output_tokens=output.counter.tokens,
        output_micro_batches=output.counter.micro_batches,
        warmup_accelerator_s=finished.ranks * warmup_end,
        steady_accelerator_s=finished.ranks * (finished.wall_s - warmup_end),
    )


async def _follow(tail: ProbeTail) -> None:
    """Read the probe file as soon as it grows: its arrival times are the launcher's own clock for the timing
    invariant. Woken by inotify where the kernel has it (a wake-up per record), else polled."""

    async def read() -> None:
        tail.poll()

    await fswatch.follow(tail.file.path.parent, read, wake_timeout_s=WATCH_TIMEOUT_S, poll_interval_s=tail.interval_s)


async def _follow_output(output: OutputTail) -> None:
    """Read a coarse job's output as soon as it grows, so each line's time is the launcher's clock when it
    appeared (the job's Python runs unbuffered: ``PYTHONUNBUFFERED``). Woken by inotify, else polled."""

    async def read() -> None:
        output.poll()

    await fswatch.follow(output.file.path.parent, read, wake_timeout_s=WATCH_TIMEOUT_S, poll_interval_s=lambda: TAIL_S)


def _emulated_capacity(cluster: ev.ClusterInfo) -> int | None:
    """On a CPU host the device capacity is emulated per rank; a GPU enforces its own."""
    if cluster.accelerator.lower() == "cpu" and cluster.memory_capacity_bytes > 0:
        return cluster.memory_capacity_bytes
    return None


def _spec_to_json(spec: JobSpec) -> dict[str, Any]:
    return {**dataclasses.asdict(spec), "workdir": str(spec.workdir), "state_dir": str(spec.state_dir)}


def _spec_from_json(data: dict[str, Any]) -> JobSpec:
    return JobSpec(**{**data, "workdir": Path(data["workdir"]), "state_dir": Path(data["state_dir"])})


def _all_records(probe_dir: Path) -> list[ev.TrialStep]:
    out = []
    for path in sorted(probe_dir.glob("probe-rank*.jsonl")) if probe_dir.is_dir() else []:
        out += _decode_records(path)
    return out


def _rank0_records(probe_dir: Path) -> list[ev.TrialStep]:
    path = probe_dir / "probe-rank0.jsonl"
    return sorted(_decode_records(path), key=lambda r: r.step) if path.exists() else []


def _decode_records(path: Path) -> list[ev.TrialStep]:
    try:
        data = read_regular(path)  # the job's own file: never through a link, never blocking on a FIFO
    except FileNotFoundError:
        return []
    return [e.payload for e in ev.decode_each(data.splitlines()) if isinstance(e.payload, ev.TrialStep)]


def _last_error_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "Exception" in line or "error:" in line:
            return line[:300]
    return lines[-1][:300] if lines else "(no output)"


def _remove_worktree(path: Path) -> None:
    if not path.exists():
        return
    try:
        workspace.remove(path)
    except workspace.WorkspaceError:
        shutil.rmtree(path, ignore_errors=True)
