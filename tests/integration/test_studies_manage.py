"""Studies as things you manage (issue 36, item 3), through the bus with the real services: ``infrarsi studies``,
``infrarsi cancel`` (the running trial stopped, its cost kept, the reason an event), ``infrarsi resume`` (the
trial the cancel cut short run again) and ``infrarsi verify`` refused while a verification runs.

Real nats-server, the real launcher, telemetry and proposer (in this process, each on its own connection), a
real PyTorch job with the real probe in a git worktree (``support.slowed_workload``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import pytest
from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.cli import invoke
from infrarsi.commands import studies as studies_cmd
from infrarsi.commands import verify as verify_cmd
from infrarsi.commands.study_log import read_study
from infrarsi.errors import EXIT_USAGE
from support.owned import owned_event
from support.slowed_workload import make_slowed_workload
from support.synthetic_study import synthetic_study, write_workload
from test_launcher_helpers import launcher, serving, telemetry

pytestmark = pytest.mark.integration


def proposer(h, url):
    from infrarsi_services.proposer.service import ProposerService

    return ProposerService()


def cli_args(url: str, data_dir, **fields) -> argparse.Namespace:
    return argparse.Namespace(nats_url=url, data_dir=data_dir, **fields)


async def events_of(bus: Bus, study: str, event_type: type) -> list[ev.Event]:
    events, _ = await read_study(bus, study)
    return [e for e in events if isinstance(e.payload, event_type)]


async def until(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


async def test_cancel_stops_the_running_trial_keeps_its_cost_and_resume_runs_it_again(tmp_path, capsys) -> None:
    # 40 steps of 0.25 s: a trial runs ~10 s after its start, long enough to be cancelled mid-run
    contract = make_slowed_workload(tmp_path, bf16_factor=1.0, steps=40, step_s=0.25, trials=2, timeout_s=300.0)
    async with serving(tmp_path, launcher, telemetry, proposer) as h:
        study = await h.create_study(contract)
        await h.bus.publish(owned_event(ev.RunRequested(trials=2, parallel=1), study_id=study))

        async def first_search_step():
            launched = [t for t, seen in h.events.items() if "TrialLaunched" in seen and "TrialStep" not in seen
                        and seen.get("TrialProposed") is not None and seen["TrialProposed"].kind == "search"]
            return launched[0] if launched else None

        trial = await until(first_search_step, 180, "the first search trial to launch")
        await asyncio.sleep(2.0)  # the job is running (torch imported, steps under way)
        assert "TrialFinished" not in h.events[trial]

        code = await invoke(studies_cmd.run_cancel, cli_args(h.url, h.data_dir, study=study, reason="budget review",
                                                             timeout=120.0, no_wait=False))
        assert code == 0, capsys.readouterr().err
        finished = h.events[trial]["TrialFinished"]
        assert finished.status == "cancelled" and finished.infrastructure
        assert "budget review" in finished.reason and finished.reason.startswith("study cancelled: ")
        assert finished.accelerator_s > 0 and finished.wall_s > 0  # the cost it ran up is kept
        assert finished.steps_completed < 40
        [cancelled] = await events_of(h.bus, study, ev.StudyCancelled)
        assert cancelled.payload.reason == "budget review" and "@" in cancelled.payload.by
        assert cancelled.source == "cli.cancel"

        await asyncio.sleep(3.0)  # nothing new is proposed for a cancelled study
        proposed = await events_of(h.bus, study, ev.TrialProposed)
        assert [e.trial_id for e in proposed] == [trial]

        capsys.readouterr()
        assert await invoke(studies_cmd.run, cli_args(h.url, h.data_dir, json=True, stage=None)) == 0
        [listed] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert listed["study_id"] == study and listed["stage"] == "cancelled"
        assert listed["cancelled_reason"] == "budget review" and listed["outcomes"] == {"cancelled": 1}
        assert listed["accelerator_s"] == pytest.approx(finished.accelerator_s, abs=1e-3) and listed["in_flight"] == 0

        # a second cancel is refused, by name
        code = await invoke(studies_cmd.run_cancel, cli_args(h.url, h.data_dir, study=study, reason="again",
                                                             timeout=5.0, no_wait=True))
        assert code == EXIT_USAGE and "cancelled already" in capsys.readouterr().err

        assert await invoke(studies_cmd.run_resume, cli_args(h.url, h.data_dir, study=study, reason="approved")) == 0

        async def rerun():
            for e in await events_of(h.bus, study, ev.TrialProposed):
                if e.payload.retry_of == trial:
                    return e.trial_id
            return None

        again = await until(rerun, 30, "the cut-short trial to be proposed again")
        done = await h.wait_for(again, "TrialFinished", timeout_s=240)
        assert done.status == "ok", done
        [resumed] = await events_of(h.bus, study, ev.StudyResumed)
        assert resumed.payload.reason == "approved"

        # stop the rest of the search: the second cancel of the study's life, accepted after the resume
        assert await invoke(studies_cmd.run_cancel, cli_args(h.url, h.data_dir, study=study, reason="test over",
                                                             timeout=120.0, no_wait=False)) == 0


async def test_a_second_verify_while_one_runs_is_refused(tmp_path, capsys, nats_server: str, bus: Bus) -> None:
    study = ev.new_id()
    log = synthetic_study(study, write_workload(tmp_path / "wl"))
    upto = next(i for i, e in enumerate(log) if isinstance(e.payload, ev.VerifyRequested))
    await bus.publish_many(log[: upto + 1])  # the search ended and the proposer asked for a verification
    args = cli_args(nats_server, tmp_path / "data", study=study, top=1, repeats=1, timeout=5.0, no_wait=True,
                    json=False)
    assert await invoke(verify_cmd.run, args) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"error: a verification of study {study} is running: requested by cli.verify" in err
    assert f"`infrarsi cancel {study}`" in err
    assert len(await events_of(bus, study, ev.VerifyRequested)) == 1  # nothing published

    await bus.publish(owned_event(ev.StudyCancelled(reason="stop", by="t@h"), study_id=study))
    assert await invoke(verify_cmd.run, args) == EXIT_USAGE
    assert f"`infrarsi resume {study}` first" in capsys.readouterr().err


async def test_two_verifies_at_once_start_one_verification(tmp_path, capsys, nats_server: str, bus: Bus) -> None:
    study = ev.new_id()
    log = synthetic_study(study, write_workload(tmp_path / "wl"))
    upto = next(i for i, e in enumerate(log) if isinstance(e.payload, ev.VerifyRequested))
    await bus.publish_many(log[:upto])  # searched; no verification yet
    args = [cli_args(nats_server, tmp_path / "data", study=study, top=1, repeats=1, timeout=5.0, no_wait=True,
                     json=False) for _ in range(3)]
    codes = await asyncio.gather(*(invoke(verify_cmd.run, a) for a in args))
    assert sorted(codes) == [0, EXIT_USAGE, EXIT_USAGE], capsys.readouterr().err
    assert len(await events_of(bus, study, ev.VerifyRequested)) == 1


async def test_run_on_a_cancelled_study_is_refused_until_it_is_resumed(tmp_path, capsys, nats_server: str,
                                                                       bus: Bus) -> None:
    from infrarsi.commands import run as run_cmd

    study = ev.new_id()
    log = synthetic_study(study, write_workload(tmp_path / "wl"))
    upto = next(i for i, e in enumerate(log) if isinstance(e.payload, ev.DoctorCompleted))
    await bus.publish_many(log[: upto + 1])
    await bus.publish(owned_event(ev.StudyCancelled(reason="paused for the quarter", by="t@h"), study_id=study))
    args = cli_args(nats_server, tmp_path / "data", study=study, trials=None, parallel=None, until="searched",
                    timeout=5.0, no_wait=True, json=False)
    assert await invoke(run_cmd.run, args) == EXIT_USAGE
    assert "is cancelled (paused for the quarter): `infrarsi resume" in capsys.readouterr().err
    assert await invoke(studies_cmd.run_resume, cli_args(nats_server, tmp_path / "data", study=study, reason="")) == 0
    assert await invoke(run_cmd.run, args) == 0
