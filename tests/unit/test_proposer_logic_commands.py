"""The pure parts of ``infrarsi run`` (progress folded from events) and ``infrarsi model`` (rendering, replay)."""

from __future__ import annotations

from pathlib import Path

from infrarsi import events as ev
from infrarsi.commands.model import render
from infrarsi.commands.run import RunProgress
from infrarsi.study.model import replay_model
from infrarsi_services.proposer.logic import ProposerState, RunRequested
from test_proposer_logic import World, envelope, loader, of_type, run_events, study_created


def test_progress_counts_search_trials_ooms_cost_and_the_best_speedup(tmp_path: Path) -> None:
    created = study_created(tmp_path, trials=8)
    doctor = envelope(ev.DoctorCompleted(repeats=2, baseline_trial_ids=[], step_time_s=1.0, run_to_run_cv=0.01,
                                         step_to_step_cv=0.01, warmup_steps=1, phase_fractions={}, per_rank_step_s=[],
                                         stragglers=[], min_detectable_speedup=1.02, repeats_per_trial=1))
    log = run_events([ProposerState(load_study=loader)], World(loader(created.payload)),
                     [created, doctor, envelope(RunRequested(parallel=2))])
    progress = RunProgress(target=8)
    for event in log:
        progress.apply(event)
    assert progress.done == 8
    assert progress.ooms == sum(e.payload.status == "oom" for e in of_type(log, ev.TrialFinished))
    assert progress.accelerator_s == sum(e.payload.accelerator_s for e in of_type(log, ev.TrialFinished))
    speedup, how = progress.best()
    assert how == "verified" and speedup == max(e.payload.speedup for e in of_type(log, ev.VerifyCompleted))
    assert "8/8 trials" in progress.line() and "verified" in progress.line()
    assert progress.summary()["finished_reason"]


def test_model_replay_matches_the_modeler_and_renders_every_setting(tmp_path: Path) -> None:
    created = study_created(tmp_path, trials=5)
    log = run_events([ProposerState(load_study=loader)], World(loader(created.payload)),
                     [created, envelope(RunRequested(parallel=2))])
    update = replay_model(log, created.study_id, loader)
    assert update is not None and update.n_trials == 5
    lines = render(update, "replayed")
    for effect in update.time_effects:
        assert any(line.startswith(effect.feature) for line in lines)
