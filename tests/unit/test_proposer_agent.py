"""The proposer's agent role as a pure fold: when it asks, how answers enter the search (origin ``llm``, the
share of slots, priors as overrides), and that replay reproduces it from the stored answers alone.

The model is a script here (the HTTP exchange and the gates are tested against a real server in
tests/integration/test_agent_adversarial.py); the world is the synthetic workload of test_proposer_logic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infrarsi import events as ev
from infrarsi.study.contract import contract_from_dict
from infrarsi.study.ledger import TrialOutcome
from infrarsi_services.proposer.agent import AgentRole
from infrarsi_services.proposer.logic import ProposerState, RunRequested
from test_proposer_logic import World, envelope, loader, msg_copy, of_type, run_events
from test_study_space import synthetic_contract_dict, synthetic_space

FILES = {"model.py": "def attention(q, k, v):\n    return manual(q, k, v)\n"}
GOOD = ev.Candidate(knobs={"train.compile": True, "model.attention": "sdpa"})


def agent_study(repo: Path, *, tokens: int = 10_000, share: float = 0.25, trials: int = 12, **agent: Any) -> ev.Event:
    data = synthetic_contract_dict(repo, trials=trials)
    data["budget"]["llm_tokens"] = tokens
    data["agent"] = {"model": "scripted", "share": share, "ask_every": 3, "max_asks": 3, **agent}
    contract = contract_from_dict(data, check=False)
    return envelope(ev.StudyCreated(name="synthetic", goal="faster", contract=contract.to_dict(),
                                    contract_sha256=contract.sha256(), workload_dir=str(repo), baseline_ref="0" * 40,
                                    locked_files={}, cluster=contract.cluster.info()), source="cli.init")


class ScriptedModel(World):
    """The world, plus a model answering each ``AgentAsked`` with the next scripted ``AgentAnswered``."""

    def __init__(self, *args: Any, answers: list[dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answers = answers
        self.asked: list[ev.AgentAsked] = []

    def react(self, event: ev.Event) -> list[ev.Event]:
        match event.payload:
            case ev.AgentAsked() as asked:
                self.asked.append(asked)
                answered = ev.AgentAnswered(ask_id=asked.ask_id, **self.answers[min(len(self.asked), len(self.answers)) - 1])
                self.study = self.study.with_agent(answered.patches)  # the launcher knows the new patches too
                return [envelope(answered, source="proposer")]
            case _:
                return super().react(event)


def state(**kwargs: Any) -> ProposerState:
    return ProposerState(load_study=loader, agent_available=lambda _c: True, load_files=lambda *_: dict(FILES),
                         **kwargs)


def good_answer(**extra: Any) -> dict[str, Any]:
    return {"ok": True, "text": "{...}", "prompt_tokens": 900, "completion_tokens": 100,
            "candidates": [ev.AgentKnobProposal(candidate=GOOD, reason="compile and sdpa fuse the attention")],
            **extra}


def test_no_model_configured_means_no_question_and_the_same_study(tmp_path: Path) -> None:
    created = agent_study(tmp_path)
    run = envelope(RunRequested(parallel=3), event_id="run-1")
    plain = run_events([ProposerState(load_study=loader)], World(loader(created.payload), seed=1), [created, run])
    assert not of_type(plain, ev.AgentAsked)
    no_tokens = agent_study(tmp_path, tokens=0)
    log = run_events([state()], ScriptedModel(loader(no_tokens.payload), seed=1, answers=[good_answer()]),
                     [no_tokens, msg_copy(run)])
    assert not of_type(log, ev.AgentAsked)
    assert [e.payload.candidate_key for e in of_type(log, ev.TrialProposed)] == [
        e.payload.candidate_key for e in of_type(plain, ev.TrialProposed)]


def test_the_model_is_asked_at_the_start_and_its_candidate_goes_first_with_origin_llm(tmp_path: Path) -> None:
    created = agent_study(tmp_path, trials=12, share=0.25)
    world = ScriptedModel(loader(created.payload), answers=[good_answer()])
    log = run_events([state()], world, [created, envelope(RunRequested(parallel=1))])
    asked = of_type(log, ev.AgentAsked)
    assert 1 <= len(asked) <= 3 and asked[0].payload.purpose == "proposals"
    prompt = asked[0].payload.messages[1].content
    assert "<<<FILE model.py" in prompt and "train.micro_batch_size" in prompt
    # the second question shows the trials so far and what the first answers cost
    assert len(asked) >= 2 and '"status": "ok"' in asked[1].payload.messages[1].content
    assert asked[1].payload.tokens_spent_before == 1000
    llm = [e.payload for e in of_type(log, ev.TrialProposed) if e.payload.origin == "llm"]
    assert [p.candidate for p in llm] == [GOOD]  # the same candidate again is deduplicated
    assert llm[0].reason == "compile and sdpa fuse the attention" and llm[0].prediction is not None
    proposed = [e.payload for e in of_type(log, ev.TrialProposed)]
    assert proposed.index(llm[0]) == 0  # the slot was held for the first answer: the search's first trial
    first_answer = next(i for i, e in enumerate(log) if isinstance(e.payload, ev.AgentAnswered))
    first_trial = next(i for i, e in enumerate(log) if isinstance(e.payload, ev.TrialProposed))
    assert first_answer < first_trial


def test_the_agents_share_waits_for_the_first_answer_and_a_failed_one_frees_it(tmp_path: Path) -> None:
    """With its share of the slots held (2 of 4 trials, 2 slots), nothing is proposed before the first answer;
    a failed exchange (the service's bound: ``timeout``) frees them and the search runs its whole budget."""
    created = agent_study(tmp_path, trials=4, share=0.5)
    timeout = {"ok": False, "error": "timeout", "detail": "no checked answer within 1 s", "prompt_tokens": 0,
               "completion_tokens": 0}
    fold = state()
    log = run_events([fold], ScriptedModel(loader(created.payload), answers=[timeout]),
                     [created, envelope(RunRequested(parallel=2))])
    kinds = [type(e.payload).__name__ for e in log if isinstance(e.payload, ev.AgentAsked | ev.AgentAnswered
                                                                  | ev.TrialProposed)]
    assert kinds[:3] == ["AgentAsked", "AgentAnswered", "TrialProposed"], kinds
    assert len(of_type(log, ev.TrialProposed)) == 4 and of_type(log, ev.StudyFinished)
    assert not [e for e in of_type(log, ev.TrialProposed) if e.payload.origin == "llm"]

    # the same study answered well: its two trials are the first two proposed, before any of the searcher's
    good = [ev.AgentKnobProposal(candidate=ev.Candidate(knobs={"train.micro_batch_size": mb}), reason=f"mb {mb}")
            for mb in (1, 4)]
    log = run_events([state()], ScriptedModel(loader(created.payload), answers=[good_answer(candidates=good)]),
                     [msg_copy(created), envelope(RunRequested(parallel=2))])
    assert [e.payload.origin for e in of_type(log, ev.TrialProposed)][:2] == ["llm", "llm"]


def test_the_share_caps_the_agents_trials(tmp_path: Path) -> None:
    many = [ev.AgentKnobProposal(candidate=ev.Candidate(knobs={"train.micro_batch_size": mb}), reason=f"mb {mb}")
            for mb in (1, 4, 8, 16)]
    created = agent_study(tmp_path, trials=12, share=0.25)
    log = run_events([state()], ScriptedModel(loader(created.payload), answers=[good_answer(candidates=many)]),
                     [created, envelope(RunRequested(parallel=2))])
    llm = [e for e in of_type(log, ev.TrialProposed) if e.payload.origin == "llm"]
    assert len(llm) == 3  # floor(0.25 × 12)
    assert len(of_type(log, ev.TrialProposed)) == 12


def test_priors_enter_the_knowledge_base_and_patches_the_space(tmp_path: Path) -> None:
    prior = ev.AgentPrior(feature="compile", mean=-0.4, std=0.1, weight=0.5, reason="fusion")
    patch = ev.AgentPatch(patch_id="llm-abc", diff="--- a/model.py\n", description="fuse", files=["model.py"],
                          expected_time_log_ratio=-0.2, prior_std=0.1)
    created = agent_study(tmp_path, trials=8)
    fold = state()
    log = run_events([fold], ScriptedModel(loader(created.payload), answers=[good_answer(priors=[prior], patches=[patch])]),
                     [created, envelope(RunRequested(parallel=1))])
    study = fold.studies[created.study_id].space
    assert study.kb.time["compile"] == (-0.4, 0.1) and "compile" in study.agent_features
    assert study.space.patch("llm-abc").time_prior == (-0.2, 0.1) and "llm-abc" in study.contract.search_space.patches
    # the new patch is tried on the baseline (no candidate of the answer used it), within the share
    llm = [e.payload.candidate for e in of_type(log, ev.TrialProposed) if e.payload.origin == "llm"]
    assert llm == [GOOD, ev.Candidate(patches=["llm-abc"])]


def test_failed_and_over_budget_answers_are_recorded_and_the_search_goes_on(tmp_path: Path) -> None:
    created = agent_study(tmp_path, trials=8, tokens=1500)
    answers = [{"ok": False, "error": "not_json", "text": "sure!", "prompt_tokens": 800, "completion_tokens": 20},
               {"ok": False, "error": "budget_exceeded", "prompt_tokens": 600, "completion_tokens": 200}]
    fold = state()
    log = run_events([fold], ScriptedModel(loader(created.payload), answers=answers),
                     [created, envelope(RunRequested(parallel=1))])
    assert len(of_type(log, ev.AgentAsked)) == 2  # then the 1500 tokens are spent: no third question
    assert fold.studies[created.study_id].agent.tokens_spent == 1620
    assert not [e for e in of_type(log, ev.TrialProposed) if e.payload.origin == "llm"]
    assert len(of_type(log, ev.TrialProposed)) == 8 and of_type(log, ev.StudyFinished)


def test_replay_reads_the_stored_answers_and_asks_nothing_new(tmp_path: Path) -> None:
    created = agent_study(tmp_path, trials=9)
    world = ScriptedModel(loader(created.payload), seed=2, answers=[good_answer()])
    log = run_events([state()], world, [created, envelope(RunRequested(parallel=3), event_id="run-1")])
    emitted = [(e.trial_id, e.payload) for e in log if e.source == "ProposerState"]
    fresh = state()
    replayed = [(e.trial_id, e.payload) for event in log for e in fresh.apply(event)]
    assert replayed == emitted  # the same questions, byte for byte, and the same proposals
    assert fresh.studies[created.study_id].agent.pending is None  # every question has its stored answer
    asked_before = len(world.asked)
    assert asked_before == len(of_type(log, ev.AgentAsked))  # nothing but the fold's own questions


def test_share_zero_never_spends_a_trial_on_the_agent(tmp_path: Path) -> None:
    created = agent_study(tmp_path, trials=6, share=0.0)
    log = run_events([state()], ScriptedModel(loader(created.payload), answers=[good_answer()]),
                     [created, envelope(RunRequested(parallel=1))])
    assert not [e for e in of_type(log, ev.TrialProposed) if e.payload.origin == "llm"]


def test_measurements_overrule_a_confidently_wrong_model(tmp_path: Path) -> None:
    """The world's compile and sdpa make steps faster; a model claiming both slow them by ×1.8 has its priors
    dropped after a few trials, and the search then finds the fast settings all the same."""
    wrong = [ev.AgentPrior(feature=f, mean=0.6, std=0.1, weight=0.5, reason="confidently wrong")
             for f in ("compile", "attention=sdpa")]
    created = agent_study(tmp_path, trials=14, share=0.0)
    fold = state()
    log = run_events([fold], ScriptedModel(loader(created.payload), answers=[good_answer(candidates=[], priors=wrong)]),
                     [created, envelope(RunRequested(parallel=1))])
    agent = fold.studies[created.study_id].agent
    assert agent.distrusted_at is not None and agent.distrusted_at <= 4, agent.log_bayes_factor
    study = fold.studies[created.study_id].space
    assert "compile" not in study.agent_features and study.kb.time.get("compile") != (0.6, 0.1)
    best = of_type(log, ev.VerifyRequested)[0].payload.candidates[0]
    assert best.knobs.get("train.compile") is True and best.knobs.get("model.attention") == "sdpa"


def test_a_right_model_keeps_its_priors(tmp_path: Path) -> None:
    right = [ev.AgentPrior(feature="compile", mean=-0.3, std=0.05, weight=0.5, reason="right"),
             ev.AgentPrior(feature="attention=sdpa", mean=-0.2, std=0.05, weight=0.5, reason="right")]
    created = agent_study(tmp_path, trials=10, share=0.0)
    fold = state()
    log = run_events([fold], ScriptedModel(loader(created.payload), answers=[good_answer(candidates=[], priors=right)]),
               [created, envelope(RunRequested(parallel=1))])
    agent = fold.studies[created.study_id].agent
    reasons = [e.payload.reason for e in of_type(log, ev.TrialProposed)]
    hedged = [r for r in reasons if r.startswith("without the model's priors (they are on probation)")]
    assert hedged, reasons  # undecided, so every other searcher proposal was the hedge's
    assert agent.distrusted_at is None and agent.log_bayes_factor < 0
    assert fold.studies[created.study_id].space.kb.time["compile"] == (-0.3, 0.05)


def test_after_a_drop_the_search_goes_on_as_the_hedge_without_the_models_picks(tmp_path: Path) -> None:
    """Neither the hedge nor the search rebuilt once the wrong priors are dropped learns from the trials the
    model chose while on probation (its own knob vectors and its searcher's picks): that search goes on as the
    search without the model would."""
    wrong = [ev.AgentPrior(feature=f, mean=0.6, std=0.1, weight=0.5, reason="confidently wrong")
             for f in ("compile", "attention=sdpa")]
    slow = ev.Candidate(knobs={"train.compile": False, "model.attention": "manual", "train.micro_batch_size": 1})
    created = agent_study(tmp_path, trials=12, share=0.25)
    fold = state()
    answer = good_answer(candidates=[ev.AgentKnobProposal(candidate=slow, reason="wrong")], priors=wrong)
    log = run_events([fold], ScriptedModel(loader(created.payload), answers=[answer]),
                     [created, envelope(RunRequested(parallel=1))])
    study = fold.studies[created.study_id]
    assert study.agent.distrusted_at is not None
    proposed = {e.trial_id: e.payload for e in of_type(log, ev.TrialProposed)}
    led = {proposed[t].candidate.key() for t in study.model_led}
    assert any(proposed[t].origin == "llm" for t in study.model_led)  # the model's own knob vector
    seen = {study.space.to_event(o.candidate).key() for o in study.searcher.observations}
    assert seen and not seen & led
    assert all(not proposed[t].reason.startswith("without the model's priors") for t in study.model_led)


def test_the_hedge_proposes_right_after_the_models_own_candidate(tmp_path: Path) -> None:
    right = [ev.AgentPrior(feature="compile", mean=-0.3, std=0.05, weight=0.5, reason="right")]
    created = agent_study(tmp_path, trials=6, share=0.2)
    fold = state()
    log = run_events([fold], ScriptedModel(loader(created.payload), answers=[good_answer(priors=right)]),
                     [created, envelope(RunRequested(parallel=1))])
    proposals = [e.payload for e in of_type(log, ev.TrialProposed)]
    assert proposals[0].origin == "llm"
    assert proposals[1].reason.startswith("without the model's priors (they are on probation)"), proposals[1].reason


def test_runs_that_broke_an_invariant_still_measure_speed_for_the_prior_check(tmp_path: Path) -> None:
    """A trial that broke the loss ran at its real speed: its step time is evidence about the model's time
    priors (as it is for the time model), so a wrong model is overruled even when no trial kept every
    invariant."""
    study = synthetic_space(tmp_path)
    role = AgentRole(files={}, priors=[ev.AgentPrior(feature="compile", mean=0.6, std=0.1, weight=0.5)])
    runs = [({"train.compile": c, "model.attention": a}, t) for c, a, t in
            [(False, "manual", 2.0), (True, "manual", 1.4), (False, "sdpa", 1.9), (True, "sdpa", 1.3)]]
    outcomes = [TrialOutcome(trial_id=f"t{i}", candidate=ev.Candidate(knobs=k), kind="search",
                             status="invariant_violation", step_time_s=t, peak_bytes=2**30, accelerator_s=1.0)
                for i, (k, t) in enumerate(runs)]
    assert role.check_priors(study, outcomes, noise_std=0.03) and role.distrusted_at == 4


def test_the_models_own_fast_pick_is_verified_though_its_priors_were_dropped(tmp_path: Path) -> None:
    """The search after a drop learns without the model's picks, but the verification shortlist ranks every
    measured trial: a fast knob vector of a model whose priors were wrong is still verified."""
    wrong = [ev.AgentPrior(feature=f, mean=0.6, std=0.1, weight=0.5, reason="confidently wrong")
             for f in ("compile", "attention=sdpa")]
    created = agent_study(tmp_path, trials=6, share=0.2)
    fold = state()
    log = run_events([fold], ScriptedModel(loader(created.payload), answers=[good_answer(priors=wrong)]),
                     [created, envelope(RunRequested(parallel=1))])
    study = fold.studies[created.study_id]
    assert study.agent.distrusted_at is not None
    llm = [e.payload.candidate for e in of_type(log, ev.TrialProposed) if e.payload.origin == "llm"]
    verified = of_type(log, ev.VerifyRequested)[0].payload.candidates
    assert llm and llm[0] in verified, (llm, verified)
