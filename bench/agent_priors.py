"""SIMULATOR benchmark of the agent's priors: do a model's priors speed the search up, and how much can wrong
ones cost?

Per simulator scenario, the InfraRSI Searcher searches side by side over the same seeds:

- ``no_agent``  the built-in knowledge base only;
- ``good``      a model that knows this job the way a platform engineer who read it and the published effects
                does (``recommendation``, ``local_effects``): it recommends the configuration it reaches by
                tuning by hand — from the contract's baseline, the best valid move of one or two knobs at a
                time (two where the device count ties a knob to dp), on the scenario's physics, until none
                is faster — and proposes it as its knob vector; its priors are the *local*, one-knob-at-a-time
                deltas around that recommendation (each setting next to it: the change of log step time and
                log peak memory to the fastest valid configuration holding it, one knob away or two where the
                device count forces it), and the invariants the settings next to it risk (P = 0.9 that FP8 GEMMs break
                the loss on dense7b_h100x64, that capacity factor 1.0 does on moe8x7b) — never the oracle's
                exhaustive argmin (``model_pick_vs_oracle`` in the result says how close the walk got);
- ``inverted``  a model as confident and as wrong: every effect's sign flipped, every invariant breaker
                called safe (P = 0.01), and its knob vector the same walk by a model that believes every effect
                the other way round (each move to the slowest valid neighbour);
- ``good_tuned`` / ``inverted_tuned``  the same models' priors without their knob vector (what the priors alone
                do);
- ``good_baseline`` / ``inverted_baseline``  priors only: the one-knob deltas around the *baseline* (what a
                model that knows only how each knob moves the job from where it starts would say);
- ``good_global`` / ``inverted_global``  priors only, the previous definition: for every main feature, the
                effect a least-squares fit of log step time over every valid configuration finds (time only).

The priors enter exactly as the agent's do (``infrarsi.agent.answers.prior_from_answer`` — floored std, widened
by ``agent.prior_weight``; invariant claims clamped — then ``StudySpace.with_agent``'s
``modeling.adapt.with_priors``), stated std 0.1, weight 0.5. The claims are built from the simulator's physics
(``sim.scenarios.enumerate_scenario``), apart from the search code they measure; the search sees only noisy
trials. The model's answer is handled by the proposer's rule (``run``, services/proposer/logic.py): its knob
vector takes the first trial, then its priors are on probation, hedged by a searcher without them that learns
only from its own trials, until the Bayes-factor check drops them (the search goes on as the hedge) or trusts
them.

Metric: trials until the best valid trial so far is within 95% of the oracle's speed (noise-free time ≤ oracle
/ 0.95); a run that never gets there within ``--max-trials`` counts as max-trials + 1. Everything here is a
simulation and says so.

    python bench/agent_priors.py --json OUT.json [--seeds 10] [--workers 2] [--arms good inverted ...]
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
from infrarsi.agent.answers import MIN_RISK, RISK_KINDS, prior_from_answer  # noqa: E402
from infrarsi.agent.prior_check import TIMED, judge  # noqa: E402
from infrarsi.modeling.adapt import invariant_overrides, prior_overrides, with_priors  # noqa: E402
from infrarsi.modeling.observations import Observation  # noqa: E402
from infrarsi.modeling.priors import default_knowledge_base  # noqa: E402
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.space import Candidate, FeatureEncoder, SearchSpace  # noqa: E402
from infrarsi.modeling.time_model import TimeModel  # noqa: E402
from infrarsi.sim.scenarios import enumerate_scenario, get_scenario, oracle  # noqa: E402

SCENARIOS = ("dense7b_h100x64", "dense13b_a100x32", "moe8x7b_h100x128")
ARMS = ("no_agent", "good", "inverted", "good_tuned", "inverted_tuned", "good_baseline", "inverted_baseline",
        "good_global", "inverted_global")
FRACTION = 0.95
STATED_STD = 0.1
WEIGHT = 0.5
RIDGE = 1e-3
LOCAL_CHANGES = 2
"""How far a local claim or a hand-tuning move reaches: one knob, or two where the device count ties a knob to
dp."""
Claims = tuple[dict[str, float], dict[str, float], dict[str, float]]
"""(time, memory, invariant) per feature: what the model says of a scenario."""
RISK = 0.9
"""What the model says of a setting that breaks an invariant of the job (``answers.MAX_RISK``)."""


def recommendation(name: str, inverted: bool = False) -> Candidate:
    """The configuration an engineer who knows this job's physics reaches by hand: from the baseline (the
    contract's default configuration), repeatedly the best valid move of one or two knobs or patches (two
    where the device count ties a knob to dp: tp up means dp down), until no such move is faster. Valid: it
    fits in memory and keeps every invariant, as the scenario's physics says. Not the oracle's exhaustive
    argmin — a local walk, which may stop short of it (``meta.recommendation_vs_oracle`` reports how far).
    ``inverted``: the same walk by a model that believes every effect the other way round (each move to the
    slowest valid neighbour) — what a confidently wrong model recommends."""
    sc = get_scenario(name)
    cands, times, _peaks, valid = enumerate_scenario(name)
    believed = 1.0 / times if inverted else times
    at = cands.index(sc.space.default_candidate())
    while True:
        moves = [i for i, c in enumerate(cands) if valid[i] and believed[i] < believed[at]
                 and _changes(cands[at], c) <= LOCAL_CHANGES]
        if not moves:
            return cands[at]
        at = min(moves, key=lambda i: believed[i])


def local_effects(name: str, around: Candidate) -> Claims:
    """What a model that knows this job says *around* one configuration: (time, memory, invariant).

    Time and memory, one knob at a time: for every setting next to ``around`` (another value of a knob, a bool
    flipped, a patch added or removed), the change in log noise-free step time and log peak bytes from
    ``around`` to the fastest valid configuration that holds it within ``LOCAL_CHANGES`` changes — the
    one-knob delta, or the two-knob one a device count forces (tp=2 means dp halved). Stated on the feature
    that holds it: a level its delta (the level ``around`` has, and every knob's trend, 0); a bool or a patch
    the delta of switching it, signed for the feature being on. A setting with no valid configuration next
    to ``around`` gets no claim (the knowledge base's prior stays). Invariant: P = ``RISK`` for every setting
    that, moved to alone from ``around``, breaks an invariant of the job (FP8 GEMMs that diverge, a capacity
    factor that drops tokens). All of it the scenario's own physics, as a model that read the job and the
    published effects would state it; nothing from the oracle."""
    sc = get_scenario(name)
    cands, times, peaks, valid = enumerate_scenario(name)
    near = [i for i, c in enumerate(cands) if _changes(around, c) <= LOCAL_CHANGES]
    encoder = FeatureEncoder(sc.space)
    x = encoder.encode_many([cands[i] for i in near]) > 0  # (n, p): which settings each neighbour holds
    here = encoder.encode(around) > 0  # (p,)
    at = cands.index(around)
    time_effects, memory_effects = {}, {}
    for k, spec in enumerate(encoder.specs):
        if spec.kind == "numeric" or (spec.kind == "level" and here[k]):
            time_effects[spec.name] = memory_effects[spec.name] = 0.0
            continue
        holding = [i for i, row in zip(near, x, strict=True) if valid[i] and row[k] != here[k]]
        if spec.kind not in RISK_KINDS or not holding:
            continue
        best = min(holding, key=lambda i: times[i])
        sign = -1.0 if here[k] else 1.0
        time_effects[spec.name] = sign * float(np.log(times[best] / times[at]))
        memory_effects[spec.name] = sign * float(np.log(peaks[best] / peaks[at]))
    risky = {}
    for i, row in zip(near, x, strict=True):
        if _changes(around, cands[i]) == 1 and sc.violates(cands[i]) is not None:
            risky |= {spec.name: RISK for spec, on, was in zip(encoder.specs, row, here, strict=True)
                      if spec.kind in RISK_KINDS and on and not was}
    return time_effects, memory_effects, risky


def _changes(a: Candidate, b: Candidate) -> int:
    """Knob values and patches that differ between two candidates."""
    return sum(a.knobs.get(k) != v for k, v in b.knobs.items()) + len(set(a.patches) ^ set(b.patches))


def _main_effects(encoder: FeatureEncoder, cols: list[int], x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Ridge fit of ``y`` (n,) on the main-feature columns ``x`` (n, p), intercept free."""
    x_c, y_c = x - x.mean(axis=0), y - y.mean()
    coef = np.linalg.solve(x_c.T @ x_c + RIDGE * len(y) * np.eye(len(cols)), x_c.T @ y_c)  # (p,)
    return {encoder.specs[i].name: float(b) for i, b in zip(cols, coef, strict=True)}


def true_main_effects(name: str) -> dict[str, float]:
    """The old definition (arms ``*_global``): per main feature, its coefficient in a ridge fit of
    log(noise-free step time) over every valid configuration (intercept free, interactions left out)."""
    sc = get_scenario(name)
    cands, times, _peaks, valid = enumerate_scenario(name)
    encoder = FeatureEncoder(sc.space)
    cols = [i for i, s in enumerate(encoder.specs) if s.kind not in ("intercept", "interaction")]
    x = encoder.encode_many([c for c, ok in zip(cands, valid, strict=True) if ok])[:, cols]  # (n, p)
    return _main_effects(encoder, cols, x, np.log(times[valid]))


def claims_for(name: str) -> dict[str, Claims]:
    """The model's claims per definition: ``tuned`` (around ``recommendation``: arms good/inverted),
    ``baseline`` (around the baseline: arms *_baseline) and ``global`` (``true_main_effects``, time only:
    arms *_global)."""
    base = get_scenario(name).space.default_candidate()
    return {"tuned": local_effects(name, recommendation(name)), "baseline": local_effects(name, base),
            "global": (true_main_effects(name), {}, {})}


def arm_priors(arm: str, claims: dict[str, Claims]) -> list:
    """The model's answer for an arm, through the agent's own prior gate. ``inverted``: every effect's sign
    flipped, and every setting it knows to break an invariant called safe (``MIN_RISK``)."""
    if arm == "no_agent":
        return []
    time, memory, risky = claims[arm.split("_")[1] if "_" in arm else "tuned"]
    wrong = arm.startswith("inverted")
    sign = -1.0 if wrong else 1.0
    return ([prior_from_answer(f, "time", sign * m, STATED_STD, WEIGHT, "bench") for f, m in sorted(time.items())]
            + [prior_from_answer(f, "memory", sign * m, STATED_STD, WEIGHT, "bench") for f, m in sorted(memory.items())]
            + [prior_from_answer(f, "invariant", MIN_RISK if wrong else p, STATED_STD, WEIGHT, "bench")
               for f, p in sorted(risky.items())])


def model_pick(name: str, arm: str) -> Candidate | None:
    """The knob vector the model proposes (the agent's candidates, which take the search's first trial — the
    proposer waits for the first answer): ``good`` its ``recommendation``, ``inverted`` the inverted walk's.
    The other definitions' models give priors only."""
    return recommendation(name, inverted=arm == "inverted") if arm in ("good", "inverted") else None


def run(args: tuple[str, str, int, int, dict[str, Claims], bool, Candidate | None]) -> dict:
    """One search, with the proposer's rule for the model's answer (services/proposer/logic.py, agent.py): its
    knob vector ``pick`` first; then, on probation, every other trial comes from a hedge — a searcher without
    the model's priors that learns only from its own trials, the knowledge base's best guess first; the
    Bayes-factor check (step times of ``prior_check.TIMED`` outcomes) then drops the priors (the search goes on
    as the hedge) or trusts them (no more hedging). ``check`` False: the ablation that keeps the model's priors
    whatever the measurements say."""
    name, arm, seed, max_trials, claims, check, pick = args
    sc = get_scenario(name)
    _, t_oracle = oracle(name)
    base_kb = default_knowledge_base()
    priors = arm_priors(arm, claims)
    time_priors, memory_priors = prior_overrides(priors)
    space, kb = sc.space, base_kb
    if priors:
        space, kb = with_priors(sc.space, base_kb, time_priors, memory_priors, invariant_overrides(priors))
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
    queue = [pick] if pick is not None else []
    for trial in range(1, max_trials + 1):
        turn = searcher
        if queue:  # the model's own knob vector: its turn, so the hedge's comes next
            c, hedge_turn = queue.pop(0), True
        else:
            if hedge is not None and verdict == "open":
                hedge_turn = not hedge_turn
                turn = searcher if hedge_turn else hedge
            suggestion = turn.suggest(1)
            if not suggestion:
                break
            c = suggestion[0].candidate
        out = sc.evaluate(c, rng)
        observations.append(Observation(c, out.status, out.step_time_s, out.peak_bytes, out.cost_seconds))
        searcher.observe(observations[-1])
        if hedge is not None and hedge is not searcher and (turn is hedge or verdict != "open"):
            hedge.observe(observations[-1])  # on probation the hedge learns from its own trials only
        if out.status == "ok":
            best = min(best, sc.true_step_time(c))
        if best <= t_oracle / FRACTION:
            reached = trial
            break
        if hedge is not None and verdict == "open":
            measured = [(o.candidate, o.step_time_s) for o in observations if o.status in TIMED and o.step_time_s]
            searcher.refit()
            verdict, _bf = judge(with_model, without_model, measured, searcher.time_model.noise_std)
            if verdict != "open":
                decided_at = trial
            if verdict == "dropped":  # the rest of the search without the model's priors
                searcher = hedge
    return {"scenario": name, "arm": arm, "seed": seed, "verdict": verdict, "decided_at": decided_at,
            "trials_to_95": reached if reached is not None else max_trials + 1, "reached": reached is not None}


def targets(per: dict) -> dict[str, bool]:
    """The issue's two targets, per definition of good priors that was run: good sooner than no agent (median),
    inverted at most 3 trials later."""
    none = per["no_agent"]["trials_to_95_median"]
    out = {}
    for suffix in ("", "_tuned", "_baseline", "_global"):
        if f"good{suffix}" in per:
            out[f"good{suffix}_lt_no_agent"] = per[f"good{suffix}"]["trials_to_95_median"] < none
        if f"inverted{suffix}" in per:
            out[f"inverted{suffix}_le_no_agent_plus_3"] = per[f"inverted{suffix}"]["trials_to_95_median"] <= none + 3
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--max-trials", type=int, default=60)
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS))
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS,
                        help="no_agent is always run (the targets compare against it)")
    parser.add_argument("--no-check", action="store_true",
                        help="ablation: keep the model's priors however the measurements disagree")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    arms = ["no_agent", *(a for a in ARMS if a in args.arms and a != "no_agent")]
    claims = {name: claims_for(name) for name in args.scenarios}
    picks = {(name, arm): model_pick(name, arm) for name in args.scenarios for arm in arms}
    jobs = [(name, arm, seed, args.max_trials, claims[name], not args.no_check, picks[name, arm])
            for name in args.scenarios for arm in arms for seed in range(args.seeds)]
    with ProcessPoolExecutor(args.workers) as pool:
        runs = list(pool.map(run, jobs))
    result: dict = {}
    for name in args.scenarios:
        per: dict = {}
        for arm in arms:
            trials = [r["trials_to_95"] for r in runs if r["scenario"] == name and r["arm"] == arm]
            per[arm] = {"trials_to_95_median": statistics.median(trials), "trials_to_95_mean": statistics.fmean(trials),
                        "trials_to_95": trials, "reached": sum(t <= args.max_trials for t in trials), "seeds": len(trials),
                        "priors_verdict": [f"{r['verdict']}@{r['decided_at']}" if r["decided_at"] else r["verdict"]
                                           for r in runs if r["scenario"] == name and r["arm"] == arm]}
        per["targets"] = targets(per)
        per["claims"] = {d: {"time": len(t), "memory": len(m), "invariant": sorted(r)}
                         for d, (t, m, r) in claims[name].items()}
        t_oracle = oracle(name)[1]
        per["model_pick_vs_oracle"] = {arm: round(get_scenario(name).true_step_time(c) / t_oracle, 3)
                                       for (n, arm), c in picks.items() if n == name and c is not None}
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
                          for arm in arms)
        print(f"{name:18s} median trials to 95% of the oracle: {cells}  {r['targets']}  (SIMULATOR)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
