"""Search quality at equal trial budgets: InfraRSI Searcher vs Optuna TPE, Optuna GP, random.

Two kinds of space, labelled in the table:

- (simulator): SIMULATOR scenarios (infrarsi.sim) with a known optimum; best_over_oracle = oracle time / the
  noise-free time of the tuner's chosen best. Budget ``--budget`` (40), ``--seeds`` seeds (10).
- (real, CPU): the real dense-1node GPT contract on this host (``bench/real_space.py``): every trial is a real
  training job run through the launcher and telemetry services in-process, at a ``--real-steps`` horizon (12,
  not the contract's 30), with a smaller budget ``--real-budget`` (12) and fewer seeds ``--real-seeds`` (3); a
  math-changing patch or a reward hack fails its invariants and counts as a failed trial. Each candidate is
  measured once per bench process, and a repeat (another seed or tuner) gets that cached measurement back.
  There is no known oracle: the reference is the best step time measured (ok, every invariant holding) over
  every trial of every tuner and seed on the space, and best_over_oracle = reference / the measured time of
  the tuner's chosen best (the JSON says ``"oracle": "best measured by any tuner"``). ``--no-real`` skips it, and
  so does a ``--spaces`` list that does not name ``dense-1node``.

More spaces come through ``--extra-space module:function``, the function returning a ``BenchSpace`` (an
``evaluate(candidate, rng)`` callable plus, when known, the noise-free time and oracle). Every tuner gets the
same budget on a space, batch size 1; trials_to_95 and cost_to_95 are counted against the oracle or reference.

    python bench/search_vs_peers.py [--quick] [--seeds N] [--spaces NAME...] [--no-real] [--real-budget N]
                                    [--real-seeds N] [--json OUT.json]
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
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from _common import BenchSpace, Outcome, write_json
from infrarsi.modeling.observations import Observation
from infrarsi.modeling.pool import CandidatePool
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.space import Candidate


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
    origin: str = ""
    """Why InfraRSI proposed it (``Suggestion.origin``); empty for the peers."""
    predicted_p_oom: float | None = None
    """InfraRSI's P(OOM) of the candidate when it was proposed."""
    admission: str = ""
    """What let InfraRSI propose it at that risk (``Suggestion.admission``); empty for the peers."""


# ------------------------------------------------------------------------------------------------ tuners


def doctor_baseline(bs: BenchSpace, seed: int) -> list[tuple[Candidate, Outcome]]:
    """The golden baseline's ``bs.doctor_runs`` measured runs, drawn from their own stream (the same for every
    tuner, and apart from the trials' draws)."""
    if bs.doctor_runs <= 0 or bs.baseline is None:
        return []
    rng = np.random.default_rng(40_000 + seed)
    return [(bs.baseline, bs.evaluate(bs.baseline, rng)) for _ in range(bs.doctor_runs)]


def design_done(s: Searcher, told: int = 0) -> bool:
    """The proposer's rule for when ``should_stop`` is asked: the initial design measured (the search's own
    trials, not the ``told`` doctor runs) and something fitted (services/proposer/logic.py, ``_design_done``)."""
    return len(s.observations) - told >= 1 + s.config.n_seeds and any(o.status == "ok" for o in s.observations)


def run_infrarsi(bs: BenchSpace, seed: int, budget: int) -> list[Trial]:
    # what a study gives the proposer: the contract's knowledge base and golden baseline, where the space has them
    floor = {} if bs.noise_floor is None else {"noise_floor": bs.noise_floor}
    s = Searcher(bs.space, bs.capacity_bytes, meta=bs.meta, kb=bs.kb, baseline=bs.baseline, seed=seed, pool=bs.pool,
                 config=bs.search_config, **floor)
    if bs.memory_model is not None:
        s.memory_model = bs.memory_model(s)
        s.memory_peer = None  # a reference model (bench/robustness.py --memory-oracle) is measured alone
    for c, o in doctor_baseline(bs, seed):  # the proposer observes the doctor's baseline runs
        s.observe(Observation(c, o.status, o.step_time_s, o.peak_bytes, o.cost_seconds))  # type: ignore[arg-type]
    told = len(s.observations)
    rng = np.random.default_rng(10_000 + seed)
    out: list[Trial] = []
    for _ in range(budget):
        if design_done(s, told) and s.should_stop()[0]:
            break  # what the proposer does: no more expected gain ends the study (a tiny space runs out of fits)
        sug = s.suggest(1, left=budget - len(out))  # the open race may take the budget's last trials
        if not sug:
            break
        c = sug[0].candidate
        o = bs.evaluate(c, rng)
        s.observe(Observation(c, o.status, o.step_time_s, o.peak_bytes, o.cost_seconds))  # type: ignore[arg-type]
        top = s.top_candidates(1)
        out.append(Trial(c, o.status, o.step_time_s, o.cost_seconds, top[0][0] if top else None, sug[0].origin,
                         sug[0].p_oom, sug[0].admission))
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
    for c, o in doctor_baseline(bs, seed):  # a completed trial the sampler learns from (not the tuner's pick)
        if o.status != "ok" or o.step_time_s is None:
            continue
        worst[0] = max(worst[0], o.step_time_s)
        params = {k.name: c[k.name] for k in bs.space.knobs} | {f"patch:{p.id}": p.id in c.patches
                                                                 for p in bs.space.patches}
        dists = {k.name: optuna.distributions.CategoricalDistribution(list(k.values()))  # type: ignore[arg-type]
                 for k in bs.space.knobs} | {f"patch:{p.id}": optuna.distributions.CategoricalDistribution(
                     [False, True]) for p in bs.space.patches}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=o.step_time_s,
                                                  constraints={"memory_and_invariants": 0.0}))
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


@dataclass(frozen=True)
class MeasuredReference:
    """The oracle's stand-in on a space without one (a real space): the best step time any tuner measured."""

    time_s: float
    """Fastest measured step time of a candidate that ran ok with every invariant holding."""
    candidate: Candidate
    time_of: dict[str, float]
    """Candidate key → its measured step time (median of its ok trials; one trial when the space caches)."""


def measured_reference(runs: Iterable[Sequence[Trial]]) -> MeasuredReference | None:
    """The reference over every trial of every tuner and seed on one space; ``None`` when none ran ok."""
    times: dict[str, list[float]] = {}
    cands: dict[str, Candidate] = {}
    for trials in runs:
        for t in trials:
            if t.status == "ok" and t.step_time_s is not None and t.step_time_s > 0:
                times.setdefault(t.candidate.key, []).append(t.step_time_s)
                cands[t.candidate.key] = t.candidate
    if not times:
        return None
    time_of = {key: float(np.median(v)) for key, v in times.items()}
    best = min(time_of, key=time_of.__getitem__)
    return MeasuredReference(time_of[best], cands[best], time_of)


def score(bs: BenchSpace, trials: list[Trial], budget: int, reference: MeasuredReference | None = None
          ) -> dict[str, Any]:
    """best_over_oracle at 10/20/40 trials and at the budget, OOM fraction, trials and cost to 95% of the oracle.

    With an oracle (simulator): oracle time / noise-free time of the tuner's chosen best. Without one (a real
    space): ``reference.time_s`` / the measured time of the chosen best (0 when it never ran ok), where the
    reference comes from ``measured_reference`` over every tuner's trials on the space."""
    has_oracle = bs.has_oracle
    if not has_oracle and reference is None and any(t.status == "ok" for t in trials):
        raise ValueError(f"{bs.name} has no oracle: score it against a measured_reference")

    def quality(c: Candidate | None) -> float:
        if c is None:
            return 0.0
        if has_oracle:
            return bs.oracle_time / bs.true_time(c)  # type: ignore[misc,operator]
        measured = reference.time_of.get(c.key) if reference is not None else None
        return reference.time_s / measured if reference is not None and measured else 0.0

    ratios = [quality(t.chosen_best) for t in trials]
    at = {str(k): (ratios[min(k, len(ratios)) - 1] if ratios else 0.0)
          for k in sorted({10, 20, 40, budget}) if k <= budget}
    to95 = next((i + 1 for i, r in enumerate(ratios) if r >= 0.95), budget + 1)
    costs = np.cumsum([t.cost for t in trials])
    cost95 = float(costs[to95 - 1]) if to95 <= len(trials) else float(costs[-1]) if len(costs) else 0.0
    return {"best_over_oracle": at, "oom_fraction": sum(t.status == "oom" for t in trials) / max(len(trials), 1),
            "trials_to_95": to95, "cost_to_95": cost95}


# ------------------------------------------------------------------------------------------------ main


REAL_SPACE = "dense-1node"
"""``--spaces`` name of the real dense-1node CPU space (bench/real_space.py)."""


def _cell(value: float | None) -> str:
    return f"{value:6.3f}" if value is not None else f"{'-':>6s}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="3 seeds, 3 main simulator spaces; the real space at budget 6, 1 seed")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per simulator space (default 10; --quick 3)")
    ap.add_argument("--budget", type=int, default=40, help="trials per tuner and seed on a simulator space")
    ap.add_argument("--spaces", nargs="*", default=None,
                    help=f"simulator scenarios and/or {REAL_SPACE!r}, the real space (default: every scenario and the "
                         "real space; --quick: 3 scenarios and the real space; the flag alone: none)")
    ap.add_argument("--tuners", nargs="*", default=list(TUNERS))
    ap.add_argument("--no-real", action="store_true", help="skip the real dense-1node CPU space")
    ap.add_argument("--real-budget", type=int, default=None,
                    help="trials per tuner and seed on a real space (default 12; --quick 6)")
    ap.add_argument("--real-seeds", type=int, default=None, help="seeds per real space (default 3; --quick 1)")
    ap.add_argument("--real-steps", type=int, default=12,
                    help="horizon of a real trial in steps (the contract's is 30; default 12)")
    ap.add_argument("--extra-space", action="append", default=[],
                    help="module:function returning a BenchSpace (one whose kind is not 'simulator' gets the real "
                         "budget and seeds)")
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
    real_budget = args.real_budget if args.real_budget is not None else (6 if args.quick else 12)
    real_seeds = args.real_seeds if args.real_seeds is not None else (1 if args.quick else 3)
    names = args.spaces if args.spaces is not None else (list(SCENARIOS[:3]) if args.quick else list(SCENARIOS))
    spaces: list[Callable[[], BenchSpace]] = [lambda n=n: sim_space(n) for n in names if n != REAL_SPACE]
    # an explicit --spaces list is the whole selection: the real space runs only when it names it
    if not args.no_real and (args.spaces is None or REAL_SPACE in args.spaces):
        from real_space import dense_1node_cpu  # bench/ is the script's directory

        spaces.append(lambda: dense_1node_cpu(steps=args.real_steps))
    for spec in args.extra_space:
        mod, fn = spec.split(":")
        spaces.append(getattr(importlib.import_module(mod), fn))
    result: dict[str, Any] = {"simulated": True, "budget": args.budget, "seeds": seeds, "spaces": {},
                              "space_info": {}}
    rows = []
    for build in spaces:
        bs = build()
        simulated = bs.kind == "simulator"
        budget, n_seeds = (args.budget, seeds) if simulated else (real_budget, real_seeds)
        try:
            runs: dict[str, list[list[Trial]]] = {}
            elapsed: dict[str, float] = {}
            for tuner in args.tuners:
                t0 = time.perf_counter()
                runs[tuner] = [TUNERS[tuner](bs, seed, budget) for seed in range(n_seeds)]
                elapsed[tuner] = time.perf_counter() - t0
            has_oracle = bs.has_oracle
            reference = None if has_oracle else measured_reference(t for r in runs.values() for t in r)
            per_tuner: dict[str, Any] = {}
            for tuner, tuner_runs in runs.items():
                scores = [score(bs, trials, budget, reference) for trials in tuner_runs]
                agg = {
                    "best_over_oracle_median": {k: float(np.median([s["best_over_oracle"][k] for s in scores]))
                                                for k in scores[0]["best_over_oracle"]},
                    "oom_fraction": float(np.mean([s["oom_fraction"] for s in scores])),
                    "trials_to_95_median": float(np.median([s["trials_to_95"] for s in scores])),
                    "cost_to_95_median": float(np.median([s["cost_to_95"] for s in scores])),
                    "per_seed_best_over_oracle_at_budget": [s["best_over_oracle"].get(str(budget)) for s in scores],
                    "wall_seconds": elapsed[tuner],
                }
                per_tuner[tuner] = agg
                b = agg["best_over_oracle_median"]
                rows.append((bs.name, tuner, budget, b.get("10"), b.get("20"), b.get(str(budget)),
                             agg["oom_fraction"], agg["trials_to_95_median"], agg["cost_to_95_median"]))
                log.info("%-34s %-11s best/oracle@10 %s @20 %s @%d %s  oom %.3f  to95 %.1f  cost95 %.3g  (%.0fs)",
                         bs.name, tuner, _cell(b.get("10")), _cell(b.get("20")), budget, _cell(b.get(str(budget))),
                         agg["oom_fraction"], agg["trials_to_95_median"], agg["cost_to_95_median"], elapsed[tuner])
            key = bs.name.replace(f" ({bs.kind})", "")
            result["spaces"][key] = per_tuner
            info: dict[str, Any] = {"kind": bs.kind, "budget": budget, "seeds": n_seeds}
            if has_oracle:
                info |= {"oracle": "simulator optimum (noise-free step time)", "oracle_step_time_s": bs.oracle_time}
            else:
                info |= {"oracle": "best measured by any tuner",
                         "oracle_step_time_s": reference.time_s if reference else None,
                         "oracle_candidate": str(reference.candidate) if reference else None}
            result["space_info"][key] = info | (bs.info() if bs.info is not None else {})
            result["simulated"] = result["simulated"] and simulated
        finally:
            if bs.close is not None:
                bs.close()
    print("Spaces labelled (simulator) are simulated (infrarsi.sim, known oracle); (real, CPU) spaces run real "
          "trials on this host,\nscored against the best step time any tuner measured there. @B: at the space's "
          "budget B.")
    print(f"{'space':34s} {'tuner':11s} {'B':>3s} {'@10':>6s} {'@20':>6s} {'@B':>6s} {'oom':>6s} {'to95':>5s} "
          f"{'cost95':>9s}")
    for r in rows:
        print(f"{r[0]:34s} {r[1]:11s} {r[2]:3d} {_cell(r[3])} {_cell(r[4])} {_cell(r[5])} {r[6]:6.3f} {r[7]:5.1f} "
              f"{r[8]:9.3g}")
    write_json(args.json_out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
