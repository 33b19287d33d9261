"""Acquisition math: expected improvement on log time, feasibility probabilities, cost, OOM domination.

Owns: pure functions over arrays, and the small per-patch Beta-Bernoulli model of P(invariants hold).
Must not: hold search state (that is `search.Searcher`) or do I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.special import ndtr

from infrarsi.modeling.space import Candidate, Categorical, KnobValue, SearchSpace


def expected_improvement(mu: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """EI for minimisation of log time: E[max(best - f, 0)], f ~ N(mu, sd²)."""
    sd = np.maximum(sd, 1e-9)
    z = (best - mu) / sd
    ei: np.ndarray = (best - mu) * ndtr(z) + sd * np.exp(-0.5 * z**2) / np.sqrt(2 * np.pi)
    return ei


def acquisition(ei: np.ndarray, p_oom: np.ndarray, p_hold: np.ndarray, cost: np.ndarray,
                oom_risk_power: float = 2.0) -> np.ndarray:
    """What a trial is worth per unit cost: EI × P(no OOM)^power × P(invariants hold) / predicted cost.

    Power 1 is risk-neutral EI; above 1 an OOM is priced as well as its lost improvement (see
    ``SearchConfig.oom_risk_power``)."""
    worth: np.ndarray = ei * (1.0 - p_oom) ** oom_risk_power * p_hold / np.maximum(cost, 1e-9)
    return worth


@dataclass
class InvariantModel:
    """P(a candidate keeps every invariant), learnt from invariant-violation outcomes.

    Items are the candidate's patches and knob settings ("name=value"). Each item is either *bad* for this
    workload (it always breaks an invariant: FP8 that diverges, a capacity factor that drops tokens) or fine;
    P(bad) starts at the patch metadata's Beta mean (knob settings: ``level_prior``). Trials are then flaky
    at rate ``flake``: P(violation | candidate) = 1 - (1 - flake) Π_items (1 - bad_item). The posterior is the
    mean-field fixed point over items, so one violation with two patches is shared by the likelier culprit and
    a single pass clears an item. This is the Beta-Bernoulli of each item collapsed to its two extreme rates,
    which is what a deterministic invariant looks like and why two or three violations suffice.
    """

    prior: Mapping[str, tuple[float, float]]
    level_prior: float = 0.02
    flake: float = 0.03
    history: list[tuple[tuple[str, ...], bool]] = field(default_factory=list)
    _q: dict[str, float] = field(default_factory=dict)
    _suspects: set[str] = field(default_factory=set)
    _passes: dict[str, int] = field(default_factory=dict)
    _stale: bool = False
    _incidence: tuple[tuple[str, ...], int, np.ndarray, np.ndarray, np.ndarray] = (
        (), 0, np.zeros(0, int), np.zeros(0, int), np.zeros(0, bool))
    """(suspects, runs of ``history`` read, run, suspect column, violated): the flattened (run, suspect)
    incidence, extended with new runs while the suspects stay the same (rebuilt when one is added)."""

    @staticmethod
    def items(c: Candidate) -> tuple[str, ...]:
        return tuple(sorted(c.patches)) + tuple(f"{k}={v}" for k, v in c.knob_items)

    def _prior(self, item: str) -> float:
        if item in self.prior:
            a, b = self.prior[item]
            return a / (a + b)
        return self.level_prior

    def observe(self, c: Candidate, violated: bool) -> None:
        its = self.items(c)
        self.history.append((its, violated))
        if violated:
            self._suspects.update(its)
        else:
            for i in its:
                self._passes[i] = self._passes.get(i, 0) + 1
        self._stale = bool(self._suspects)

    def _solve(self, sweeps: int = 8) -> None:
        """Mean-field fixed point over suspects (items seen in a violation); other items only ever passed,
        so their P(bad) is the prior times the pass likelihood ratio (see `p_bad`).

        Coordinate-wise (each item's update sees the others' latest values), in a fixed order: updating every
        item at once from the previous sweep oscillates — all suspects look bad, so none is needed to explain
        a violation, so all look good again — and stopped on whichever side the sweep count left it. Each
        run keeps Σ log(1 - q) over its suspects, so an item's update is one vector operation over its runs."""
        sus = sorted(self._suspects)
        col = {item: k for k, item in enumerate(sus)}
        known, read, runs, items, viol = self._incidence  # (run, suspect) incidence, flattened
        if known != tuple(sus):
            read, runs, items, viol = 0, runs[:0], items[:0], viol[:0]
        run_of: list[int] = []
        item_of: list[int] = []
        violated: list[bool] = []
        for its, v in self.history[read:]:
            cols = [col[i] for i in its if i in col]
            if cols:
                run_of.extend([viol.size + len(violated)] * len(cols))
                item_of.extend(cols)
                violated.append(v)
        runs = np.concatenate([runs, np.array(run_of, dtype=int)])
        items = np.concatenate([items, np.array(item_of, dtype=int)])
        viol = np.concatenate([viol, np.array(violated, dtype=bool)])
        self._incidence = (tuple(sus), len(self.history), runs, items, viol)
        by_item = np.argsort(items, kind="stable")  # each suspect's runs, in run order
        runs_of = np.split(runs[by_item], np.cumsum(np.bincount(items, minlength=len(sus)))[:-1])
        prior = np.array([self._prior(i) for i in sus])
        prior_logit = np.log(prior / (1.0 - prior))
        q = np.array([self._q.get(i, self._prior(i)) for i in sus])
        log_good = np.log1p(-np.clip(q, 0.0, 1.0 - 1e-12))  # log(1 - q) per suspect
        run_log_good = np.zeros(viol.size)
        np.add.at(run_log_good, runs, log_good[items])
        f = self.flake
        for _ in range(sweeps):
            change = 0.0
            for k, r in enumerate(runs_of):
                others = np.exp(run_log_good[r] - log_good[k])  # P(no other suspect of the run is bad)
                # i good: the run passes when no other item is bad and it did not flake, or, rarely, despite
                # a bad other item (at the rate ε = flake a bad item is let through); i bad: it passes at ε
                p_pass_good = (1.0 - f) * others + f * (1.0 - others)
                evidence = np.where(viol[r], np.log((1.0 - f) / np.maximum(1.0 - p_pass_good, 1e-12)),
                                    np.log(f / np.maximum(p_pass_good, 1e-12)))
                new = 1.0 / (1.0 + math.exp(-min(max(prior_logit[k] + float(evidence.sum()), -50.0), 50.0)))
                new_log_good = math.log1p(-min(new, 1.0 - 1e-12))
                run_log_good[r] += new_log_good - log_good[k]
                log_good[k] = new_log_good
                change = max(change, abs(new - q[k]))
                q[k] = new
            if change < 1e-4:
                break
        self._q = dict(zip(sus, q.tolist(), strict=True))

    def fit(self) -> None:
        """Solve the posterior if an observation arrived since the last solve (else a no-op)."""
        if self._stale:
            self._solve()
            self._stale = False

    def p_bad(self, item: str) -> float:
        self.fit()
        if item in self._q:
            return self._q[item]
        prior = self._prior(item)
        odds = prior / (1 - prior) * (self.flake / (1 - self.flake)) ** self._passes.get(item, 0)
        return odds / (1 + odds)

    def p_hold(self, c: Candidate) -> float:
        p = 1.0 - self.flake
        for i in self.items(c):
            p *= 1.0 - self.p_bad(i)
        return p


@dataclass
class CostModel:
    """Trial cost (accelerator-seconds) ≈ c0 + c1 · step_time, fitted by least squares on finished trials."""

    c0: float = 0.0
    c1: float = 1.0
    _pairs: list[tuple[float, float]] = field(default_factory=list)
    _times: list[float] = field(default_factory=list)
    _costs: list[float] = field(default_factory=list)

    def observe(self, step_time_s: float | None, cost_seconds: float | None) -> None:
        if step_time_s is not None and cost_seconds is not None and cost_seconds > 0:
            self._pairs.append((step_time_s, cost_seconds))
            self._times.append(step_time_s)
            self._costs.append(cost_seconds)
            if len(self._pairs) >= 2:
                t, c = np.array(self._times), np.array(self._costs)
                a = np.stack([np.ones_like(t), t], axis=1)
                (c0, c1), *_ = np.linalg.lstsq(a, c, rcond=None)
                if c1 > 0 and c0 >= 0:
                    self.c0, self.c1 = float(c0), float(c1)
                else:
                    self.c0, self.c1 = 0.0, float(np.median(c / t))
            else:
                self.c0, self.c1 = 0.0, cost_seconds / step_time_s

    def predict(self, step_time_s: np.ndarray) -> np.ndarray:
        return self.c0 + self.c1 * step_time_s


class DominationIndex:
    """Vectorised test 'candidate needs at least as much memory as a known OOM' over a fixed candidate list.

    A candidate dominates an OOM when every knob is equal or moved in its known memory-increasing direction
    (numeric/bool knobs: `SearchSpace.memory_direction`; categoricals: `Categorical.memory_order`) and the patch
    set is equal. Knobs with no known direction must be equal.
    """

    def __init__(self, space: SearchSpace, cands: Sequence[Candidate]) -> None:
        self.space = space
        cols: list[np.ndarray] = []
        self._dirs: list[int] = []
        for k in space.knobs:
            vals = [c[k.name] for c in cands]
            if isinstance(k, Categorical):
                if k.memory_order is not None:
                    rank: dict[KnobValue, int] = {v: i for i, v in enumerate(k.memory_order)}
                    cols.append(np.array([rank[v] for v in vals], dtype=float))
                    self._dirs.append(1)
                else:
                    lookup: dict[KnobValue, int] = {v: i for i, v in enumerate(k.choices)}
                    cols.append(np.array([lookup[v] for v in vals], dtype=float))
                    self._dirs.append(0)
            else:
                cols.append(np.array([float(v) for v in vals]))
                d = space.memory_direction.get(k.name, 0)
                self._dirs.append(int(d))
        self._knob_vals = np.stack(cols, axis=1) if cols else np.zeros((len(cands), 0))  # (N, K)
        pids = [p.id for p in space.patches]
        self._patch_vals = np.array([[pid in c.patches for pid in pids] for c in cands], dtype=bool).reshape(
            len(cands), len(pids))
        self._pids = pids
        self.mask = np.zeros(len(cands), dtype=bool)

    def _row(self, c: Candidate) -> tuple[np.ndarray, np.ndarray]:
        vals = []
        for k in self.space.knobs:
            if isinstance(k, Categorical):
                order = k.memory_order if k.memory_order is not None else k.choices
                vals.append(float(order.index(c[k.name])))
            else:
                vals.append(float(c[k.name]))
        return np.array(vals), np.array([pid in c.patches for pid in self._pids], dtype=bool)

    def dominating(self, oom: Candidate) -> np.ndarray:
        kv, pv = self._row(oom)
        ok: np.ndarray = (self._patch_vals == pv).all(axis=1)  # (N,)
        for j, d in enumerate(self._dirs):
            col = self._knob_vals[:, j]
            if d == 0:
                ok &= col == kv[j]
            else:
                ok &= (col - kv[j]) * d >= 0
        return ok

    def add_oom(self, oom: Candidate) -> None:
        self.mask |= self.dominating(oom)

    def dominates_any(self, c: Candidate, ooms: Sequence[Candidate]) -> bool:
        kv, pv = self._row(c)
        for o in ooms:
            okv, opv = self._row(o)
            if not (pv == opv).all():
                continue
            if all((kv[j] == okv[j]) if d == 0 else ((kv[j] - okv[j]) * d >= 0) for j, d in enumerate(self._dirs)):
                return True
        return False
