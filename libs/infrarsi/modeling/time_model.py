"""Bayesian linear model of log step time over encoded candidate features.

Owns: the Gaussian prior per feature (from the knowledge base and patch metadata), the closed-form posterior,
the noise variance (empirical Bayes: maximised marginal likelihood under a log-normal prior centred on the
noise floor the doctor measured), robustness to stragglers (Student-t by iteratively reweighted least squares),
predictive mean/std for any candidate, and a prior-vs-posterior report per feature. Must not: do I/O.

Slow readable path: `posterior_direct` inverts the posterior precision explicitly; `fit` works with Cholesky
factors and is checked against it in the tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_solve, solve_triangular
from scipy.optimize import minimize_scalar

from infrarsi.modeling.priors import KnowledgeBase, default_knowledge_base
from infrarsi.modeling.space import Candidate, FeatureEncoder, FloatRange, IntChoice, IntRange, SearchSpace


@dataclass(frozen=True)
class FeatureEffect:
    """One feature's effect on log step time: prior and posterior (for `infrarsi model STUDY`)."""

    name: str
    prior_mean: float
    prior_std: float
    posterior_mean: float
    posterior_std: float


class TimeModel:
    """y = log step time = φ(c)·w + ε,  w ~ N(m0, diag(s0²)),  ε ~ N(0, σ²) (Student-t weights when robust)."""

    def __init__(self, space: SearchSpace, kb: KnowledgeBase | None = None, encoder: FeatureEncoder | None = None,
                 noise_floor: float = 0.03, robust: bool = True, student_nu: float = 4.0,
                 prior_nu: float | None = None) -> None:
        self.space = space
        self.encoder = encoder or FeatureEncoder(space)
        self.kb = kb or default_knowledge_base()
        self.prior_mean, self.prior_std = self.kb.time_priors(self.encoder)
        self._scale_interactions()
        self._prior_is_knowledge = np.array([spec.kind not in ("intercept", "interaction")
                                             for spec in self.encoder.specs])
        self.noise_floor = noise_floor
        self.robust = robust
        self.nu = student_nu
        self.min_robust = 4
        """Measured rows needed before any of them is down-weighted as a straggler."""
        self.prior_nu = prior_nu
        """Student-t degrees of freedom of each effect's prior (``None``: Gaussian). A prior the measurements
        contradict by k prior stds keeps weight (ν+1)/(ν+k²) of its precision, so a wrong knowledge-base entry
        stops holding the data back after a few trials."""
        p = self.encoder.dim
        self._rows: list[np.ndarray] = []
        self._ys: list[float] = []
        self._x = np.zeros((0, p))
        self._buf = np.zeros((0, p))
        self._y = np.zeros(0)
        self.log_noise = math.log(noise_floor)
        self.mean = self.prior_mean.copy()
        self._eff_prior_std = self.prior_std.copy()
        """The prior stds the current posterior used: ``prior_std`` widened where the data contradict it."""
        self._prec_chol = np.diag(1.0 / self.prior_std)  # lower Cholesky factor of the posterior precision
        self._weights = np.zeros(0)
        self._cens_rows: list[np.ndarray] = []
        self._cens_bounds: list[float] = []
        self._stop_rows: list[np.ndarray] = []
        self._stop_ys: list[float] = []
        self._normal: tuple[np.ndarray, np.ndarray] | None = None
        """XᵀWX and XᵀWy of the last ``_fit_rows`` posterior."""
        self._anchor: tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        """(rows, XᵀWX, XᵀWy, mean, weights) of a ``fit(upto=rows)``: what ``update`` adds the later rows to."""

    def _scale_interactions(self) -> None:
        """An interaction column is a product of two factors; divide its prior std by both factors' ranges so
        that the prior bounds the effect across the whole space, not per unit of log2(tp)*log2(micro_batch)."""
        ranges = np.ones(self.encoder.n_main)
        for i, spec in enumerate(self.encoder.specs[: self.encoder.n_main]):
            if spec.kind == "numeric" and spec.knob is not None:
                k = self.space.knob(spec.knob)
                if isinstance(k, FloatRange):
                    lo, hi = (math.log2(k.low), math.log2(k.high)) if k.log else (0.0, 1.0)
                else:
                    assert isinstance(k, IntRange | IntChoice)  # a numeric column's knob
                    vals = [self.encoder._trend(k, v) for v in k.values()]
                    lo, hi = min(vals), max(vals)
                ranges[i] = max(hi - lo, 1e-9)
        for j, (a, b) in enumerate(self.encoder._pairs):
            col = self.encoder.n_main + j
            self.prior_std[col] = self.prior_std[col] / (ranges[a] * ranges[b])

    # ---- data
    def observe(self, c: Candidate, step_time_s: float) -> None:
        self.observe_encoded(self.encoder.encode(c), step_time_s)

    def observe_encoded(self, x: np.ndarray, step_time_s: float) -> None:
        self._rows.append(np.asarray(x, dtype=float))
        self._ys.append(math.log(step_time_s))

    def observe_censored_encoded(self, x: np.ndarray, at_least_s: float) -> None:
        """A trial stopped before its step time was measured (a timeout, a trial stopped as too slow): its step
        time is at least ``at_least_s`` — a right-censored observation, as an OOM is for memory."""
        self._cens_rows.append(np.asarray(x, dtype=float))
        self._cens_bounds.append(math.log(at_least_s))

    def observe_stopped_encoded(self, x: np.ndarray, step_time_s: float) -> None:
        """A trial stopped early because its steps were already far slower than the incumbent's: its step time
        is measured, but it was chosen for being a surprise, so (like an imputed censored row) it is neither a
        sample of the noise nor ever down-weighted as a straggler — else one stopped trial is explained as noise
        instead of by the setting that made it slow."""
        self._stop_rows.append(np.asarray(x, dtype=float))
        self._stop_ys.append(math.log(step_time_s))

    @property
    def n_censored(self) -> int:
        return len(self._cens_bounds)

    @property
    def n_stopped(self) -> int:
        return len(self._stop_ys)

    def _empty(self) -> bool:
        return self.n == 0 and not self._cens_bounds and not self._stop_ys

    def _materialise(self) -> None:
        """``_x``/``_y`` as arrays of every measured row; the rows live in a buffer that doubles when full, so
        one new row costs O(p), not a copy of all of them."""
        n, have = len(self._ys), self._y.size
        if n != have:
            if n > self._buf.shape[0]:
                grown = np.zeros((max(2 * self._buf.shape[0], n, 64), self.encoder.dim))
                grown[:have] = self._buf[:have]
                self._buf = grown
            self._buf[have:n] = self._rows[have:n]
            self._x = self._buf[:n]
            self._y = np.asarray(self._ys)

    @property
    def n(self) -> int:
        return len(self._ys)

    @property
    def noise_std(self) -> float:
        return math.exp(self.log_noise)

    # ---- fit
    def _posterior(self, xtx: np.ndarray, xty: np.ndarray, noise_var: float) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and lower Cholesky factor of the precision A = S0^-1 + XᵀWX/σ²."""
        prior_prec = 1.0 / self._eff_prior_std**2
        a = xtx / noise_var
        a[np.diag_indices_from(a)] += prior_prec
        b = xty / noise_var + prior_prec * self.prior_mean
        la = np.linalg.cholesky(a)
        mean = cho_solve((la, True), b)
        return mean, la

    def _neg_log_evidence(self, log_s: float, xtx: np.ndarray, xty: np.ndarray, yty: float, n_eff: float,
                          logdet_w: float) -> float:
        noise_var = math.exp(2 * log_s)
        prior_prec = 1.0 / self._eff_prior_std**2
        a = xtx / noise_var
        a[np.diag_indices_from(a)] += prior_prec
        try:
            la = np.linalg.cholesky(a)
        except np.linalg.LinAlgError:
            return 1e30
        m0 = self.prior_mean
        # r = y - X m0 ; rᵀC⁻¹r with C = X S0 Xᵀ + σ² W⁻¹ via Woodbury
        rtr = yty - 2 * m0 @ xty + m0 @ xtx @ m0
        xtr = (xty - xtx @ m0) / noise_var
        v = solve_triangular(la, xtr, lower=True)
        quad = rtr / noise_var - v @ v
        logdet = 2 * np.log(np.diag(la)).sum() + np.log(self._eff_prior_std**2).sum() + n_eff * 2 * log_s - logdet_w
        nll = 0.5 * (quad + logdet)
        # log-normal prior on σ centred on the noise floor: noise is rarely far below what the doctor measured
        nll += 0.5 * ((log_s - math.log(self.noise_floor)) / 0.5) ** 2
        return float(nll)

    def fit(self, irls_iterations: int = 3, censored_iterations: int = 4, upto: int | None = None) -> None:
        """Posterior given every observation. Censored ones (step time ≥ bound) enter as their conditional
        mean E[y | y > bound] under the current fit, refitted a few times (Buckley–James style imputation):
        a bound above what the model expects pulls the candidate's features up; one below it says little.

        ``upto``: only the first ``upto`` measured rows (when there is no censored or stopped row), kept as the
        anchor that ``update`` adds the later rows to."""
        self._materialise()
        self._anchor = None
        if self._empty():
            self.mean = self.prior_mean.copy()
            return
        if not self._cens_bounds and not self._stop_ys:
            m = self.n if upto is None else min(upto, self.n)
            self._fit_rows(self._x[:m], self._y[:m], irls_iterations)
            assert self._normal is not None
            self._anchor = (m, *self._normal, self.mean.copy(), self._weights.copy())
            return
        from scipy.special import log_ndtr

        # the noise comes from the measured rows alone: an imputed value is no sample of the noise, and letting it
        # in let one surprising timeout be explained as noise instead of by the setting that caused it (the same
        # holds for a trial stopped as slow: ``observe_stopped_encoded``)
        log_noise = math.log(self.noise_floor)
        if self.n:
            self._fit_rows(self._x, self._y, irls_iterations)
            log_noise = self.log_noise
        x_known = np.vstack([self._x, *self._stop_rows]) if self._stop_rows else self._x
        y_known = np.concatenate([self._y, self._stop_ys])
        if not self._cens_bounds:
            self._fit_rows(x_known, y_known, irls_iterations, n_robust=self.n, log_noise=log_noise)
            return
        xc = np.array(self._cens_rows)  # (m, p)
        bounds = np.array(self._cens_bounds)  # (m,)
        yc = bounds.copy()
        for _ in range(censored_iterations):
            self._fit_rows(np.vstack([x_known, xc]), np.concatenate([y_known, yc]), irls_iterations,
                           n_robust=self.n, log_noise=log_noise)
            mu_c, sd_latent = self.predict_encoded(xc)  # (m,)
            assert sd_latent is not None
            sd = np.sqrt(sd_latent**2 + self.noise_std**2)
            z = (bounds - mu_c) / sd
            yc = np.maximum(bounds, mu_c + sd * np.exp(-0.5 * z**2 - 0.5 * math.log(2 * math.pi) - log_ndtr(-z)))

    def update(self) -> bool:
        """The posterior of the last ``fit(upto=…)`` with every measured row after it folded in, at that fit's
        noise, prior widths and straggler rule (a later row's Student-t weight from its residual under the
        anchor's mean): a rank-k update of XᵀWX, O(k·p² + p³), instead of a full fit's evidence search and
        reweighting at O(n·p²) per iteration. It depends only on the rows, not on how often it is called (a
        replayed model equals the live one). ``False`` (nothing changed) when only a full fit will do: no
        anchor, or a censored or stopped row (imputation and the noise split need the whole fit)."""
        self._materialise()
        if self._anchor is None or self._cens_bounds or self._stop_ys:
            return False
        m, xtx, xty, mean, weights = self._anchor
        x, y = self._x[m:], self._y[m:]
        noise_var = self.noise_std**2
        w = np.ones(len(y))
        if self.robust and self.n >= self.min_robust:
            w = (self.nu + 1) / (self.nu + (y - x @ mean) ** 2 / noise_var)
        xw = x * w[:, None]
        self.mean, self._prec_chol = self._posterior(xtx + xw.T @ x, xty + xw.T @ y, noise_var)
        self._weights = np.concatenate([weights, w])  # lines up with the measured rows (``posterior_direct``)
        return True

    def _fit_rows(self, x: np.ndarray, y: np.ndarray, irls_iterations: int, n_robust: int | None = None,
                  log_noise: float | None = None) -> None:
        """Posterior from rows (x, y); the first ``n_robust`` rows (all by default) get Student-t weights. Rows
        after them are imputed censored bounds: a trial stopped as too slow is exactly the surprise the data
        must be allowed to make, so it is never discounted as a straggler. ``log_noise`` fixes the noise instead
        of estimating it."""
        n = x.shape[0]
        n_robust = n if n_robust is None else n_robust
        # a straggler stands out only against a few measurements: one or two are the data, not outliers (with a
        # single measurement beside a timed-out trial, its Student-t weight made the timeout set the level)
        robust_rows = np.arange(n) < (n_robust if n_robust >= self.min_robust else 0)
        w = np.ones(n)
        self._eff_prior_std = self.prior_std.copy()
        iterations = irls_iterations if self.robust else 1
        if self.prior_nu is not None:
            iterations = max(iterations, 8)
        for _ in range(iterations):
            xw = x * w[:, None]
            xtx, xty, yty = xw.T @ x, xw.T @ y, float((w * y) @ y)
            if log_noise is None:
                res = minimize_scalar(self._neg_log_evidence, bounds=(math.log(0.002), math.log(2.0)),
                                      method="bounded", args=(xtx, xty, yty, float(n), float(np.log(w).sum())),
                                      options={"xatol": 0.02})
                self.log_noise = float(res.x)
            else:
                self.log_noise = log_noise
            noise_var = self.noise_std**2
            self.mean, la = self._posterior(xtx, xty, noise_var)
            self._normal = (xtx, xty)
            self._weights = w  # the weights this posterior was computed with
            moved = False
            if self.prior_nu is not None:
                # Student-t prior as a scale mixture: an effect k prior stds from its prior mean keeps (ν+1)/(ν+k²)
                # of its prior precision (the intercept and interactions are left as they are)
                k2 = ((self.mean - self.prior_mean) / self.prior_std) ** 2
                weight = (self.prior_nu + 1) / (self.prior_nu + k2)
                eff = np.where(self._prior_is_knowledge, self.prior_std / np.sqrt(np.minimum(weight, 1.0)),
                               self.prior_std)
                moved = not np.allclose(eff, self._eff_prior_std, rtol=1e-2)
                self._eff_prior_std = eff
            if not self.robust and not moved:
                break
            # Student-t weights: an outlier (straggler) gets weight (ν+1)/(ν+r²); its information is kept
            r2 = ((y - x @ self.mean) ** 2) / noise_var
            w_new = np.where(robust_rows, (self.nu + 1) / (self.nu + r2), 1.0) if self.robust else w
            if np.allclose(w_new, w, atol=1e-3) and not moved:
                break
            w = w_new
        self._prec_chol = la

    def posterior_direct(self) -> tuple[np.ndarray, np.ndarray]:
        """Slow path: posterior mean and covariance by explicit inverses (for tests and audits)."""
        self._materialise()
        noise_var = self.noise_std**2
        w = self._weights if self._weights.size == self.n else np.ones(self.n)
        s0_inv = np.diag(1.0 / self._eff_prior_std**2)
        a = s0_inv + (self._x.T * w) @ self._x / noise_var
        cov = np.linalg.inv(a)
        mean = cov @ (s0_inv @ self.prior_mean + (self._x.T * w) @ self._y / noise_var)
        return mean, cov

    # ---- prediction
    def predict_encoded(self, x: np.ndarray, with_std: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """Latent (noise-free) log step time: mean (N,) and std (N,) from parameter uncertainty."""
        mu = x @ self.mean
        if not with_std:
            return mu, None
        if self._empty():
            var = (x**2) @ (self.prior_std**2)
        else:
            v = solve_triangular(self._prec_chol, x.T, lower=True)  # (p, N): Σ = A⁻¹ -> xᵀΣx = |La⁻¹x|²
            var = np.einsum("ij,ij->j", v, v)
        return mu, np.sqrt(np.maximum(var, 1e-12))

    def predict(self, cs: Sequence[Candidate]) -> tuple[np.ndarray, np.ndarray]:
        mu, sd = self.predict_encoded(self.encoder.encode_many(cs))
        assert sd is not None
        return mu, sd

    def believer_std(self, x: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        """Kriging believer: latent std (N,) of rows x (N, p) after pretending the rows ``chosen`` (m, p) were
        observed at their mean — the mean does not move, the variance shrinks around them, so a batch's next
        pick goes elsewhere."""
        la = self._prec_chol @ self._prec_chol.T + chosen.T @ chosen / self.noise_std**2
        v = solve_triangular(np.linalg.cholesky(la), x.T, lower=True)  # (p, N)
        std: np.ndarray = np.sqrt(np.maximum(np.einsum("ij,ij->j", v, v), 1e-12))
        return std

    def covariance(self) -> np.ndarray:
        if self._empty():
            return np.diag(self.prior_std**2)
        inv_l = solve_triangular(self._prec_chol, np.eye(self.encoder.dim), lower=True)
        cov: np.ndarray = inv_l.T @ inv_l
        return cov

    def effects(self) -> list[FeatureEffect]:
        sd = np.sqrt(np.diag(self.covariance()))
        return [FeatureEffect(n, float(self.prior_mean[i]), float(self.prior_std[i]), float(self.mean[i]),
                              float(sd[i])) for i, n in enumerate(self.encoder.names)]
