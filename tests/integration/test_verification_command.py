"""``infrarsi verify`` against a real nats-server: the verifier logic (as the service would run it) and a
stand-in launcher+telemetry answer its VerifyRequested; the command picks the top candidates from the log
and returns when every verification is final."""

from __future__ import annotations

import argparse
import asyncio

import pytest
from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.commands import verify as verify_cmd
from infrarsi.commands.study_log import read_study
from infrarsi_services.verifier.logic import VerifierLogic
from support.synthetic_study import _measured, synthetic_study, write_workload

pytestmark = pytest.mark.integration


async def stand_ins(bus: Bus, study: str, stop: asyncio.Event, fast_key: str) -> None:
    logic = VerifierLogic()
    seq = 1
    while not stop.is_set():
        new, seq = await read_study(bus, study, seq)
        for e in new:
            for out in logic.apply(e):  # the verifier service, minus the runner
                await bus.publish(ev.make_event(out.payload, study_id=out.study_id, source="verifier",
                                                trial_id=out.trial_id or e.trial_id, event_id=ev.derived_id(e.event_id, out.key)))
            if isinstance(e.payload, ev.TrialProposed) and e.payload.kind == "verify":  # launcher + telemetry
                factor = 0.8 if e.payload.candidate_key == fast_key else 1.0
                m = _measured(e.payload.candidate_key, "verify", 0.2 * factor, None, steps=120, peak=1 << 30)
                await bus.publish(ev.make_event(m, study_id=study, source="telemetry", trial_id=e.trial_id))
        await asyncio.sleep(0.1)


async def test_verify_command_end_to_end(tmp_path, capsys, nats_server: str, bus: Bus):
    stop = asyncio.Event()
    try:
        study = ev.new_id()
        log = synthetic_study(study, write_workload(tmp_path / "wl"))
        upto = next(i for i, e in enumerate(log) if isinstance(e.payload, ev.VerifyRequested))
        await bus.publish_many(log[:upto])  # the study up to the search; verification is the command's job
        fastest = ev.Candidate(knobs={"micro_batch_size": 8}, patches=["fused-qkv"])
        task = asyncio.create_task(stand_ins(bus, study, stop, fastest.key()))
        args = argparse.Namespace(study=study, top=2, repeats=2, timeout=60.0, no_wait=False, json=False,
                                  nats_url=nats_server, data_dir=tmp_path / "data")
        assert await verify_cmd.run(args) == 0
        stop.set()
        await task
        events, _ = await read_study(bus, study)
        requests = [e.payload for e in events if isinstance(e.payload, ev.VerifyRequested)]
        # Top 2 by median search step time among invariant-passing runs: mbs=8+fused-qkv, then mbs=8.
        assert [c.key() for c in requests[0].candidates] == [fastest.key(), ev.Candidate(knobs={"micro_batch_size": 8}).key()]
        assert requests[0].steps == 120 and requests[0].repeats == 2
        done = [e.payload for e in events if isinstance(e.payload, ev.VerifyCompleted)]
        by_key = {}
        for d in done:
            by_key.setdefault(d.candidate_key, []).append(d)
        assert [d.passes for d in by_key[fastest.key()]] == [1, 2] and by_key[fastest.key()][-1].promotable
        slow = by_key[ev.Candidate(knobs={"micro_batch_size": 8}).key()]
        assert len(slow) == 1 and not slow[0].promotable and slow[0].ci_low <= 1.0
        out = capsys.readouterr()
        assert "PROMOTABLE" in out.out and "1 of 2 candidates promotable" in out.err
        # The cost, predicted before any verify run: 2 × 2 rounds × 2 pairs × 2 runs × 120 steps × the doctor's 0.2 s.
        assert ("verify cost (predicted, at most): 2 candidate(s) × 2 round(s) × 2 pair(s) × 2 runs × 120 steps"
                " × 200.0 ms/step (doctor) × 1 accelerator(s) = 384 accelerator-s") in out.err
    finally:
        stop.set()


async def test_run_command_shows_the_verify_cost_before_the_search(tmp_path, capsys, nats_server: str, bus: Bus):
    from infrarsi.commands import run as run_cmd

    study = ev.new_id()
    log = synthetic_study(study, write_workload(tmp_path / "wl"))
    upto = next(i for i, e in enumerate(log) if isinstance(e.payload, ev.DoctorCompleted))
    await bus.publish_many(log[: upto + 1])  # created and doctored; nothing searched yet
    args = argparse.Namespace(study=study, trials=None, parallel=None, until="searched", timeout=10.0, no_wait=True,
                              json=False, nats_url=nats_server, data_dir=tmp_path / "data")
    assert await run_cmd.run(args) == 0
    # contract: verify top 2 × 2 passes × 3 pairs × 2 runs × 120 verify steps × the doctor's 0.2 s × 1 rank
    assert ("verify cost (predicted, at most): 2 candidate(s) × 2 round(s) × 3 pair(s) × 2 runs × 120 steps"
            " × 200.0 ms/step (doctor) × 1 accelerator(s) = 576 accelerator-s") in capsys.readouterr().err
