"""The dashboard's parameter importance (``infrarsi.dashboard.importance``) on synthetic trials whose answer is
known: one knob drives the step time, another is irrelevant; a knob that drives running out of memory; a knob the
search changed together with the one that matters. Pure numbers, no database."""

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
