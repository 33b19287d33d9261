"""The bank loop over a real nats-server: a study that finishes makes the reporter process publish its
``BankEntry``; the next ``infrarsi init`` of a similar study reads it, records the seeds and the priors in
``StudyCreated`` and says why."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml
from infrarsi import events as ev
from infrarsi.bank import entry_id_for, read_bank_entries
from infrarsi.bus.client import LIFECYCLE_STREAM, Bus
from infrarsi.commands import init
from infrarsi.commands.init import prepare_study, study_created_event
from test_apply import contract_dict, make_workload

pytestmark = pytest.mark.integration

FAST = ev.Candidate(knobs={"knobs.attention": "sdpa", "knobs.compile": True})
CLUSTER = "local-cpu"  # the contract's cluster id


def effect(feature: str, prior: tuple[float, float], post: tuple[float, float]) -> ev.Effect:
    return ev.Effect(feature=feature, prior_mean=prior[0], prior_std=prior[1], post_mean=post[0], post_std=post[1])


def finished_study(study_id: str, created: ev.Event) -> list[ev.Event]:
    """A small study's lifecycle: one measured candidate, a model update, a verdict, the end."""

    def event(payload: ev.Payload, trial_id: str | None = None, source: str = "test") -> ev.Event:
        return ev.make_event(payload, study_id=study_id, trial_id=trial_id, source=source, cluster_id=CLUSTER)

    measured = ev.TrialMeasured(
        candidate_key=FAST.key(), kind="search", status="ok", steps=10, warmup_steps=1, step_time_s=0.8,
        step_time_mad_s=0.01, step_time_with_warmup_s=0.8, tokens_per_s=1.0, mfu=None, flops_per_step=None,
        phases={}, peak_memory_bytes=[2**28], per_rank_step_s=[0.8], stragglers=[], loss_curve=[], eval_curve=[],
        optimizer_steps=10, tokens=320, invariants=[], invariants_ok=True)
    verdict = ev.VerifyCompleted(
        verify_id="v1", candidate=FAST, candidate_key=FAST.key(), passes=2, promotable=True, speedup=1.25,
        ci_low=1.2, ci_high=1.3, baseline_step_s=1.0, candidate_step_s=0.8, mfu_before=None, mfu_after=None,
        invariants=[], failed_invariants=[], trial_ids=[])
    model = ev.ModelUpdated(n_trials=1, n_oom=0, fit_seconds=0.01, noise_std_log=0.02, time_effects=[
        effect("attention=sdpa", (-0.1, 0.2), (-0.3, 0.03)), effect("compile=True", (-0.1, 0.2), (-0.2, 0.03)),
        effect("intercept", (0.0, 3.0), (0.0, 0.01))], memory_effects=[])
    return [
        created,
        event(ev.TrialProposed(candidate=FAST, candidate_key=FAST.key(), kind="search", origin="prior"), "t1",
              "proposer"),
        event(ev.TrialFinished(status="ok", accelerator_s=10.0), "t1", "launcher"),
        event(measured, "t1", "telemetry"),
        event(model, "t1", "modeler"),
        event(verdict, source="verifier"),
        event(ev.StudyFinished(reason="done", trials=1, accelerator_s=10.0, best_candidate_key=FAST.key(),
                               best_speedup=1.25), source="proposer"),
    ]


async def study_created_events(bus: Bus) -> dict[str, ev.StudyCreated]:
    out = {}
    async for event in bus.events(LIFECYCLE_STREAM, types=(ev.StudyCreated,)):
        out[event.study_id] = event.payload
    return out


async def test_a_finished_study_seeds_the_next_init_through_the_reporter(
    fresh_nats_server: str, spawn_service, wait_answering, wait_for, tmp_path: Path, capsys
) -> None:
    make_workload(tmp_path / "wl", as_git=False)
    contract_path = tmp_path / "contract.yaml"
    contract_path.write_text(yaml.safe_dump(contract_dict(), sort_keys=False))
    older = prepare_study(contract_path, tmp_path / "older", study_id="older-study")  # an empty bank
    assert older.created.bank is not None and older.created.bank.matches == [] and older.created.bank_seeds == []

    bus = await Bus.connect(fresh_nats_server, service="test")
    try:
        for event in finished_study("older-study", study_created_event(older)):
            await bus.publish(event)
        reporter = spawn_service("reporter", fresh_nats_server)
        await wait_answering(bus, reporter)

        # (a) the reporter distilled the finished study into the bank
        entries = await wait_for(lambda: read_bank_entries(bus), timeout_s=30)
        assert [e.entry_id for e in entries] == [entry_id_for("older-study")]
        entry = entries[0]
        assert entry.origin_study == "older-study" and entry.meta == older.created.bank.meta
        assert entry.winners == [FAST]
        assert {e.feature for e in entry.time_effects} == {"attention=sdpa", "compile=True"}

        # (b) init of a similar study reads the bank: seeds and priors in StudyCreated, the reason printed
        common = {"data_dir": tmp_path / "newer", "nats_url": fresh_nats_server}
        assert await init.run(argparse.Namespace(contract=contract_path, json=True, **common)) == 0
        out = json.loads(capsys.readouterr().out)
        bank = out["bank"]
        assert bank["consulted"] and bank["entries_seen"] == 1
        assert bank["matches"] == [{"entry_id": entry.entry_id, "similarity": 1.0,
                                    "why": "same hardware, model, parallelism and batch"}]
        assert bank["priors"] == {"time": 2, "memory": 0}
        assert [(s["candidate_key"], s["entry_id"]) for s in bank["seeds"]] == [(FAST.key(), entry.entry_id)]

        assert await init.run(argparse.Namespace(contract=contract_path, json=False, **common)) == 0
        text = capsys.readouterr()
        assert text.out.strip() and "\n" not in text.out.strip()  # stdout: the study id alone
        assert f"bank:   {entry.entry_id}  similarity 1.00  same hardware" in text.err

        created = (await study_created_events(bus))[out["study_id"]]
        assert created.bank_seeds == [entry.entry_id]
        assert created.bank is not None and [s.candidate for s in created.bank.seeds] == [FAST]
        assert set(created.bank.time_priors) == {"attention=sdpa", "compile"}
        sdpa = created.bank.time_priors["attention=sdpa"]
        assert sdpa.entries == [entry.entry_id] and -0.31 < sdpa.mean < -0.25 and sdpa.std < 0.05  # toward -0.3
        assert reporter.terminate(timeout_s=60) == 0  # generous: the suite shares two busy cores
    finally:
        await bus.close()
