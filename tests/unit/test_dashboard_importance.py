"""The dashboard's parameter importance (``infrarsi.dashboard.importance``) on synthetic trials whose answer is
known: one knob drives the step time, another is irrelevant; a knob that drives running out of memory; a knob the
search changed together with the one that matters; a patch that helps only at one micro-batch (a pure pairwise
interaction), an additive truth (no interaction) and pure noise (no effect at all). Pure numbers, no database."""

from __future__ import annotations

import math

import numpy as np
import pytest
from infrarsi.dashboard import importance, views


def _trials(seed: int, n: int = 24) -> tuple[dict[str, list], list[float]]:
    """``micro_batch`` (4 levels) sets the step time (×0.5 per doubling), ``compile`` (on/off) does nothing,
    ``lr_scale`` (a float, every trial its own value) does nothing; 2 % log-normal noise."""
    rng = np.random.default_rng(seed)
    mb = [int(v) for v in rng.choice([1, 2, 4, 8], size=n)]
    compile_ = [str(v) for v in rng.choice(["on", "off"], size=n)]
    lr = [float(v) for v in rng.uniform(0.5, 2.0, size=n)]
    step = [0.8 * (1 / m) ** 0.5 * math.exp(rng.normal(0, 0.02)) for m in mb]
    return {"micro_batch": mb, "compile": compile_, "lr_scale": lr}, step


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_knob_that_drives_the_step_time_carries_its_variance_and_the_irrelevant_ones_none(seed):
    dims, step = _trials(seed)
    fit = importance.main_effects(dims, [math.log(s) for s in step], "log step time")
    assert fit is not None and fit.trials == 24
    assert fit.ranked()[0][0] == "micro_batch"
    assert fit.shares["micro_batch"] > 0.97
    assert fit.shares["compile"] < 0.01 and fit.shares["lr_scale"] < 0.01
    assert fit.unexplained < 0.02  # the 2 % noise
    assert sum(fit.shares.values()) + fit.unexplained == pytest.approx(1.0)


def test_swapping_the_roles_swaps_the_answer():
    """Not a fixed ranking: the same trials with ``compile`` driving the time instead."""
    dims, _ = _trials(5)
    rng = np.random.default_rng(9)
    step = [(0.4 if c == "on" else 0.8) * math.exp(rng.normal(0, 0.02)) for c in dims["compile"]]
    fit = importance.main_effects(dims, [math.log(s) for s in step], "log step time")
    assert fit is not None and fit.ranked()[0][0] == "compile" and fit.shares["compile"] > 0.97
    assert fit.shares["micro_batch"] < 0.01


def test_a_knob_changed_together_with_the_one_that_matters_does_not_take_its_credit():
    """The search set ``recompute`` on for most large micro-batches (as it would: they need the memory), yet only
    the micro-batch changes the time. Per-knob means credit ``recompute``; the joint fit does not."""
    rng = np.random.default_rng(3)
    mb = [int(v) for v in rng.choice([2, 8], size=40)]
    recompute = [bool((m == 8) != (rng.uniform() < 0.15)) for m in mb]
    log_step = [math.log(0.5 if m == 8 else 1.0) + rng.normal(0, 0.01) for m in mb]
    fit = importance.main_effects({"micro_batch": mb, "recompute": recompute}, log_step, "log step time")
    assert fit is not None
    assert fit.shares["micro_batch"] > 0.9 and fit.shares["recompute"] < 0.01
    # what the one-knob-at-a-time comparison would have said about recompute
    on = [y for y, r in zip(log_step, recompute, strict=True) if r]
    off = [y for y, r in zip(log_step, recompute, strict=True) if not r]
    assert abs(np.mean(on) - np.mean(off)) > 0.4


def test_a_constant_dimension_has_no_share_and_too_few_trials_give_none():
    fit = importance.main_effects({"a": [1, 2, 1, 2, 1], "same": ["x"] * 5}, [0.0, 1.0, 0.1, 0.9, 0.0], "t")
    assert fit is not None and fit.shares["same"] == 0.0 and fit.shares["a"] > 0.9
    assert importance.main_effects({"a": [1, 2, 1]}, [0.0, 1.0, 0.0], "t") is None
    assert importance.main_effects({"a": [1, 2, 1, 2]}, [1.0] * 4, "t") is None  # nothing to explain
    with pytest.raises(ValueError, match="one value per trial"):
        importance.main_effects({"a": [1, 2]}, [0.0, 1.0, 2.0, 3.0], "t")


def _trial(n: int, knobs: dict, patches: list[str], outcome: str, step: float | None) -> dict:
    return {"n": n, "trial_id": f"t{n}", "kind": "search", "knobs": knobs, "patches": patches, "outcome": outcome,
            "step_time_s": step, "speedup": 1.0 / step if step else None, "censored_peak_bytes": None}


def test_the_analysis_keeps_oom_trials_and_finds_the_knob_that_runs_out_of_memory():
    """Through the view: micro-batch 16 always runs out of memory, the patch changes nothing; the OOM trials are
    in the analysis (with their outcome, no step time) and the OOM importance names micro_batch_size."""
    rng = np.random.default_rng(11)
    trials = []
    for n in range(1, 31):
        mb = int(rng.choice([2, 4, 8, 16]))
        patches = ["fused-qkv"] if rng.uniform() < 0.5 else []
        if mb == 16:
            trials.append(_trial(n, {"micro_batch_size": mb}, patches, "oom", None))
        else:
            trials.append(_trial(n, {"micro_batch_size": mb}, patches, "ok", 0.4 / mb ** 0.5 * math.exp(rng.normal(0, 0.02))))
    trials.append(_trial(31, {"micro_batch_size": 2}, [], "cancelled", None))  # the harness's doing: left out
    trials.append(_trial(32, {"micro_batch_size": 4}, [], "running", None))
    analysis = views.search_analysis(trials)
    ooms = sum(t["outcome"] == "oom" for t in trials)
    assert ooms >= 4
    assert len(analysis["trials"]) == 30 and analysis["oom_trials"] == ooms and analysis["ran_trials"] == 30
    assert [t["outcome"] for t in analysis["trials"]].count("oom") == ooms
    by_target = {imp["target"]: imp for imp in analysis["importance"]}
    assert by_target["OOM"]["trials"] == 30
    assert by_target["OOM"]["ranked"][0]["label"] == "micro_batch_size"
    patch_share = next(r["share"] for r in by_target["OOM"]["ranked"] if r["label"] == "patch fused-qkv")
    assert patch_share < 0.05
    assert by_target["log step time"]["trials"] == 30 - ooms
    assert by_target["log step time"]["ranked"][0]["label"] == "micro_batch_size"
    [mb] = [d for d in analysis["dimensions"] if d["label"] == "micro_batch_size"]
    assert not mb["categorical"] and len(mb["values"]) == 30


def _three_knobs(rng, n: int) -> dict[str, list]:
    return {"micro_batch": [int(v) for v in rng.choice([2, 8], size=n)],
            "patch": [str(v) for v in rng.choice(["on", "off"], size=n)],
            "compile": [str(v) for v in rng.choice(["on", "off"], size=n)]}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_pure_interaction_is_the_pairs_and_not_its_knobs(seed):
    """The patch speeds up micro-batch 8 and slows micro-batch 2 by as much: no main effect, all interaction. The
    first-order fit calls it unexplained; the pairwise one gives it to the pair and to no other."""
    rng = np.random.default_rng(seed)
    dims = _three_knobs(rng, 40)
    log_step = [0.3 * (1 if (m == 8) == (p == "on") else -1) + rng.normal(0, 0.02)
                for m, p in zip(dims["micro_batch"], dims["patch"], strict=True)]
    first = importance.main_effects(dims, log_step, "log step time")
    assert first is not None and first.unexplained > 0.85
    fit = importance.pairwise(dims, log_step, "log step time")
    assert isinstance(fit, importance.Importance)
    assert fit.ranked()[0][0] == "micro_batch × patch" and fit.shares["micro_batch × patch"] > 0.85
    assert fit.shares["micro_batch × compile"] < 0.01 and fit.shares["patch × compile"] < 0.01
    assert fit.unexplained < 0.02
    assert sum(fit.shares.values()) + fit.unexplained == pytest.approx(1.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_additive_truth_has_no_interaction_and_keeps_its_main_effects(seed):
    rng = np.random.default_rng(seed)
    dims = _three_knobs(rng, 40)
    log_step = [math.log(0.5 if m == 8 else 1.0) + (-0.2 if p == "on" else 0.0) + rng.normal(0, 0.02)
                for m, p in zip(dims["micro_batch"], dims["patch"], strict=True)]
    fit = importance.pairwise(dims, log_step, "log step time")
    first = importance.main_effects(dims, log_step, "log step time")
    assert isinstance(fit, importance.Importance) and first is not None
    assert all(share < 0.01 for label, share in fit.shares.items() if importance.PAIR in label)
    for knob in dims:
        assert fit.shares[knob] == pytest.approx(first.shares[knob], abs=0.01)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_interaction_never_takes_a_main_effects_credit(seed):
    """The patch helps at micro-batch 8 only (an AND: part main effects, part interaction), and the search tried
    micro-batch 8 more often and the patch mostly there (as a search does). The pairs are fitted on what the main
    effects leave, so each knob keeps the share the first-order fit gave it, and the pair takes what that fit left
    unexplained (fitted on the raw products instead, the pair shifts the patch's share by up to 0.12 here)."""
    rng = np.random.default_rng(seed)
    mb = [int(v) for v in rng.choice([2, 8], size=40, p=[0.3, 0.7])]
    dims = {"micro_batch": mb, "patch": ["on" if rng.uniform() < (0.8 if m == 8 else 0.3) else "off" for m in mb],
            "compile": [str(v) for v in rng.choice(["on", "off"], size=40)]}
    log_step = [math.log(0.5 if m == 8 else 1.0) + (-0.5 if m == 8 and p == "on" else 0.0) + rng.normal(0, 0.01)
                for m, p in zip(dims["micro_batch"], dims["patch"], strict=True)]
    first = importance.main_effects(dims, log_step, "log step time")
    fit = importance.pairwise(dims, log_step, "log step time")
    assert first is not None and isinstance(fit, importance.Importance)
    for knob in dims:
        assert fit.shares[knob] == pytest.approx(first.shares[knob], abs=0.01)
    assert fit.shares["micro_batch × patch"] == pytest.approx(first.unexplained - fit.unexplained, abs=0.01)
    assert fit.shares["micro_batch × patch"] > 0.02


def test_noise_is_not_passed_off_as_interactions():
    """A step time that no knob moves, over eight seeds: each interaction's variance is net of what its columns
    fit of noise, so the pairs share little on average and most of the variance stays unexplained (an unadjusted
    least-squares fit gives the pairs 5.6 % on average on these trials, against under 1 %)."""
    pair_shares, unexplained = [], []
    for seed in range(8):
        rng = np.random.default_rng(seed)
        dims = {**_three_knobs(rng, 60), "micro_batch": [int(v) for v in rng.choice([2, 4, 8], size=60)]}
        fit = importance.pairwise(dims, list(rng.normal(0, 1, size=60)), "log step time")
        assert isinstance(fit, importance.Importance)
        pair_shares.append(sum(share for label, share in fit.shares.items() if importance.PAIR in label))
        unexplained.append(fit.unexplained)
    assert np.mean(pair_shares) < 0.04 and np.mean(unexplained) > 0.88


def test_pairwise_says_why_when_the_trials_cannot_carry_it():
    rng = np.random.default_rng(0)
    dims = _three_knobs(rng, 12)  # 3 main + 3 pair columns: 18 trials needed
    reason = importance.pairwise(dims, list(rng.normal(size=12)), "log step time")
    assert reason == "12 trials for 6 columns: pairwise interactions need 3 trials per column (18)"
    assert importance.pairwise({"a": [1, 2] * 10, "b": ["x"] * 20}, list(range(20)), "t") == \
        "fewer than two knobs or patches vary"
    assert importance.pairwise(_three_knobs(rng, 30), [1.0] * 30, "t") == "the t does not vary"
    with pytest.raises(ValueError, match="one value per trial"):
        importance.pairwise({"a": [1, 2]}, [0.0, 1.0, 2.0], "t")


def test_the_analysis_finds_a_patch_that_helps_only_at_one_micro_batch():
    """Through the view: the patch speeds up micro-batch 8 alone; the interactions name that pair first."""
    rng = np.random.default_rng(5)
    trials = []
    for n in range(1, 41):
        mb = int(rng.choice([2, 8]))
        patches = ["fused-qkv"] if rng.uniform() < 0.5 else []
        step = 0.4 / mb ** 0.5 * (0.6 if mb == 8 and patches else 1.0) * math.exp(rng.normal(0, 0.01))
        trials.append(_trial(n, {"micro_batch_size": mb, "compile": bool(rng.uniform() < 0.5)}, patches, "ok", step))
    pairs = views.search_analysis(trials)["interactions"]
    assert pairs["trials"] == 40
    assert pairs["ranked"][0]["label"] == "micro_batch_size × patch fused-qkv" and pairs["ranked"][0]["share"] > 0.03
    assert all(r["share"] < 0.001 for r in pairs["ranked"][1:])
    few = views.search_analysis(trials[:8])["interactions"]
    assert "ranked" not in few and "pairwise interactions need" in few["reason"]
