"""SIMULATOR benchmark of the experience bank: does a bank warm-start cut the trials a study needs?

A target study on H100-class devices (simulator scenario ``dense7b_h100x64``) is searched by the InfraRSI
Searcher, side by side over the same seeds:

- ``cold``              the built-in knowledge base only;
- ``cross_generation``  warm-started from a bank built on A100-class studies (``dense7b_a100x64``);
- ``same_cluster``      warm-started from a bank of earlier studies of the same cluster and model;
- ``irrelevant``        warm-started from a bank of MoE studies (``moe8x7b_h100x128``): must not hurt.

Each bank is built the way production builds it: the Searcher runs a source study on the source scenario,
its top candidates are re-measured (a simulated verify), and ``infrarsi.bank.distil`` turns the posterior and
outcomes into a ``BankEntry``. The target study then gets ``bank_priors`` (shrunk toward the knowledge base by
similarity) and ``bank_seeds`` (origin ``bank``) exactly as the modeler and proposer will.

Metric: trials until the best valid trial so far is within 95% of the oracle's speed (noise-free time ≤
oracle / 0.95); a run that never gets there within ``--max-trials`` counts as max-trials + 1. Everything here
is a simulation and says so.

    python bench/transfer.py --json OUT.json [--seeds 10] [--workers 2]
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
from infrarsi import events as ev  # noqa: E402
from infrarsi.bank import StudyFacts, TrialFact, bank_priors, bank_seeds, distil, explain_seeds  # noqa: E402
from infrarsi.bank.similarity import generation_of  # noqa: E402
from infrarsi.bank.transfer import TransferConfig, searcher_priors  # noqa: E402
from infrarsi.modeling.adapt import (  # noqa: E402
    adapter_for_space,
    knowledge_base_priors,
    searcher_effects,
    to_event_candidate,
    to_space_candidate,
)
from infrarsi.modeling.observations import Observation  # noqa: E402
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.space import Candidate  # noqa: E402
from infrarsi.sim.scenarios import Scenario, get_scenario, oracle  # noqa: E402

TARGET = "dense7b_h100x64"
ARMS: dict[str, str | None] = {
    "cold": None,
    "cross_generation": "dense7b_a100x64",
    "same_cluster": "dense7b_h100x64",
    "irrelevant": "moe8x7b_h100x128",
}
ABLATIONS: dict[str, str] = {
    "cross_generation_priors_only": "dense7b_a100x64",
    "same_cluster_priors_only": "dense7b_h100x64",
    "irrelevant_no_threshold": "moe8x7b_h100x128",
}
"""``--ablations``: the bank's priors without its winners as seeds (what the shrunk priors alone are worth), and
the irrelevant bank with the similarity threshold off (the shrinkage alone must keep it harmless)."""
FRACTION = 0.95


# ------------------------------------------------------------------------------------------ scenario glue


def scenario_meta(sc: Scenario) -> ev.BankMeta:
    """What ``infrarsi init`` would record for a study of this simulated cluster and model."""
    base = sc.space.default_candidate().knobs
    per_node = sc.device.gpus_per_node
    return ev.BankMeta(
        accelerator=sc.device.name, generation=generation_of(sc.device.name),
        device_memory_bytes=int(sc.device.memory_bytes), interconnect="nvlink+infiniband",
        nodes=max(sc.n_devices // per_node, 1), devices_per_node=min(per_node, sc.n_devices),
        parallelism={k: int(base.get(k, 1)) for k in ("tp", "pp", "dp", "ep")} | {"zero": int(base.get("zero_stage", 0))},
        model_family="moe" if sc.model.experts > 1 else "dense", model_params=float(sc.model.total_params),
        seq_len=sc.model.seq_len, global_batch=sc.global_batch, micro_batch=int(base.get("micro_batch", 1)),
        precision="bf16",
    )


def observe(searcher: Searcher, sc: Scenario, c: Candidate, rng: np.random.Generator
            ) -> tuple[Observation, TrialFact]:
    out = sc.evaluate(c, rng)
    obs = Observation(c, out.status, out.step_time_s, out.peak_bytes, out.cost_seconds)
    searcher.observe(obs)
    fact = TrialFact(
        candidate=to_event_candidate(c), status=out.status,
        step_time_s=out.step_time_s if out.status == "ok" else None,
        peak_memory_bytes=out.peak_bytes if out.status != "oom" else None,
        censored_peak_bytes=out.peak_bytes if out.status == "oom" else None,
        memory_capacity_bytes=sc.capacity_bytes, reason=out.detail,
    )
    return obs, fact


# ------------------------------------------------------------------------------------------ source studies


def source_entry(name: str, seed: int, trials: int) -> ev.BankEntry:
    """One source study: search ``trials`` trials, re-measure the top 2 three times (simulated verify), distil."""
    sc = get_scenario(name)
    searcher = Searcher(sc.space, sc.capacity_bytes, meta=sc.memory_meta(), seed=seed, pool=pool_for(name, sc.space))
    rng = np.random.default_rng([seed, 1])
    facts: list[TrialFact] = []
    baseline = sc.space.default_candidate()
    _, fact = observe(searcher, sc, baseline, rng)
    facts.append(fact)
    for _ in range(trials - 1):
        suggestion = searcher.suggest(1)
        if not suggestion:
            break
        facts.append(observe(searcher, sc, suggestion[0].candidate, rng)[1])
    baseline_s = sc.true_step_time(baseline) if sc.fits(baseline) else None
    verifications = []
    for c, _pred, _sd in searcher.top_candidates(2):
        runs = [sc.evaluate(c, rng) for _ in range(3)]
        ok = all(r.status == "ok" for r in runs)
        t = statistics.median(r.step_time_s for r in runs if r.step_time_s is not None) if ok else float("nan")
        speedup = (baseline_s / t) if (ok and baseline_s) else 0.0
        verifications.append(ev.VerifyCompleted(
            verify_id=f"sim-{seed}-{c.key[:8]}", candidate=to_event_candidate(c), candidate_key=c.key, passes=2 if ok else 0,
            promotable=ok and speedup > 1.0, speedup=speedup, ci_low=speedup * 0.97, ci_high=speedup * 1.03,
            baseline_step_s=baseline_s or 0.0, candidate_step_s=t if ok else 0.0, mfu_before=None, mfu_after=None,
            invariants=[], failed_invariants=[] if ok else [r.detail for r in runs if r.status != "ok"][:1],
            trial_ids=[],
        ))
    time_effects, memory_effects = searcher_effects(searcher)
    return distil(StudyFacts(
        study_id=f"sim-{name}-{seed}", meta=scenario_meta(sc), time_effects=time_effects,
        memory_effects=memory_effects, trials=facts, verifications=verifications, baseline_step_s=baseline_s,
    ))


# ------------------------------------------------------------------------------------------ target studies


def target_run(arm: str, seed: int, bank: Sequence[ev.BankEntry], max_trials: int, use_seeds: bool = True,
               config: TransferConfig | None = None) -> dict:
    config = config or TransferConfig()
    sc = get_scenario(TARGET)
    _, t_oracle = oracle(TARGET)
    threshold = t_oracle / FRACTION
    meta = scenario_meta(sc)
    space = sc.space
    kb = None
    seeds: list = []
    n_prior = 0
    if bank:
        kb_time, kb_memory = knowledge_base_priors(sc.space)
        priors = bank_priors(bank, meta, kb_time=kb_time, kb_memory=kb_memory, features=set(kb_time) | set(kb_memory),
                             config=config)
        n_prior = len(priors.time) + len(priors.memory)
        if n_prior:
            space, kb = searcher_priors(sc.space, priors)
        if use_seeds:
            seeds = bank_seeds(bank, meta, adapt=adapter_for_space(sc.space), config=config)
    searcher = Searcher(space, sc.capacity_bytes, meta=sc.memory_meta(), kb=kb, seed=seed,
                        pool=pool_for(TARGET, space))
    if seeds:
        searcher.enqueue([to_space_candidate(s.candidate) for s in seeds], "bank", "experience bank winner")
    rng = np.random.default_rng([seed, 2])
    best = math.inf
    reached = None
    origins: list[str] = []
    for trial in range(1, max_trials + 1):
        suggestion = searcher.suggest(1)
        if not suggestion:
            break
        c = suggestion[0].candidate
        origins.append(suggestion[0].origin)
        obs, _ = observe(searcher, sc, c, rng)
        if obs.status == "ok":
            best = min(best, sc.true_step_time(c))
        if best <= threshold:
            reached = trial
            break
    return {"arm": arm, "seed": seed, "trials_to_95": reached if reached is not None else max_trials + 1,
            "reached": reached is not None, "best_fraction_of_oracle": t_oracle / best if best < math.inf else 0.0,
            "bank_priors": n_prior, "bank_seeds": len(seeds), "first_origins": origins[:5]}


def _source_job(args: tuple[str, int, int]) -> ev.BankEntry:
    return source_entry(*args)


def _target_job(args: tuple[str, int, list[bytes], int]) -> dict:
    arm, seed, encoded, max_trials = args
    bank = [ev.decode(b).payload for b in encoded]
    config = TransferConfig(threshold=0.0) if arm == "irrelevant_no_threshold" else TransferConfig()
    return target_run(arm, seed, bank, max_trials, use_seeds=not arm.endswith("priors_only"),  # type: ignore[arg-type]
                      config=config)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--seeds", type=int, default=10, help="target-study seeds per arm (>= 10 for the report)")
    parser.add_argument("--source-studies", type=int, default=3, help="source studies per bank")
    parser.add_argument("--source-trials", type=int, default=30, help="trials per source study")
    parser.add_argument("--max-trials", type=int, default=60, help="trial budget of a target study")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--ablations", action="store_true", help="also run the priors-only arms")
    args = parser.parse_args(argv)
    arms: dict[str, str | None] = {**ARMS, **(ABLATIONS if args.ablations else {})}
    t0 = time.perf_counter()

    sources = sorted({s for s in arms.values() if s is not None})
    jobs = [(name, 1000 + i, args.source_trials) for name in sources for i in range(args.source_studies)]
    with ProcessPoolExecutor(args.workers) as pool:
        entries = list(pool.map(_source_job, jobs))
    banks: dict[str, list[ev.BankEntry]] = {name: [] for name in sources}
    for (name, _, _), entry in zip(jobs, entries, strict=True):
        banks[name].append(entry)
    t_banks = time.perf_counter() - t0

    target_meta = scenario_meta(get_scenario(TARGET))
    encoded = {name: [ev.encode(ev.make_event(e, study_id=e.origin_study, source="bench", cluster_id="sim")) for e in bank]
               for name, bank in banks.items()}
    target_jobs = [(arm, seed, encoded[src] if src else [], args.max_trials) for arm, src in arms.items()
                   for seed in range(args.seeds)]
    with ProcessPoolExecutor(args.workers) as pool:
        runs = list(pool.map(_target_job, target_jobs))

    result: dict = {}
    for arm, src in arms.items():
        mine = [r for r in runs if r["arm"] == arm]
        trials = [r["trials_to_95"] for r in mine]
        bank = banks[src] if src else []
        result[arm] = {
            "trials_to_95_median": statistics.median(trials),
            "trials_to_95_mean": statistics.fmean(trials),
            "trials_to_95": trials,
            "reached": sum(r["reached"] for r in mine),
            "seeds": len(mine),
            "source_scenario": src,
            "bank_entries": len(bank),
            "similarity": [round(s, 4) for _, s, _ in explain_seeds(bank, target_meta, threshold=0.0)],
            "why": explain_seeds(bank, target_meta, threshold=0.0)[0][2] if bank else None,
            "bank_priors_used": mine[0]["bank_priors"] if mine else 0,
            "bank_seeds_used": mine[0]["bank_seeds"] if mine else 0,
        }
    cold = result["cold"]["trials_to_95_median"]
    result["meta"] = {
        "simulated": True,
        "target": TARGET,
        "oracle_step_s": oracle(TARGET)[1],
        "fraction_of_oracle": FRACTION,
        "seeds": args.seeds,
        "source_studies": args.source_studies,
        "source_trials": args.source_trials,
        "max_trials": args.max_trials,
        "seconds": {"banks": round(t_banks, 1), "total": round(time.perf_counter() - t0, 1)},
        "targets": {
            "cross_generation_le_half_cold": result["cross_generation"]["trials_to_95_median"] <= cold / 2,
            "irrelevant_le_cold_plus_3": result["irrelevant"]["trials_to_95_median"] <= cold + 3,
        },
        "command": " ".join(["python", "bench/transfer.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    for arm in arms:
        r = result[arm]
        print(f"{arm:17s} median {r['trials_to_95_median']:5.1f}  mean {r['trials_to_95_mean']:5.1f}  "
              f"reached {r['reached']}/{r['seeds']}  (SIMULATOR)")
    print(json.dumps(result["meta"]["targets"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
