"""Modeler speed: refit time (time, memory and invariant models) at 1k and 5k trials, observe+suggest latency
at ~100 trials, and the proposer's decision latency at 5k observed trials (a trial measured → the next one
proposed: observe, should_stop, suggest, the proposal's prediction).

Beyond ``SearchConfig.refit_all_until`` observations a refit is a rank-k update of the time model between full
refits (``SearchConfig.refit_every``): both are timed, and the decision latency is measured twice in one run,
with the schedule and with every refit in full (``refit_all_until`` = ∞), interleaved decision by decision.

Trials come from a SIMULATOR scenario (random feasible candidates, simulated outcomes incl. OOMs). With
``--no-shape`` the searchers are not told the workload's shape: the generic memory model and its peer of the
other form (``SearchConfig.memory_peer_weight``), what a study of a user's own script gets.

    python bench/modeler_refit.py [--no-shape] [--json OUT.json]
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
from infrarsi.modeling.observations import Observation
from infrarsi.modeling.pool import CandidatePool
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.sim.scenarios import get_scenario


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="dense7b_h100x64")
    ap.add_argument("--no-shape", action="store_true", help="no workload shape: the generic memory models")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    sc = get_scenario(args.space)
    meta = None if args.no_shape else sc.memory_meta()
    pool = CandidatePool.build(sc.space, meta)
    rng = np.random.default_rng(0)
    result: dict = {"simulated": True, "space": args.space, "workload_shape": meta is not None, "refit_seconds": {},
                    "latency_ms": {}}
    for n in (1000, 5000):
        s = Searcher(sc.space, sc.capacity_bytes, meta=meta, pool=pool, seed=0)
        full = Searcher(sc.space, sc.capacity_bytes, meta=meta, pool=pool, seed=0,
                        config=SearchConfig(refit_all_until=10**9))
        idx = rng.choice(len(pool.candidates), size=n, replace=True)
        for i in idx:
            c = pool.candidates[int(i)]
            o = sc.evaluate(c, rng)
            s.observe(Observation(c, o.status, o.step_time_s, o.peak_bytes, o.cost_seconds))
            full.observe(Observation(c, o.status, o.step_time_s, o.peak_bytes, o.cost_seconds))
        s.refit()  # cold fit
        full.refit()
        # the timed trial breaks an invariant, so the invariant model re-solves too (the costlier case)
        for j in rng.integers(len(pool.candidates), size=10_000):
            c = pool.candidates[int(j)]
            o = sc.evaluate(c, rng)
            if o.status == "invariant_violation":
                break
        timed = {}
        for name, searcher in (("scheduled", s), ("full", full)):
            searcher.observe(Observation(c, o.status, o.step_time_s, o.peak_bytes, o.cost_seconds))
            t0 = time.perf_counter()
            searcher.refit()  # warm refit after one more trial: what the modeler does per event
            timed[name] = time.perf_counter() - t0
        result["refit_seconds"][str(n)] = timed
        print(f"refit at {n} trials, warm, after one new trial: {timed['scheduled']:.3f} s as scheduled "
              f"(rank-k update between full refits), {timed['full']:.3f} s in full")
    decisions: dict[str, list[float]] = {"scheduled": [], "full": []}
    cpu: dict[str, list[float]] = {"scheduled": [], "full": []}  # on a loaded host wall time is mostly waiting
    for _ in range(25):
        sug = []
        for name, searcher in (("scheduled", s), ("full", full)):  # the same trial, each searcher in turn
            t0, c0 = time.perf_counter(), time.process_time()
            searcher.observe(Observation(c, o.status, o.step_time_s, o.peak_bytes, o.cost_seconds))
            searcher.should_stop()
            sug = searcher.suggest(1)
            searcher.predict([sug[0].candidate])
            decisions[name].append((time.perf_counter() - t0) * 1000)
            cpu[name].append((time.process_time() - c0) * 1000)
        c = sug[0].candidate
        o = sc.evaluate(c, rng)
    n_obs = len(s.observations)
    result["decision_latency_ms"] = {name: {"p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95)),
                                            "cpu_p50": float(np.percentile(cpu[name], 50))}
                                     for name, v in decisions.items()} | {"observed_trials": n_obs,
                                                                          "load_average": os.getloadavg()[0]}
    lat = result["decision_latency_ms"]
    print(f"decision latency (measured -> next proposed) at {n_obs} observed trials: p50 "
          f"{lat['scheduled']['p50']:.1f} ms, p95 {lat['scheduled']['p95']:.1f} ms as scheduled; every refit in "
          f"full: p50 {lat['full']['p50']:.1f} ms, p95 {lat['full']['p95']:.1f} ms "
          f"(ratio {lat['full']['p50'] / lat['scheduled']['p50']:.2f}x); CPU time p50 {lat['scheduled']['cpu_p50']:.1f} "
          f"vs {lat['full']['cpu_p50']:.1f} ms; load average {lat['load_average']:.1f}")
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
