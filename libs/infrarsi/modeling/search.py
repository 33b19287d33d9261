"""The Searcher: observe trial outcomes, suggest the next candidates.

Owns: the in-study state the proposer and modeler services need (time model, censored memory model,
invariant and cost models, dedup, known-OOM regions), the initial design (prior-guided best + space-filling
seeds), batches maximising EI(log time) × P(no OOM) × P(invariants hold) / predicted cost with kriging-believer
diversification, pairing of memory-hungry wins with memory savers, the race of the leaders on a noisy host
(re-runs of measured candidates, ``SearchConfig.race``), the stopping rule and the verification shortlist.
Must not: do I/O, read clocks for decisions, or keep state that a replay of the observations in order would
not rebuild: `Searcher.replay(...)` and a live Searcher fed the same events suggest the same candidates.

Beside it: its settings (``search_config.SearchConfig``), the candidates it scores (``pool.CandidatePool``) and
what goes in and out (``observations``: ``Observation``, ``Suggestion``, ``Prediction``).

Calling order: construct -> (observe | suggest)* ; `suggest` is a pure function of (seed, observations so far,
``pending``, ``left``) and does not change the state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.special import expit, log_ndtr, logit, ndtr

from infrarsi.modeling.acquisition import (
    CostModel,
    DominationIndex,
    InvariantModel,
    acquisition,
    expected_improvement,
)
from infrarsi.modeling.memory_model import MemoryModel, TransformerMeta, mix_normals
from infrarsi.modeling.observations import Admission, Observation, Origin, Prediction, Suggestion
from infrarsi.modeling.pool import CandidatePool
from infrarsi.modeling.priors import KnowledgeBase, default_knowledge_base
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import (
    Candidate,
    Categorical,
    Knob,
    KnobValue,
    SearchSpace,
    maximin_select,
)
from infrarsi.modeling.time_model import TimeModel

_ANCHORS = 256
"""Measured peaks ``SearchConfig.memory_anchor_spread`` measures distances to: the latest (bounds its cost)."""


@dataclass(frozen=True)
class _Runs:
    """The measured candidates' runs as arrays, in ``Searcher._measured``'s order (racing and ranking)."""

    keys: list[str]
    n: np.ndarray
    """(C,) measured runs of each candidate."""
    mean_log: np.ndarray
    """(C,) mean of its runs' log step times."""
    noise: float
    """``Searcher.race_noise``."""


@dataclass
class _FitCache:
    """What the current fit determines, kept until the next refit (``Searcher._pool_means``, ``_incumbent``)."""

    pool_n: int | None = None
    """Pool size ``mu_all`` and ``mem_mu`` were computed for."""
    mu_all: np.ndarray | None = None
    """Latent log time of every pool row."""
    mem_mu: np.ndarray | None = None
    """Mean log peak of every pool row."""
    incumbent: float | None = None
    stop_scan: tuple[int, float, bool] | None = None
    """(pool size, ``Searcher._stop_scan``'s answer): ``should_stop`` and a confirming ``suggest`` both ask."""
    runs: _Runs | None = None
    """Every measured candidate's runs (``Searcher._runs``)."""


class Searcher:
    """Sequential/batch Bayesian search over one study's space. Deterministic given ``seed`` and the ordered
    observations."""

    def __init__(self, space: SearchSpace, capacity_bytes: float, *, meta: TransformerMeta | None = None,
                 kb: KnowledgeBase | None = None, seed: int = 0, noise_floor: float = 0.03,
                 config: SearchConfig | None = None, pool: CandidatePool | None = None,
                 baseline: Candidate | None = None) -> None:
        self.space = space
        self.seed = seed
        self.config = config or SearchConfig()
        self.kb = kb or default_knowledge_base()
        self.pool = pool or CandidatePool.build(space, meta, seed, self.config.max_pool, self.config.sample_pool)
        self._dom = DominationIndex(space, self.pool.candidates)
        self.time_model = TimeModel(space, self.kb, encoder=self.pool.encoder, noise_floor=noise_floor,
                                    prior_nu=self.config.prior_nu)
        self.memory_model = MemoryModel(space, capacity_bytes, meta=meta, kb=self.kb,
                                        interaction_std=self.config.memory_interaction_std,
                                        two_terms=self.config.memory_two_terms,
                                        misfit_floor=self.config.memory_misfit_floor if meta is None else None,
                                        spread_scale=self.config.memory_spread_scale)
        self.memory_peer: MemoryModel | None = None
        """The second opinion on peaks (``SearchConfig.memory_peer_weight``); the reports read ``memory_model``."""
        if meta is None and self.config.memory_peer_weight is not None:
            self.memory_peer = MemoryModel(space, capacity_bytes, kb=self.kb,
                                           interaction_std=self.config.memory_interaction_std or 0.1,
                                           two_terms=not self.config.memory_two_terms,
                                           misfit_floor=self.config.memory_misfit_floor,
                                           spread_scale=self.config.memory_spread_scale)
        self.memory_learned: list[MemoryModel] = []
        """With a workload shape and ``SearchConfig.memory_formula_weight``: the memory models a study without a
        shape uses, averaged with the formula by their prequential likelihood (``_memory_members``)."""
        if meta is not None and self.config.memory_formula_weight is not None:
            self.memory_learned = [
                MemoryModel(space, capacity_bytes, kb=self.kb, interaction_std=self.config.memory_interaction_std,
                            two_terms=self.config.memory_two_terms, misfit_floor=self.config.memory_misfit_floor,
                            spread_scale=self.config.memory_spread_scale)]
            if self.config.memory_peer_weight is not None:
                self.memory_learned.append(
                    MemoryModel(space, capacity_bytes, kb=self.kb,
                                interaction_std=self.config.memory_interaction_std or 0.1,
                                two_terms=not self.config.memory_two_terms,
                                misfit_floor=self.config.memory_misfit_floor,
                                spread_scale=self.config.memory_spread_scale))
        self._memory_scores = np.zeros(1 + len(self.memory_learned))
        """Per member of ``_memory_models()``: the summed log predictive density of the peaks scored so far."""
        self._memory_scored = 0
        """Memory observations scored into ``_memory_scores`` (each under the fits on the ones before it)."""
        self._memory_residuals: list[tuple[float, bool]] = []
        """Per scored peak of a candidate not measured before (a re-run's peak is known, its residual says
        nothing of the proposals'): its standardised residual under the mixture fitted before it, and whether it
        was an OOM (the residual then is the bound's: the peak lay above it) — ``SearchConfig.memory_recalibrate``."""
        self._memory_calibration = (0, 0.0, 1.0)
        """(residuals it was fitted on, shift b, scale s) of ``memory_calibration``."""
        self._oom_outcomes: list[tuple[float, bool, bool]] = []
        """Per residual of ``_memory_residuals``: the P(OOM) the memory predictive (recalibrated on the residuals
        before it) gave that candidate, whether it ran out of memory, and whether it was a step from the
        incumbent (``_steps``) when it was observed (``SearchConfig.oom_calibration``,
        ``SearchConfig.oom_step_calibration``)."""
        self._oom_maps: dict[bool, tuple[int, np.ndarray, np.ndarray, np.ndarray]] = {}
        """Per class (a step from the incumbent or not): (outcomes it was fitted on, the map's a and c at the grid
        points the posterior holds, their weights)."""
        self._peak_steps: list[bool] = []
        """Per memory observation, in the memory models' row order: whether its candidate was a step from the
        incumbent (``_steps``) when it was observed."""
        self.invariants = InvariantModel({**self.kb.invariant, **{p.id: p.invariant_prior for p in space.patches}})
        self.cost_model = CostModel()
        self.capacity_bytes = capacity_bytes
        self.baseline = baseline
        self.observations: list[Observation] = []
        self._seen: set[str] = set()
        self._baseline_runs = 0
        """The leading observations that are all of the golden baseline (the doctor's runs, observed before the
        search's first trial): not trials of the initial design."""
        self._seen_rows: list[int] = []
        """Pool rows of every observation (the shortlist excludes them)."""
        self._ok_rows: list[int] = []
        """Pool rows of the observations that ran ok (incumbent candidates)."""
        self._peak_rows: dict[int, None] = {}
        """Pool rows of the last ``_ANCHORS`` distinct candidates with a measured peak, oldest first."""
        self._measured: dict[str, list[float]] = {}
        """Measured step times of each candidate that ran ok, in order of its first run."""
        self._best_ok: list[tuple[float, int, int]] = []
        """(measured step time, observation number, pool row) of the three fastest ok observations."""
        self._rows_at: list[tuple[int, int]] = []
        """(time-model rows, memory-model rows) after each observation: a checkpoint's prefix of each model."""
        self._fitted_at: dict[str, int] = {}
        """Checkpoint (observations) each model was last fitted in full at (``SearchConfig.refit_every``)."""
        self._cache = _FitCache()
        self._neighbours: tuple[int, dict[int, list[int]]] = (0, {})
        """(pool size, row → its neighbour rows): the incumbents' neighbourhoods, kept while the pool stays."""
        """Pool-wide predictions of the current fit (cleared by a refit, keyed by the pool's size)."""
        self._ooms: list[Candidate] = []
        self._refused: list[frozenset[str]] = []
        """Patch sets of the trials refused as ``scope_violation``: a refusal is the patches' (one reaching out
        of scope, two that do not apply together), so every candidate holding the same set is refused too."""
        self._refused_rows: tuple[int, int, np.ndarray] = (0, 0, np.zeros(0, dtype=bool))
        """(pool size, refusals, mask of the pool rows holding a refused set), kept while both stay."""
        self._queue: list[Suggestion] = []
        self._repeats = 0
        """Observations of a candidate observed before (race and confirmation runs), the doctor's leading runs of
        the golden baseline not counted."""
        self._dirty = True

    # ------------------------------------------------------------------------------------------- events
    @classmethod
    def replay(cls, space: SearchSpace, capacity_bytes: float, observations: Iterable[Observation],
               **kwargs: Any) -> Searcher:
        """Rebuild from the ordered event log (the services are event-sourced); ``kwargs``: the constructor's."""
        s = cls(space, capacity_bytes, **kwargs)
        for o in observations:
            s.observe(o)
        return s

    def observe(self, obs: Observation) -> None:
        c = obs.candidate
        self.observations.append(obs)
        leading = self._baseline_runs == len(self.observations) - 1
        if leading and self.baseline is not None and c.key == self.baseline.key:
            self._baseline_runs += 1
        elif c.key in self._seen:
            self._repeats += 1
        self._seen.add(c.key)
        if c.key not in self.pool.index:
            self.pool.extend([c])
        row = self.pool.index[c.key]
        self._seen_rows.append(row)
        # a step from the incumbent it was proposed beside (``oom_step_calibration``)
        step = bool(self._steps(np.array([row]))[0]) if self._step_calibrated() else False
        if obs.status == "ok":
            self._ok_rows.append(row)
            if obs.step_time_s is not None:
                self._measured.setdefault(c.key, []).append(obs.step_time_s)
            t = obs.step_time_s or math.inf
            self._best_ok = sorted([*self._best_ok, (t, len(self.observations), row)])[:3]
        match obs.status:
            case "ok" | "invariant_violation":
                if obs.step_time_s is not None and obs.step_time_s > 0:
                    self.time_model.observe_encoded(self.pool.x_time[self.pool.index[c.key]], obs.step_time_s)
                if obs.peak_bytes is not None:
                    self._observe_peak(c, obs.peak_bytes, oom=False, step=step)
                self.invariants.observe(c, violated=obs.status == "invariant_violation")
                self.cost_model.observe(obs.step_time_s, obs.cost_seconds)
            case "stopped_slow":
                # stopped early as far slower than the incumbent: its steady steps are a measurement (it is never
                # an incumbent; its invariants were not run to the end, so they teach nothing)
                if obs.step_time_s is not None and obs.step_time_s > 0:
                    self.time_model.observe_stopped_encoded(self.pool.x_time[self.pool.index[c.key]], obs.step_time_s)
                if obs.peak_bytes is not None:
                    self._observe_peak(c, obs.peak_bytes, oom=False, step=step)
                # not the cost model: a trial cut short cost less than its full run would
            case "oom":
                bound = obs.peak_bytes if obs.peak_bytes is not None else self.capacity_bytes * 0.95
                self._observe_peak(c, bound, oom=True, step=step)
                self._ooms.append(c)
                self._domination().add_oom(c)
            case "scope_violation" if c.patches:
                self._refused.append(frozenset(c.patches))
            case "timeout" if obs.step_time_s is not None and obs.step_time_s > 0:
                # stopped before its steps were measured: its step time is at least this (right-censored)
                self.time_model.observe_censored_encoded(self.pool.x_time[self.pool.index[c.key]], obs.step_time_s)
            case _:
                pass  # a crash, or a timeout with no step seen: no time or memory information; dedup only
        self._rows_at.append((self.time_model.n, self.memory_model.n))
        self._dirty = True

    def _observe_peak(self, c: Candidate, peak_bytes: float, oom: bool, step: bool) -> None:
        for mm in self._memory_models():
            mm.observe(c, peak_bytes, oom=oom)
        self._peak_steps.append(step)
        row = self.pool.index[c.key]
        if not oom and row not in self._peak_rows:
            self._peak_rows[row] = None
            if len(self._peak_rows) > _ANCHORS:
                del self._peak_rows[next(iter(self._peak_rows))]

    def _memory_models(self) -> list[MemoryModel]:
        if self.memory_learned:
            return [self.memory_model, *self.memory_learned]
        return [self.memory_model] if self.memory_peer is None else [self.memory_model, self.memory_peer]

    def _memory_members(self) -> list[tuple[MemoryModel, float]]:
        """The memory models and their weights in the mixture (``SearchConfig.memory_peer_weight``): the peer
        only once a peak is measured — before, both are priors, and the design's rules are the first model's.
        With a workload shape and learned models beside the formula: ``memory_weights``."""
        if self.memory_learned:
            return list(zip(self._memory_models(), self.memory_weights(), strict=True))
        if self.memory_peer is None or self.memory_peer.n == 0:
            return [(self.memory_model, 1.0)]
        w = float(self.config.memory_peer_weight or 0.0)
        return [(self.memory_model, 1.0 - w), (self.memory_peer, w)]

    def memory_weights(self) -> np.ndarray:
        """Bayesian model-averaging weights of ``_memory_models()`` (the formula first): prior weights
        (``SearchConfig.memory_formula_weight``, the rest split by ``memory_peer_weight``) times the
        exponentiated prequential log scores, each at least ``memory_formula_floor``. Before any peak is
        scored, the formula alone: the learned models are priors with nothing to say yet. Refits first if
        observations arrived."""
        self.refit()
        return self._weights_from_scores(self._memory_scored)

    def _weights_from_scores(self, scored: int) -> np.ndarray:
        """``memory_weights`` from the scores as they stand (no refit), ``scored`` peaks scored."""
        if not self.memory_learned or scored <= self.config.memory_formula_burn_in:
            return np.array([1.0] + [0.0] * len(self.memory_learned))
        w_f = float(self.config.memory_formula_weight or 0.0)
        peer = float(self.config.memory_peer_weight or 0.0) if len(self.memory_learned) > 1 else 0.0
        prior = np.array([w_f, (1 - w_f) * (1 - peer), (1 - w_f) * peer][: 1 + len(self.memory_learned)])
        log_w = np.log(np.maximum(prior, 1e-12)) + self._memory_scores
        w = np.exp(log_w - log_w.max())
        w = np.maximum(w / w.sum(), self.config.memory_formula_floor)
        weights: np.ndarray = w / w.sum()
        return weights

    _MEMORY_SCORE_FLOOR = -8.0
    """The least log density one peak adds to a model's score: one outlier (a straggling allocator, a peak
    misread) must not outvote every other peak (a robust, heavy-tailed predictive)."""

    def _score_memory(self, rows: int) -> None:
        """Scores memory observations ``_memory_scored`` .. ``rows - 1`` into ``_memory_scores``, each under
        every model fitted on the observations before it (a prequential score: a function of the ordered
        observations alone, so a replayed searcher scores them as the live one did)."""
        if not self.memory_learned:
            return
        models = self._memory_models()
        while self._memory_scored < rows:
            j = self._memory_scored
            self._memory_scored += 1
            if j < self.config.memory_formula_burn_in:
                continue
            weights = self._weights_from_scores(j)  # the mixture as it predicted this peak
            mus, sds = [], []
            for i, mm in enumerate(models):
                if mm.fit_result is None or mm.fit_result.n_ok + mm.fit_result.n_censored != j:
                    mm.fit(upto=j)
                xj, saj, yj, cj = mm._arrays()
                mu, g = mm.log_mean_grad(mm.theta, xj[j:j + 1], saj[j:j + 1])
                sd = math.sqrt(float(np.sum((g @ mm.covariance) * g)) + math.exp(2 * mm.log_sigma)) * mm.spread_scale
                z = (float(yj[j]) - float(mu[0])) / sd
                if cj[j]:
                    score = float(log_ndtr(-z))  # an OOM: log P(log peak > log bound)
                else:
                    score = -0.5 * z * z - math.log(sd) - 0.5 * math.log(2 * math.pi)
                self._memory_scores[i] += max(score, self._MEMORY_SCORE_FLOOR)
                mus.append(np.array([float(mu[0])]))
                sds.append(np.array([sd]))
            if self.config.memory_recalibrate and not (j and np.all(xj[:j] == xj[j], axis=1).any()):
                m, sd_m = mix_normals(list(weights), mus, sds)
                b, s = self._calibrate(self._memory_residuals)  # the calibration as it stood before this peak
                p = float(ndtr((float(m[0]) + b * float(sd_m[0]) - math.log(self.capacity_bytes))
                               / (s * float(sd_m[0]))))
                self._oom_outcomes.append((p, bool(cj[j]), self._peak_steps[j]))
                self._memory_residuals.append(((float(yj[j]) - float(m[0])) / float(sd_m[0]), bool(cj[j])))

    _CALIBRATION_GRID = (np.linspace(-1.5, 2.5, 41), np.exp(np.linspace(math.log(0.7), math.log(4.0), 36)))

    def memory_calibration(self) -> tuple[float, float]:
        """(b, s) of ``SearchConfig.memory_recalibrate``: the shift and scale of the standard normal that best
        explain the mixture's standardised residuals on the peaks scored so far, MAP on a grid (priors N(0, 0.5²)
        on b and on log s); (0, 1) when off, without a shape, or before any residual."""
        self.refit()
        res = self._memory_residuals
        if not self.config.memory_recalibrate or not res:
            return 0.0, 1.0
        if self._memory_calibration[0] != len(res):
            self._memory_calibration = (len(res), *self._calibrate(res))
        return self._memory_calibration[1], self._memory_calibration[2]

    def _calibrate(self, res: Sequence[tuple[float, bool]]) -> tuple[float, float]:
        """``memory_calibration``'s (b, s) from the residuals ``res``; (0, 1) from none."""
        if not res:
            return 0.0, 1.0
        bs, ss = self._CALIBRATION_GRID
        b, s = bs[:, None, None], ss[None, :, None]
        z = np.array([r for r, _ in res])[None, None, :]
        oom = np.array([c for _, c in res])[None, None, :]
        u = (z - b) / s
        ll = np.where(oom, log_ndtr(-u), -0.5 * u * u - np.log(s))
        post = np.maximum(ll, self._MEMORY_SCORE_FLOOR).sum(axis=2) - 0.5 * (b[..., 0] / 0.5) ** 2 \
            - 0.5 * (np.log(s[..., 0]) / 0.5) ** 2
        w = np.exp(post - post.max())
        w /= w.sum()
        mean_b = float((w * b[..., 0]).sum())
        var = float((w * (s[..., 0] ** 2 + (b[..., 0] - mean_b) ** 2)).sum())
        return mean_b, math.sqrt(var)

    _OOM_MAP_GRID = (np.linspace(-3.0, 2.0, 26), np.exp(np.linspace(math.log(0.1), math.log(1.5), 15)))
    """The P(OOM) calibration map's grid: a, and c (``SearchConfig.oom_calibration``)."""
    _OOM_STEP_GRID = (np.linspace(-3.0, 1.0, 21), np.exp(np.linspace(math.log(0.5), math.log(5.0), 19)))
    """The step map's grid (``SearchConfig.oom_step_calibration``): its slope may exceed 1."""

    def oom_map(self, step: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The posterior of a P(OOM) calibration map on its grid: (a, c, weight) at the points that hold it
        (weight at least 1e-4 of the largest) — ``SearchConfig.oom_calibration``'s, fitted on the outcomes of
        the candidates that were not a step from the incumbent, or with ``step`` ``oom_step_calibration``'s,
        fitted on the steps' (with it off, one map on every outcome); the identity where the map is off."""
        self.refit()
        cal = self.config.oom_step_calibration if step else self.config.oom_calibration
        if cal is None or not self.memory_learned or not self.config.memory_recalibrate:
            return np.zeros(1), np.ones(1), np.ones(1)
        split = self._step_calibrated()
        outcomes = [(q, o) for q, o, is_step in self._oom_outcomes if not split or is_step == step]
        cached = self._oom_maps.get(step)
        if cached is None or cached[0] != len(self._oom_outcomes):
            a0, c0, sd_a, sd_c = cal
            grid_a, grid_c = np.meshgrid(*(self._OOM_STEP_GRID if step else self._OOM_MAP_GRID), indexing="ij")
            a, c = grid_a.ravel(), grid_c.ravel()
            post = -0.5 * ((a - a0) / sd_a) ** 2 - 0.5 * ((np.log(c) - math.log(c0)) / sd_c) ** 2
            if outcomes:
                p = np.clip(np.array([q for q, _ in outcomes]), 1e-6, 1 - 1e-6)
                y = np.array([o for _, o in outcomes])
                eta = a[:, None] + c[:, None] * logit(p)[None, :]
                post = post + np.where(y, -np.logaddexp(0.0, -eta), -np.logaddexp(0.0, eta)).sum(axis=1)
            w = np.exp(post - post.max())
            keep = w >= 1e-4
            cached = (len(self._oom_outcomes), a[keep], c[keep], w[keep] / w[keep].sum())
            self._oom_maps[step] = cached
        return cached[1], cached[2], cached[3]

    def _calibrated_p_oom(self, p: np.ndarray, steps: np.ndarray | None = None) -> np.ndarray:
        """P(OOM) from the memory predictive's P(OOM) ``p``: the posterior mean of ``oom_calibration``'s map at
        ``p``, never below ``p``; at the rows ``steps`` marks (a step from the incumbent, ``_steps``) whose ``p``
        is at most ``probe_max_p_oom`` the posterior mean of ``oom_step_calibration``'s map, which may lower it
        too."""
        out: np.ndarray = np.maximum(p, self._mapped(p, *self.oom_map()))
        limit = self.config.probe_max_p_oom
        if steps is not None and limit is not None:
            # above the step probe's limit no such step is ever proposed: no outcome of the study speaks there
            steps = steps & (p <= limit)
            if steps.any():
                out[steps] = self._mapped(p[steps], *self.oom_map(step=True))
        return out

    @staticmethod
    def _mapped(p: np.ndarray, a: np.ndarray, c: np.ndarray, w: np.ndarray) -> np.ndarray:
        """The posterior mean of the map logit P = a + c·logit p over the grid points (a, c) weighted ``w``."""
        if a.size == 1 and a[0] == 0.0 and c[0] == 1.0:
            return p
        lp = logit(np.clip(p, 1e-6, 1 - 1e-6))
        out: np.ndarray = np.empty_like(lp)
        for lo in range(0, lp.size, 4096):  # (grid points, rows) a block at a time
            out[lo:lo + 4096] = w @ expit(a[:, None] + c[:, None] * lp[None, lo:lo + 4096])
        return out

    def _step_calibrated(self) -> bool:
        """Whether steps from the incumbent get their own P(OOM) map (``SearchConfig.oom_step_calibration``)."""
        cfg = self.config
        return (bool(self.memory_learned) and cfg.memory_recalibrate and cfg.oom_calibration is not None
                and cfg.oom_step_calibration is not None)

    def _steps(self, idx: np.ndarray) -> np.ndarray:
        """Pool rows ``idx`` that are a step from the incumbent (the fastest measured fit): one knob moved to the
        next value in its order (any level of a categorical or bool), patches unchanged, along a knob the
        measured fits have varied — the move a memory step probe makes, where the formula's change of peak is
        added to a measured one and the mixture's std, the same anywhere, overstates the error
        (``SearchConfig.oom_step_calibration``)."""
        if not self._best_ok or self.pool.codes is None or idx.size == 0:
            return np.zeros(idx.size, dtype=bool)
        step, unvaried = self._one_step(idx)
        out: np.ndarray = step & ~unvaried
        return out

    def _one_step(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """At pool rows ``idx`` (an incumbent measured): (whether the row is one step from the incumbent — one
        knob moved to the next value in its order, any level of a categorical or bool, patches unchanged —,
        whether the knob it moves is one the measured fits have never varied)."""
        assert self.pool.codes is not None
        nk = len(self.space.knobs)
        inc = self.pool.codes[self._best_ok[0][2]]
        codes = self.pool.codes[idx]
        diff = codes != inc
        one = (diff[:, :nk].sum(axis=1) == 1) & ~diff[:, nk:].any(axis=1)
        ordered = np.array([k.values() is not None and not isinstance(k, Categorical) for k in self.space.knobs])
        far = (diff[:, :nk] & ordered & (np.abs(codes[:, :nk] - inc[:nk]) > 1.0)).any(axis=1)
        ok = self.pool.codes[np.array(self._ok_rows, dtype=int)][:, :nk]
        unvaried = (ok == ok[0]).all(axis=0)
        moved = np.argmax(diff[:, :nk], axis=1)
        return one & ~far, unvaried[moved]

    def enqueue(self, candidates: Iterable[Candidate], origin: Origin, reason: str) -> None:
        """External suggestions (experience bank, LLM) proposed before model-driven ones, deduplicated."""
        for c in candidates:
            if self.space.is_feasible(c):
                self._queue.append(Suggestion(c, origin, reason))

    def _refused_mask(self) -> np.ndarray:
        """Pool rows whose patches include a set a trial was refused for (never proposed again)."""
        n = len(self.pool.candidates)
        if self._refused_rows[:2] != (n, len(self._refused)):
            mask = np.zeros(n, dtype=bool)
            if self._refused and self.pool.codes is not None:
                column = {p.id: len(self.space.knobs) + j for j, p in enumerate(self.space.patches)}
                for patches in self._refused:
                    cols = [column[pid] for pid in patches if pid in column]
                    if len(cols) == len(patches):
                        mask |= np.all(self.pool.codes[:, cols] == 1.0, axis=1)
            self._refused_rows = (n, len(self._refused), mask)
        return self._refused_rows[2]

    def _domination(self) -> DominationIndex:
        """OOM-dominated mask over the pool, rebuilt when the pool grew (infinite spaces)."""
        if len(self._dom.mask) != len(self.pool.candidates):
            self._dom = DominationIndex(self.space, self.pool.candidates)
            for o in self._ooms:
                self._dom.add_oom(o)
        return self._dom

    def refit(self) -> None:
        if not self._dirty:
            return
        n = len(self.observations)
        k = self.checkpoint(n)
        tm = self.time_model
        if k == n:
            tm.fit()
            self._score_memory(self.memory_model.n)
            for mm in self._memory_models():
                mm.fit()
        else:  # between checkpoints: the models of the last one, the time model updated with the rows since
            time_rows, memory_rows = self._rows_at[k - 1]
            if self._fitted_at.get("memory") != k:
                self._score_memory(memory_rows)
                for mm in self._memory_models():
                    mm.fit(upto=memory_rows)
            if tm.n_censored or tm.n_stopped:
                tm.fit()  # imputation and the noise split need every row
            else:
                if self._fitted_at.get("time") != k:
                    tm.fit(upto=time_rows)
                tm.update()
        self._fitted_at = {"time": k, "memory": k}
        self.invariants.fit()
        self._dirty = False
        self._cache = _FitCache()

    def checkpoint(self, n: int) -> int:
        """The observation count the models are fitted in full at, for ``n`` observations: ``n`` itself up to
        ``SearchConfig.refit_all_until``, then a sequence growing by ``refit_every`` each step. A function of
        ``n`` alone, so a searcher rebuilt by replay holds the same models as the one that lived through it."""
        k = self.config.refit_all_until
        if n <= k:
            return n
        while (step := k + max(1, math.ceil(self.config.refit_every * k))) <= n:
            k = step
        return k

    def _pool_means(self) -> tuple[np.ndarray, np.ndarray]:
        """Latent log time and mean log peak of every pool row under the current fit (cached until a refit)."""
        n = len(self.pool.candidates)
        cache = self._cache
        if cache.pool_n != n or cache.mu_all is None or cache.mem_mu is None:
            mu_all, _ = self.time_model.predict_encoded(self.pool.x_time, with_std=False)
            everything = np.arange(n)
            mem_mu = sum((w * mm.log_mean(mm.theta, self._memory_x(mm), self._memory_components(mm, everything))
                          for mm, w in self._memory_members()), np.zeros(n))
            cache.pool_n, cache.mu_all, cache.mem_mu = n, mu_all, mem_mu
        return cache.mu_all, cache.mem_mu

    # --------------------------------------------------------------------------------------- predictions
    def _memory_x(self, mm: MemoryModel) -> np.ndarray:
        """The pool's rows as a memory model encodes them (with the knob-pair columns when it has them)."""
        enc = mm.encoder
        if enc.dim == enc.n_main:
            return self.pool.x_main
        assert enc.dim == self.pool.x_time.shape[1], "the memory model's pair columns are the time model's"
        return self.pool.x_time

    def _memory_arrays(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std of log peak bytes at pool rows ``idx``: the memory models' mixture, moment-matched, its
        std set from the nearest measured peak (``SearchConfig.memory_anchor_spread``) without a shape."""
        mu, sd = self._memory_mixture(idx)
        if self.memory_learned and self.config.memory_recalibrate:
            b, s = self.memory_calibration()
            mu, sd = mu + b * sd, s * sd
        if (self.config.memory_anchor_spread is not None and self._peak_rows and self.pool.codes is not None
                and not self.memory_model.structured):
            sd = self._anchored_std(idx, mu, sd)
        return mu, sd

    def _memory_mixture(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std of log peak bytes at pool rows ``idx``: the memory models' mixture, moment-matched."""
        cs = [self.pool.candidates[i] for i in idx]
        members = self._memory_members()
        preds = [mm.predict_log(cs, self._memory_x(mm)[idx], self._memory_components(mm, idx)) for mm, _ in members]
        if len(members) == 1:
            return preds[0]
        return mix_normals([w for _, w in members], [mu for mu, _ in preds], [sd for _, sd in preds])

    def _anchored_std(self, idx: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
        """``SearchConfig.memory_anchor_spread`` at pool rows ``idx`` (the mixture's mean ``mu``, std ``sd``)."""
        assert self.config.memory_anchor_spread is not None and self.pool.codes is not None
        a, b, g = self.config.memory_anchor_spread
        anchors = np.fromiter(self._peak_rows, dtype=int)
        mu_a = self._memory_mixture(anchors)[0]
        codes, codes_a = self.pool.codes[idx], self.pool.codes[anchors]
        # knob changes = columns - matches; matches by one-hot of the anchors' values: one matrix product
        values = [(k, v) for k in range(codes.shape[1]) for v in np.unique(codes_a[:, k])]
        cols, vals = np.array([k for k, _ in values]), np.array([v for _, v in values])
        hot, hot_a = (codes[:, cols] == vals).astype(np.float32), (codes_a[:, cols] == vals).astype(np.float32)
        delta, near = np.empty(idx.size), np.empty(idx.size)
        for lo in range(0, idx.size, 2048):  # (rows, anchors) arrays a block at a time
            dist = codes.shape[1] - np.rint(hot[lo:lo + 2048] @ hot_a.T)
            near[lo:lo + 2048] = dist.min(axis=1)
            gap = np.abs(mu[lo:lo + 2048, None] - mu_a[None, :])
            delta[lo:lo + 2048] = np.where(dist == near[lo:lo + 2048, None], gap, np.inf).min(axis=1)
        anchored: np.ndarray = np.hypot(np.where(near <= 1, a, 1.0 + g * (near - 1.0)) * sd, b * delta)
        return anchored

    def _memory_components(self, mm: MemoryModel, idx: np.ndarray) -> np.ndarray:
        """(len(idx), 2) a memory model's per-row term scales: the structural formula's bytes, ones for the
        generic two-term model (zeros, unused, for the log-linear one)."""
        if mm.structured and self.pool.mem_components is not None:
            rows: np.ndarray = self.pool.mem_components[idx]
            return rows
        return np.full((idx.size, 2), 1.0 if mm.two_terms else 0.0)

    def predict(self, candidates: Sequence[Candidate]) -> list[Prediction]:
        """The current models' expectation of each candidate (refits first if observations arrived)."""
        self.refit()
        idx = np.array(self.pool.extend(candidates), dtype=int)
        if idx.size == 0:
            return []
        mu, sd = self.time_model.predict_encoded(self.pool.x_time[idx])
        assert sd is not None
        mem_mu, mem_sd = self._memory_arrays(idx)
        p_oom, p_hold = self._p_oom(idx), self._p_hold(idx)
        best = self._incumbent()
        ei = expected_improvement(mu, sd, best) if best is not None else np.zeros(idx.size)
        return [Prediction(float(mu[i]), float(sd[i]), float(mem_mu[i]), float(mem_sd[i]), float(p_oom[i]),
                           float(p_hold[i]), float(ei[i])) for i in range(idx.size)]

    def _p_oom(self, idx: np.ndarray) -> np.ndarray:
        return self._p_oom_with(idx, step_map=True)

    def _p_oom_with(self, idx: np.ndarray, step_map: bool) -> np.ndarray:
        """P(OOM) at pool rows ``idx``; ``step_map`` off: as if no row were a step from the incumbent (the
        P(OOM) that decides which rule may propose a step, ``suggest``)."""
        from scipy.special import ndtr

        mu, sd = self._memory_arrays(idx)
        steps = self._steps(idx) if step_map and self._step_calibrated() else None
        p = self._calibrated_p_oom(ndtr((mu - math.log(self.capacity_bytes)) / sd), steps)
        return np.where(self._domination().mask[idx], 1.0, p)

    def _p_hold(self, idx: np.ndarray) -> np.ndarray:
        """Vectorised `InvariantModel.p_hold` over pool rows (items = knob settings + patches)."""
        inv = self.invariants
        if self.pool.codes is None or not self.pool.complete:
            return np.array([inv.p_hold(self.pool.candidates[i]) for i in idx])
        codes = self.pool.codes[idx].astype(int)
        logp = np.full(idx.size, math.log(1.0 - inv.flake))
        for j, k in enumerate(self.space.knobs):
            vals = k.values()
            assert vals is not None
            table = np.array([math.log(max(1.0 - inv.p_bad(f"{k.name}={v}"), 1e-12)) for v in vals])
            logp += table[codes[:, j]]
        base = len(self.space.knobs)
        for j, p in enumerate(self.space.patches):
            logp += codes[:, base + j] * math.log(max(1.0 - inv.p_bad(p.id), 1e-12))
        p_hold: np.ndarray = np.exp(logp)
        return p_hold

    def oom_allowance(self, pending: Sequence[Candidate] = ()) -> float:
        """OOMs the study may still risk on its next proposal (``SearchConfig.oom_budget``; inf without one):
        the budget earned by the trials run and pending, plus the credit, less the OOMs observed and the
        predicted P(OOM) of the pending trials."""
        budget = self.config.oom_budget
        if budget is None:
            return math.inf
        spent = sum(o.status == "oom" for o in self.observations)
        risk = float(self._p_oom(np.array(self.pool.extend(pending), dtype=int)).sum()) if pending else 0.0
        return budget * (len(self.observations) + len(pending) + 1) + self.config.oom_budget_credit - spent - risk

    def _incumbent(self) -> float | None:
        """Best posterior mean log time among observed candidates that kept every invariant."""
        if not self._ok_rows:
            return None
        if self._cache.incumbent is None:
            mu, _ = self.time_model.predict_encoded(self.pool.x_time[np.array(self._ok_rows)], with_std=False)
            self._cache.incumbent = float(mu.min())
        return self._cache.incumbent

    def _best_ok_rows(self) -> list[int]:
        """Pool rows of the three fastest measured ok observations (ties: the earlier observed)."""
        return [row for _, _, row in self._best_ok]

    def _shortlist(self, rng: np.random.Generator, exclude: Iterable[str] = ()) -> np.ndarray:
        """Pool rows worth scoring: the predicted fastest (any, and likely to fit), random ones, and the
        neighbours of the best measured; never an observed row, a known-OOM region or one of ``exclude``."""
        n = len(self.pool.candidates)
        mu_all, mem_mu = self._pool_means()
        cap = math.log(self.capacity_bytes)
        blocked = self._domination().mask | self._refused_mask()
        blocked[np.array(self._seen_rows, dtype=int)] = True
        index = self.pool.index
        blocked[np.array([index[k] for k in exclude if k in index], dtype=int)] = True
        fits = (mem_mu < cap) & ~blocked
        top_any = _smallest(np.where(blocked, np.inf, mu_all), self.config.shortlist_top // 2)
        top_fit = _smallest(np.where(fits, mu_all, np.inf), self.config.shortlist_top)
        top_fit = top_fit[fits[top_fit]]
        free = np.flatnonzero(~blocked)
        rand = rng.choice(free, size=min(self.config.shortlist_random, free.size), replace=False) if free.size else free
        # neighbours of the best observed candidates: local refinement around incumbents
        near: list[int] = []
        if self._neighbours[0] != n:  # the pool grew: a row's neighbours may have too
            self._neighbours = (n, {})
        neighbours = self._neighbours[1]
        for row in self._best_ok_rows():
            if row not in neighbours:
                neighbours[row] = self.pool.neighbour_indices(row).tolist()
            near.extend(neighbours[row])
        near_arr = np.array([i for i in near if i < n and not blocked[i]], dtype=int)
        idx = np.unique(np.concatenate([top_any, top_fit, rand, near_arr]).astype(int))
        shortlist: np.ndarray = idx[~blocked[idx]]
        return shortlist

    # ---------------------------------------------------------------------------------------- suggest
    def suggest(self, n: int = 1, pending: Sequence[Candidate] = (), left: int | None = None) -> list[Suggestion]:
        """Up to n candidates: new ones (never observed, never pending, never in a known-OOM region), but for a
        run of the open race (``SearchConfig.race``; with it off, a confirmation before the stop), origin
        ``confirm``, which repeats a measured candidate. ``left``: the trials the study's budget has left (``None``:
        not known); when the open race needs at least that many, its runs come before any new candidate."""
        self.refit()
        rng = np.random.default_rng([self.seed, len(self.observations), len(pending)])
        taken: set[str] = {c.key for c in pending}  # beside the observed ones (``self._seen``)
        out: list[Suggestion] = []
        for s in self._queue:
            if len(out) >= n:
                break
            if s.candidate.key not in taken and s.candidate.key not in self._seen:
                out.append(s)
                taken.add(s.candidate.key)
        if len(out) >= n:
            return out
        if self.config.race:
            race = self._race_turn(pending, left)
            if race is not None:
                out.append(race)
                if len(out) >= n:
                    return out
        else:
            confirm = self._confirmation(pending)
            if confirm is not None and self._stop_reason() is not None:
                return [*out, confirm]  # nothing new is worth a trial: the leaders are re-measured (``should_stop``)
        n_done = self._design_count(pending)
        idx = self._shortlist(rng, taken)
        if idx.size == 0:
            return out
        mu, sd = self.time_model.predict_encoded(self.pool.x_time[idx])
        assert sd is not None
        # a step the cut-off excluded before its own P(OOM) map remains the step probe's to propose (its worth,
        # risk-neutral, is what a step is for), at that map's P(OOM)
        p_oom = self._p_oom(idx)
        p_rule = self._p_oom_with(idx, step_map=False) if self._step_calibrated() else p_oom
        p_hold = self._p_hold(idx)
        allowance = self.oom_allowance(pending)
        cutoff = self._cutoff(n_done, allowance)
        probe = p_hold >= self.config.invariant_exclude
        usable = (p_rule <= cutoff) & probe
        lifted = budgeted = False
        stuck = not usable.any() and probe.any()  # every candidate above the cut-off, some not known to break
        if not self._ok_rows and (self._ooms or stuck):
            # nothing has fitted yet: the golden baseline, where it may run, before any further risk
            golden = self._baseline_escape(taken, f"{len(self._ooms)} trial(s) ran out of memory" if self._ooms
                                           else f"every candidate has P(oom) > {cutoff:.2f}")
            if golden is not None:
                out.append(golden)
                return out
        if not usable.any():
            if not probe.any():
                return out
            if not self._ok_rows:
                # nothing has fitted yet and the prior puts every candidate above the exclusion: rather than stall
                # the study before its first measurement, probe the least risky candidate (ties: the smallest
                # predicted peak) among those far from every OOM so far
                j = self._escape_probe(idx, probe, p_oom)
                out.append(Suggestion(self.pool.candidates[idx[j]], "prior", f"every candidate has P(oom) > "
                                      f"{cutoff:.2f}: the least risky far from the OOMs probes the memory model",
                                      float(mu[j]), float(p_oom[j]), "escape"))
                return out
            # after a success the cut-off would end the study while should_stop() still expects a gain: lift it
            # just enough to admit the least risky candidates, and let the acquisition choose among them — as far
            # as the OOM budget holds them (beyond it should_stop() says the fitting candidates are used up)
            usable, lifted = probe & (p_oom <= float(np.min(np.where(probe, p_oom, np.inf))) + 0.05), True
            budgeted = n_done >= 1 + self.config.n_seeds and self._covers_space(idx.size + len(taken))
            if budgeted:  # the design must get its first measurements; a large space may hold fits unscanned
                usable &= p_oom <= max(allowance, self.config.oom_budget_fit_p_oom)

        admitted: Admission = "lifted" if lifted else "cut_off"
        # initial design: the prior's best guess (with a workload shape), then space-filling seeds among
        # likely-fitting candidates
        below: np.ndarray | None = None  # the same shortlist for every seed: predicted once
        prior_first = self.config.design_first == "prior" or (self.config.design_first == "auto" and
                                                               self.memory_model.meta is not None)
        while len(out) < n and n_done + len(out) < 1 + self.config.n_seeds:
            k = n_done + len(out)
            safe = usable & (p_oom < self.config.seed_max_p_oom) & (p_hold > 0.5)
            first = k == 0 and prior_first
            if not first and self.config.design_below_baseline and self.baseline is not None:
                below = self._below_baseline(idx) if below is None else below
                safe &= below
            if not safe.any():
                safe = usable
            if not safe.any():
                break
            if first:
                score = np.where(safe, mu, np.inf)
                j = int(np.argmin(score))
                out.append(Suggestion(self.pool.candidates[idx[j]], "prior", "best predicted time under the prior "
                                      "among candidates likely to fit", float(mu[j]), float(p_oom[j]),
                                      admitted))
            else:
                good = safe & (mu <= np.quantile(mu[safe], 0.25))
                cand_idx = np.flatnonzero(good)
                chosen = [self.pool.index[c.key] for c in [*pending, *(s.candidate for s in out)]
                          if c.key in self.pool.index] + [self.pool.index[o.candidate.key] for o in self.observations]
                pts_idx = np.concatenate([idx[cand_idx], np.array(chosen, dtype=int)])
                pts = self.pool.encoder.unit_box([self.pool.candidates[i] for i in pts_idx])
                start = list(range(cand_idx.size, pts_idx.size))
                pick = maximin_select(pts, 1, start=start, rng=rng) if start else [int(rng.integers(cand_idx.size))]
                if not pick or pick[0] >= cand_idx.size:
                    break
                j = int(cand_idx[pick[0]])
                out.append(Suggestion(self.pool.candidates[idx[j]], "seed", "space-filling seed among the "
                                      "prior's best quarter", float(mu[j]), float(p_oom[j]),
                                      admitted))
            taken.add(out[-1].candidate.key)
            usable[j] = False
        if len(out) >= n:
            return out

        best = self._incumbent()
        if best is None:
            best = float(np.min(np.where(usable, mu, np.inf))) if usable.any() else float(mu.min())
        cost = self.cost_model.predict(np.exp(mu)) ** self.config.cost_power
        believer_rows: list[np.ndarray] = []
        probed = np.zeros(idx.size, dtype=bool)
        while len(out) < n and usable.any():
            if believer_rows:
                sd = self.time_model.believer_std(self.pool.x_time[idx], np.array(believer_rows))
            ei = expected_improvement(mu, sd, best)
            acq = np.where(usable, acquisition(ei, p_oom, p_hold, cost, self.config.oom_risk_power), -np.inf)
            j = int(np.argmax(acq))
            origin: Origin = "ei"
            admission = admitted
            reason = (f"EI={ei[j]:.4f} P(oom)={p_oom[j]:.2f} P(inv)={p_hold[j]:.2f} "
                      f"pred={math.exp(mu[j]):.3g}s±{sd[j]:.3f}")
            # pairing: the most promising speed-up ignoring memory is likely to OOM -> its memory-saver variant
            raw = np.where(p_hold > 0.5, ei, -np.inf)
            r = int(np.argmax(raw))
            if p_oom[r] > self.config.pairing_trigger and r != j:
                paired = self._pair(idx, r, mu, sd, p_oom, p_hold, usable, best, cost)
                if paired is not None and acq[paired] >= 0.5 * acq[j]:
                    j = paired
                    origin = "pairing"
                    reason = (f"memory saver paired with {self.pool.candidates[idx[r]]} "
                              f"(P(oom)={p_oom[r]:.2f}) -> P(oom)={p_oom[j]:.2f}; " + reason)
            step = self._step_probe(idx, ei, p_oom, p_hold, usable, probed, cost, cutoff, float(acq[j]), allowance,
                                    p_rule)
            if step is not None:
                j, origin, admission = step, "ei", "step_probe"
                reason = (f"memory step probe: one step from the incumbent that the cut-off {cutoff:.2f} excludes, "
                          f"EI={ei[j]:.4f} x P(fit)={1 - p_oom[j]:.2f} beats the admitted candidates")
            if lifted:
                reason = f"every candidate has P(oom) > the cut-off {cutoff:.2f}; " + reason
            out.append(Suggestion(self.pool.candidates[idx[j]], origin, reason, float(mu[j]), float(p_oom[j]),
                                  admission))
            usable[j], probed[j] = False, True
            allowance -= float(p_oom[j])
            if lifted and budgeted:
                usable &= p_oom <= max(allowance, self.config.oom_budget_fit_p_oom)
            believer_rows.append(self.pool.x_time[idx[j]])
        return out

    def _step_probe(self, idx: np.ndarray, ei: np.ndarray, p_oom: np.ndarray, p_hold: np.ndarray,
                    usable: np.ndarray, taken: np.ndarray, cost: np.ndarray, cutoff: float, admitted: float,
                    allowance: float, p_rule: np.ndarray | None = None) -> int | None:
        """The shortlist row of the best memory step probe (``SearchConfig.probe_max_p_oom``), or None.

        A step is one knob moved from the incumbent (the fastest measured fit) to the next value in its order
        (any level of a categorical or bool), patches unchanged. Valued risk-neutrally, EI × P(fit): an OOM there
        is a censored bound one step from a measured peak, the most informative OOM the memory model can get,
        and a fit unlocks the steps after it. Only a step whose P(OOM) fits in the OOM budget left
        (``allowance``, ``SearchConfig.oom_budget``) is a probe; the cut-off excludes it by ``p_rule``, its P(OOM)
        before the steps' own map (``SearchConfig.oom_step_calibration``)."""
        limit = self.config.probe_max_p_oom
        if limit is None or not self._best_ok or self.pool.codes is None:
            return None
        step, unvaried = self._one_step(idx)
        cap = np.full(idx.size, limit)
        fresh = self.config.probe_fresh_max_p_oom
        if fresh is not None:
            # a knob the measured peaks have never varied has its memory slope from the prior alone: its step may
            # be probed at a higher risk than one whose slope the measurements already say
            cap = np.where(unvaried, max(fresh, limit), limit)
        p_rule = p_oom if p_rule is None else p_rule
        cand = step & ~usable & ~taken & (p_rule > cutoff) & (p_oom <= np.minimum(cap, allowance)) & (p_hold > 0.5)
        if not cand.any():
            return None
        worth = np.where(cand, ei * (1.0 - p_oom) * p_hold / np.maximum(cost, 1e-9), -np.inf)
        j = int(np.argmax(worth))
        return j if worth[j] > self.config.probe_margin * admitted else None

    def _design_count(self, pending: Sequence[Candidate]) -> int:
        """Trials that count towards the initial design (``1 + n_seeds``): those run and pending, but the golden
        baseline's runs observed before any other — a study observes the doctor's repeats of it (five by
        default) before its first proposal, and they are one point of the space, not a design. (The baseline
        proposed by the search itself, as a seed, is one of its trials.)"""
        return len(self.observations) - self._baseline_runs + len(pending)

    def _cutoff(self, n_done: int, allowance: float) -> float:
        """The P(OOM) above which an ordinary proposal is excluded: the design's while it is drawn, then
        ``oom_exclude`` — or ``oom_budget_floor`` while the OOM budget is overspent."""
        if n_done < 1 + self.config.n_seeds:
            return self.config.design_oom_exclude
        floor = self.config.oom_budget_floor
        return min(self.config.oom_exclude, floor) if floor is not None and allowance < 0 else self.config.oom_exclude

    def _covers_space(self, scanned: int) -> bool:
        """Whether a shortlist of ``scanned`` rows holds every candidate not yet run and not known to OOM: only
        then is "nothing under the cut-off" a fact about the space rather than about a sample of it."""
        blocked = self._domination().mask | self._refused_mask()
        blocked[np.array(self._seen_rows, dtype=int)] = True
        return scanned >= int((~blocked).sum())

    def _baseline_escape(self, taken: set[str], why: str) -> Suggestion | None:
        """The golden baseline as the escape before anything has fitted (``escape_baseline``), when the study
        has one that is feasible and has neither run nor is pending; else None."""
        b = self.baseline
        if not self.config.escape_baseline or b is None or b.key in self._seen or b.key in taken:
            return None
        if not self.space.is_feasible(b):
            return None
        row = np.array(self.pool.extend([b]), dtype=int)
        mu, _ = self.time_model.predict_encoded(self.pool.x_time[row])
        return Suggestion(b, "prior", f"{why} and nothing has fitted yet: the golden baseline, which fits, anchors "
                          "the memory model", float(mu[0]), float(self._p_oom(row)[0]), "escape")

    def _below_baseline(self, idx: np.ndarray) -> np.ndarray:
        """Shortlist rows whose predicted peak is at most the golden baseline's (``design_below_baseline``)."""
        assert self.baseline is not None
        base = np.array(self.pool.extend([self.baseline]), dtype=int)
        mem_mu, _ = self._memory_arrays(np.concatenate([idx, base]))
        below: np.ndarray = mem_mu[:-1] <= mem_mu[-1]
        return below

    def _escape_probe(self, idx: np.ndarray, probe: np.ndarray, p_oom: np.ndarray) -> int:
        """The shortlist row to try when nothing has fitted yet: the least risky among the candidates farthest
        from every OOM so far (at least ¾ of the largest such distance in the shortlist).

        Censored by OOMs alone, the memory model cannot tell which knob to blame: its fit raises the level of
        everything it saw just above the capacity and keeps the prior's directions, so a prior that has a memory
        saver backwards (or knobs it has never heard of) keeps picking near copies of the OOMs, each at P(OOM)
        ≈ 0.5. Moving far from them is what finds a first fitting configuration: a capacity that any sizeable
        share of the space fits under is then a few probes away whatever the prior says."""
        mem_mu, _ = self._memory_arrays(idx)
        far = probe
        if self._ooms and self.pool.codes is not None:
            # distance: value positions scaled to [0, 1] per knob, so the far end of an ordered knob (the largest
            # tp, the fullest recompute) counts as farther than its neighbour value
            codes = self.pool.codes
            span = np.maximum(codes.max(axis=0) - codes.min(axis=0), 1.0)
            rows = np.array([self.pool.index[c.key] for c in self._ooms], dtype=int)
            d = (np.abs(codes[idx][:, None, :] - codes[rows][None, :, :]) / span).sum(axis=2).min(axis=1)
            far = probe & (d >= 0.75 * float(d[probe].max()))
        order = np.lexsort((mem_mu, np.round(np.where(far, p_oom, np.inf), 3)))
        return int(order[0])

    def _pair(self, idx: np.ndarray, r: int, mu: np.ndarray, sd: np.ndarray, p_oom: np.ndarray,
              p_hold: np.ndarray, usable: np.ndarray, best: float, cost: np.ndarray) -> int | None:
        """Among usable shortlisted candidates that differ from candidate r only by memory savers (knobs moved
        in their memory-decreasing direction, at most two of them), the best one with low P(OOM)."""
        base = self.pool.candidates[idx[r]]
        savers = self._saver_moves(base)
        rows = np.flatnonzero(usable & (p_oom < self.config.pairing_target))
        if self.pool.codes is not None and all(k.values() is not None for k in self.space.knobs):
            return self._pair_by_codes(idx, r, rows, savers, mu, sd, p_hold, best, cost)
        best_j, best_val = None, -np.inf
        for j in rows:
            c = self.pool.candidates[idx[j]]
            if c.patches != base.patches:
                continue
            moved = [k for k in self.space.knobs if c[k.name] != base[k.name]]
            if not moved or len(moved) > 3 or not all(
                    (k.name, c[k.name]) in savers or self._is_saver(k, base[k.name], c[k.name]) for k in moved):
                continue
            val = float(expected_improvement(mu[j:j + 1], sd[j:j + 1], best)[0] * p_hold[j] / cost[j])
            if val > best_val:
                best_j, best_val = int(j), val
        return best_j

    def _pair_by_codes(self, idx: np.ndarray, r: int, rows: np.ndarray, savers: set[tuple[str, object]],
                       mu: np.ndarray, sd: np.ndarray, p_hold: np.ndarray, best: float,
                       cost: np.ndarray) -> int | None:
        """``_pair``'s loop over the pool's value codes at once (every knob enumerable): the same pick."""
        assert self.pool.codes is not None
        base = self.pool.candidates[idx[r]]
        nk = len(self.space.knobs)
        codes = self.pool.codes[idx[rows]]
        base_codes = self.pool.codes[idx[r]]
        moved = codes[:, :nk] != base_codes[:nk]
        same_patches = np.all(codes[:, nk:] == base_codes[nk:], axis=1)
        allowed = np.ones(moved.shape, dtype=bool)
        for col, k in enumerate(self.space.knobs):
            values = k.values()
            assert values is not None
            saves = np.array([(k.name, v) in savers or self._is_saver(k, base[k.name], v) for v in values])
            allowed[:, col] = saves[codes[:, col].astype(int)]
        n_moved = moved.sum(axis=1)
        ok = same_patches & (n_moved >= 1) & (n_moved <= 3) & np.all(~moved | allowed, axis=1)
        if not ok.any():
            return None
        val = expected_improvement(mu[rows], sd[rows], best) * p_hold[rows] / cost[rows]
        return int(rows[int(np.argmax(np.where(ok, val, -np.inf)))])

    def _saver_moves(self, base: Candidate) -> set[tuple[str, object]]:
        """Single knob changes from ``base`` that the memory model (its prior, or what it learnt) prices below
        ``base``: memory savers on knobs no table knows, and the ones a wrong table would miss."""
        moves = [(k.name, v) for k in self.space.knobs for v in (k.values() or ()) if v != base[k.name]]
        if not moves:
            return set()
        cs = [base, *(base.with_knob(name, v) for name, v in moves)]
        mu = sum((w * mm.predict_log(cs)[0] for mm, w in self._memory_members()), np.zeros(len(cs)))
        return {m for m, d in zip(moves, mu[1:] - mu[0], strict=True) if d < 0}

    def _is_saver(self, k: Knob, old: KnobValue, new: KnobValue) -> bool:
        """A move the space declares memory-saving (a categorical's memory order, a knob's memory direction)."""
        if isinstance(k, Categorical):
            if k.memory_order is None:
                return False
            return k.memory_order.index(new) < k.memory_order.index(old)
        name = k.name
        if name == "dp":
            return True  # moves with tp/pp under tp*pp*dp == devices
        d = self.space.memory_direction.get(name, 0)
        return d != 0 and (float(new) - float(old)) * d < 0

    # ------------------------------------------------------------------------------------ stop / verify
    def max_expected_improvement(self) -> float:
        return self._stop_scan()[0]

    def _stop_scan(self) -> tuple[float, bool]:
        """(the largest expected improvement × P(fit) × P(hold) over the shortlist, whether every candidate
        ``suggest`` may propose is used up: the shortlist is the whole space left, none of it under the cut-off,
        none above it within the OOM budget)."""
        self.refit()
        n = len(self.pool.candidates)
        if self._cache.stop_scan is None or self._cache.stop_scan[0] != n:
            self._cache.stop_scan = (n, *self._scan_for_stop())
        return self._cache.stop_scan[1], self._cache.stop_scan[2]

    def _scan_for_stop(self) -> tuple[float, bool]:
        best = self._incumbent()
        if best is None:
            return math.inf, False
        rng = np.random.default_rng([self.seed, len(self.observations), 7])
        idx = self._shortlist(rng)
        if idx.size == 0:
            return 0.0, True
        mu, sd = self.time_model.predict_encoded(self.pool.x_time[idx])
        assert sd is not None  # asked for (with_std)
        p_oom, p_hold = self._p_oom(idx), self._p_hold(idx)
        allowance = self.oom_allowance()
        limit = max(self._cutoff(self._design_count(()), allowance), allowance, self.config.oom_budget_fit_p_oom)
        admitted = (p_hold >= self.config.invariant_exclude) & (p_oom <= limit)
        used_up = not admitted.any() and self._covers_space(idx.size)
        return float(np.max(expected_improvement(mu, sd, best) * (1.0 - p_oom) * p_hold)), used_up

    def should_stop(self, pending: Sequence[Candidate] = ()) -> tuple[bool, str]:
        """Stop when the largest expected improvement is a small fraction of the run-to-run noise, or when every
        candidate that fits the cut-off has run and the OOM budget holds none of the rest (a tiny space) — once
        no race is open (``SearchConfig.race``; with it off, once the leaders tied within noise are measured
        ``SearchConfig.confirm_repeats`` times each), the ``pending`` runs counted."""
        why = self._stop_reason()
        if why is None:
            return False, f"max EI {self._stop_scan()[0]:.4g} >= threshold {self._stop_threshold()[0]:.4g}"
        if self.config.race:
            race = self._race(pending)
            return (False, f"{why}; {race[0].reason}") if race is not None else (True, why)
        confirm = self._confirmation(pending)
        if confirm is not None:
            return False, f"{why}; {confirm.reason}"
        return True, why

    def _stop_reason(self) -> str | None:
        """Why the search has nothing left worth a new candidate (``None``: it has)."""
        ei, used_up = self._stop_scan()
        if used_up:
            return (f"every candidate under the P(oom) cut-off has run, none of the rest is more likely to "
                    f"fit than not, and the OOM budget left ({self.oom_allowance():.2f}) holds none of them")
        thr, noise, which = self._stop_threshold()
        if ei < thr:
            return f"max EI {ei:.4g} < {self.config.stop_ei_fraction} x {which} {noise:.4g}"
        return None

    def _stop_threshold(self) -> tuple[float, float, str]:
        """(the expected improvement below which the search stops, the noise it is a fraction of, its name):
        ``stop_ei_fraction`` of the run-to-run noise (``SearchConfig.stop_noise``)."""
        tm = self.time_model
        if self.config.stop_noise == "floor":
            noise, which = min(tm.noise_floor, tm.noise_std), "run-to-run noise"
        else:
            noise, which = tm.noise_std, "noise std"
        return self.config.stop_ei_fraction * noise, noise, which

    def _confirmation(self, pending: Sequence[Candidate] = ()) -> Suggestion | None:
        """The best-ranked leader tied within noise with the fastest measured one (``top_candidates``) that has
        fewer than ``SearchConfig.confirm_repeats`` measurements, run and pending: one measurement of each is
        the luckiest draw among tens (2-8% noise), and a re-measurement is what tells a lucky one apart."""
        if self.config.confirm_repeats <= 1:
            return None
        for c, _, _, tied in self._ranked(self.config.confirm_top):
            runs = len(self._measured.get(c.key, ())) + sum(p.key == c.key for p in pending)
            if tied and runs < self.config.confirm_repeats:
                return Suggestion(c, "confirm", f"re-measured: tied within noise with the fastest measured "
                                                f"({runs} of {self.config.confirm_repeats} runs)")
        return None

    def top_candidates(self, k: int = 3) -> list[tuple[Candidate, float, float]]:
        """Observed candidates that kept every invariant, best first: (candidate, measured step seconds (median
        of repeats), posterior std of its log time). For verification and the study's chosen best.

        Measurements within ``SearchConfig.select_tie_sigmas`` noise stds of the fastest measured one are a tie
        that the measurement alone cannot break: among them the mean of the measured and the posterior log time
        (every trial's evidence) ranks; the rest follow by measured time. The posterior alone lost up to 4% of the
        optimum where the model's misfit exceeded the noise (simulator: 0.962 on dense7b_h100x64); the measurement
        alone kept the luckiest draw — with 2-8% noise and ~30 measured candidates, one 5-10% slower than the
        best measured won often (robustness family: the oracle measured in most runs, a slower one chosen).
        The figures: docs/modeling.md, "Choosing the study's best".

        With ``SearchConfig.race`` on, a candidate's measurement is the mean of its runs' log times, and in the tie
        the posterior counts as one run more: the key is (n × mean + posterior) / (n + 1), so a candidate measured
        five times is ranked by its runs and one measured once as before. A candidate measured once never ranks
        above a re-measured one whose mean is less than ``race_z`` standard errors of their difference above its
        run (the race's test, ``race_noise``): one lucky draw does not beat a mean it has not been raced against.
        The step seconds reported are then exp(mean log time)."""
        return [(c, t, sd) for c, t, sd, _ in self._ranked(k)]

    def _ranked(self, k: int) -> list[tuple[Candidate, float, float, bool]]:
        """``top_candidates`` with whether each is tied with the fastest measured one."""
        self.refit()
        if not self._measured:
            return []
        if self.config.race:
            return self._ranked_by_runs(k)
        keys = list(self._measured)
        measured = np.fromiter((np.log(np.median(t)) if len(t) > 1 else math.log(t[0])
                                for t in self._measured.values()), dtype=float, count=len(keys))
        tied_all = measured <= measured.min() + self.config.select_tie_sigmas * self.time_model.noise_std
        # the tied ones are the fastest measured: they and the next k by measurement hold the first k
        sub = np.sort(_smallest(measured, min(len(keys), int(tied_all.sum()) + k)))
        idx = np.array([self.pool.index[keys[i]] for i in sub])
        mu, sd = self.time_model.predict_encoded(self.pool.x_time[idx])
        assert sd is not None
        tied = tied_all[sub]
        key = np.where(tied, mu if self._by_posterior() else 0.5 * (measured[sub] + mu), measured[sub])
        order = sorted(range(sub.size), key=lambda i: (not tied[i], key[i]))[:k]
        return [(self.pool.candidates[idx[i]], float(math.exp(measured[sub[i]])), float(sd[i]), bool(tied[i]))
                for i in order]

    def _by_posterior(self) -> bool:
        """Whether the tie is ranked by the posterior alone (``SearchConfig.select_posterior_noise``)."""
        at = self.config.select_posterior_noise
        return at is not None and self.race_noise() >= at

    def _ranked_by_runs(self, k: int) -> list[tuple[Candidate, float, float, bool]]:
        """``_ranked`` with ``SearchConfig.race`` on (``top_candidates``' docstring has the rule)."""
        runs = self._runs()
        n, m = runs.n, runs.mean_log
        z, sigma = self.config.race_z, runs.noise
        tie = self.config.select_tie_sigmas * self.time_model.noise_std
        # the tied ones, the re-measured ones that may hold a tied single run back, and the next k by measurement
        near = m <= m.min() + tie + z * sigma * math.sqrt(2.0)
        sub = np.sort(_smallest(m, min(m.size, int(near.sum()) + k)))
        idx = np.array([self.pool.index[runs.keys[i]] for i in sub])
        mu, sd = self.time_model.predict_encoded(self.pool.x_time[idx])
        assert sd is not None
        n_sub, m_sub = n[sub], m[sub]
        tied = m_sub <= m.min() + tie
        key = np.where(tied, mu if self._by_posterior() else (n_sub * m_sub + mu) / (n_sub + 1.0), m_sub)
        remaining = sorted(range(sub.size), key=lambda i: (not tied[i], key[i]))
        # a single run is held back by any re-measured candidate left whose mean is within the race's test of it
        hold = m_sub - z * sigma * np.sqrt(1.0 + 1.0 / n_sub)  # (S,) a single run above this is held back
        order: list[int] = []
        while remaining and len(order) < k:
            again = [i for i in remaining if n_sub[i] > 1]
            lowest = float(hold[again].min()) if again else math.inf
            pos = next(p for p, i in enumerate(remaining) if n_sub[i] > 1 or m_sub[i] <= lowest)
            order.append(remaining.pop(pos))
        return [(self.pool.candidates[idx[i]], float(math.exp(m_sub[i])), float(sd[i]), bool(tied[i]))
                for i in order]

    # ------------------------------------------------------------------------------------------ racing
    def _runs(self) -> _Runs:
        """Every measured candidate's run count and mean log time, and the race noise (cached until a refit)."""
        self.refit()
        if self._cache.runs is None:
            keys = list(self._measured)
            n = np.fromiter((len(t) for t in self._measured.values()), dtype=float, count=len(keys))
            logs = [np.log(t) for t in self._measured.values()]
            m = np.fromiter((y.mean() for y in logs), dtype=float, count=len(keys))
            # pooled within-candidate spread, the doctor's noise floor weighing race_noise_df degrees of freedom
            df = self.config.race_noise_df
            ss = df * self.time_model.noise_floor**2 + sum(float(((y - y.mean()) ** 2).sum()) for y in logs
                                                          if y.size > 1)
            noise = math.sqrt(ss / (df + float((n - 1.0).sum())))
            self._cache.runs = _Runs(keys, n, m, noise)
        return self._cache.runs

    def race_noise(self) -> float:
        """σ of one run's log step time that a race tests differences against: the doctor's run-to-run noise (the
        time model's noise floor) pooled with the spread of the study's repeated runs of the same candidate
        (``SearchConfig.race_noise_df``). Not the time model's fitted noise, which holds its misfit too."""
        return self._runs().noise if self._measured else self.time_model.noise_floor

    def race_cap(self) -> int:
        """Most runs of one candidate in a race: the doctor's ``repeats_for_effect`` of ``race_effect`` at the
        doctor's noise (the noise floor), within [``race_min_cap``, ``race_max_cap``]."""
        from infrarsi.verdicts.doctor import repeats_for_effect

        need = repeats_for_effect(self.time_model.noise_floor, self.config.race_effect,
                                  max_repeats=self.config.race_max_cap)
        return max(self.config.race_min_cap, need)

    def _race(self, pending: Sequence[Candidate] = ()) -> tuple[Suggestion, int] | None:
        """The open race's next run and the runs the race may still take; ``None`` when none is open.

        The incumbent is ``top_candidates``' first; a challenger is a measured candidate whose mean log time
        differs from the incumbent's by less than ``race_z`` × σ·sqrt(1/n_c + 1/n_i) (unresolved) while one of
        the pair has fewer than ``race_cap`` runs, run and pending. Of the challengers the one measured fastest
        races; of the pair the one with fewer runs is re-run (ties: the one measured faster, the likelier lucky
        draw)."""
        ranked = self._ranked(1)
        if not ranked:
            return None
        runs = self._runs()
        cap, z = self.race_cap(), self.config.race_z
        extra: dict[str, int] = {}
        for c in pending:
            extra[c.key] = extra.get(c.key, 0) + 1
        total = runs.n + np.array([extra.get(key, 0) for key in runs.keys], dtype=float)  # (C,) run and pending
        inc = runs.keys.index(ranked[0][0].key)
        gap = runs.mean_log - runs.mean_log[inc]
        bound = z * runs.noise * np.sqrt(1.0 / runs.n + 1.0 / runs.n[inc])
        open_ = (np.abs(gap) < bound) & ((total < cap) | (total[inc] < cap))
        open_[inc] = False
        if not open_.any():
            return None
        ch = int(np.argmin(np.where(open_, runs.mean_log, np.inf)))
        pair = [ch, inc] if runs.mean_log[ch] <= runs.mean_log[inc] else [inc, ch]
        run = min((i for i in pair if total[i] < cap), key=lambda i: total[i])
        need = int(max(cap - total[ch], 0) + max(cap - total[inc], 0))
        who = "challenger" if run == ch else "incumbent"
        reason = (f"race: re-run of the {who}; challenger {math.exp(runs.mean_log[ch]):.4g}s over "
                  f"{int(runs.n[ch])} run(s) vs incumbent {math.exp(runs.mean_log[inc]):.4g}s over "
                  f"{int(runs.n[inc])}: |Δ log| {abs(gap[ch]):.3f} < {z:g}σ·sqrt(1/n_c+1/n_i) = {bound[ch]:.3f} "
                  f"(σ {runs.noise:.3f}, cap {cap} runs each)")
        return Suggestion(self.pool.candidates[self.pool.index[runs.keys[run]]], "confirm", reason), need

    def _race_turn(self, pending: Sequence[Candidate], left: int | None) -> Suggestion | None:
        """The open race's next run when it is the race's turn (``SearchConfig.race_share``), when the race needs
        the trials the budget has ``left`` (at most ``race_end_share`` of the study's trials), or when nothing new
        is worth a trial; else ``None``. Never during the initial design."""
        if self._design_count(pending) < 1 + self.config.n_seeds or not self._ok_rows:
            return None
        race = self._race(pending)
        if race is None:
            return None
        suggestion, need = race
        end = min(need, math.floor(self.config.race_end_share * (self._design_count(pending) + left))) \
            if left is not None else 0
        if left is not None and end >= left:
            return replace(suggestion, reason=f"{suggestion.reason}; the race needs up to {need} runs "
                                              f"and the budget has {left} left")
        since = self._design_count(pending) - (1 + self.config.n_seeds)
        repeats = self._repeats + sum(c.key in self._seen for c in pending)
        if repeats < self.config.race_share * (since + 1) or self._stop_reason() is not None:
            return suggestion
        return None


def _smallest(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` smallest values, in no particular order (a partition, not a sort: O(n))."""
    if k >= values.size:
        return np.arange(values.size)
    return np.argpartition(values, k)[:k]
