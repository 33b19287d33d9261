"""``infrarsi doctor`` against a real nats-server, with a stand-in launcher+telemetry that answers the
doctor's TrialProposed events with per-step samples and a TrialMeasured (known noise, warm-up, straggler)."""

from __future__ import annotations

import argparse
import asyncio

import numpy as np
import pytest
from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.commands import doctor as doctor_cmd
from infrarsi.commands.study_log import read_study
from support.synthetic_study import synthetic_study, write_workload

pytestmark = pytest.mark.integration


async def fake_launcher(bus: Bus, study: str, stop: asyncio.Event) -> None:
    rng = np.random.default_rng(1)
    seq = 1
    while not stop.is_set():
        new, seq = await read_study(bus, study, seq)
        for e in new:
            if not (isinstance(e.payload, ev.TrialProposed) and e.payload.kind == "doctor"):
                continue
            level = float(0.1 * np.exp(0.03 * rng.standard_normal()))
            steps = []
            for rank in range(2):
                for step in range(40):
                    t = float(level * (5.0 if step < 4 else 1.0) * (1.3 if rank == 1 else 1.0) * (1 + 0.01 * rng.standard_normal()))
                    steps.append(ev.make_event(ev.TrialStep(
                        rank=rank, world_size=2, step=step, loss=3.0, step_time_s=t, phases={"forward": 0.4 * t, "backward": 0.5 * t},
                        tokens=1024, optimizer_steps=step + 1, peak_memory_bytes=1 << 28), study_id=study, source="probe", trial_id=e.trial_id))
            await bus.publish_many(steps)
            await bus.publish(ev.make_event(ev.TrialMeasured(
                candidate_key=e.payload.candidate_key, kind="doctor", status="ok", steps=40, warmup_steps=4, step_time_s=level * 1.3,
                step_time_mad_s=0.001, step_time_with_warmup_s=level, tokens_per_s=1.0, mfu=None, flops_per_step=1e8,
                phases={}, peak_memory_bytes=[1 << 28] * 2, per_rank_step_s=[level, level * 1.3], stragglers=[1],
                loss_curve=[ev.LossPoint(10, 3.0), ev.LossPoint(20, 2.5)], eval_curve=[], optimizer_steps=40, tokens=40 * 1024,
                invariants=[], invariants_ok=True), study_id=study, source="telemetry", trial_id=e.trial_id))
        await asyncio.sleep(0.2)


async def test_doctor_command_proposes_waits_and_publishes(tmp_path, capsys, nats_server: str, bus: Bus):
    stop = asyncio.Event()
    try:
        study = ev.new_id()
        created = synthetic_study(study, write_workload(tmp_path / "wl"))[0]
        await bus.publish(created)
        launcher = asyncio.create_task(fake_launcher(bus, study, stop))
        args = argparse.Namespace(study=study, repeats=4, steps=None, target_speedup=1.05, no_peak=True, timeout=30.0,
                                  json=False, nats_url=nats_server, data_dir=tmp_path / "data")
        assert await doctor_cmd.run(args) == 0
        stop.set()
        await launcher
        events, _ = await read_study(bus, study)
        proposed = [e for e in events if isinstance(e.payload, ev.TrialProposed)]
        assert len(proposed) == 4 and all(p.payload.origin == "baseline" and p.payload.candidate == ev.Candidate() for p in proposed)
        done = [e.payload for e in events if isinstance(e.payload, ev.DoctorCompleted)]
        assert len(done) == 1
        d = done[0]
        assert d.repeats == 4 and d.warmup_steps == 4 and d.stragglers == [1]
        assert d.per_rank_step_s[1] / d.per_rank_step_s[0] == pytest.approx(1.3, rel=0.02)
        assert d.phase_fractions["backward"] == pytest.approx(0.5, abs=0.01)
        assert 0.005 < d.run_to_run_cv < 0.1 and d.step_to_step_cv == pytest.approx(0.01, rel=0.5)
        assert d.baseline_loss_curve == [ev.LossPoint(10, 3.0), ev.LossPoint(20, 2.5)]
        assert set(d.baseline_trial_ids) == {p.trial_id for p in proposed}
        assert "min detectable" in capsys.readouterr().out
        # Run again: the request is complete, so a new one is made (not resumed).
        stop.clear()
        launcher = asyncio.create_task(fake_launcher(bus, study, stop))
        assert await doctor_cmd.run(args) == 0
        stop.set()
        await launcher
    finally:
        stop.set()
