"""The ``sim`` backend: a trial runs on the analytic cluster simulator instead of real hardware. SIMULATOR.

A sim workload is a tiny repository (``write_sim_workload`` makes one): a golden ``launch.yaml`` whose keys
are the scenario's knobs (``tp``, ``micro_batch``, ``recompute`` …), and a patch library whose diffs each
add a marker file ``sim/patches/<id>.on``. The launcher treats it like any workload — worktree, scope-checked
``git apply``, launch file, command — and hands the job to this backend, which

1. reads the candidate the way a real job would: knob values from the trial's launch file (``--launch`` in
   the command), patches from the marker files the applied diffs left in the working directory;
2. draws the trial's outcome from the scenario (``Scenario.evaluate``: noise, stragglers, OOM with a
   censoring bound, crashes, invariant-breaking settings), seeded by scenario and trial name, so a re-run of
   the same trial id gives the same numbers;
3. plays the trial out in *scaled* real time on a thread: each optimiser step becomes one ``TrialStep`` per
   rank, written where the probe writes (``$INFRARSI_PROBE_DIR/probe-rank<r>.jsonl``) and published on
   ``irsi.telemetry.<study>.<trial>`` when ``INFRARSI_NATS_URL``/``INFRARSI_TRIAL`` are set, with the probe's
   ``Nats-Msg-Id``; the launcher's clock sees the steps arrive at the pace they report, so the timing
   invariant holds; an OOM ends the job with a CUDA-OOM line in its output and the peak seen before the kill.

Everything it produces says it is simulated: events' ``source`` is ``sim``, the output tail starts with
``SIMULATOR:``, and the handle's host is ``simulator``. Time is scaled (``time_scale`` maps a simulated
second to a wall second; the scenario's 120 s start-up is compressed further) so a study of dozens of trials
runs in seconds; accelerator-seconds are therefore in scaled seconds too, and they are the *simulated* ones
(start-up plus the steps played, per rank), never this host's wall time: a study's course must not depend on
the load of the machine simulating it.
"""

from __future__ import annotations

import math
import os
import subprocess
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from infrarsi import events as ev
from infrarsi.backends.base import Backend, JobHandle, JobResult, JobSpec
from infrarsi.bus.credentials import NKEY_FILE_ENV
from infrarsi.bus.subjects import step_msg_id, telemetry_subject
from infrarsi.modeling.space import Candidate
from infrarsi.runtime.settings import JobEnv, env_var
from infrarsi.study.space import SIM_SCENARIO_ENV

SIM_LABEL = "SIMULATOR"
SOURCE = "sim"
PATCH_MARKER_DIR = "sim/patches"
STEP_S_ENV = env_var("sim_step_s")
"""Wall seconds the scenario's default candidate's step is scaled to (default 0.01)."""
SEED_ENV = env_var("sim_seed")
RETRY_OF_ENV = env_var("retry_of")
DEFAULT_STEP_S = 0.01
MAX_STARTUP_S = 0.2
WARMUP_FACTORS = (3.0, 1.5)
"""The first steps are slower (allocator, autotuning), as in a real job."""
EVAL_EVERY = 5
CRASH_AFTER_STEPS = 2


# --------------------------------------------------------------------------------------------------
# The pure part: a trial's outcome and its step records
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimStep:
    step: int
    step_time_s: float
    """Scaled wall seconds (what the job reports and the launcher's clock sees)."""
    loss: float
    eval_loss: float | None


@dataclass(frozen=True)
class SimTrial:
    """What one simulated job does: its steps, how it ends, what it leaves in its output."""

    status: str
    """The scenario's outcome: ok | oom | crash | invariant_violation."""
    startup_s: float
    steps: tuple[SimStep, ...]
    peak_bytes: int
    exit_code: int
    output: str
    tokens_per_step: int
    mfu: float | None = None


def time_scale(scenario: Any, step_s: float = DEFAULT_STEP_S) -> float:
    """Wall seconds per simulated second: the scenario's default candidate steps in ``step_s``."""
    return step_s / float(scenario.true_step_time(scenario.space.default_candidate()))


def trial_rng(scenario_name: str, trial: str, seed: int = 0) -> np.random.Generator:
    return np.random.default_rng([zlib.crc32(scenario_name.encode()), zlib.crc32(trial.encode()), seed])


def baseline_loss(step: int) -> float:
    """The loss curve every candidate that trains the same model follows (deterministic, so the loss
    invariant compares like with like)."""
    return 2.0 + 6.0 * math.exp(-step / 8.0) + 0.01 * math.sin(step)


def plan_trial(scenario: Any, candidate: Candidate, *, steps: int, rng: np.random.Generator,
               scale: float) -> SimTrial:
    """Draw one trial of ``candidate`` on ``scenario``. Pure given ``rng``."""
    tokens = int(scenario.global_batch * scenario.model.seq_len)
    startup = min(120.0 * scale, MAX_STARTUP_S)
    if not scenario.space.is_feasible(candidate):
        why = ", ".join(scenario.space.violated(candidate))
        return SimTrial("crash", startup, (), 0, 1, f"{SIM_LABEL}: setting rejected by the simulated job: {why}",
                        tokens)
    outcome = scenario.evaluate(candidate, rng)
    jitter = rng.standard_normal(max(steps, 1))  # step-to-step noise, drawn after the trial's own draws
    t = (outcome.step_time_s or scenario.true_step_time(candidate)) * scale

    def step_times(n: int) -> Iterator[tuple[int, float]]:
        for i in range(n):
            warm = WARMUP_FACTORS[i] if i < len(WARMUP_FACTORS) else 1.0
            yield i, t * warm * math.exp(0.01 * float(jitter[i % jitter.size]))

    breaks_loss = outcome.status == "invariant_violation"

    def loss_at(i: int) -> float:
        base = baseline_loss(i)
        return base * (1.0 + 0.2 * min(1.0, (i + 1) / 4)) if breaks_loss else base

    def make(n: int) -> tuple[SimStep, ...]:
        return tuple(SimStep(i, dt, loss_at(i), loss_at(i) + 0.05 if (i + 1) % EVAL_EVERY == 0 else None)
                     for i, dt in step_times(n))

    match outcome.status:
        case "oom":
            return SimTrial("oom", startup, (), int(outcome.peak_bytes or 0), 1,
                            f"{SIM_LABEL}: torch.OutOfMemoryError: CUDA out of memory (simulated; peak seen "
                            f"{int(outcome.peak_bytes or 0)} B of {int(scenario.capacity_bytes)} B)", tokens)
        case "crash":
            return SimTrial("crash", startup, make(min(CRASH_AFTER_STEPS, steps)), 0, 1,
                            f"{SIM_LABEL}: {outcome.detail}", tokens)
        case _:
            b = scenario.breakdown(candidate)
            flops = 6.0 * scenario.model.total_params * tokens
            mfu = flops / (b.step_time_s * scenario.device.peak_bf16_flops * scenario.n_devices)
            detail = f" ({outcome.detail})" if outcome.detail else ""
            return SimTrial(outcome.status, startup, make(steps), int(outcome.peak_bytes or 0), 0,
                            f"{SIM_LABEL}: {steps} steps of {candidate} on {scenario.description}{detail}", tokens,
                            mfu=float(mfu))


def read_candidate(scenario: Any, launch: Mapping[str, Any], workdir: Path) -> Candidate:
    """The candidate a sim job runs: scenario knobs from the launch file (matched by the last component
    of each key, at any depth), the scenario's default for the rest; patches from their marker files."""
    flat = dict(_leaves(launch))
    values = scenario.space.default_candidate().knobs
    for name in values:
        if name in flat:
            values[name] = flat[name]
    patches = [p.id for p in scenario.space.patches if (workdir / PATCH_MARKER_DIR / f"{p.id}.on").exists()]
    return Candidate.of(values, patches)


def _leaves(tree: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from _leaves(value)
        else:
            yield str(key).rsplit(".", 1)[-1], value


# --------------------------------------------------------------------------------------------------
# The backend
# --------------------------------------------------------------------------------------------------


@dataclass
class _SimJob:
    trial: SimTrial
    thread: threading.Thread
    stop: threading.Event = field(default_factory=threading.Event)
    ended_at: float | None = None
    cancelled: str | None = None
    steps_written: int = 0


class SimBackend(Backend):
    """Runs jobs on the simulator (see the module docstring). Jobs are threads of this process."""

    name = "sim"

    def __init__(self, owner: str = "", *, scenario: str | None = None, step_s: float | None = None,
                 publish: bool = True) -> None:
        self.owner = owner
        self.scenario = scenario
        self.step_s = step_s
        self.publish = publish
        self._live: dict[str, JobHandle] = {}

    def live_jobs(self) -> list[JobHandle]:
        return list(self._live.values())

    def submit(self, spec: JobSpec) -> JobHandle:
        from infrarsi.sim.scenarios import get_scenario

        spec.state_dir.mkdir(parents=True, exist_ok=True)
        name = _arg(spec.argv, "--scenario") or spec.env.get(SIM_SCENARIO_ENV) or self.scenario
        if not name:
            raise ValueError(f"job {spec.name}: no simulator scenario (--scenario or ${SIM_SCENARIO_ENV})")
        scenario = get_scenario(name)
        launch_arg = _arg(spec.argv, "--launch")
        if launch_arg is None:
            raise ValueError(f"job {spec.name}: a sim job's command needs --launch <launch file>")
        launch_path = Path(launch_arg) if Path(launch_arg).is_absolute() else spec.workdir / launch_arg
        launch = yaml.safe_load(launch_path.read_text()) or {}
        steps = int(_arg(spec.argv, "--steps") or launch.get("steps", 20))
        candidate = read_candidate(scenario, launch, spec.workdir)
        step_s = self.step_s or float(spec.env.get(STEP_S_ENV, DEFAULT_STEP_S))
        seed = int(spec.env.get(SEED_ENV, "0"))
        # A re-run (after an infrastructure failure, or a timing verdict taken under host interference) is the
        # same simulated experiment: it replays the draw of the trial it re-runs, so whether the host forced a
        # re-run does not change what the study learns (a study is a function of its id, whatever the load).
        draw = spec.env.get(RETRY_OF_ENV) or spec.name
        trial = plan_trial(scenario, candidate, steps=steps, rng=trial_rng(name, draw, seed),
                           scale=time_scale(scenario, step_s))
        started = time.time()
        job = _SimJob(trial=trial, thread=threading.Thread(target=lambda: None))
        job.thread = threading.Thread(target=self._play, args=(spec, job), name=f"sim-{spec.name}", daemon=True)
        handle = JobHandle(job_id=f"sim-{spec.name}", spec=spec, host="simulator",
                           command=[f"<{SIM_LABEL} {name}>", *spec.argv], started_at=started, private=job)
        self._live[spec.name] = handle
        job.thread.start()
        return handle

    def poll(self, handle: JobHandle) -> bool:
        job: _SimJob = handle.private
        if job.ended_at is None and not job.thread.is_alive():
            job.ended_at = time.time()
        return job.ended_at is not None

    def cancel(self, handle: JobHandle, reason: str) -> None:
        job: _SimJob = handle.private
        if job.cancelled is None and job.ended_at is None:
            job.cancelled = reason
        job.stop.set()

    def collect(self, handle: JobHandle) -> JobResult:
        job: _SimJob = handle.private
        job.thread.join()
        ended = job.ended_at or time.time()
        self._live.pop(handle.spec.name, None)
        trial = job.trial
        ranks = handle.spec.ranks
        oom = trial.status == "oom" and job.cancelled is None
        exit_code = -15 if job.cancelled else trial.exit_code
        # The simulated cost, not this host's wall time: the searcher divides expected improvement by a cost
        # fitted on accelerator-seconds, so a wall-time cost made the study's course depend on the host's load
        # (two runs of one study parted after 17 trials). Scaled seconds, like the steps.
        played = trial.steps[: job.steps_written]
        # plain floats: the scenario computes in numpy, and msgspec encodes no numpy scalar into TrialFinished
        accelerator_s = float(ranks * (trial.startup_s + sum(s.step_time_s for s in played)))
        return JobResult(
            exit_code=exit_code,
            wall_s=ended - handle.started_at,
            accelerator_s=accelerator_s,
            oom=oom,
            oom_detail=trial.output if oom else "",
            peak_memory_bytes=trial.peak_bytes,
            peak_per_rank={r: trial.peak_bytes for r in range(ranks)},
            cancelled=job.cancelled,
            output_tail=trial.output + ("" if job.cancelled is None else f"\n{SIM_LABEL}: cancelled: {job.cancelled}"),
        )

    # ---------------------------------------------------------------- playing a trial out

    def _play(self, spec: JobSpec, job: _SimJob) -> None:
        trial = job.trial
        env = JobEnv.from_env(spec.env)
        study = env.study
        trial_id = env.trial or spec.name
        probe_dir = env.probe_dir or spec.state_dir / "probe"
        probe_dir.mkdir(parents=True, exist_ok=True)
        publisher = None
        if self.publish and env.nats_url and env.trial:
            from infrarsi.probe.sinks import NatsPublisher

            publisher = NatsPublisher(env.nats_url, nkey_file=spec.env.get(NKEY_FILE_ENV))
        files = [open(probe_dir / f"probe-rank{r}.jsonl", "ab", buffering=0) for r in range(spec.ranks)]
        headers_extra = {"traceparent": env.traceparent} if env.traceparent else {}
        try:
            if job.stop.wait(trial.startup_s):
                return
            for s in trial.steps:
                if job.stop.wait(s.step_time_s):
                    return
                for rank, fh in enumerate(files):
                    # Plain Python numbers: the simulator computes with numpy, msgspec encodes builtins only.
                    record = ev.TrialStep(
                        rank=rank, world_size=spec.ranks, step=int(s.step), loss=float(s.loss),
                        step_time_s=float(s.step_time_s), phases={}, tokens=int(trial.tokens_per_step),
                        optimizer_steps=int(s.step) + 1, loss_tokens=int(trial.tokens_per_step),
                        peak_memory_bytes=int(trial.peak_bytes), flops=None,
                        mfu=None if trial.mfu is None else float(trial.mfu),
                        eval_loss=None if s.eval_loss is None else float(s.eval_loss),
                        eval_tokens=int(trial.tokens_per_step) // 8 if s.eval_loss is not None else None,
                        wall_time=time.time(),
                    )
                    event = ev.make_event(record, study_id=study, trial_id=trial_id, source=SOURCE, cluster_id=env.cluster,
                                          event_id=ev.derived_id(trial_id, str(rank), "step", str(s.step)))
                    data = ev.encode(event)
                    fh.write(data + b"\n")
                    if publisher is not None:
                        publisher.publish(telemetry_subject(study, trial_id), data,
                                          {"Nats-Msg-Id": step_msg_id(trial_id, rank, int(s.step)), **headers_extra})
                job.steps_written += 1
        finally:
            for fh in files:
                fh.close()
            if publisher is not None:
                publisher.close()


def _arg(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


# --------------------------------------------------------------------------------------------------
# A sim workload and its contract
# --------------------------------------------------------------------------------------------------


def write_sim_workload(root: Path, scenario_name: str, *, knobs: list[str] | None = None,
                       restrict: Mapping[str, list[Any]] | None = None, steps: int = 20,
                       trials: int = 20, accelerator_hours: float = 1.0, parallel: int = 2,
                       git: bool = True) -> dict[str, Any]:
    """Write a sim workload repo under ``root`` and return its contract (a dict for ``contract_from_dict``
    with ``base_dir=root``). ``knobs`` limits the searched knobs (default: all of the scenario's);
    ``restrict`` narrows a knob's choices. The golden launch file holds the scenario's defaults."""
    from infrarsi.modeling.space import BoolKnob, Categorical, FloatRange
    from infrarsi.sim.scenarios import get_scenario

    scenario = get_scenario(scenario_name)
    root = Path(root)
    (root / PATCH_MARKER_DIR).mkdir(parents=True, exist_ok=True)
    (root / PATCH_MARKER_DIR / ".keep").write_text("")
    (root / "README.md").write_text(f"{SIM_LABEL} workload: {scenario.description}. Trials run on the sim backend.\n")
    defaults = scenario.space.default_candidate().knobs
    (root / "launch.yaml").write_text(yaml.safe_dump({**defaults, "steps": steps}, sort_keys=True))
    patch_dir = root / "patches"
    patch_dir.mkdir(exist_ok=True)
    index = []
    for p in scenario.space.patches:
        marker = f"{PATCH_MARKER_DIR}/{p.id}.on"
        (patch_dir / f"{p.id}.patch").write_text(
            f"diff --git a/{marker} b/{marker}\nnew file mode 100644\n--- /dev/null\n+++ b/{marker}\n"
            f"@@ -0,0 +1 @@\n+{p.id}\n")
        entry: dict[str, Any] = {"id": p.id, "description": f"{SIM_LABEL}: {p.description}", "files": [marker],
                                 "risk": p.risk, "conflicts_with": sorted(p.conflicts)}
        if p.time_prior is not None:
            entry["time_log_ratio"] = {"mean": p.time_prior[0], "std": p.time_prior[1]}
        if p.memory_prior is not None:
            entry["memory_log_ratio"] = {"mean": p.memory_prior[0], "std": p.memory_prior[1]}
        index.append(entry)
    (patch_dir / "index.yaml").write_text(yaml.safe_dump({"patches": index}, sort_keys=False))

    names = knobs or [k.name for k in scenario.space.knobs]
    space_knobs: dict[str, Any] = {}
    for name in names:
        k = scenario.space.knob(name)
        allowed = list((restrict or {}).get(name) or [])
        match k:
            case BoolKnob():
                space_knobs[name] = {"type": "bool"}
            case Categorical():
                space_knobs[name] = {"type": "choice", "choices": allowed or list(k.choices)}
            case FloatRange():
                space_knobs[name] = {"type": "float", "low": k.low, "high": k.high, "log": k.log}
            case _:
                space_knobs[name] = {"type": "int", "choices": allowed or list(k.values())}
    if git:
        for args in (["init", "-q"], ["add", "-A"],
                     ["-c", "user.name=infrarsi", "-c", "user.email=sim@infrarsi", "commit", "-q", "-m", "sim workload"]):
            subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
    return {
        "name": f"sim-{scenario_name}".replace("_", "-"),
        "goal": f"{SIM_LABEL}: find a faster setting for {scenario.description}",
        "workload": {
            "repo": str(root),
            "command": ["{python}", "-m", "infrarsi.backends.sim", "--scenario", scenario_name, "--launch",
                        "{launch_file}"],
            "launch_file": "launch.yaml",
            "steps": steps,
            "verify_steps": steps * 2,
            "env": {SIM_SCENARIO_ENV: scenario_name},
        },
        "cluster": {"id": "sim", "accelerator": scenario.device.name, "nodes": 1, "devices_per_node": 1,
                    "memory_capacity_bytes": int(scenario.capacity_bytes),
                    "peak_flops": float(scenario.device.peak_bf16_flops), "interconnect": "simulated"},
        "backend": {"kind": "sim", "parallel": parallel, "timeout_s": 120.0},
        "scope": {"files": [f"{PATCH_MARKER_DIR}/"], "launch_keys": list(names)},
        "search_space": {"knobs": space_knobs, "patches": [p.id for p in scenario.space.patches]},
        "invariants": {"loss": {"tolerance": 0.05}},
        "budget": {"trials": trials, "accelerator_hours": accelerator_hours},
        "doctor": {"repeats": 2},
        "verify": {"top_k": 2, "repeats": 2, "passes_required": 1},
    }


# --------------------------------------------------------------------------------------------------
# ``python -m infrarsi.backends.sim``: the same job as a process (for the local backend or by hand)
# --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m infrarsi.backends.sim",
                                     description=f"{SIM_LABEL}: play one simulated trial out, like a probed job")
    parser.add_argument("--scenario", default=os.environ.get(SIM_SCENARIO_ENV))
    parser.add_argument("--launch", required=True)
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args(argv)
    argv_out = ["--scenario", args.scenario, "--launch", args.launch] + (
        ["--steps", str(args.steps)] if args.steps else [])
    workdir = Path.cwd()
    spec = JobSpec(name=JobEnv.from_env().trial or "local", argv=argv_out, workdir=workdir,
                   env=dict(os.environ), state_dir=workdir / ".infrarsi" / "sim")
    backend = SimBackend()
    handle = backend.submit(spec)
    while not backend.poll(handle):
        time.sleep(0.01)
    result = backend.collect(handle)
    print(result.output_tail, file=sys.stderr if result.exit_code else sys.stdout)
    return int(result.exit_code or 0)


if __name__ == "__main__":
    raise SystemExit(main())
