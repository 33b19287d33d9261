"""A model's claim that a setting breaks an invariant of the job (an ``invariant`` prior): through the agent's
gate, into the search's invariant model, and overruled by one run that keeps every invariant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from infrarsi import events as ev
from infrarsi.agent.answers import MAX_RISK, MIN_RISK, GoldenRepo, check_proposals, prior_from_answer
from infrarsi.modeling.observations import Observation
from infrarsi.modeling.search import Searcher
from test_study_space import synthetic_space


def test_an_invariant_prior_names_a_setting_and_its_probability_is_clamped(tmp_path: Path) -> None:
    study = synthetic_space(tmp_path)
    text = json.dumps({"priors": [
        {"feature": "attention=sdpa", "target": "invariant", "mean": 1.0, "reason": "diverges"},
        {"feature": "compile", "target": "invariant", "mean": -0.5},
        {"feature": "micro_batch_size:log2", "target": "invariant", "mean": 0.5},
        {"feature": "patch:fused-qkv", "target": "invariant", "mean": 0.3},
    ]})
    checked = check_proposals(text, study, GoldenRepo(tmp_path, "0" * 40, {}), prior_weight=0.5, max_patches=3)
    assert [(p.feature, p.target, p.mean) for p in checked.priors] == [
        ("attention=sdpa", "invariant", MAX_RISK), ("compile", "invariant", MIN_RISK),
        ("patch:fused-qkv", "invariant", 0.3)]
    assert [(r.item, r.kind) for r in checked.refused] == [("prior micro_batch_size:log2", "unknown_feature")]


def test_the_models_invariant_claim_steers_the_search_until_a_run_clears_it(tmp_path: Path) -> None:
    study = synthetic_space(tmp_path)
    claims = [prior_from_answer("compile", "invariant", 0.9, 0.1, 0.5, "recompiles diverge"),
              prior_from_answer("patch:fused-qkv", "invariant", 0.9, 0.1, 0.5, "fused kernel is unstable")]
    told, untold = study.with_agent(priors=claims), study.with_agent(priors=claims, trust_model=False)
    compiled = study.from_event(ev.Candidate(knobs={"train.compile": True}))
    fused = study.from_event(ev.Candidate(patches=["fused-qkv"]))

    def p_hold(s, c, seen: tuple[Observation, ...] = ()) -> float:
        searcher = Searcher(s.space, 10 * 2**30, kb=s.kb)
        for o in seen:
            searcher.observe(o)
        return searcher.predict([c])[0].p_invariants

    assert p_hold(untold, compiled) > 0.8 and p_hold(told, compiled) < 0.2
    assert p_hold(told, fused) < 0.2 < p_hold(untold, fused)
    assert p_hold(told, compiled, (Observation(compiled, "ok", 1.0, 2**30),)) > 0.7  # one clean run overrules it


def test_an_invariant_claim_does_not_make_the_settings_time_prior_the_models(tmp_path: Path) -> None:
    study = synthetic_space(tmp_path).with_agent(priors=[prior_from_answer("compile", "invariant", 0.9, 0.1, 0.5, "")])
    assert list(study.kb.invariant) == ["compile=True"] and study.kb.invariant["compile=True"] == pytest.approx((1.8, 0.2))
    assert "compile" not in study.agent_features  # the report's prior source stays the knowledge base's
