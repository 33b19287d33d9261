"""Helpers (no benchmark) shared by bench/chaos.py and bench/fuzz_bus.py: a simulator study run through a real
stack (embedded nats-server, the six service processes, backend ``sim``), and what its log says afterwards.

``study_ledger`` reads the lifecycle stream *with duplicates* (every stored message, not one per event id)
and counts trials proposed / finished / measured, trials lost (proposed, never finished), messages sharing an
event id, and trials finished or launched twice. ``analyst_equals_replay`` compares the reporter's analyst
DuckDB with a fresh replay of the streams, table by table.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import nats.errors
import yaml
from infrarsi import eventlog
from infrarsi import events as ev
from infrarsi.backends.sim import write_sim_workload
from infrarsi.bus.client import Bus
from infrarsi.bus.credentials import ADMIN
from infrarsi.bus.subjects import LIFECYCLE_STREAM, lifecycle_subject
from infrarsi.commands.init import prepare_study, publish_study
from infrarsi.runtime.logs import setup_logging
from infrarsi.runtime.stack import Stack

SCENARIO = "dense7b_h100x64"
KNOBS = ["tp", "pp", "dp", "micro_batch", "recompute", "flash_attention"]
RESTRICT = {"dp": [16, 32, 64], "micro_batch": [1, 2, 4]}


def write_contract(root: Path, *, trials: int, parallel: int, timing_tolerance: float | None = None,
                   scenario: str = SCENARIO) -> Path:
    """A sim workload repo under ``root`` and its contract file (search budget ``trials``, ``parallel`` slots;
    the contract's ``invariants.timing_tolerance`` when given)."""
    contract = write_sim_workload(root / "workload", scenario, knobs=KNOBS, restrict=RESTRICT, steps=12,
                                  trials=trials, parallel=parallel, accelerator_hours=1000.0)  # fmt: skip
    if timing_tolerance is not None:
        contract["invariants"]["timing_tolerance"] = timing_tolerance
    path = root / "contract.yaml"
    path.write_text(yaml.safe_dump(contract, sort_keys=False))
    return path


async def create_study(bus: Bus, contract: Path, data_dir: Path, study_id: str) -> None:
    prepared = await asyncio.to_thread(prepare_study, contract, data_dir, study_id=study_id)
    await publish_study(bus, prepared)


async def run_study(bus: Bus, study_id: str, *, trials: int, parallel: int, timeout_s: float) -> ev.StudyFinished | None:
    """Publish ``RunRequested`` and wait for the study's ``StudyFinished`` (``None`` on timeout)."""
    await bus.publish(ev.make_event(ev.RunRequested(trials=trials, parallel=parallel), study_id=study_id,
                                    source="cli.run", event_id=ev.derived_id(study_id, "bench-run")))  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            finished = [e.payload for e in await lifecycle(bus, study_id) if isinstance(e.payload, ev.StudyFinished)]
        except nats.errors.Error:  # a cluster's JetStream electing a leader ("temporarily unavailable"): ask again
            finished = []
        if finished:
            return finished[-1]
        await asyncio.sleep(1.0)
    return None


async def lifecycle(bus: Bus, study_id: str | None = None) -> list[ev.Event]:
    """Every stored lifecycle message that decodes, duplicates included, in stream order."""
    subject = lifecycle_subject(study_id, "*") if study_id else None
    return [event async for event in bus.events(LIFECYCLE_STREAM, subject)]


def study_ledger(events: list[ev.Event]) -> dict[str, Any]:
    """Trials proposed / finished / measured, lost, and duplicates, from a study's stored messages."""
    proposed = {e.trial_id for e in events if e.type == "TrialProposed"}
    finished = Counter(e.trial_id for e in events if e.type == "TrialFinished")
    measured = {e.trial_id for e in events if e.type == "TrialMeasured"}
    launched = Counter(e.trial_id for e in events if e.type == "TrialLaunched")
    ids = Counter(e.event_id for e in events)
    statuses = Counter(e.payload.status for e in events if isinstance(e.payload, ev.TrialFinished))
    return {
        "trials_proposed": len(proposed),
        "trials_finished": len(finished),
        "trials_measured": len(measured),
        "trials_lost": len(proposed - set(finished)),
        "duplicate_event_ids": sum(n - 1 for n in ids.values() if n > 1),
        "trials_finished_twice": sum(1 for n in finished.values() if n > 1),
        "trials_launched_twice": sum(1 for n in launched.values() if n > 1),
        "infrastructure_retries": sum(1 for e in events if isinstance(e.payload, ev.TrialProposed)
                                      and _is_rerun(e.payload)),  # fmt: skip
        "finished_statuses": dict(statuses),
    }


async def reference_result(data_dir: Path, contract: Path, study_id: str, *, trials: int, timeout_s: float,
                           env: dict[str, str] | None = None) -> dict[str, Any] | None:  # fmt: skip
    """The result of the study on a clean single-node stack (no faults), one trial at a time: the reference a
    faulted run of the same study must reproduce."""
    stack = await asyncio.to_thread(Stack.start, data_dir, env=env)
    try:
        bus = await Bus.connect(stack.url, service=ADMIN, data_dir=data_dir)
        await create_study(bus, contract, data_dir, study_id)
        finished = await run_study(bus, study_id, trials=trials, parallel=1, timeout_s=timeout_s)
        events = await lifecycle(bus, study_id)
        await bus.close()
    finally:
        await asyncio.to_thread(stack.stop)
    return result_of(finished, study_ledger(events), events)


def result_of(finished: ev.StudyFinished | None, ledger: dict[str, Any] | None = None,
              events: list[ev.Event] | None = None) -> dict[str, Any] | None:
    """The study's result; ``search_trials`` leaves out the re-runs of infrastructure failures and of timing
    verdicts taken under host interference (they depend on the host's load, not on the study). Given its
    ``events``, also the study's course: the search trials' candidates in order (re-runs left out) and the
    candidates sent to verification."""
    if finished is None:
        return None
    retries = ledger["infrastructure_retries"] if ledger else 0
    result = {"best_candidate_key": finished.best_candidate_key, "best_speedup": finished.best_speedup,
              "trials": finished.trials, "search_trials": finished.trials - retries}  # fmt: skip
    if events is not None:
        result["search_path"] = [e.payload.candidate_key for e in events if isinstance(e.payload, ev.TrialProposed)
                                 and e.payload.kind == "search" and not _is_rerun(e.payload)]  # fmt: skip
        result["verify_requested"] = [c.key() for e in events if isinstance(e.payload, ev.VerifyRequested)
                                      for c in e.payload.candidates]  # fmt: skip
        result["verdicts"] = {e.payload.candidate_key: e.payload.promotable for e in events
                              if isinstance(e.payload, ev.VerifyCompleted)}  # fmt: skip  # the last per candidate
        reruns = {e.trial_id for e in events if isinstance(e.payload, ev.TrialProposed) and _is_rerun(e.payload)}
        result["search_measured"] = [  # what the models learnt, trial by trial: where two courses part, and why
            [e.payload.candidate_key, e.payload.status, e.payload.steps, round(e.payload.step_time_s or 0.0, 6),
             e.payload.invariants_ok, e.trial_id in reruns]
            for e in events if isinstance(e.payload, ev.TrialMeasured) and e.payload.kind == "search"]  # fmt: skip
    return result


def _is_rerun(proposal: ev.TrialProposed) -> bool:
    return proposal.retry_of is not None


def run_and_print(measurement: Coroutine[Any, Any, dict[str, Any]], *, as_json: bool) -> dict[str, Any]:
    """Run a bench's measurement (logs on stderr: stdout is the result) and print it, as JSON or one line a key."""
    setup_logging("bench", level="error")
    result = asyncio.run(measurement)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:<28} {value}")
    return result


def _dump(path: Path) -> dict[str, list[tuple]]:
    with eventlog.AnalystDB.open(path, read_only=True) as db:
        return {t: db.query(f"SELECT * FROM {t} ORDER BY ALL")[1] for t in eventlog.PROJECTION_TABLES}


async def analyst_equals_replay(bus: Bus, analyst_db: Path) -> dict[str, Any]:
    """The reporter's DB (its writer stopped) vs a fresh replay of the streams: per table, equal or not."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "fresh.duckdb"
        await eventlog.replay(bus, fresh)
        live, replayed = _dump(analyst_db), _dump(fresh)
    tables = {t: live[t] == replayed[t] for t in eventlog.PROJECTION_TABLES}
    return {"equal": all(tables.values()), "tables": tables, "rows": {t: len(replayed[t]) for t in replayed}}
