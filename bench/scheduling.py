"""Scheduling overhead per trial: the local backend vs Slurm, side by side in one run.

    make slurm-up && export SLURM_CONF=/run/infrarsi-slurm/slurm.conf
    python bench/scheduling.py --trials 5 --json OUT.json

The real launcher service runs in this process against an embedded nats-server; a tiny job (no torch: it
writes three probe steps of 50 ms, then its own end time) is proposed ``--trials`` times per backend,
alternating local and slurm so drift hits both. Per trial:

- **submit → first step**: ``TrialFinished.step_seen_s[0]``, the launcher's own clock from its submit to the
  first probe line it saw, minus the job's own time to that line (its start, measured by the job itself);
- **finish → TrialFinished**: from the job's last act (its end time, written by the job) to the moment this
  process receives ``TrialFinished`` on the bus.

Prints the medians per backend and their ratio; ``--json`` writes every sample.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import yaml
from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.bus.embedded import EmbeddedServer
from infrarsi.commands.init import prepare_study, study_created_event
from infrarsi.runtime.service import Runner
from infrarsi_services.launcher.service import LauncherService

JOB = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import yaml
    from infrarsi import events as ev

    started = time.time()
    launch = yaml.safe_load(open(sys.argv[1]))
    probe = Path(sys.argv[2])
    out = open(probe / "probe-rank0.jsonl", "ab", buffering=0)
    first_at = None
    for i in range(launch["run"]["steps"]):
        t0 = time.perf_counter()
        time.sleep(launch["knobs"]["sleep"])
        step = ev.TrialStep(rank=0, world_size=1, step=i, loss=1.0, step_time_s=time.perf_counter() - t0, tokens=1,
                            optimizer_steps=i + 1, peak_memory_bytes=1, flops=1.0)
        event = ev.make_event(step, study_id=os.environ["INFRARSI_STUDY"], trial_id=os.environ["INFRARSI_TRIAL"],
                              source="probe", event_id=ev.derived_id(os.environ["INFRARSI_TRIAL"], "0", "step", str(i)))
        out.write(ev.encode(event) + b"\\n")
        first_at = first_at or time.time()
    (probe / "timing.json").write_text(
        '{"first_step_after_start_s": %r, "ended_at": %r}' % (first_at - started, time.time())
    )
    """
)


def make_workload(root: Path, kind: str) -> Path:
    repo = root / "workload"
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "job.py").write_text(JOB)
    (repo / "launch.yaml").write_text(yaml.safe_dump({"run": {"steps": 3}, "knobs": {"sleep": 0.05}}))
    contract = {
        "name": f"sched-{kind}",
        "goal": "measure scheduling overhead",
        "workload": {"repo": "workload", "command": ["{python}", "job.py", "{launch_file}", "{probe_dir}"],
                     "launch_file": "launch.yaml", "steps": 3, "steps_key": "run.steps", "verify_steps": 3},
        "cluster": {"id": "bench-cpu", "accelerator": "cpu", "memory_capacity_bytes": 1 << 30, "peak_flops": 1e11},
        "backend": {"kind": kind, "timeout_s": 120},
        "scope": {"files": ["*.py"], "launch_keys": ["knobs.sleep"]},
        "search_space": {"knobs": {"knobs.sleep": {"type": "float", "low": 0.0, "high": 1.0}}},
        "invariants": {"loss": {"tolerance": 0.01, "at": "every_eval"}},
        "budget": {"trials": 100, "accelerator_hours": 1.0},
    }  # fmt: skip
    path = root / "contract.yaml"
    path.write_text(yaml.safe_dump(contract))
    return path


async def bench(trials: int, work: Path) -> dict[str, list[dict[str, float]]]:
    server = EmbeddedServer.start(work / "nats")
    data_dir = work / "data"
    bus = await Bus.connect(server.url, service="bench")
    finished_at: dict[str, tuple[float, ev.TrialFinished]] = {}
    arrived = asyncio.Event()

    async def on_msg(msg) -> None:
        event = ev.decode(msg.data)
        if isinstance(event.payload, ev.TrialFinished) and event.trial_id:
            finished_at[event.trial_id] = (time.time(), event.payload)
            arrived.set()

    await bus.nc.subscribe("irsi.*.TrialFinished", cb=on_msg)
    launcher_bus = await Bus.connect(server.url, service="launcher")
    runner = Runner(LauncherService(data_dir, nats_url=server.url), launcher_bus, grace_s=5.0)
    task = asyncio.create_task(runner.run())
    studies = {}
    for kind in ("local", "slurm"):
        prepared = prepare_study(make_workload(work / kind, kind), data_dir)
        await bus.publish(study_created_event(prepared))
        studies[kind] = prepared.study_id
    samples: dict[str, list[dict[str, float]]] = {"local": [], "slurm": []}
    try:
        for i in range(trials * 2):
            kind = ("local", "slurm")[i % 2]
            trial = ev.new_id()
            proposal = ev.TrialProposed(candidate=ev.Candidate(), candidate_key=ev.Candidate().key(), kind="search",
                                        origin="manual")  # fmt: skip
            await bus.publish(ev.make_event(proposal, study_id=studies[kind], trial_id=trial, source="bench"))
            while trial not in finished_at:
                arrived.clear()
                await asyncio.wait_for(arrived.wait(), 300)
            received, finished = finished_at[trial]
            if finished.status != "ok":
                raise SystemExit(f"{kind} trial {trial} ended {finished.status}: {finished.reason}")
            timing = json.loads((data_dir / "launcher" / "trials" / trial / "probe" / "timing.json").read_text())
            samples[kind].append({
                "submit_to_first_step_s": finished.step_seen_s[0] - timing["first_step_after_start_s"],
                "finish_to_trial_finished_s": received - timing["ended_at"],
                "wall_s": finished.wall_s,
            })  # fmt: skip
            print(f"{kind:5s} {samples[kind][-1]}", flush=True)
    finally:
        runner.stopping.set()
        await asyncio.wait_for(task, 30)
        await launcher_bus.close()
        await bus.close()
        server.stop()
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="trials per backend (default 5)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
        sys.exit("no Slurm cluster answers: `make slurm-up` and export SLURM_CONF=/run/infrarsi-slurm/slurm.conf")
    with tempfile.TemporaryDirectory(prefix="irsi-sched-") as tmp:
        samples = asyncio.run(bench(args.trials, Path(tmp)))
    summary = {}
    for metric in ("submit_to_first_step_s", "finish_to_trial_finished_s"):
        med = {k: statistics.median(s[metric] for s in v) for k, v in samples.items()}
        summary[metric] = {**med, "slurm_over_local": med["slurm"] / med["local"] if med["local"] > 0 else None}
        print(f"{metric}: local {med['local']:.3f} s, slurm {med['slurm']:.3f} s "
              f"(slurm - local {med['slurm'] - med['local']:+.3f} s)")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "samples": samples}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
