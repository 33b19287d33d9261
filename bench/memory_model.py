"""Peak-memory model accuracy after 10 trials: censored (Tobit) fit vs one that drops OOM trials.

SIMULATOR spaces (infrarsi.sim). For each space and seed: 10 random feasible candidates are run (OOMs report
their censoring bound), both models are fitted, then scored on held-out candidates: median |relative error| of
predicted peak bytes on those that fit, and OOM classification accuracy (P(OOM) > 0.5) on all.

    python bench/memory_model.py [--seeds N] [--trials 10] [--json OUT.json]
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
from collections.abc import Sequence

import numpy as np
from _common import write_json
from infrarsi.modeling.memory_model import MemoryModel
from infrarsi.sim.scenarios import SCENARIOS, enumerate_scenario, get_scenario


def run(name: str, seed: int, n_trials: int, n_test: int, structured: bool) -> dict[str, dict[str, float]]:
    sc = get_scenario(name)
    cands, _, peaks, _ = enumerate_scenario(name)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(cands))
    train, test = order[:n_trials], order[n_trials:n_trials + n_test]
    out: dict[str, dict[str, float]] = {}
    meta = sc.memory_meta() if structured else None
    models = {"censored": MemoryModel(sc.space, sc.capacity_bytes, meta=meta),
              "drop_oom": MemoryModel(sc.space, sc.capacity_bytes, meta=meta, censored=False)}
    outcomes = [(cands[i], sc.evaluate(cands[i], rng)) for i in train]
    for label, mm in models.items():
        for c, o in outcomes:
            if o.peak_bytes is not None:
                mm.observe(c, o.peak_bytes, oom=o.status == "oom")
        mm.fit()
        test_c = [cands[i] for i in test]
        true = peaks[test]
        pred = mm.predict_bytes(test_c)
        p_oom = mm.p_oom(test_c)
        fits = true <= sc.capacity_bytes
        out[label] = {
            "median_abs_rel_error": float(np.median(np.abs(pred[fits] / true[fits] - 1.0))),
            "oom_accuracy": float(np.mean((p_oom > 0.5) == ~fits)),
            "train_ooms": float(sum(o.status == "oom" for _, o in outcomes)),
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--generic", action="store_true", help="no workload structure: pure log-linear model")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    result: dict = {"simulated": True, "trials": args.trials, "seeds": args.seeds,
                    "mode": "generic" if args.generic else "structured", "spaces": {}}
    print(f"SIMULATOR memory-model benchmark ({result['mode']}, {args.trials} trials, {args.seeds} seeds)")
    print(f"{'space':20s} {'fit':9s} {'med|err|':>9s} {'oom acc':>8s}")
    for name in SCENARIOS:
        runs = [run(name, s, args.trials, args.test, not args.generic) for s in range(args.seeds)]
        agg = {}
        for label in runs[0]:
            agg[label] = {k: float(np.median([r[label][k] for r in runs])) for k in runs[0][label]}
            print(f"{name:20s} {label:9s} {agg[label]['median_abs_rel_error']:9.4f} {agg[label]['oom_accuracy']:8.4f}")
        result["spaces"][name] = agg
    write_json(args.json_out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
