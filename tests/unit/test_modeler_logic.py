"""The modeler's state machine: ModelUpdated per completed trial, effects that move from prior to data, OOMs
entering the memory model as censored observations."""

from __future__ import annotations

from pathlib import Path

from infrarsi import events as ev
from infrarsi.study.model import prediction, single_changes
from infrarsi_services.modeler.logic import ModelerState
from test_proposer_logic import STUDY, World, envelope, loader, of_type, run_events, study_created
from test_study_space import GIB


def _propose(candidate: ev.Candidate, trial_id: str) -> ev.Event:
    return envelope(ev.TrialProposed(candidate=candidate, candidate_key=candidate.key(), kind="search", origin="seed"),
                    trial_id=trial_id)


def _effect(update: ev.ModelUpdated, feature: str, target: str = "time") -> ev.Effect:
    effects = update.time_effects if target == "time" else update.memory_effects
    return next(e for e in effects if e.feature == feature)


def test_one_model_update_per_completed_trial_with_counts(tmp_path: Path) -> None:
    created = study_created(tmp_path)
    world = World(loader(created.payload))
    trials = [ev.Candidate(), ev.Candidate(knobs={"train.compile": True}),
              ev.Candidate(knobs={"train.micro_batch_size": 16}), ev.Candidate(knobs={"model.attention": "sdpa"})]
    log = run_events([ModelerState(load_study=loader)], world,
                     [created, *[_propose(c, f"t{i}") for i, c in enumerate(trials)]])
    updates = [e.payload for e in of_type(log, ev.ModelUpdated)]
    assert [u.n_trials for u in updates] == [1, 2, 3, 4]
    assert updates[-1].n_oom == 1
    assert updates[-1].best_candidate_key in {c.key() for c in trials}
    assert updates[-1].best_predicted_step_s > 0 and updates[-1].fit_seconds >= 0
    assert of_type(log, ev.ModelUpdated)[0].trial_id == "t0"  # the update belongs to the trial that caused it
    # one effect per non-golden knob setting and per patch, prior and posterior, for time and memory
    names = {e.feature for e in updates[-1].time_effects}
    assert {"compile=True", "attention=sdpa", "micro_batch_size=16", "patch:fused-qkv", "lr_scale=0.5"} <= names
    assert "micro_batch_size=2" not in names  # the golden value is the reference, not an effect
    assert names == {e.feature for e in updates[-1].memory_effects}
    assert _effect(updates[-1], "patch:fused-qkv").source == "patch_metadata"
    assert _effect(updates[-1], "compile=True").source == "knowledge_base"


def test_effects_move_from_the_prior_toward_the_data(tmp_path: Path) -> None:
    created = study_created(tmp_path)
    state = ModelerState(load_study=loader)
    world = World(loader(created.payload))
    # compile really saves 0.3 in log time (the knowledge base says 0.08); slow-patch costs +0.1 (metadata: -0.1)
    design = [ev.Candidate(), ev.Candidate(knobs={"train.compile": True}), ev.Candidate(patches=["slow-patch"]),
              ev.Candidate(knobs={"train.compile": True}, patches=["slow-patch"])]
    first = [created] + [_propose(c, f"r{r}-{i}") for r in range(3) for i, c in enumerate(design)]
    log = run_events([state], world, first)
    update = of_type(log, ev.ModelUpdated)[-1].payload
    compile_ = _effect(update, "compile=True")
    assert abs(compile_.post_mean - (-0.3)) < abs(compile_.prior_mean - (-0.3))
    assert abs(compile_.post_mean - (-0.3)) < 0.05
    assert compile_.post_std < compile_.prior_std / 2
    slow = _effect(update, "patch:slow-patch")
    assert slow.prior_mean < 0 < slow.post_mean
    # memory: the observed peaks pull the generic model's micro-batch effect from its prior
    mem = _effect(update, "compile=True", "memory")
    assert mem.post_std < mem.prior_std
    # an untried setting keeps (about) its prior
    untried = _effect(update, "lr_scale=0.5")
    assert abs(untried.post_mean - untried.prior_mean) < 0.05


def test_an_oom_enters_as_censored_and_raises_p_oom_of_its_region(tmp_path: Path) -> None:
    created = study_created(tmp_path)
    state = ModelerState(load_study=loader)
    space = loader(created.payload)
    fits = [ev.Candidate(), ev.Candidate(knobs={"train.micro_batch_size": 1}),
            ev.Candidate(knobs={"train.micro_batch_size": 4})]
    run_events([state], World(space), [created, *[_propose(c, f"ok{i}") for i, c in enumerate(fits)]])
    big = space.baseline.replace(micro_batch_size=16)
    bigger_region = space.baseline.replace(micro_batch_size=16, compile=True)
    before = prediction(state.searcher(STUDY), big).p_oom
    before_region = prediction(state.searcher(STUDY), bigger_region).p_oom

    oom = ev.Candidate(knobs={"train.micro_batch_size": 16})
    out = run_events([state], World(space), [_propose(oom, "oom1")])
    update = of_type(out, ev.ModelUpdated)[-1].payload
    assert update.n_oom == 1 and update.diagnostics["memory_censored"] == 1.0
    after = prediction(state.searcher(STUDY), big).p_oom
    after_region = prediction(state.searcher(STUDY), bigger_region).p_oom
    assert after > before and after > 0.5
    assert after_region > before_region  # the same micro-batch with another knob changed: the region, not the point


def test_replay_gives_the_same_updates(tmp_path: Path) -> None:
    created = study_created(tmp_path)
    world = World(loader(created.payload))
    log = run_events([ModelerState(load_study=loader)], world,
                     [created, *[_propose(ev.Candidate(knobs={"train.micro_batch_size": m}), f"m{m}") for m in (1, 2, 4, 8, 16)]])
    emitted = [e.payload for e in of_type(log, ev.ModelUpdated)]
    fresh = ModelerState(load_study=loader)
    replayed = [e.payload for event in log for e in fresh.apply(event)]

    def stable(u: ev.ModelUpdated) -> tuple:
        return (u.n_trials, u.n_oom, u.best_candidate_key, round(u.noise_std_log, 9),
                tuple((e.feature, round(e.post_mean, 9)) for e in u.time_effects))

    assert [stable(u) for u in replayed] == [stable(u) for u in emitted]


def test_single_changes_cover_every_setting_once(tmp_path: Path) -> None:
    space = loader(study_created(tmp_path).payload)
    changes = single_changes(space)
    names = [n for n, *_ in changes]
    assert len(names) == len(set(names))
    for _name, c, _knob, _value in changes:
        differing = [k for k in c.knobs if c[k] != space.baseline[k]] + sorted(c.patches)
        assert len(differing) == 1
    assert 10 * GIB == space.capacity_bytes
