"""The proposer's state machine, driven by an in-memory event loop over a synthetic workload with a known truth."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from infrarsi import events as ev
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import Candidate
from infrarsi.study.contract import contract_from_dict
from infrarsi.study.space import StudySpace
from infrarsi_services.modeler.logic import ModelerState
from infrarsi_services.proposer.logic import ProposerState, RunRequested
from test_study_space import GIB, LAUNCH, LIBRARY, synthetic_contract_dict

STUDY = "study-synthetic"


# ------------------------------------------------------------------------------------------- the world


def true_log_time(c: Candidate) -> float:
    """Bigger micro-batches, compile, sdpa and fused-qkv help; slow-patch hurts (its metadata says otherwise)."""
    t = -0.12 * math.log2(c["micro_batch_size"]) - 0.3 * c["compile"] - 0.2 * (c["attention"] == "sdpa")
    t += -0.1 * ("fused-qkv" in c.patches) + 0.1 * ("slow-patch" in c.patches) - 0.05 * ("alt-qkv" in c.patches)
    return t


def true_peak(c: Candidate) -> float:
    return 1.5 * GIB + 1.0 * GIB * c["micro_batch_size"]  # micro-batch 16 does not fit in 10 GiB


def envelope(payload: Any, *, trial_id: str | None = None, event_id: str | None = None, source: str = "test") -> ev.Event:
    # msgspec does not validate on construction, so a payload not yet in the catalog (RunRequested) fits too
    return ev.Event(event_id=event_id or ev.new_id(), type=type(payload).__name__, study_id=STUDY, trial_id=trial_id,
                    cluster_id="c1", source=source, ts=datetime.now(UTC), payload=payload)


class World:
    """Runs what the services publish: trials (launcher + telemetry) and verifications (verifier)."""

    def __init__(self, study: StudySpace, *, seed: int = 0, accelerator_s: float = 60.0,
                 crash: Callable[[Candidate], bool] = lambda c: False, noise: float = 0.02) -> None:
        self.study = study
        self.noise = noise
        """Run-to-run σ of log step time."""
        self.rng = np.random.default_rng(seed)
        self.accelerator_s = accelerator_s
        self.crash = crash
        self.trials: list[tuple[str, ev.TrialProposed]] = []

    def react(self, event: ev.Event) -> list[ev.Event]:
        match event.payload:
            case ev.TrialProposed() as p:
                self.trials.append((event.trial_id, p))
                return self._trial(event.trial_id, p)
            case ev.VerifyRequested(candidates=candidates):
                out = []
                for c in candidates:
                    speedup = math.exp(-true_log_time(self.study.from_event(c)) + true_log_time(self.study.baseline))
                    out.append(envelope(ev.VerifyCompleted(
                        verify_id=f"v-{c.key()}", candidate=c, candidate_key=c.key(), passes=1, promotable=True,
                        speedup=speedup, ci_low=speedup * 0.98, ci_high=speedup * 1.02, baseline_step_s=1.0,
                        candidate_step_s=1.0 / speedup, mfu_before=None, mfu_after=None, invariants=[],
                        failed_invariants=[], trial_ids=[]), source="verifier"))
                return out
            case _:
                return []

    def _trial(self, trial_id: str, p: ev.TrialProposed) -> list[ev.Event]:
        c = self.study.from_event(p.candidate)
        if self.crash(c):
            return [envelope(ev.TrialFinished(status="crash", accelerator_s=5.0), trial_id=trial_id)]
        if true_peak(c) > self.study.capacity_bytes:
            return [envelope(ev.TrialFinished(status="oom", accelerator_s=10.0, peak_memory_bytes=int(9.8 * GIB),
                                              censored_peak_bytes=int(9.8 * GIB)), trial_id=trial_id)]
        step = math.exp(true_log_time(c) + self.noise * self.rng.standard_normal())
        finished = envelope(ev.TrialFinished(status="ok", accelerator_s=self.accelerator_s), trial_id=trial_id)
        measured = envelope(ev.TrialMeasured(
            candidate_key=p.candidate_key, kind=p.kind, status="ok", steps=10, warmup_steps=1, step_time_s=step,
            step_time_mad_s=0.0, step_time_with_warmup_s=step, tokens_per_s=1.0, mfu=None, flops_per_step=None,
            phases={}, peak_memory_bytes=[int(true_peak(c))], per_rank_step_s=[step], stragglers=[], loss_curve=[],
            eval_curve=[], optimizer_steps=10, tokens=160, invariants=[], invariants_ok=True), trial_id=trial_id)
        return [finished, measured]


def loader(created: ev.StudyCreated) -> StudySpace:
    return StudySpace.from_contract(contract_from_dict(created.contract, check=False), baseline_launch=LAUNCH,
                                    library=LIBRARY)


def study_created(repo: Path, **kwargs: Any) -> ev.Event:
    data = synthetic_contract_dict(repo, **kwargs)
    contract = contract_from_dict(data, check=False)
    return envelope(ev.StudyCreated(name="synthetic", goal="faster", contract=contract.to_dict(),
                                    contract_sha256=contract.sha256(), workload_dir=str(repo), baseline_ref="0" * 40,
                                    locked_files={}, cluster=contract.cluster.info()), source="cli.init")


def run_events(states: list[Any], world: World | None, first: list[ev.Event], max_events: int = 5000) -> list[ev.Event]:
    """An in-memory bus: every event goes to every state (and the world); what they emit is appended with the
    ids ``Outbox.emit`` would derive. Returns the log in order."""
    queue = list(first)
    log: list[ev.Event] = []
    while queue:
        event = queue.pop(0)
        log.append(event)
        assert len(log) < max_events, "runaway event loop"
        for state in states:
            for e in state.apply(event):
                queue.append(envelope(e.payload, trial_id=e.trial_id, source=type(state).__name__,
                                      event_id=ev.derived_id(event.event_id, type(state).__name__,
                                                             type(e.payload).__name__, e.key)))
        if world is not None:
            queue.extend(world.react(event))
    return log


def of_type(log: list[ev.Event], cls: type) -> list[ev.Event]:
    return [e for e in log if isinstance(e.payload, cls)]


@pytest.fixture
def space(tmp_path: Path) -> StudySpace:
    return loader(study_created(tmp_path).payload)


# ------------------------------------------------------------------------------------------- tests


def test_a_study_runs_to_verify_and_finish_without_proposing_a_candidate_twice(tmp_path: Path) -> None:
    created = study_created(tmp_path, trials=14)
    world = World(loader(created.payload))
    log = run_events([ProposerState(load_study=loader)], world, [created, envelope(RunRequested(parallel=3))])
    proposed = [e.payload for e in of_type(log, ev.TrialProposed)]
    assert len(proposed) == 14
    # twice only as a run of the searcher's race (origin confirm), of a candidate proposed before it
    keys = [p.candidate_key for p in proposed if p.origin != "confirm"]
    assert len(keys) == len(set(keys))
    assert all(p.candidate_key in keys[:i] for i, p in enumerate(proposed) if p.origin == "confirm")
    assert all(p.candidate.key() == p.candidate_key and p.kind == "search" for p in proposed)
    assert len({e.trial_id for e in of_type(log, ev.TrialProposed)}) == 14
    verify = of_type(log, ev.VerifyRequested)
    assert len(verify) == 1
    request = verify[0].payload
    assert 1 <= len(request.candidates) <= 2 and ev.Candidate() not in request.candidates
    assert request.steps == 20 and request.repeats == 2
    # the search found the known good settings (compile, sdpa) among its top candidates
    best = world.study.from_event(request.candidates[0])
    assert best["compile"] and best["attention"] == "sdpa"
    finished = of_type(log, ev.StudyFinished)
    assert len(finished) == 1 and log.index(finished[0]) > log.index(verify[0])
    assert finished[0].payload.trials == 14 and finished[0].payload.best_speedup > 1.5
    assert finished[0].payload.accelerator_s == pytest.approx(sum(e.payload.accelerator_s for e in of_type(log, ev.TrialFinished)))


def test_origins_reasons_and_predictions_are_recorded_and_the_initial_design_is_diverse(tmp_path: Path) -> None:
    created = study_created(tmp_path, trials=10)
    log = run_events([ProposerState(load_study=loader)], World(loader(created.payload)),
                     [created, envelope(RunRequested(parallel=4))])
    proposed = [e.payload for e in of_type(log, ev.TrialProposed)]
    first = proposed[:4]
    assert all(p.origin == "seed" for p in first)  # no workload shape: no prior's guess (SearchConfig.design_first)
    assert {p.origin for p in proposed[4:]} <= {"ei", "pairing", "confirm"}
    assert all(p.reason.startswith(("race: ", "re-measured")) for p in proposed if p.origin == "confirm")
    assert all(p.reason and p.prediction is not None and p.prediction.step_time_s > 0 for p in proposed)
    assert all(0.0 <= p.prediction.p_oom <= 1.0 for p in proposed)
    # diverse: not one incumbent and its neighbours — the design's candidates differ pairwise in ≥ 2 settings
    space = loader(created.payload)
    cands = [space.from_event(p.candidate) for p in first]

    def distance(a: Candidate, b: Candidate) -> int:
        return sum(a[k] != b[k] for k in a.knobs) + len(a.patches ^ b.patches)

    distances = [distance(a, b) for i, a in enumerate(cands) for b in cands[i + 1:]]
    assert min(distances) >= 2 and np.mean(distances) >= 3


def test_the_trial_budget_is_a_ceiling_and_parallel_slots_are_kept(tmp_path: Path) -> None:
    created = study_created(tmp_path, trials=7)
    state = ProposerState(load_study=loader)
    log = run_events([state], World(loader(created.payload)), [created, envelope(RunRequested(trials=50, parallel=3))])
    assert len(of_type(log, ev.TrialProposed)) == 7  # the contract's locked budget caps the request
    # never more than 3 in flight: count proposals minus completed trials along the log
    in_flight = peak = 0
    for e in log:
        if isinstance(e.payload, ev.TrialProposed):
            in_flight += 1
        elif isinstance(e.payload, ev.TrialMeasured) or (isinstance(e.payload, ev.TrialFinished) and e.payload.status != "ok"):
            in_flight -= 1
        peak = max(peak, in_flight)
    assert peak == 3
    # a later, larger request extends the finished search
    more = run_events([state], None, [envelope(RunRequested(trials=5, parallel=3))])
    assert of_type(more, ev.StudyFinished) and "already spent" in of_type(more, ev.StudyFinished)[0].payload.reason


def test_the_accelerator_budget_stops_the_search(tmp_path: Path) -> None:
    # 0.1 h = 360 s; trials cost 60 s each (ok) → at most 6 can be paid for, failed trials included
    created = study_created(tmp_path, trials=40, hours=0.1)
    log = run_events([ProposerState(load_study=loader)], World(loader(created.payload)),
                     [created, envelope(RunRequested(parallel=2))])
    spent = sum(e.payload.accelerator_s for e in of_type(log, ev.TrialFinished))
    assert spent <= 360.0 + 60.0  # the estimate may miss by at most one trial's cost
    assert len(of_type(log, ev.TrialProposed)) < 40
    assert "accelerator budget" in of_type(log, ev.VerifyRequested)[0].payload.reason


def test_replay_rebuilds_the_same_state_and_the_same_proposals(tmp_path: Path) -> None:
    created = study_created(tmp_path, trials=9)
    run = envelope(RunRequested(parallel=3), event_id="run-1")
    log = run_events([ProposerState(load_study=loader)], World(loader(created.payload), seed=3), [created, run])
    emitted = [(e.trial_id, e.payload) for e in log if e.source == "ProposerState"]

    # a fresh state fed the same log (what the service's start() replays) emits the same, in the same order
    fresh = ProposerState(load_study=loader)
    replayed = [(e.trial_id, e.payload) for event in log for e in fresh.apply(event)]
    assert replayed == emitted

    # and the whole study, run again from scratch with the same inputs, proposes the same candidates
    created_again = msg_copy(created)
    log2 = run_events([ProposerState(load_study=loader)], World(loader(created.payload), seed=3),
                      [created_again, envelope(RunRequested(parallel=3), event_id="run-1")])
    assert [(e.trial_id, e.payload.candidate_key, e.payload.origin) for e in of_type(log2, ev.TrialProposed)] == [
        (e.trial_id, e.payload.candidate_key, e.payload.origin) for e in of_type(log, ev.TrialProposed)]


def msg_copy(event: ev.Event) -> ev.Event:
    return ev.decode(ev.encode(event))


def test_a_redelivered_event_returns_its_first_emissions_and_changes_nothing(tmp_path: Path) -> None:
    created = study_created(tmp_path, trials=6)
    state = ProposerState(load_study=loader)
    state.apply(created)
    run = envelope(RunRequested(parallel=2))
    first = state.apply(run)
    assert len(first) == 2
    again = state.apply(run)
    assert again == first
    assert len(state.studies[STUDY].proposals) == 2


def test_failed_trials_count_and_free_their_slot(tmp_path: Path) -> None:
    created = study_created(tmp_path, trials=8)
    world = World(loader(created.payload), crash=lambda c: bool(c["compile"]))
    log = run_events([ProposerState(load_study=loader)], world, [created, envelope(RunRequested(parallel=2))])
    assert len(of_type(log, ev.TrialProposed)) == 8
    statuses = [e.payload.status for e in of_type(log, ev.TrialFinished)]
    assert "crash" in statuses and len(statuses) == 8
    verify = of_type(log, ev.VerifyRequested)
    assert verify and not any(c.knobs.get("train.compile") for c in verify[0].payload.candidates)


def test_a_contract_that_cannot_be_loaded_finishes_the_study_with_the_reason(tmp_path: Path) -> None:
    def broken(_created: ev.StudyCreated) -> StudySpace:
        raise FileNotFoundError("workload repo gone")

    state = ProposerState(load_study=broken)
    state.apply(study_created(tmp_path))
    out = state.apply(envelope(RunRequested()))
    assert len(out) == 1 and isinstance(out[0].payload, ev.StudyFinished)
    assert "workload repo gone" in out[0].payload.reason


def test_proposer_and_modeler_share_one_bus(tmp_path: Path) -> None:
    created = study_created(tmp_path, trials=6)
    log = run_events([ProposerState(load_study=loader), ModelerState(load_study=loader)], World(loader(created.payload)),
                     [created, envelope(RunRequested(parallel=2))])
    updates = of_type(log, ev.ModelUpdated)
    assert len(updates) == 6  # one per completed trial
    assert updates[-1].payload.n_trials == 6


class KilledLauncherWorld(World):
    """The launcher is killed during every ``kill_every``-th trial: that trial is ``cancelled`` (infrastructure)."""

    def __init__(self, study: StudySpace, kill_every: int) -> None:
        super().__init__(study)
        self.kill_every = kill_every

    def _trial(self, trial_id: str, p: ev.TrialProposed) -> list[ev.Event]:
        if len(self.trials) % self.kill_every == 0:
            reason = "the launcher was stopped or killed mid-trial; its processes were reaped"
            return [envelope(ev.TrialFinished(status="cancelled", reason=reason, accelerator_s=7.0, infrastructure=True),
                             trial_id=trial_id)]
        return super()._trial(trial_id, p)


def test_an_infrastructure_failure_costs_but_does_not_use_up_the_candidate(tmp_path: Path) -> None:
    created = study_created(tmp_path, trials=8)
    world = KilledLauncherWorld(loader(created.payload), kill_every=3)
    proposer = ProposerState(load_study=loader)
    log = run_events([proposer], world, [created, envelope(RunRequested(parallel=1))])
    proposed = of_type(log, ev.TrialProposed)
    cancelled = [e.trial_id for e in of_type(log, ev.TrialFinished) if e.payload.status == "cancelled"]
    assert cancelled, "the world killed some launchers"
    retries = [e for e in proposed if e.payload.reason.startswith("re-run of trial")]
    by_trial = {e.trial_id: e.payload for e in proposed}
    retried = {e.payload.reason.split()[3] for e in retries}
    # Every cancelled first run was re-run once, with the same candidate; a cancelled re-run is not re-run again.
    first_runs = [t for t in cancelled if not by_trial[t].reason.startswith("re-run")]
    assert retried == set(first_runs)
    for e in retries:
        assert e.payload.candidate_key == by_trial[e.payload.reason.split()[3]].candidate_key
        assert e.payload.retry_of == e.payload.reason.split()[3]  # what the simulator replays the draw of
    # Eight candidates were measured or failed on their own account; the cancelled runs cost accelerator time.
    assert len(proposed) - len(retries) == 8
    # The n-th search trial has the same id whatever was re-run before it (the simulator draws by trial id, so a
    # host that forces re-runs would otherwise change the course of a study).
    first = [e.trial_id for e in proposed if e.payload.retry_of is None and e.payload.kind == "search"]
    assert first == [ev.derived_id(STUDY, "search", str(i)) for i in range(len(first))]
    finished = of_type(log, ev.StudyFinished)[-1].payload
    assert finished.accelerator_s == pytest.approx(sum(e.payload.accelerator_s for e in of_type(log, ev.TrialFinished)))
    # The models never saw the cancelled runs as failures of their candidates.
    searcher = proposer.studies[STUDY].searcher
    assert searcher is not None and all(o.status == "ok" for o in searcher.observations if o.status != "oom")


def test_leaders_tied_within_noise_are_re_measured_before_the_search_stops(tmp_path: Path) -> None:
    # a space of 20 candidates and a budget the search does not use up: it stops once every candidate has run,
    # after racing its leaders (SearchConfig.race) on a host whose doctor measured a run-to-run CV of 8%
    data = synthetic_contract_dict(tmp_path, trials=40)
    data["search_space"]["knobs"] = {k: v for k, v in data["search_space"]["knobs"].items()
                                     if k in ("train.micro_batch_size", "model.attention", "train.compile")}
    data["search_space"]["patches"] = []
    contract = contract_from_dict(data, check=False)
    created = envelope(ev.StudyCreated(name="synthetic", goal="faster", contract=contract.to_dict(),
                                       contract_sha256=contract.sha256(), workload_dir=str(tmp_path),
                                       baseline_ref="0" * 40, locked_files={}, cluster=contract.cluster.info()),
                       source="cli.init")
    doctor = ev.DoctorCompleted(repeats=3, baseline_trial_ids=[], step_time_s=1.0, run_to_run_cv=0.08,
                                step_to_step_cv=0.0, warmup_steps=0, phase_fractions={}, per_rank_step_s=[],
                                stragglers=[], min_detectable_speedup=1.2, repeats_per_trial=1)
    log = run_events([ProposerState(load_study=loader, config=SearchConfig(race=True))],
                     World(loader(created.payload), noise=0.08),
                     [created, envelope(doctor), envelope(RunRequested(parallel=1))])
    proposed = [e.payload for e in of_type(log, ev.TrialProposed)]
    assert len(proposed) < 40
    confirms = [p for p in proposed if p.origin == "confirm"]
    fresh = [p.candidate_key for p in proposed if p.origin != "confirm"]
    assert confirms and len(fresh) == len(set(fresh))
    assert all(p.candidate_key in fresh[:i] for i, p in ((proposed.index(c), c) for c in confirms))
    assert all(p.reason.startswith("race: ") for p in confirms)
    cap = SearchConfig().race_max_cap  # a raced candidate runs at most the race's cap in all
    assert all(1 + sum(c.candidate_key == p.candidate_key for c in confirms) <= cap for p in confirms)
    assert len(of_type(log, ev.StudyFinished)) == 1
