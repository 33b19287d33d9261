"""Stopping a slow trial early (issue 13), through the bus: telemetry sees a search trial's steady steps far
slower than the incumbent and publishes ``TrialStopRequested``; the launcher, busy running that very trial,
reads it beside its slots and stops the job; the trial ends ``stopped_slow``, its cost counted and its steps
measured. A verify run equally slow is never stopped. Real nats-server, real PyTorch jobs with the real probe
(``support.slowed_workload``: ``bfloat16`` sleeps ``bf16_factor`` × longer per step)."""

from __future__ import annotations

import pytest
from infrarsi.study.ledger import TrialLedger
from infrarsi.trial import procs
from support.slowed_workload import make_slowed_workload
from test_launcher_helpers import launcher, serving, telemetry

pytestmark = pytest.mark.integration

SLOW = {"knobs.autocast_dtype": "bfloat16"}
"""5x the baseline's 0.1 s steps."""


async def test_a_slow_search_trial_is_stopped_early_and_its_steps_are_a_measurement(tmp_path) -> None:
    async with serving(tmp_path, launcher, telemetry) as h:
        study = await h.create_study(make_slowed_workload(tmp_path, bf16_factor=5.0, steps=15))
        base = await h.propose(study, kind="baseline")
        assert (await h.wait_for(base, "TrialMeasured")).status == "ok"

        slow = await h.propose(study, knobs=SLOW, origin="ei")  # chosen by the search (a manual trial runs to the end)
        finished = await h.wait_for(slow, "TrialFinished")
        stop = h.events[slow]["TrialStopRequested"]
        assert stop.incumbent_trial == base and stop.incumbent_step_s == pytest.approx(0.1, abs=0.05)
        assert stop.steady_step_s == pytest.approx(0.5, abs=0.1)
        assert finished.status == "stopped_slow", finished
        assert finished.reason.startswith("stopped_slow: ") and "incumbent" in finished.reason
        assert 5 <= finished.steps_completed < 15  # stopped, not run to the horizon
        assert finished.accelerator_s == pytest.approx(finished.wall_s) and finished.accelerator_s > 0
        measured = await h.wait_for(slow, "TrialMeasured")
        assert measured.status == "stopped_slow" and not measured.invariants_ok
        assert measured.step_time_s == pytest.approx(0.5, abs=0.1)

        ledger = TrialLedger()  # as the proposer and the modeler see it
        for trial in (base, slow):
            ledger.proposed(trial, h.events[trial]["TrialProposed"])
            ledger.finished(trial, h.events[trial]["TrialFinished"])
            ledger.measured(trial, h.events[trial]["TrialMeasured"])
        outcome = ledger.outcome(slow)
        assert outcome is not None and outcome.status == "stopped_slow"
        assert outcome.step_time_s == pytest.approx(0.5, abs=0.1) and outcome.accelerator_s == finished.accelerator_s

        verify = await h.propose(study, knobs=SLOW, kind="verify")
        finished = await h.wait_for(verify, "TrialFinished")
        assert finished.status == "ok" and finished.steps_completed == 15
        assert "TrialStopRequested" not in h.events[verify]
        assert procs.tagged_processes(f"{h.data_dir.absolute() / 'launcher' / 'trials'}|") == []
