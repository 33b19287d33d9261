"""Search robustness on cost models the search was not written for: InfraRSI (three prior arms) vs Optuna TPE,
Optuna GP and random, side by side, on a seeded family of independent cost models (bench/robust_family.py).

Every tuner gets the same models, budget, noise and OOM reporting (the harness of bench/search_vs_peers.py:
OOMs come back with the capacity-scaled censoring bound; the peers see them as constraint violations). The
InfraRSI arms differ only in the knowledge base the Searcher is given:

- ``default``: the built-in knowledge base (what a study of this contract gets);
- ``inverted``: every built-in time and memory prior mean negated (a knowledge base that is wrong everywhere);
- ``flat``: no priors at all.

``--doctor-baseline RUNS`` tells every tuner RUNS measured runs of the golden baseline before its first trial —
what the doctor stage measures before the product's search, which its proposer observes: InfraRSI observes them,
the Optuna samplers get them as completed trials, random ignores them. They are not trials of the budget and are
not scored. Off by default (the protocol the earlier figures were measured with).

``--family shaped`` runs the family of transformer jobs with known shapes and an independent memory truth
(bench/shaped_family.py) instead; there every InfraRSI arm runs twice, side by side: without the shape (named
``infrarsi[ARM]``, as on the robust family) and with the shape the probe reports (``infrarsi[ARM+shape]``: the
study built by ``StudySpace.with_shape`` on the golden run's measured peak, so the memory model is the
structural formula). ``--shape none`` or ``--shape known`` runs one of the two. The peers never see the shape.

``--memory-oracle ERROR ...`` adds reference arms that are not tuners: InfraRSI with the built-in priors and its
memory model replaced by the true log peak plus a fixed N(0, ERROR²) error per candidate (``OracleMemory``) —
what the search policy gives with a memory model that precise (docs/modeling.md, "What the targets need from the
memory model").

Scores per (model, seed): best/oracle at 10/20/40 trials (exact oracle: the spaces are enumerated), trials to
95% of the oracle, OOM fraction; for InfraRSI also the mean predicted P(OOM) of its proposals, how often
each origin (``pairing``, ``ei``...) produced the final best, and where its OOMs come from: per move (the
proposal's origin, or the rule that let it past the OOM cut-off: ``step_probe``, ``lifted``, ``escape``) and per
bin of predicted P(OOM), the OOM share observed against the one predicted. The JSON keeps every model's numbers,
and the table prints the per-model spread (min, 10th percentile, median, max), not only the median.

    nice -n 10 python bench/robustness.py [--family robust|shaped] [--shape none known] [--models 30] [--seeds 2]
                                          [--budget 40] [--tuners ...] [--arms ...]
                                          [--memory-oracle 0 0.05 ...] [--doctor-baseline 3] [--json OUT.json]
"""

# ruff: noqa: E402  (BLAS thread count must be set before numpy is imported)
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import dataclasses
import functools
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from _common import BenchSpace
from infrarsi.modeling.memory_model import MemoryFit, MemoryModel
from infrarsi.modeling.pool import CandidatePool
from infrarsi.modeling.priors import KnowledgeBase
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import Candidate
from robust_family import FamilyModel, draw_model  # bench/ is the script's directory
from search_vs_peers import TUNERS, Trial, _cell, score
from shaped_family import ShapedModel, shape_known_study
from shaped_family import draw_model as draw_shaped_model

FAMILIES: dict[str, Callable[[int], FamilyModel]] = {"robust": draw_model, "shaped": draw_shaped_model}
SHAPE_ARMS = ("none", "known")
"""Without the workload's shape (the generic memory model) and with it (the structural formula)."""
ARMS = ("default", "inverted", "flat")
CHECKPOINTS = (10, 20)
"""Trial counts reported besides the budget (those above a smaller budget are left out)."""


def inverted(kb: KnowledgeBase) -> KnowledgeBase:
    """Every prior mean negated, stds kept: confidently wrong."""
    return dataclasses.replace(kb, time={k: (-m, s) for k, (m, s) in kb.time.items()},
                               memory={k: (-m, s) for k, (m, s) in kb.memory.items()})


def arm_kb(kb: KnowledgeBase, arm: str) -> KnowledgeBase:
    if arm == "inverted":
        return inverted(kb)
    if arm == "flat":
        return KnowledgeBase(time={}, memory={}, device_kind=kb.device_kind)
    return kb


def bench_space(model: FamilyModel, pool: CandidatePool, arm: str = "default", config: SearchConfig | None = None,
                doctor_runs: int = 0, shape: bool = False) -> BenchSpace:
    """The model as a tuner sees it; ``shape``: InfraRSI's study once the probe reported the workload's shape
    (a ``ShapedModel`` only; ``pool`` must then be built with that study's meta, ``shaped_pool``)."""
    study = model.study
    if shape:
        assert isinstance(model, ShapedModel), "only the shaped family has a workload shape"
        study = shape_known_study(model)
        assert pool.meta is study.meta or pool.meta == study.meta, "the pool's formula is the study's"
    return BenchSpace(f"family-{model.seed}", study.space, study.capacity_bytes, model.evaluate, model.true_time,
                      model.oracle_time, study.meta, pool, kind="family", kb=arm_kb(study.kb, arm),
                      baseline=study.baseline, search_config=config, doctor_runs=doctor_runs)


def shaped_pool(model: ShapedModel) -> CandidatePool:
    """The candidate pool of the shape-known study (its rows carry the structural formula's terms)."""
    study = shape_known_study(model)
    return CandidatePool.build(study.space, study.meta)


class OracleMemory(MemoryModel):
    """A reference memory model, not a tuner: the family's true log peak plus a fixed error per candidate drawn
    N(0, ``error``²), reported with std ``error`` (calibrated on average). What the search's OOM share and
    best/oracle would be with a memory model that precise; it ignores every observation."""

    def __init__(self, searcher: Searcher, model: FamilyModel, error: float) -> None:
        super().__init__(searcher.space, searcher.capacity_bytes, kb=searcher.kb)
        self.error = error
        pool = searcher.pool.candidates
        truth = np.log([model.memory_of(c.knobs) for c in pool])
        self.pool_log_peak = truth + error * np.random.default_rng(7_000 + model.seed).standard_normal(truth.size)
        self.by_key = {c.key: float(v) for c, v in zip(pool, self.pool_log_peak, strict=True)}

    def fit(self, max_iterations: int = 50, upto: int | None = None) -> MemoryFit:
        return MemoryFit(self.theta, self.log_sigma, self.covariance, 0, 0, True)

    def log_mean(self, theta: np.ndarray, x: np.ndarray, sa: np.ndarray) -> np.ndarray:
        assert x.shape[0] == self.pool_log_peak.size, "asked for the whole pool only (Searcher._pool_means)"
        return self.pool_log_peak.copy()

    def predict_log(self, cs: Sequence[Candidate], x: np.ndarray | None = None,
                    sa: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        mu = np.array([self.by_key[c.key] for c in cs])
        return mu, np.full(mu.shape, max(self.error, 1e-3))


def search_config(pairs: Sequence[str]) -> SearchConfig:
    """``SearchConfig`` with ``FIELD=VALUE`` overrides (``None``, numbers, ``true``/``false``): to measure a
    setting against the defaults on the same models."""
    fields = {f.name for f in dataclasses.fields(SearchConfig)}
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or name not in fields:
            raise SystemExit(f"--search-config {pair!r}: expected FIELD=VALUE with FIELD one of {sorted(fields)}")
        out[name] = json.loads(text.replace("None", "null"))
    return dataclasses.replace(SearchConfig(), **out)


def run_model(model: FamilyModel, tuners: Sequence[str], arms: Sequence[str], seeds: int, budget: int,
              config: SearchConfig | None = None, memory_oracle: Sequence[float] = (), doctor_runs: int = 0,
              shape_arms: Sequence[str] = ("none",)) -> dict[str, Any]:
    pool = CandidatePool.build(model.study.space)
    runs: dict[str, list[list[Trial]]] = {}
    for tuner in tuners:
        if tuner == "infrarsi":
            for arm in arms:
                for shape in shape_arms:
                    known = shape == "known"
                    bs = bench_space(model, shaped_pool(model) if known else pool,  # type: ignore[arg-type]
                                     arm, config, doctor_runs, shape=known)
                    runs[f"infrarsi[{arm}+shape]" if known else f"infrarsi[{arm}]"] = [
                        TUNERS[tuner](bs, seed, budget) for seed in range(seeds)]
            for error in memory_oracle:
                bs = bench_space(model, pool, "default", config, doctor_runs)
                bs.memory_model = functools.partial(OracleMemory, model=model, error=error)
                runs[f"infrarsi[memory_oracle={error:g}]"] = [TUNERS[tuner](bs, seed, budget)
                                                              for seed in range(seeds)]
        else:
            bs = bench_space(model, pool, doctor_runs=doctor_runs)
            runs[tuner] = [TUNERS[tuner](bs, seed, budget) for seed in range(seeds)]
    bs = bench_space(model, pool)
    out: dict[str, Any] = {"features": list(model.features), "size": len(pool.candidates),
                           "knobs": [k.name for k in model.study.space.knobs], "noise_sigma": model.noise_sigma,
                           "oracle": str(model.oracle), "oracle_memory_fraction": model.oracle_memory_fraction,
                           "tuners": {}}
    for name, tuner_runs in runs.items():
        scores = [score(bs, trials, budget) for trials in tuner_runs]
        entry: dict[str, Any] = {
            "best_over_oracle": [s["best_over_oracle"][str(budget)] for s in scores],
            **{f"best_over_oracle_{k}": [s["best_over_oracle"][str(k)] for s in scores] for k in CHECKPOINTS
               if k <= budget},
            "trials_to_95": [s["trials_to_95"] for s in scores],
            "oom_fraction": [s["oom_fraction"] for s in scores],
        }
        if name.startswith("infrarsi"):
            predicted = [t.predicted_p_oom for trials in tuner_runs for t in trials if t.predicted_p_oom is not None]
            entry["mean_predicted_p_oom"] = float(np.mean(predicted)) if predicted else None
            entry["origins"] = _origins(tuner_runs)
            entry["oom_sources"] = _oom_sources(tuner_runs)
            entry["p_oom_bins"] = _calibration(tuner_runs)
            entry["best_found_by"] = [_finder(trials) for trials in tuner_runs]
        out["tuners"][name] = entry
    return out


def _origins(runs: list[list[Trial]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for trials in runs:
        for t in trials:
            counts[t.origin] = counts.get(t.origin, 0) + 1
    return counts


P_OOM_BINS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5)
"""Lower edges of the predicted-P(OOM) bins the calibration table counts (the last runs to 1)."""


def _move(t: Trial) -> str:
    """The rule that proposed an InfraRSI trial at its risk: its origin when the OOM cut-off admitted it, else
    what let it past the cut-off (a memory step probe, a lifted cut-off, the escape probe)."""
    return t.origin if t.admission in ("", "cut_off") else t.admission


def _tally(runs: list[list[Trial]], key: Callable[[Trial], Any]) -> dict[Any, list[float]]:
    """Per ``key`` of a trial: [trials, OOMs, summed predicted P(OOM)]."""
    out: dict[Any, list[float]] = {}
    for trials in runs:
        for t in trials:
            row = out.setdefault(key(t), [0, 0, 0.0])
            row[0] += 1
            row[1] += t.status == "oom"
            row[2] += t.predicted_p_oom or 0.0
    return out


def _oom_sources(runs: list[list[Trial]]) -> dict[str, list[float]]:
    """Per move: [trials, OOMs, summed predicted P(OOM)] — where a tuner's OOMs come from."""
    return _tally(runs, _move)


def _calibration(runs: list[list[Trial]]) -> list[list[float]]:
    """Per ``P_OOM_BINS`` bin of the predicted P(OOM): [trials, OOMs, summed predicted P(OOM)]."""
    by_bin = _tally(runs, lambda t: int(np.searchsorted(P_OOM_BINS, t.predicted_p_oom or 0.0, side="right")) - 1)
    return [by_bin.get(i, [0, 0, 0.0]) for i in range(len(P_OOM_BINS))]


def _add_rows(rows: Iterable[Sequence[float]]) -> list[float]:
    """Element-wise sum of [trials, OOMs, summed P(OOM)] rows."""
    out = [0, 0, 0.0]
    for row in rows:
        out = [a + b for a, b in zip(out, row, strict=True)]
    return out


def _finder(trials: list[Trial]) -> str | None:
    """The origin of the trial that proposed the run's final chosen best."""
    best = trials[-1].chosen_best if trials else None
    return next((t.origin for t in trials if best is not None and t.candidate == best), None)


def summarise(models: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    """Per tuner over the family: medians over every (model, seed) run, and the per-model spread of the
    per-model median best/oracle."""
    names = list(models[0]["tuners"])
    out: dict[str, Any] = {}
    for name in names:
        per_run = [v for m in models for v in m["tuners"][name]["best_over_oracle"]]
        per_model = [float(np.median(m["tuners"][name]["best_over_oracle"])) for m in models]
        to95 = [v for m in models for v in m["tuners"][name]["trials_to_95"]]
        ooms = [v for m in models for v in m["tuners"][name]["oom_fraction"]]
        entry = {
            f"best_over_oracle_at_{budget}_median": float(np.median(per_run)),
            **{f"best_over_oracle_at_{k}_median": float(np.median(
                [v for m in models for v in m["tuners"][name][f"best_over_oracle_{k}"]])) for k in CHECKPOINTS
               if k <= budget},
            "per_model_median_spread": {"min": min(per_model), "p10": float(np.quantile(per_model, 0.1)),
                                        "p25": float(np.quantile(per_model, 0.25)),
                                        "median": float(np.median(per_model)), "max": max(per_model)},
            "models_at_or_above_0.93": sum(v >= 0.93 for v in per_model) / len(per_model),
            "trials_to_95_median": float(np.median(to95)),
            "runs_reaching_95": sum(v <= budget for v in to95) / len(to95),
            "oom_fraction": float(np.mean(ooms)),
        }
        if name.startswith("infrarsi"):
            predicted = [m["tuners"][name]["mean_predicted_p_oom"] for m in models
                         if m["tuners"][name]["mean_predicted_p_oom"] is not None]
            entry["mean_predicted_p_oom"] = float(np.mean(predicted)) if predicted else None
            found: dict[str, int] = {}
            for m in models:
                for f in m["tuners"][name]["best_found_by"]:
                    found[str(f)] = found.get(str(f), 0) + 1
            entry["best_found_by"] = found
            parts = [m["tuners"][name] for m in models]  # a merged older JSON may lack the tallies
            moves = dict.fromkeys(move for p in parts for move in p.get("oom_sources", {}))  # first-seen order
            entry["oom_sources"] = {move: _add_rows(p["oom_sources"][move] for p in parts
                                                    if move in p.get("oom_sources", {})) for move in moves}
            entry["p_oom_bins"] = [_add_rows(p["p_oom_bins"][i] for p in parts if "p_oom_bins" in p)
                                   for i in range(len(P_OOM_BINS))]
        out[name] = entry
    return out


def targets(summary: dict[str, Any], budget: int) -> dict[str, Any]:
    """Issue 13's targets, each with the numbers it compares."""
    key = f"best_over_oracle_at_{budget}_median"
    d, tpe = summary.get("infrarsi[default]"), summary.get("optuna_tpe")
    out: dict[str, Any] = {}
    if d is not None:
        out["median_best_over_oracle_ge_0.97"] = (d[key], d[key] >= 0.97)
        out["models_ge_0.93_at_least_90pct"] = (d["models_at_or_above_0.93"], d["models_at_or_above_0.93"] >= 0.9)
        out["oom_fraction_le_0.08"] = (d["oom_fraction"], d["oom_fraction"] <= 0.08)
        if tpe is not None:
            out["trials_to_95_le_half_tpe"] = ((d["trials_to_95_median"], tpe["trials_to_95_median"]),
                                               d["trials_to_95_median"] <= 0.5 * tpe["trials_to_95_median"])
            out["oom_fraction_le_third_tpe"] = ((d["oom_fraction"], tpe["oom_fraction"]),
                                                d["oom_fraction"] <= tpe["oom_fraction"] / 3)
    shaped = summary.get("infrarsi[default+shape]")
    if shaped is not None:
        out |= shape_targets(shaped, d, tpe, budget)
    if "infrarsi[inverted]" in summary:
        v = summary["infrarsi[inverted]"][key]
        out["inverted_median_ge_0.93"] = (v, v >= 0.93)
    if "infrarsi[flat]" in summary:
        v = summary["infrarsi[flat]"][key]
        out["flat_median_ge_0.95"] = (v, v >= 0.95)
    return out


CALIBRATION_MIN_TRIALS = 30
"""A P(OOM) bin is held to the calibration target once it holds this many trials (issue 33)."""


def shape_targets(shaped: dict[str, Any], no_shape: dict[str, Any] | None, tpe: dict[str, Any] | None, budget: int
                  ) -> dict[str, Any]:
    """Issue 33's targets for the shape-known arm (``infrarsi[default+shape]``), each with what it compares."""
    key = f"best_over_oracle_at_{budget}_median"
    out: dict[str, Any] = {
        "shape_median_best_over_oracle_ge_0.97": (shaped[key], shaped[key] >= 0.97),
        "shape_models_ge_0.93_at_least_90pct": (shaped["models_at_or_above_0.93"],
                                                shaped["models_at_or_above_0.93"] >= 0.9),
        "shape_oom_fraction_le_0.08": (shaped["oom_fraction"], shaped["oom_fraction"] <= 0.08),
    }
    if tpe is not None:
        out["shape_trials_to_95_le_half_tpe"] = ((shaped["trials_to_95_median"], tpe["trials_to_95_median"]),
                                                 shaped["trials_to_95_median"] <= 0.5 * tpe["trials_to_95_median"])
        out["shape_oom_fraction_le_third_tpe"] = ((shaped["oom_fraction"], tpe["oom_fraction"]),
                                                  shaped["oom_fraction"] <= tpe["oom_fraction"] / 3)
    if no_shape is not None:
        out["shape_median_within_0.01_of_no_shape"] = ((shaped[key], no_shape[key]),
                                                       shaped[key] >= no_shape[key] - 0.01)
    gaps = [(i, o / n - p / n) for i, (n, o, p) in enumerate(shaped.get("p_oom_bins", []))
            if n >= CALIBRATION_MIN_TRIALS]
    worst = max((abs(g) for _, g in gaps), default=0.0)
    out["shape_p_oom_calibrated_within_5_points"] = ([(P_OOM_BINS[i], round(g, 3)) for i, g in gaps], worst <= 0.05)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=30, help="cost models drawn (seeds 0..N-1 of the family)")
    ap.add_argument("--first-model", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=2, help="tuner seeds per model")
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--tuners", nargs="*", default=list(TUNERS))
    ap.add_argument("--arms", nargs="*", default=list(ARMS), help="InfraRSI prior arms")
    ap.add_argument("--family", choices=list(FAMILIES), default="robust",
                    help="robust: bench/robust_family.py (no shapes); shaped: bench/shaped_family.py (transformer "
                         "jobs with known shapes and an independent memory truth)")
    ap.add_argument("--shape", nargs="*", choices=list(SHAPE_ARMS), default=None,
                    help="InfraRSI without the workload's shape (none) and/or with it (known); default: both on "
                         "the shaped family, none on the robust one (it has no shapes)")
    ap.add_argument("--search-config", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="InfraRSI SearchConfig overrides, e.g. oom_exclude=0.35 memory_interaction_std=None")
    ap.add_argument("--memory-oracle", nargs="*", type=float, default=[], metavar="ERROR",
                    help="reference arms: InfraRSI (built-in priors) with its memory model replaced by the true "
                         "log peak plus a fixed N(0, ERROR^2) error per candidate, e.g. 0 0.05 0.1")
    ap.add_argument("--doctor-baseline", type=int, default=0, metavar="RUNS",
                    help="every tuner is told RUNS measured runs of the golden baseline before its first trial "
                         "(what the doctor stage measures and the product's proposer observes; default 0)")
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--merge", nargs="*", default=None, metavar="PART.json",
                    help="summarise the per-model results of earlier runs (e.g. the family split over processes, "
                         "or the tuners run apart on the same models) instead of running")
    args = ap.parse_args(argv)
    config = search_config(args.search_config)
    shape_arms = args.shape if args.shape is not None else (list(SHAPE_ARMS) if args.family == "shaped" else ["none"])
    if "known" in shape_arms and args.family != "shaped":
        raise SystemExit("--shape known needs --family shaped (the robust family has no shapes)")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    log = logging.getLogger("bench")
    models: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    for part in args.merge or ():
        with open(part) as f:
            data = json.load(f)
        told = data.get("doctor_runs", 0)
        if data.get("family", "bench/robust_family.py") != f"bench/{args.family}_family.py":
            raise SystemExit(f"{part}: family {data.get('family')} is not --family {args.family}")
        if data["budget"] != args.budget or data["seeds"] != args.seeds or told != args.doctor_baseline:
            raise SystemExit(f"{part}: budget {data['budget']}, seeds {data['seeds']}, doctor runs {told} differ "
                             f"from --budget {args.budget} --seeds {args.seeds} --doctor-baseline "
                             f"{args.doctor_baseline}")
        for m in data["per_model"]:
            # a model already read from another part (other tuners on the same models): its tuners join
            same = next((old for old in models if old["model"] == m["model"]), None)
            if same is None:
                models.append(m)
            else:
                same["tuners"].update(m["tuners"])
    if args.merge is not None:
        args.models = len(models)
    for i in range(args.first_model, args.first_model + args.models) if args.merge is None else ():
        t0 = time.perf_counter()
        model = FAMILIES[args.family](i)
        m = run_model(model, args.tuners, args.arms, args.seeds, args.budget, config, args.memory_oracle,
                      args.doctor_baseline, shape_arms)
        m["model"] = i
        models.append(m)
        cells = "  ".join(f"{n} {np.median(v['best_over_oracle']):.3f}/{np.mean(v['oom_fraction']):.2f}"
                          for n, v in m["tuners"].items())
        log.info("model %2d (%5d cands, %s): %s  (%.0fs)", i, m["size"], ",".join(m["features"]) or "-", cells,
                 time.perf_counter() - t0)
    summary = summarise(models, args.budget)
    checks = targets(summary, args.budget)
    key = f"best_over_oracle_at_{args.budget}_median"
    told = f", {args.doctor_baseline} doctor runs of the baseline told" if args.doctor_baseline else ""
    print(f"Robustness family ({args.family}): {args.models} models x {args.seeds} seeds, budget {args.budget}{told} "
          f"({time.perf_counter() - t_start:.0f} s)")
    print(f"{'tuner':24s} {'@10':>6s} {'@20':>6s} {'@B':>6s}  {'per-model min/p10/med/max':>27s} {'>=.93':>6s} "
          f"{'to95':>5s} {'reach':>6s} {'oom':>6s} {'pred':>6s}")
    for name, s in summary.items():
        sp = s["per_model_median_spread"]
        pred = s.get("mean_predicted_p_oom")
        early = " ".join(_cell(s.get(f"best_over_oracle_at_{k}_median")) for k in CHECKPOINTS)
        print(f"{name:24s} {early} {s[key]:6.3f}  {sp['min']:6.3f} {sp['p10']:6.3f} {sp['median']:6.3f} {sp['max']:6.3f} "
              f"{s['models_at_or_above_0.93']:6.2f} {s['trials_to_95_median']:5.1f} {s['runs_reaching_95']:6.2f} "
              f"{s['oom_fraction']:6.3f} {pred if pred is not None else float('nan'):6.3f}")
    for name, s in summary.items():
        if "best_found_by" in s:
            print(f"{name}: final best proposed by {s['best_found_by']}")
    for name, s in summary.items():
        if s.get("oom_sources"):
            total = sum(row[0] for row in s["oom_sources"].values())
            cells = ", ".join(f"{move} {int(o)}/{int(n)} (pred {p / n:.2f}; {o / total:.3f} of trials)"
                              for move, (n, o, p) in sorted(s["oom_sources"].items(), key=lambda kv: -kv[1][1]))
            print(f"{name}: OOMs by move, OOM/trials: {cells}")
            edges = [*P_OOM_BINS, 1.0]
            cells = ", ".join(f"[{lo:.2f},{hi:.2f}) {int(n)}: {o / n:.3f} vs {p / n:.3f}"
                              for lo, hi, (n, o, p) in zip(edges, edges[1:], s["p_oom_bins"], strict=False) if n)
            print(f"{name}: P(OOM) bins, trials: observed vs predicted OOM share: {cells}")
    for target, (value, ok) in checks.items():
        print(f"target {target}: {'met' if ok else 'NOT met'} ({value})")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"simulated": True, "family": f"bench/{args.family}_family.py", "models": args.models,
                       "shape_arms": shape_arms,
                       "search_config": dataclasses.asdict(config),
                       "seeds": args.seeds, "budget": args.budget, "doctor_runs": args.doctor_baseline, "summary": summary, "targets": checks,
                       "per_model": models}, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
