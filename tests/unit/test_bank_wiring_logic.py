"""The experience bank wired into the search: resolved once at init (``StudyCreated.bank``), read by the
proposer (seeds, origin ``bank``) and the modeler (priors), distilled again by the reporter's fold."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from infrarsi import events as ev
from infrarsi.bank.resolve import resolve_bank, study_meta
from infrarsi.bus import subjects
from infrarsi.commands.init import bank_lines, bank_summary
from infrarsi.study.space import StudySpace
from infrarsi_services.modeler.logic import ModelerState
from infrarsi_services.proposer.logic import ProposerState, RunRequested
from infrarsi_services.reporter.bank import BankDistiller
from test_proposer_logic import World, envelope, loader, msg_copy, of_type, run_events, study_created

WINNER = ev.Candidate(knobs={"model.attention": "sdpa", "train.compile": True, "gone.knob": 3},
                      patches=["fused-qkv", "gone-patch"])
"""A similar study's winner: a knob and a patch this study does not have are dropped when it is adapted."""
ADAPTED = ev.Candidate(knobs={"model.attention": "sdpa", "train.compile": True}, patches=["fused-qkv"])


def effect(feature: str, prior: tuple[float, float], post: tuple[float, float]) -> ev.Effect:
    return ev.Effect(feature=feature, prior_mean=prior[0], prior_std=prior[1], post_mean=post[0], post_std=post[1])


def entry_for(meta: ev.BankMeta, entry_id: str = "entry-similar", winners: list[ev.Candidate] | None = None
              ) -> ev.BankEntry:
    """What the reporter distils from a finished study: ``ModelUpdated``'s per-setting effects, winners."""
    return ev.BankEntry(
        entry_id=entry_id, origin_study="older-study", meta=meta,
        time_effects=[
            effect("model.attention=sdpa", (0.0, 0.3), (-0.2, 0.03)),  # not a feature name here: ignored
            effect("attention=sdpa", (-0.1, 0.2), (-0.3, 0.03)),       # categorical level: transferred
            effect("compile=True", (-0.1, 0.2), (-0.25, 0.03)),        # bool setting → feature ``compile``
            effect("micro_batch_size=4", (-0.1, 0.2), (-0.2, 0.03)),   # int level = deviation from a trend: no
            effect("patch:fused-qkv", (-0.05, 0.05), (-0.12, 0.02)),
        ],
        memory_effects=[effect("patch:fused-qkv", (0.0, 0.1), (0.05, 0.02))],
        winners=winners if winners is not None else [WINNER],
    )


def resolution_for(study: StudySpace, created: ev.StudyCreated, entries: list[ev.BankEntry]) -> ev.BankResolution:
    return resolve_bank(entries, study, study_meta(study, created.cluster))


def test_init_resolution_records_matches_priors_and_adapted_seeds(tmp_path: Path) -> None:
    created = study_created(tmp_path).payload
    study = loader(created)
    meta = study_meta(study, created.cluster)
    assert meta.accelerator == "H100-80G" and meta.generation == "hopper" and meta.micro_batch == 2
    assert meta.global_batch == 16 and meta.device_memory_bytes == created.cluster.memory_capacity_bytes
    moe = msgspec.structs.replace(meta, accelerator="V100-32G", generation="", model_family="moe",
                                  device_memory_bytes=32 * 2**30, nodes=16, devices_per_node=8)
    entries = [entry_for(moe, "entry-far"), entry_for(meta)]
    resolution = resolve_bank(entries, study, meta)

    assert [m.entry_id for m in resolution.matches] == ["entry-similar"]  # the far one is under the threshold
    assert resolution.matches[0].similarity == pytest.approx(1.0)
    assert resolution.matches[0].why == "same hardware, model, parallelism and batch"
    assert set(resolution.time_priors) == {"attention=sdpa", "compile", "patch:fused-qkv"}
    assert set(resolution.memory_priors) == {"patch:fused-qkv"}
    sdpa = resolution.time_priors["attention=sdpa"]
    assert sdpa.entries == ["entry-similar"] and -0.31 < sdpa.mean < -0.27 and sdpa.std < 0.05
    assert [(s.candidate, s.entry_id) for s in resolution.seeds] == [(ADAPTED, "entry-similar")]
    assert "winner #1 of entry-similar" in resolution.seeds[0].reason
    # deterministic: the order in which the streams returned the entries does not matter
    assert resolve_bank(list(reversed(entries)), study, meta) == resolution
    # and it survives the wire
    created_with_bank = msgspec.structs.replace(created, bank=resolution)
    assert msgspec.json.decode(msgspec.json.encode(created_with_bank), type=ev.StudyCreated) == created_with_bank

    summary = bank_summary(created_with_bank, entries_seen=2)
    assert summary["matches"][0]["entry_id"] == "entry-similar" and summary["priors"] == {"time": 3, "memory": 1}
    assert summary["seeds"][0]["candidate_key"] == ADAPTED.key()
    lines = bank_lines(created_with_bank, entries_seen=2)
    assert lines[0].startswith("bank: 1 of 2 entries seed this study")
    assert "entry-similar  similarity 1.00  same hardware" in lines[1]


def test_an_empty_bank_records_only_the_study_meta(tmp_path: Path) -> None:
    created = study_created(tmp_path).payload
    resolution = resolution_for(loader(created), created, [])
    assert resolution.matches == [] and resolution.time_priors == {} and resolution.seeds == []
    assert resolution.meta.accelerator == "H100-80G"
    assert loader(created).with_bank(resolution).kb == loader(created).kb  # no priors: the same space


def created_with_bank(tmp_path: Path, **kwargs) -> ev.Event:
    created = study_created(tmp_path, **kwargs)
    study = loader(created.payload)
    resolution = resolution_for(study, created.payload, [entry_for(study_meta(study, created.payload.cluster))])
    payload = msgspec.structs.replace(created.payload, bank=resolution,
                                      bank_seeds=[m.entry_id for m in resolution.matches])
    return msgspec.structs.replace(created, payload=payload)


def test_proposer_starts_from_the_bank_seeds_and_replay_gives_the_same_proposals(tmp_path: Path) -> None:
    created = created_with_bank(tmp_path, trials=8)
    run = envelope(RunRequested(parallel=3), event_id="run-1")
    log = run_events([ProposerState(load_study=loader)], World(loader(created.payload), seed=1), [created, run])
    proposed = of_type(log, ev.TrialProposed)
    first = proposed[0].payload
    assert first.origin == "bank" and first.candidate == ADAPTED and "winner #1 of entry-similar" in first.reason
    # the bank seed takes the design's first slot (the prior's best guess); space-filling seeds follow
    assert [p.payload.origin for p in proposed[1:3]] == ["seed", "seed"]
    assert sum(p.payload.origin == "bank" for p in proposed) == 1  # never proposed twice

    # replay (what the service's start() does) emits the same, in the same order
    emitted = [(e.trial_id, e.payload) for e in log if e.source == "ProposerState"]
    fresh = ProposerState(load_study=loader)
    assert [(e.trial_id, e.payload) for event in log for e in fresh.apply(msg_copy(event))] == emitted

    # without the bank the same study starts elsewhere: the seed came from StudyCreated.bank
    plain = study_created(tmp_path, trials=8)
    cold = run_events([ProposerState(load_study=loader)], World(loader(plain.payload), seed=1),
                      [plain, envelope(RunRequested(parallel=3), event_id="run-1")])
    assert "bank" not in {e.payload.origin for e in of_type(cold, ev.TrialProposed)}


def test_modeler_and_proposer_take_the_bank_priors_from_study_created(tmp_path: Path) -> None:
    created = created_with_bank(tmp_path, trials=4)
    bank = created.payload.bank
    assert bank is not None
    modeler = ModelerState(load_study=loader)
    proposer = ProposerState(load_study=loader)
    log = run_events([proposer, modeler], World(loader(created.payload)), [created, envelope(RunRequested(parallel=2))])
    study = modeler.model(created.study_id).space
    assert study.bank_features == {"attention=sdpa", "compile", "patch:fused-qkv"}
    specs = {s.name: i for i, s in enumerate(modeler.searcher(created.study_id).time_model.encoder.specs)}
    tm = modeler.searcher(created.study_id).time_model
    for feature in ("attention=sdpa", "compile", "patch:fused-qkv"):
        prior = bank.time_priors[feature]
        assert tm.prior_mean[specs[feature]] == pytest.approx(prior.mean)
        assert tm.prior_std[specs[feature]] == pytest.approx(prior.std)
    # the proposer's searcher was built from the same space: the same priors
    ptm = proposer.studies[created.study_id].searcher.time_model
    assert list(ptm.prior_mean) == list(tm.prior_mean)
    updates = [e.payload for e in of_type(log, ev.ModelUpdated)]
    assert updates and {e.source for e in updates[-1].time_effects if e.feature == "patch:fused-qkv"} == {"bank"}


# --------------------------------------------------------------------------------- reporter: the fold


def finished_study_log(tmp_path: Path) -> list[ev.Event]:
    created = created_with_bank(tmp_path, trials=6)
    return run_events([ProposerState(load_study=loader), ModelerState(load_study=loader)],
                      World(loader(created.payload), seed=2), [created, envelope(RunRequested(parallel=2))])


def test_the_reporter_fold_distils_a_finished_study_once_and_replays_identically(tmp_path: Path) -> None:
    log = finished_study_log(tmp_path)
    finished = of_type(log, ev.StudyFinished)
    assert len(finished) == 1
    fold = BankDistiller()
    published = [(event, out) for event in log for out in fold.apply(event)]
    # published exactly on StudyFinished (verdicts during the search wait for it)
    assert [cause.event_id for cause, _ in published] == [finished[0].event_id]
    bank_event = published[0][1]
    entry = bank_event.payload
    assert isinstance(entry, ev.BankEntry)
    assert bank_event.type == "BankEntry" and bank_event.cluster_id == "c1" and bank_event.source == "reporter"
    assert subjects.subject_for(bank_event) == f"bank.c1.{entry.entry_id}"
    created = log[0].payload
    assert entry.origin_study == log[0].study_id and entry.meta == created.bank.meta
    assert entry.time_effects and all(e.feature != "intercept" for e in entry.time_effects)
    verified = {e.payload.candidate.key() for e in of_type(log, ev.VerifyCompleted) if e.payload.promotable}
    assert entry.winners and entry.winners[0].key() in verified
    assert ev.Candidate() not in entry.winners  # the baseline is no lesson

    # a fresh fold fed the same log (the reporter's start) publishes the same event id; a redelivery re-publishes
    again = BankDistiller()
    replayed = [out for event in log for out in again.apply(msg_copy(event))]
    assert [e.event_id for e in replayed] == [bank_event.event_id] and replayed[0].payload == entry
    assert [e.event_id for e in again.apply(finished[0])] == [bank_event.event_id]

    # a verification completed after the study finished publishes a revision with that verdict
    late = msgspec.structs.replace(of_type(log, ev.VerifyCompleted)[-1].payload, verify_id="late-verify",
                                   failed_invariants=["loss"], promotable=False)
    revision = fold.apply(envelope(late, source="verifier"))
    assert len(revision) == 1 and revision[0].payload.entry_id == entry.entry_id
    assert revision[0].event_id != bank_event.event_id
    assert any(f.kind == "invariant_violation" for f in revision[0].payload.failures)


def test_telemetry_is_not_remembered_by_the_fold() -> None:
    fold = BankDistiller()
    step = ev.TrialStep(rank=0, world_size=1, step=1, loss=1.0, step_time_s=0.1, tokens=1, optimizer_steps=1,
                        peak_memory_bytes=1)
    assert fold.apply(envelope(step, trial_id="t")) == [] and not fold._seen
