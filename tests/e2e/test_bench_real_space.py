"""The real dense-1node CPU space of bench/search_vs_peers.py: real training jobs through the launcher and telemetry
services in-process, two tuners at budget 2, one seed; a repeated candidate is the cached measurement."""

from __future__ import annotations

import math

import pytest
from support.bench_spaces import load_bench

bench = load_bench()

STATUSES = {"ok", "oom", "crash", "timeout", "scope_violation", "invariant_violation"}


@pytest.mark.slow
@pytest.mark.timeout(1800)  # real jobs: ~2 min on a quiet 2-core host, several times that on a busy one
def test_real_space_runs_real_trials_and_measures_each_candidate_once() -> None:
    from real_space import DENSE_1NODE, RealTrials, bench_space

    trials = RealTrials(DENSE_1NODE, steps=12)
    bs = bench_space(trials, "dense-1node (real, CPU)")
    try:
        assert bs.kind == "real, CPU" and bs.true_time is None and bs.oracle_time is None
        assert bs.capacity_bytes == 2**30
        runs = {"infrarsi": bench.TUNERS["infrarsi"](bs, 0, 2), "random": bench.TUNERS["random"](bs, 0, 2)}
        for run in runs.values():
            assert len(run) == 2
            for t in run:
                assert t.status in STATUSES
                if t.status == "ok":
                    assert t.step_time_s is not None and 0.0 < t.step_time_s < 60.0
                if t.status not in ("scope_violation",):
                    assert t.cost > 0.0
        baseline = trials.baseline
        assert baseline is not None and baseline.status == "ok"
        assert baseline.step_time_s is not None and baseline.step_time_s > 0.0
        assert baseline.peak_bytes is not None and 0 < baseline.peak_bytes < bs.capacity_bytes

        unique = {t.candidate.key for run in runs.values() for t in run} | {bs.baseline.key}
        assert trials.trials_run == len(unique)  # the baseline, then each candidate once
        hits_before = trials.cache_hits
        again = bench.TUNERS["random"](bs, 0, 2)  # the same seed asks for the same candidates
        assert [t.candidate for t in again] == [t.candidate for t in runs["random"]]
        assert [(t.status, t.step_time_s, t.cost) for t in again] == [
            (t.status, t.step_time_s, t.cost) for t in runs["random"]]
        assert trials.trials_run == len(unique) and trials.cache_hits == hits_before + 2

        reference = bench.measured_reference(runs.values())
        if reference is not None:  # no ok trial among four random-ish candidates is possible, if unlikely
            assert reference.time_s > 0.0
            for run in runs.values():
                final = bench.score(bs, run, 2, reference)["best_over_oracle"]["2"]
                assert 0.0 <= final <= 1.0 and not math.isnan(final)
        info = bs.info()
        assert info["horizon_steps"] == 12 and info["real_trials_run"] == len(unique)
        assert sum(info["statuses"].values()) == len(unique)
    finally:
        bs.close()
    assert not trials.data_dir.exists()
