"""Search quality at equal trial budgets: InfraRSI Searcher vs Optuna TPE, Optuna GP, random.

Spaces are SIMULATOR scenarios (infrarsi.sim) with a known optimum; a real space can be added through
`--extra-space module:function`, the function returning a `BenchSpace` (an `evaluate(candidate, rng)` callable
plus, when known, the noise-free time and oracle). Every tuner gets the same budget, batch size 1.

    python bench/search_vs_peers.py [--quick] [--seeds N] [--json OUT.json]
"""

# ruff: noqa: E402  (BLAS thread count must be set before numpy is imported)
from __future__ import annotations

import os

# one BLAS thread: the models are small matrices, and threaded BLAS on a shared 2-core box is several times
# slower (set before numpy is imported)
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import importlib
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from infrarsi.modeling.memory_model import TransformerMeta
from infrarsi.modeling.search import CandidatePool, Observation, Searcher
from infrarsi.modeling.space import Candidate, SearchSpace


class Outcome(Protocol):
    status: str
    step_time_s: float | None
    peak_bytes: float | None
    cost_seconds: float


@dataclass
class BenchSpace:
    name: str
    space: SearchSpace
    capacity_bytes: float
    evaluate: Callable[[Candidate, np.random.Generator], Outcome]
    true_time: Callable[[Candidate], float] | None
    """Noise-free step time; None for a real space (then the measured time stands in)."""
    oracle_time: float | None
    meta: TransformerMeta | None = None
    pool: CandidatePool | None = None


def sim_space(name: str) -> BenchSpace:
    from infrarsi.sim.scenarios import get_scenario, oracle

    sc = get_scenario(name)
    _, t = oracle(name)
    meta = sc.memory_meta()
    return BenchSpace(f"{name} (simulator)", sc.space, sc.capacity_bytes, sc.evaluate, sc.true_step_time, t, meta,
                      CandidatePool.build(sc.space, meta))


@dataclass
class Trial:
    candidate: Candidate
    status: str
    step_time_s: float | None
    cost: float
    chosen_best: Candidate | None
    """The tuner's own pick of the best candidate after this trial."""


# ------------------------------------------------------------------------------------------------ tuners


def run_infrarsi(bs: BenchSpace, seed: int, budget: int) -> list[Trial]:
    s = Searcher(bs.space, bs.capacity_bytes, meta=bs.meta, seed=seed, pool=bs.pool)
    rng = np.random.default_rng(10_000 + seed)
    out: list[Trial] = []
    for _ in range(budget):
        sug = s.suggest(1)
        if not sug:
            break
        c = sug[0].candidate
        o = bs.evaluate(c, rng)
        s.observe(Observation(c, o.status, o.step_time_s, o.peak_bytes, o.cost_seconds))  # type: ignore[arg-type]
        top = s.top_candidates(1)
        out.append(Trial(c, o.status, o.step_time_s, o.cost_seconds, top[0][0] if top else None))
    return out


def _repair(bs: BenchSpace, params: dict[str, Any], rng: np.random.Generator) -> Candidate:
    """Nearest feasible candidate (fewest changed knobs/patches) to what the sampler asked for."""
    knobs = {k.name: params[k.name] for k in bs.space.knobs}
    patches = {p.id for p in bs.space.patches if params[f"patch:{p.id}"]}
    c = Candidate.of(knobs, patches)
    if bs.space.is_feasible(c):
        return c
    assert bs.pool is not None and bs.pool.codes is not None
    code = np.array(bs.pool._code(c))
    d = (bs.pool.codes != code).sum(axis=1)
    best = np.flatnonzero(d == d.min())
    return bs.pool.candidates[int(rng.choice(best))]


def run_optuna(bs: BenchSpace, seed: int, budget: int, kind: str) -> list[Trial]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)

    # constraints reach the sampler through Trial.set_constraint (optuna >= 5; constraints_func is deprecated):
    # an OOM is a finished trial whose memory constraint is violated, not a failed trial
    if kind == "tpe":
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True)
    else:
        sampler = optuna.samplers.GPSampler(seed=seed)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    rng = np.random.default_rng(10_000 + seed)
    repair_rng = np.random.default_rng(20_000 + seed)
    out: list[Trial] = []
    worst = [0.0]
    best: list[tuple[float, Candidate | None]] = [(math.inf, None)]
    for _ in range(budget):
        trial = study.ask()
        params = {k.name: trial.suggest_categorical(k.name, list(k.values())) for k in bs.space.knobs}  # type: ignore[arg-type]
        params |= {f"patch:{p.id}": trial.suggest_categorical(f"patch:{p.id}", [False, True]) for p in bs.space.patches}
        c = _repair(bs, params, repair_rng)
        o = bs.evaluate(c, rng)
        if o.status == "ok" and o.step_time_s is not None:
            value, constraint = o.step_time_s, (o.peak_bytes or 0.0) / bs.capacity_bytes - 1.0
            worst[0] = max(worst[0], o.step_time_s)
            if o.step_time_s < best[0][0]:
                best[0] = (o.step_time_s, c)
        elif o.status == "oom":
            # censoring bound: the peak was at least this; infeasible by construction
            value = 2.0 * worst[0] if worst[0] > 0 else 1e3
            constraint = max((o.peak_bytes or bs.capacity_bytes) / bs.capacity_bytes - 1.0, 0.0) + 0.05
        else:
            value = o.step_time_s if o.step_time_s is not None else (2.0 * worst[0] if worst[0] > 0 else 1e3)
            constraint = 1.0
        trial.set_constraint("memory_and_invariants", float(min(constraint, 0.0) if o.status == "ok" else constraint))
        study.tell(trial, value)
        out.append(Trial(c, o.status, o.step_time_s, o.cost_seconds, best[0][1]))
    return out


def run_random(bs: BenchSpace, seed: int, budget: int) -> list[Trial]:
    assert bs.pool is not None
    rng = np.random.default_rng(10_000 + seed)
    pick_rng = np.random.default_rng(30_000 + seed)
    order = pick_rng.permutation(len(bs.pool.candidates))[:budget]
    out: list[Trial] = []
    best: tuple[float, Candidate | None] = (math.inf, None)
    for i in order:
        c = bs.pool.candidates[int(i)]
        o = bs.evaluate(c, rng)
        if o.status == "ok" and o.step_time_s is not None and o.step_time_s < best[0]:
            best = (o.step_time_s, c)
        out.append(Trial(c, o.status, o.step_time_s, o.cost_seconds, best[1]))
    return out


TUNERS: dict[str, Callable[[BenchSpace, int, int], list[Trial]]] = {
    "infrarsi": run_infrarsi,
    "optuna_tpe": lambda bs, s, b: run_optuna(bs, s, b, "tpe"),
    "optuna_gp": lambda bs, s, b: run_optuna(bs, s, b, "gp"),
    "random": run_random,
}


# ------------------------------------------------------------------------------------------------ scoring


def score(bs: BenchSpace, trials: list[Trial], budget: int) -> dict[str, Any]:
    """best_over_oracle at 10/20/40 trials, OOM fraction, trials and cost to 95% of the oracle."""
    def quality(c: Candidate | None, measured: float | None) -> float:
        if c is None:
            return 0.0
        if bs.true_time is not None and bs.oracle_time is not None:
            return bs.oracle_time / bs.true_time(c)
        return 0.0 if measured is None else measured

    ratios = [quality(t.chosen_best, None) for t in trials]
    at = {str(k): (ratios[min(k, len(ratios)) - 1] if ratios else 0.0) for k in (10, 20, 40) if k <= budget}
    to95 = next((i + 1 for i, r in enumerate(ratios) if r >= 0.95), budget + 1)
    costs = np.cumsum([t.cost for t in trials])
    cost95 = float(costs[to95 - 1]) if to95 <= len(trials) else float(costs[-1]) if len(costs) else 0.0
    return {"best_over_oracle": at, "oom_fraction": sum(t.status == "oom" for t in trials) / max(len(trials), 1),
            "trials_to_95": to95, "cost_to_95": cost95}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 seeds, 3 main simulator spaces")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--spaces", nargs="*", default=None)
    ap.add_argument("--tuners", nargs="*", default=list(TUNERS))
    ap.add_argument("--extra-space", action="append", default=[], help="module:function returning a BenchSpace")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    log = logging.getLogger("bench")
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    from infrarsi.sim.scenarios import SCENARIOS

    seeds = args.seeds if args.seeds is not None else (3 if args.quick else 10)
    names = args.spaces or (list(SCENARIOS[:3]) if args.quick else list(SCENARIOS))
    spaces = [sim_space(n) for n in names]
    for spec in args.extra_space:
        mod, fn = spec.split(":")
        spaces.append(getattr(importlib.import_module(mod), fn)())
    result: dict[str, Any] = {"simulated": True, "budget": args.budget, "seeds": seeds, "spaces": {}}
    rows = []
    for bs in spaces:
        per_tuner: dict[str, Any] = {}
        for tuner in args.tuners:
            t0 = time.perf_counter()
            scores = [score(bs, TUNERS[tuner](bs, seed, args.budget), args.budget) for seed in range(seeds)]
            elapsed = time.perf_counter() - t0
            agg = {
                "best_over_oracle_median": {k: float(np.median([s["best_over_oracle"][k] for s in scores]))
                                            for k in scores[0]["best_over_oracle"]},
                "oom_fraction": float(np.mean([s["oom_fraction"] for s in scores])),
                "trials_to_95_median": float(np.median([s["trials_to_95"] for s in scores])),
                "cost_to_95_median": float(np.median([s["cost_to_95"] for s in scores])),
                "per_seed_best_over_oracle_40": [s["best_over_oracle"].get(str(args.budget)) for s in scores],
                "wall_seconds": elapsed,
            }
            per_tuner[tuner] = agg
            b = agg["best_over_oracle_median"]
            rows.append((bs.name, tuner, b.get("10"), b.get("20"), b.get(str(args.budget)), agg["oom_fraction"],
                         agg["trials_to_95_median"], agg["cost_to_95_median"], elapsed))
            log.info("%-34s %-11s best/oracle@10 %.3f @20 %.3f @%d %.3f  oom %.3f  to95 %.1f  cost95 %.3g  (%.0fs)",
                     bs.name, tuner, b.get("10", 0), b.get("20", 0), args.budget, b.get(str(args.budget), 0),
                     agg["oom_fraction"], agg["trials_to_95_median"], agg["cost_to_95_median"], elapsed)
        result["spaces"][bs.name.replace(" (simulator)", "")] = per_tuner
    header = f"{'space':34s} {'tuner':11s} {'@10':>6s} {'@20':>6s} {'@40':>6s} {'oom':>6s} {'to95':>5s} {'cost95':>9s}"
    print("SIMULATOR benchmark (every space is simulated; see infrarsi.sim)")
    print(header)
    for r in rows:
        print(f"{r[0]:34s} {r[1]:11s} {r[2]:6.3f} {r[3]:6.3f} {r[4]:6.3f} {r[5]:6.3f} {r[6]:5.1f} {r[7]:9.3g}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
