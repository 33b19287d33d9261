"""A short study on a SIMULATOR scenario against a real nats-server: the sim backend plays trials out (TrialStep
on the telemetry stream, OOMs with their censoring bound), the proposer's and modeler's state machines are driven
by the events read back from the bus, and this test stands in for the launcher and telemetry services."""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from infrarsi import events as ev
from infrarsi.backends.base import JobSpec
from infrarsi.backends.sim import SIM_LABEL, SimBackend, write_sim_workload
from infrarsi.bus.client import TELEMETRY_STREAM, Bus
from infrarsi.bus.embedded import EmbeddedServer
from infrarsi.bus.subjects import telemetry_subject
from infrarsi.commands.study_log import read_study
from infrarsi.study.contract import contract_from_dict
from infrarsi.study.space import load_study_space
from infrarsi_services.modeler.logic import ModelerState
from infrarsi_services.proposer.logic import ProposerState, RunRequested
from support.owned import owned_event

pytestmark = pytest.mark.integration

SCENARIO = "dense7b_h100x64"
KNOBS = ["tp", "pp", "dp", "micro_batch", "recompute", "flash_attention"]
RESTRICT = {"dp": [16, 32, 64], "micro_batch": [1, 2, 4]}


async def read_steps(bus: Bus, study: str, trial_id: str) -> list[ev.TrialStep]:
    events = [e async for e in bus.events(TELEMETRY_STREAM, telemetry_subject(study, trial_id))]
    assert all(e.source == "sim" for e in events)  # labelled as simulated
    return [e.payload for e in events if isinstance(e.payload, ev.TrialStep)]


@pytest.fixture
def server(tmp_path: Path):
    with EmbeddedServer.start(tmp_path / "nats") as s:
        yield s


def _spec(contract, workload: Path, tmp: Path, study: str, trial_id: str, p: ev.TrialProposed, url: str) -> JobSpec:
    """What the launcher would hand the backend: a worktree with the patches applied, the launch file, the env."""
    work = tmp / "trials" / trial_id
    shutil.copytree(workload, work / "worktree", ignore=shutil.ignore_patterns(".git"))
    for patch in p.candidate.patches:
        subprocess.run(["git", "apply", str(workload / "patches" / f"{patch}.patch")], cwd=work / "worktree", check=True)
    launch = work / "launch.yaml"
    import yaml

    launch_dict = yaml.safe_load((workload / "launch.yaml").read_text())
    launch_dict.update(p.candidate.knobs)
    launch.write_text(yaml.safe_dump(launch_dict))
    env = {**contract.workload.env, "INFRARSI_PROBE_DIR": str(work / "probe"), "INFRARSI_STUDY": study,
           "INFRARSI_TRIAL": trial_id, "INFRARSI_NATS_URL": url, "PATH": os.environ.get("PATH", "")}
    argv = contract.command_for(python="python", launch_file=str(launch), probe_dir=str(work / "probe"))
    return JobSpec(name=trial_id, argv=argv, workdir=work / "worktree", env=env, state_dir=work)


async def _measure(bus: Bus, study: str, trial_id: str, p: ev.TrialProposed, expected_steps: int) -> ev.TrialMeasured:
    """Telemetry's job, minimally: the robust centre of the steady steps read back from the telemetry stream."""
    deadline = time.monotonic() + 20
    while True:
        steps = await read_steps(bus, study, trial_id)
        if len(steps) >= expected_steps or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    steady = [s.step_time_s for s in steps if s.step >= 2]
    t = statistics.median(steady)
    ok = all(abs(s.loss - steps[0].loss) < 10 for s in steps)
    return ev.TrialMeasured(
        candidate_key=p.candidate_key, kind=p.kind, status="ok", steps=len(steps), warmup_steps=2, step_time_s=t,
        step_time_mad_s=0.0, step_time_with_warmup_s=statistics.mean(s.step_time_s for s in steps),
        tokens_per_s=steps[0].tokens / t, mfu=steps[0].mfu, flops_per_step=None, phases={},
        peak_memory_bytes=[max(s.peak_memory_bytes for s in steps)], per_rank_step_s=[t], stragglers=[],
        loss_curve=[ev.LossPoint(s.step, s.loss) for s in steps], eval_curve=[], optimizer_steps=steps[-1].optimizer_steps,
        tokens=sum(s.tokens for s in steps), invariants=[], invariants_ok=ok)


async def test_a_short_study_runs_on_the_simulator_through_the_bus(server, tmp_path: Path) -> None:
    workload = tmp_path / "workload"
    data = write_sim_workload(workload, SCENARIO, knobs=KNOBS, restrict=RESTRICT, steps=8, trials=6, parallel=2,
                              accelerator_hours=5.0)
    contract = contract_from_dict(data, base_dir=tmp_path)
    study = ev.new_id()
    bus = await Bus.connect(server.url, service="test")
    backend = SimBackend(str(tmp_path / "sim"))
    proposer, modeler = ProposerState(), ModelerState()
    try:
        await bus.ensure_streams()
        created = ev.StudyCreated(name=contract.name, goal=contract.goal, contract=contract.to_dict(),
                                  contract_sha256=contract.sha256(), workload_dir=str(workload), baseline_ref="HEAD",
                                  locked_files={}, cluster=contract.cluster.info())
        await bus.publish(owned_event(created, study_id=study))
        # RunRequested is not in the catalog yet (see the proposer's docstring): it goes to the states directly,
        # right after the StudyCreated read back from the bus
        run_request = ev.Event(event_id=ev.new_id(), type="RunRequested", study_id=study, cluster_id="sim",
                               source="cli.run", ts=datetime.now(UTC), payload=RunRequested(parallel=2))

        running: dict[str, tuple[object, ev.TrialProposed]] = {}
        next_seq, applied = 1, []
        finished = verify = None
        space = load_study_space(created)
        assert space.scenario == SCENARIO

        async def publish(outputs, cause: ev.Event, source: str) -> None:
            for e in outputs:
                await bus.publish(ev.make_event(e.payload, study_id=study, trial_id=e.trial_id, source=source,
                                                cluster_id="sim",
                                                event_id=ev.derived_id(cause.event_id, source, type(e.payload).__name__, e.key)))

        deadline = time.monotonic() + 120
        pending_events: list[ev.Event] = []
        while finished is None and verify is None:
            assert time.monotonic() < deadline, "the study did not finish"
            new, next_seq = await read_study(bus, study, next_seq)
            for event in new:
                pending_events.append(event)
                if isinstance(event.payload, ev.StudyCreated):
                    pending_events.append(run_request)
            for event in pending_events:
                applied.append(event)
                await publish(proposer.apply(event), event, "proposer")
                await publish(modeler.apply(event), event, "modeler")
                match event.payload:
                    case ev.TrialProposed() as p:
                        spec = _spec(contract, workload, tmp_path, study, event.trial_id, p, server.url)
                        running[event.trial_id] = (backend.submit(spec), p)
                    case ev.VerifyRequested():
                        verify = event
                    case ev.StudyFinished():
                        finished = event
            pending_events = []
            for trial_id, (handle, p) in list(running.items()):
                if not backend.poll(handle):
                    continue
                del running[trial_id]
                job = backend.collect(handle)
                status = "oom" if job.oom else ("ok" if job.exit_code == 0 else "crash")
                assert job.output_tail.startswith(SIM_LABEL)
                await bus.publish(owned_event(ev.TrialFinished(
                    status=status, reason=job.output_tail[:200], exit_code=job.exit_code, wall_s=job.wall_s,
                    accelerator_s=job.wall_s, peak_memory_bytes=job.peak_memory_bytes,
                    censored_peak_bytes=job.peak_memory_bytes if job.oom else None,
                    memory_capacity_bytes=contract.cluster.memory_capacity_bytes,
                ), study_id=study, trial_id=trial_id))
                if status == "ok":
                    measured = await _measure(bus, study, trial_id, p, expected_steps=8)
                    await bus.publish(owned_event(measured, study_id=study, trial_id=trial_id))
            await asyncio.sleep(0.05)

        proposals = [e for e in applied if isinstance(e.payload, ev.TrialProposed)]
        assert len(proposals) == 6
        assert len({e.payload.candidate_key for e in proposals}) == 6
        assert verify is not None or finished is not None
        updates = [e.payload for e in applied if isinstance(e.payload, ev.ModelUpdated)]
        assert updates and updates[-1].n_trials == 6
        # every trial's steps reached the telemetry stream, labelled as simulated
        for e in proposals:
            finished_event = next(x for x in applied if x.trial_id == e.trial_id and isinstance(x.payload, ev.TrialFinished))
            steps = await read_steps(bus, study, e.trial_id)
            if finished_event.payload.status == "ok":
                assert len(steps) == 8
            elif finished_event.payload.status == "oom":
                assert steps == [] and finished_event.payload.censored_peak_bytes > 0
        if verify is not None:
            assert verify.payload.candidates and verify.source == "proposer"
    finally:
        backend.close()
        await bus.close()


def test_a_rerun_replays_the_draw_of_the_trial_it_reruns(tmp_path: Path) -> None:
    """A re-run (``INFRARSI_RETRY_OF``, set by the launcher from ``TrialProposed.retry_of``) is the same simulated
    experiment: its steps equal those of the trial it re-runs, while another trial of the same candidate draws
    its own noise. So whether a loaded host forced a re-run does not change what a study learns."""
    workload = tmp_path / "workload"
    data = write_sim_workload(workload, SCENARIO, knobs=KNOBS, restrict=RESTRICT, steps=6, trials=2, parallel=1,
                              accelerator_hours=5.0)  # fmt: skip
    contract = contract_from_dict(data, base_dir=tmp_path)
    proposal = ev.TrialProposed(candidate=ev.Candidate(knobs={}), candidate_key="default", kind="search", origin="seed")
    backend = SimBackend(str(tmp_path / "sim"))
    handles = {}
    for trial_id, retry_of in (("t1", None), ("t2", None), ("t1-retry", "t1")):
        spec = _spec(contract, workload, tmp_path, "s1", trial_id, proposal, url="")
        if retry_of is not None:
            spec.env["INFRARSI_RETRY_OF"] = retry_of
        handles[trial_id] = backend.submit(spec)
    deadline = time.monotonic() + 60
    while not all(backend.poll(h) for h in handles.values()):
        assert time.monotonic() < deadline, "the simulated jobs did not end"
        time.sleep(0.05)
    steps, costs = {}, {}
    for trial_id, handle in handles.items():
        result = backend.collect(handle)
        assert result.exit_code == 0
        lines = (tmp_path / "trials" / trial_id / "probe" / "probe-rank0.jsonl").read_bytes().splitlines()
        steps[trial_id] = [ev.decode(line).payload.step_time_s for line in lines]
        costs[trial_id] = result.accelerator_s
    assert len(steps["t1"]) == 6
    assert steps["t1-retry"] == steps["t1"]
    assert steps["t2"] != steps["t1"]
    # The cost the searcher learns is the simulated one, the same for the same draw whatever the host did
    # meanwhile (it was ranks × wall time before: the 3-node and 1-node runs of one study parted on it).
    assert costs["t1"] is not None and costs["t1-retry"] == costs["t1"] != costs["t2"]
    startup = handles["t1"].private.trial.startup_s
    assert costs["t1"] == pytest.approx(startup + sum(steps["t1"]))
