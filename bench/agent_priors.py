"""SIMULATOR benchmark of the agent's priors: do a model's priors speed the search up, and how much can wrong
ones cost?

Per simulator scenario, the InfraRSI Searcher searches side by side over the same seeds:

- ``no_agent``  the built-in knowledge base only;
- ``good``      the knowledge base overridden by a model that knows this job: for every main feature of the
                space, the effect a least-squares fit of log step time over every valid configuration of the
                scenario finds (the best main-effects account of the truth a model could give);
- ``inverted``  the same priors with their signs flipped: a confidently wrong model.

The priors enter exactly as the agent's do (``infrarsi.agent.answers.prior_from_answer`` — floored std, widened
by ``agent.prior_weight`` — then ``StudySpace.with_agent``'s ``bank.adapt.with_priors``), stated std 0.1,
weight 0.5. The fit is built from the simulator's physics (``sim.scenarios.enumerate_scenario``), apart from
the search code it measures; the search sees only noisy trials. The model's priors are handled by the
proposer's rule (``run``): on probation, hedged by a searcher without them, until the Bayes-factor check
drops or trusts them.

Metric: trials until the best valid trial so far is within 95% of the oracle's speed (noise-free time ≤ oracle
/ 0.95); a run that never gets there within ``--max-trials`` counts as max-trials + 1. Everything here is a
simulation and says so.

    python bench/agent_priors.py --json OUT.json [--seeds 10] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "libs"))

import numpy as np  # noqa: E402
from _common import pool_for  # noqa: E402
from infrarsi.agent.answers import prior_from_answer, prior_overrides  # noqa: E402
from infrarsi.agent.prior_check import judge  # noqa: E402
from infrarsi.bank.adapt import with_priors  # noqa: E402
from infrarsi.modeling.priors import default_knowledge_base  # noqa: E402
from infrarsi.modeling.search import Observation, Searcher  # noqa: E402
from infrarsi.modeling.space import FeatureEncoder, SearchSpace  # noqa: E402
from infrarsi.modeling.time_model import TimeModel  # noqa: E402
from infrarsi.sim.scenarios import enumerate_scenario, get_scenario, oracle  # noqa: E402

SCENARIOS = ("dense7b_h100x64", "dense13b_a100x32", "moe8x7b_h100x128")
ARMS = ("no_agent", "good", "inverted")
FRACTION = 0.95
STATED_STD = 0.1
WEIGHT = 0.5
RIDGE = 1e-3


def true_main_effects(name: str) -> dict[str, float]:
    """Per main feature of the scenario's space: its coefficient in a ridge fit of log(noise-free step time)
    over every valid configuration (intercept free, interactions left out)."""
    sc = get_scenario(name)
    cands, times, _peaks, valid = enumerate_scenario(name)
    encoder = FeatureEncoder(sc.space)
    cols = [i for i, s in enumerate(encoder.specs) if s.kind not in ("intercept", "interaction")]
    x = encoder.encode_many([c for c, ok in zip(cands, valid, strict=True) if ok])[:, cols]  # (n, p)
    y = np.log(times[valid])  # (n,)
    x_c, y_c = x - x.mean(axis=0), y - y.mean()
    coef = np.linalg.solve(x_c.T @ x_c + RIDGE * len(y) * np.eye(len(cols)), x_c.T @ y_c)  # (p,)
    return {encoder.specs[i].name: float(b) for i, b in zip(cols, coef, strict=True)}


def arm_priors(arm: str, effects: dict[str, float]) -> list:
    """The model's answer for an arm, through the agent's own prior gate."""
    if arm == "no_agent":
        return []
    sign = -1.0 if arm == "inverted" else 1.0
    return [prior_from_answer(feature, "time", sign * mean, STATED_STD, WEIGHT, "bench")
            for feature, mean in sorted(effects.items())]


def run(args: tuple[str, str, int, int, dict[str, float], bool]) -> dict:
    """One search, with the proposer's rule for model priors (services/proposer/agent.py): on probation, every
    other trial comes from a hedge — a searcher without the model's priors over the same outcomes, the
    knowledge base's best guess first; the Bayes-factor check then drops the priors (the search goes on as the
    hedge) or trusts them (no more hedging). ``check`` False: the ablation that keeps the model's priors
    whatever the measurements say."""
    name, arm, seed, max_trials, effects, check = args
    sc = get_scenario(name)
    _, t_oracle = oracle(name)
    base_kb = default_knowledge_base()
    time_priors, memory_priors = prior_overrides(arm_priors(arm, effects))
    space, kb = sc.space, base_kb
    if time_priors or memory_priors:
        space, kb = with_priors(sc.space, base_kb, time_priors, memory_priors)
    with_model, without_model = TimeModel(space, kb), TimeModel(sc.space, base_kb)

    def searcher_for(space: SearchSpace, kb) -> Searcher:
        return Searcher(space, sc.capacity_bytes, meta=sc.memory_meta(), kb=kb, seed=seed, pool=pool_for(name, space))

    searcher, hedge = searcher_for(space, kb), None
    if check and arm != "no_agent":
        hedge = searcher_for(sc.space, base_kb)
        hedge.enqueue([searcher_for(sc.space, base_kb).suggest(1)[0].candidate], "prior", "the KB's best guess")
    rng = np.random.default_rng([seed, 7])
    best, reached, verdict, decided_at, hedge_turn = math.inf, None, "open", None, False
    observations: list[Observation] = []
    for trial in range(1, max_trials + 1):
        turn = searcher
        if hedge is not None and verdict == "open":
            hedge_turn = not hedge_turn
            turn = searcher if hedge_turn else hedge
        suggestion = turn.suggest(1)
        if not suggestion:
            break
        c = suggestion[0].candidate
        out = sc.evaluate(c, rng)
        observations.append(Observation(c, out.status, out.step_time_s, out.peak_bytes, out.cost_seconds))
        for s in (searcher, hedge):
            if s is not None:
                s.observe(observations[-1])
        if out.status == "ok":
            best = min(best, sc.true_step_time(c))
        if best <= t_oracle / FRACTION:
            reached = trial
            break
        if hedge is not None and verdict == "open":
            measured = [(o.candidate, o.step_time_s) for o in observations if o.status == "ok" and o.step_time_s]
            searcher.refit()
            verdict, _bf = judge(with_model, without_model, measured, searcher.time_model.noise_std)
            if verdict != "open":
                decided_at = trial
            if verdict == "dropped":  # the rest of the search without the model's priors
                searcher = hedge
    return {"scenario": name, "arm": arm, "seed": seed, "verdict": verdict, "decided_at": decided_at,
            "trials_to_95": reached if reached is not None else max_trials + 1, "reached": reached is not None}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--max-trials", type=int, default=60)
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS))
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--no-check", action="store_true",
                        help="ablation: keep the model's priors however the measurements disagree")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    effects = {name: true_main_effects(name) for name in args.scenarios}
    jobs = [(name, arm, seed, args.max_trials, effects[name], not args.no_check) for name in args.scenarios
            for arm in ARMS for seed in range(args.seeds)]
    with ProcessPoolExecutor(args.workers) as pool:
        runs = list(pool.map(run, jobs))
    result: dict = {}
    for name in args.scenarios:
        per: dict = {}
        for arm in ARMS:
            trials = [r["trials_to_95"] for r in runs if r["scenario"] == name and r["arm"] == arm]
            per[arm] = {"trials_to_95_median": statistics.median(trials), "trials_to_95_mean": statistics.fmean(trials),
                        "trials_to_95": trials, "reached": sum(t <= args.max_trials for t in trials), "seeds": len(trials),
                        "priors_verdict": [f"{r['verdict']}@{r['decided_at']}" if r["decided_at"] else r["verdict"]
                                           for r in runs if r["scenario"] == name and r["arm"] == arm]}
        per["targets"] = {
            "good_lt_no_agent": per["good"]["trials_to_95_median"] < per["no_agent"]["trials_to_95_median"],
            "inverted_le_no_agent_plus_3": per["inverted"]["trials_to_95_median"]
            <= per["no_agent"]["trials_to_95_median"] + 3,
        }
        per["priors"] = len(effects[name])
        result[name] = per
    result["meta"] = {
        "simulated": True, "fraction_of_oracle": FRACTION, "seeds": args.seeds, "max_trials": args.max_trials,
        "stated_std": STATED_STD, "weight": WEIGHT, "prior_check": not args.no_check, "seconds": round(time.perf_counter() - t0, 1),
        "command": " ".join(["python", "bench/agent_priors.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    for name in args.scenarios:
        r = result[name]
        cells = "  ".join(f"{arm} {r[arm]['trials_to_95_median']:5.1f} ({r[arm]['reached']}/{r[arm]['seeds']})"
                          for arm in ARMS)
        print(f"{name:18s} median trials to 95% of the oracle: {cells}  {r['targets']}  (SIMULATOR)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
