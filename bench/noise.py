"""What a user gets on a noisy host: the TRUE speed-up of the candidate each tuner chooses, at equal runs.

The robustness family (bench/robust_family.py: seeded independent cost models with an exact oracle and a golden
baseline) measured on hosts of run-to-run CV 2, 5, 10 and 15% (lognormal per run) and a ``drift`` host (CV 5%
whose speed steps ``DRIFT_SLOWDOWN`` slower for the runs from ``DRIFT_START`` to ``DRIFT_END`` of the study,
counted over every run the study makes, the doctor's included). Each study first measures the golden baseline
``--doctor-runs`` times (what the doctor does), and InfraRSI's noise floor is what that doctor would report: the
CV of those runs (``study.model.noise_floor``); every tuner is told the runs (bench/search_vs_peers.py,
``doctor_baseline``), none of them counts against the budget.

Tuners, each given ``--budget`` runs (40):

- ``race``: InfraRSI with racing on (``SearchConfig(race=True)``: races when the search would stop and in the
  budget's last trials, at most ``race_end_share`` of them);
- ``off``: InfraRSI as it ships (racing off; the tie ranked by the posterior on a noisy host,
  ``select_posterior_noise``);
- ``today``: InfraRSI before that ranking (racing off, the tie ranked by the mix of runs and posterior);
- ``race_half``: racing that takes up to half the runs after the initial design (``race_share=0.5``) and as
  much of the budget's end as the open race needs, with the mixed ranking;
- ``tpe``: Optuna TPE; its choice is its best trial's measured value.

Scored on the noise-free times of the candidate each chooses after its last run (``Trial.chosen_best``):
chosen/oracle = oracle time / true time of the choice, vs_baseline = true time of the baseline / true time of the
choice, the share of studies whose choice is truly slower than the baseline (no choice at all counts as slower),
the OOM share of the runs, and found/oracle: oracle time / true time of the fastest candidate the study measured
at all (what a perfect choice among its runs would get; the gap to chosen/oracle is what the choice lost).
InfraRSI may stop before the budget (``should_stop``); the runs it used are reported.

    nice -n 10 python bench/noise.py [--models 30] [--first-model 0] [--seeds 3] [--budget 40]
                                     [--hosts cv2 cv5 cv10 cv15 drift] [--tuners race off today race_half tpe] [--jobs 1]
                                     [--json OUT.json]
"""

# ruff: noqa: E402  (BLAS thread count must be set before numpy is imported)
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import dataclasses
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from _common import BenchSpace, write_json
from infrarsi import events as ev
from infrarsi.modeling.pool import CandidatePool
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import Candidate
from infrarsi.sim.scenarios import SimOutcome
from infrarsi.study.model import noise_floor
from robust_family import FamilyModel, draw_model  # bench/ is the script's directory
from robustness import bench_space
from search_vs_peers import Trial, doctor_baseline, run_infrarsi, run_optuna

DRIFT_START, DRIFT_END, DRIFT_SLOWDOWN = 0.3, 0.65, 1.15
"""The drift host's slow stretch: runs from 30% to 65% of the study's runs are 15% slower."""


@dataclass(frozen=True)
class Host:
    name: str
    cv: float
    """Run-to-run coefficient of variation of the step time (lognormal per run)."""
    drift: bool = False
    """Whether the host slows by ``DRIFT_SLOWDOWN`` over the stretch ``DRIFT_START``–``DRIFT_END`` of the runs."""


HOSTS = {h.name: h for h in (Host("cv2", 0.02), Host("cv5", 0.05), Host("cv10", 0.10), Host("cv15", 0.15),
                             Host("drift", 0.05, drift=True))}
TUNERS: dict[str, Callable[[BenchSpace, int, int], list[Trial]]] = {
    "race": run_infrarsi,
    "off": run_infrarsi,
    "today": run_infrarsi,
    "race_half": run_infrarsi,
    "tpe": lambda bs, seed, budget: run_optuna(bs, seed, budget, "tpe"),
}
CONFIGS = {"race": SearchConfig(race=True), "off": SearchConfig(),
           "today": SearchConfig(race=False, select_posterior_noise=None),
           "race_half": SearchConfig(race=True, race_share=0.5, race_end_share=1.0, select_posterior_noise=None)}


class Measured:
    """A family model measured on a host: lognormal noise of the host's CV per run, and the drift's slow stretch
    counted in the runs made so far (a fresh one per study)."""

    def __init__(self, model: FamilyModel, host: Host, total_runs: int) -> None:
        self.model = dataclasses.replace(model, noise_sigma=math.sqrt(math.log1p(host.cv**2)))
        self.host = host
        self.total_runs = total_runs
        self.runs = 0

    def evaluate(self, c: Candidate, rng: np.random.Generator) -> SimOutcome:
        o = self.model.evaluate(c, rng)
        k, self.runs = self.runs, self.runs + 1
        slow = self.host.drift and DRIFT_START * self.total_runs <= k < DRIFT_END * self.total_runs
        if slow and o.step_time_s is not None:
            return dataclasses.replace(o, step_time_s=o.step_time_s * DRIFT_SLOWDOWN)
        return o


def doctor_floor(runs: Sequence[float]) -> float:
    """The noise floor a study's doctor would give from these baseline step times (``study.model.noise_floor``
    of their run-to-run CV)."""
    t = np.asarray(runs, dtype=float)
    cv = float(t.std(ddof=1) / t.mean()) if t.size > 1 else 0.0
    report = ev.DoctorCompleted(repeats=t.size, baseline_trial_ids=[], step_time_s=float(np.median(t)),
                                run_to_run_cv=cv, step_to_step_cv=0.0, warmup_steps=0, phase_fractions={},
                                per_rank_step_s=[], stragglers=[], min_detectable_speedup=1.0, repeats_per_trial=1)
    return noise_floor(report)


def study(model: FamilyModel, pool: CandidatePool, host: Host, tuner: str, seed: int, budget: int,
          doctor_runs: int) -> dict[str, Any]:
    """One study of ``tuner`` on ``model`` measured on ``host``, scored on the true times of its choice."""
    def space() -> BenchSpace:
        bs = bench_space(model, pool, "default", CONFIGS.get(tuner), doctor_runs)
        bs.evaluate = Measured(model, host, doctor_runs + budget).evaluate
        return bs

    told = [o.step_time_s for _, o in doctor_baseline(space(), seed) if o.step_time_s is not None]
    bs = space()
    bs.noise_floor = doctor_floor(told)
    trials = TUNERS[tuner](bs, seed, budget)
    chosen = trials[-1].chosen_best if trials else None
    baseline = model.study.baseline
    assert baseline is not None
    true_base = model.true_time(baseline)
    true_chosen = model.true_time(chosen) if chosen is not None else math.inf
    measured = [model.true_time(t.candidate) for t in trials if t.status == "ok" and t.step_time_s is not None]
    true_found = min(measured, default=math.inf)
    return {"model": model.seed, "seed": seed, "chosen_over_oracle": model.oracle_time / true_chosen,
            "found_over_oracle": model.oracle_time / true_found,
            "vs_baseline": true_base / true_chosen, "slower_than_baseline": true_chosen > true_base,
            "oom_share": sum(t.status == "oom" for t in trials) / max(len(trials), 1), "runs": len(trials),
            "race_runs": sum(t.origin == "confirm" for t in trials), "doctor_noise_floor": bs.noise_floor,
            "chosen": str(chosen)}


def run_model(index: int, hosts: Sequence[str], tuners: Sequence[str], seeds: int, budget: int,
              doctor_runs: int) -> list[dict[str, Any]]:
    model = draw_model(index)
    pool = CandidatePool.build(model.study.space)
    return [{"host": h, "tuner": t} | study(model, pool, HOSTS[h], t, seed, budget, doctor_runs)
            for h in hosts for t in tuners for seed in range(seeds)]


def _run_model(work: tuple[int, Sequence[str], Sequence[str], int, int, int]) -> tuple[int, list[dict[str, Any]]]:
    return work[0], run_model(*work)


def summarise(records: list[dict[str, Any]], hosts: Sequence[str], tuners: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for h in hosts:
        for t in tuners:
            rs = [r for r in records if r["host"] == h and r["tuner"] == t]
            if not rs:
                continue
            q = np.array([r["chosen_over_oracle"] for r in rs])
            out.setdefault(h, {})[t] = {
                "studies": len(rs),
                "chosen_over_oracle_median": float(np.median(q)),
                "chosen_over_oracle_p10": float(np.quantile(q, 0.1)),
                "chosen_over_oracle_mean": float(np.mean(q)),
                "found_over_oracle_mean": float(np.mean([r["found_over_oracle"] for r in rs])),
                "vs_baseline_median": float(np.median([r["vs_baseline"] for r in rs])),
                "slower_than_baseline_share": float(np.mean([r["slower_than_baseline"] for r in rs])),
                "oom_share": float(np.mean([r["oom_share"] for r in rs])),
                "runs_median": float(np.median([r["runs"] for r in rs])),
                "race_runs_median": float(np.median([r["race_runs"] for r in rs])),
            }
    return out


def targets(summary: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets at CV 10%: the race's choice ≥ 0.95 of the oracle (median), truly slower than the
    baseline in ≤ 5% of studies, ahead of today's search and TPE at equal runs."""
    at = summary.get("cv10", {})
    race = at.get("race")
    if race is None:
        return {}
    others = {t: v for t, v in at.items() if t != "race"}
    return {
        "median_chosen_over_oracle_ge_0.95": race["chosen_over_oracle_median"] >= 0.95,
        "slower_than_baseline_le_5pct": race["slower_than_baseline_share"] <= 0.05,
        "ahead_of": {t: race["chosen_over_oracle_median"] >= v["chosen_over_oracle_median"]
                     and race["slower_than_baseline_share"] <= v["slower_than_baseline_share"]
                     for t, v in others.items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=30)
    ap.add_argument("--first-model", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget", type=int, default=40, help="runs per study, every tuner (the doctor's not counted)")
    ap.add_argument("--doctor-runs", type=int, default=3, help="baseline runs the doctor measures (default 3)")
    ap.add_argument("--hosts", nargs="*", default=list(HOSTS), choices=list(HOSTS))
    ap.add_argument("--tuners", nargs="*", default=list(TUNERS), choices=list(TUNERS))
    ap.add_argument("--jobs", type=int, default=1, help="models measured in parallel processes")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    log = logging.getLogger("bench.noise")
    t0 = time.perf_counter()
    models = range(args.first_model, args.first_model + args.models)
    work = [(i, args.hosts, args.tuners, args.seeds, args.budget, args.doctor_runs) for i in models]
    records: list[dict[str, Any]] = []
    done: list[int] = []

    def report(final: bool) -> None:
        """The table (when ``final``) and the JSON of the models done so far: a run cut short keeps them."""
        summary = summarise(records, args.hosts, args.tuners)
        checks = targets(summary)
        wall = time.perf_counter() - t0
        write_json(args.json_out, {"simulated": True, "models": sorted(done), "seeds": args.seeds,
                                   "budget": args.budget, "doctor_runs": args.doctor_runs, "complete": final,
                                   "hosts": {h: dataclasses.asdict(HOSTS[h]) for h in args.hosts},
                                   "drift": {"start": DRIFT_START, "end": DRIFT_END, "slowdown": DRIFT_SLOWDOWN},
                                   "summary": summary, "targets": checks, "wall_seconds": wall, "studies": records})
        if not final:
            return
        print(f"Robustness family (simulated), models {args.first_model}..{args.first_model + args.models - 1} x "
              f"{args.seeds} seeds, {args.budget} runs per study, {args.doctor_runs} doctor runs of the baseline "
              "told; scored on TRUE (noise-free) times of each tuner's final choice")
        print(f"{'host':6s} {'tuner':6s} {'n':>4s} {'chosen/oracle':>13s} {'p10':>6s} {'vs_base':>7s} "
              f"{'slower':>6s} {'oom':>6s} {'runs':>5s} {'race':>5s} {'mean':>6s} {'found':>6s}")
        for h, by_tuner in summary.items():
            for t, v in by_tuner.items():
                print(f"{h:6s} {t:6s} {v['studies']:4d} {v['chosen_over_oracle_median']:13.3f} "
                      f"{v['chosen_over_oracle_p10']:6.3f} {v['vs_baseline_median']:7.3f} "
                      f"{v['slower_than_baseline_share']:6.3f} {v['oom_share']:6.3f} {v['runs_median']:5.0f} "
                      f"{v['race_runs_median']:5.0f} {v['chosen_over_oracle_mean']:6.3f} "
                      f"{v['found_over_oracle_mean']:6.3f}")
        print(f"targets at cv10: {checks}")
        print(f"wall {wall:.0f}s")

    def finished(index: int, part: list[dict[str, Any]]) -> None:
        records.extend(part)
        done.append(index)
        log.info("model %d done (%.0fs)", index, time.perf_counter() - t0)
        report(final=False)

    if args.jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(args.jobs) as p:
            for index, part in p.imap_unordered(_run_model, work):
                finished(index, part)
    else:
        for w in work:
            finished(w[0], run_model(*w))
    report(final=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
