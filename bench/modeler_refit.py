"""Modeler speed: refit time (time, memory and invariant models) at 1k and 5k trials, observe+suggest latency
at ~100 trials, and the proposer's decision latency at 5k observed trials (a trial measured → the next one
proposed: observe, should_stop, suggest, the proposal's prediction).

Trials come from a SIMULATOR scenario (random feasible candidates, simulated outcomes incl. OOMs).

    python bench/modeler_refit.py [--json OUT.json]
"""

# ruff: noqa: E402  (BLAS thread count must be set before numpy is imported)
from __future__ import annotations

import os

# one BLAS thread: the models are small matrices, and threaded BLAS on a shared 2-core box is several times
# slower (set before numpy is imported)
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np
from _common import write_json
from infrarsi.modeling.search import CandidatePool, Observation, Searcher
from infrarsi.sim.scenarios import get_scenario


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="dense7b_h100x64")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    sc = get_scenario(args.space)
    meta = sc.memory_meta()
    pool = CandidatePool.build(sc.space, meta)
    rng = np.random.default_rng(0)
    result: dict = {"simulated": True, "space": args.space, "refit_seconds": {}, "latency_ms": {}}
    for n in (1000, 5000):
        s = Searcher(sc.space, sc.capacity_bytes, meta=meta, pool=pool, seed=0)
        idx = rng.choice(len(pool.candidates), size=n, replace=True)
        for i in idx:
            c = pool.candidates[int(i)]
            o = sc.evaluate(c, rng)
            s.observe(Observation(c, o.status, o.step_time_s, o.peak_bytes, o.cost_seconds))
        s.refit()  # cold fit
        # the timed trial breaks an invariant, so the invariant model re-solves too (the costlier case)
        for j in rng.integers(len(pool.candidates), size=10_000):
            c = pool.candidates[int(j)]
            o = sc.evaluate(c, rng)
            if o.status == "invariant_violation":
                break
        s.observe(Observation(c, o.status, o.step_time_s, o.peak_bytes, o.cost_seconds))
        t0 = time.perf_counter()
        s.refit()  # warm refit after one more trial: what the modeler does per event
        result["refit_seconds"][str(n)] = time.perf_counter() - t0
        print(f"refit at {n} trials: {result['refit_seconds'][str(n)]:.3f} s (warm, after one new trial)")
    decisions = []
    for _ in range(25):
        t0 = time.perf_counter()
        s.observe(Observation(c, o.status, o.step_time_s, o.peak_bytes, o.cost_seconds))
        s.should_stop()
        sug = s.suggest(1)
        s.predict([sug[0].candidate])
        decisions.append((time.perf_counter() - t0) * 1000)
        c = sug[0].candidate
        o = sc.evaluate(c, rng)
    n_obs = len(s.observations)
    result["decision_latency_ms"] = {"p50": float(np.percentile(decisions, 50)),
                                     "p95": float(np.percentile(decisions, 95)), "observed_trials": n_obs}
    print(f"decision latency (measured -> next proposed) at {n_obs} observed trials: p50 "
          f"{result['decision_latency_ms']['p50']:.1f} ms, p95 {result['decision_latency_ms']['p95']:.1f} ms")
    s = Searcher(sc.space, sc.capacity_bytes, meta=meta, pool=pool, seed=1)
    lat = []
    for k in range(130):
        t0 = time.perf_counter()
        sug = s.suggest(1)
        c = sug[0].candidate
        o = sc.evaluate(c, rng)
        s.observe(Observation(c, o.status, o.step_time_s, o.peak_bytes, o.cost_seconds))
        s.refit()
        if k >= 70:
            lat.append((time.perf_counter() - t0) * 1000 - 0.0)
    result["latency_ms"] = {"p50": float(np.percentile(lat, 50)), "p95": float(np.percentile(lat, 95)),
                            "trials": "70-130"}
    print(f"observe+suggest latency at 70-130 trials: p50 {result['latency_ms']['p50']:.1f} ms, "
          f"p95 {result['latency_ms']['p95']:.1f} ms (pool {len(pool.candidates)} candidates)")
    write_json(args.json_out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
