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
from infrarsi.modeling.space import Candidate, FeatureEncoder, FloatRange, SearchSpace


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
                 noise_floor: float = 0.03, robust: bool = True, student_nu: float = 4.0) -> None:
        self.space = space
        self.encoder = encoder or FeatureEncoder(space)
        self.kb = kb or default_knowledge_base()
        self.prior_mean, self.prior_std = self.kb.time_priors(self.encoder)
        self._scale_interactions()
        self.noise_floor = noise_floor
        self.robust = robust
        self.nu = student_nu
        p = self.encoder.dim
        self._rows: list[np.ndarray] = []
        self._ys: list[float] = []
        self._x = np.zeros((0, p))
        self._y = np.zeros(0)
        self.log_noise = math.log(noise_floor)
        self.mean = self.prior_mean.copy()
        self._prec_chol = np.diag(1.0 / self.prior_std)  # lower Cholesky factor of the posterior precision
        self._weights = np.zeros(0)

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

    def _materialise(self) -> None:
        if self._y.size != len(self._ys):
            self._x = np.vstack([self._x, *self._rows[self._y.size:]]) if self._rows else self._x
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
        prior_prec = 1.0 / self.prior_std**2
        a = xtx / noise_var
        a[np.diag_indices_from(a)] += prior_prec
        b = xty / noise_var + prior_prec * self.prior_mean
        la = np.linalg.cholesky(a)
        mean = cho_solve((la, True), b)
        return mean, la

    def _neg_log_evidence(self, log_s: float, xtx: np.ndarray, xty: np.ndarray, yty: float, n_eff: float,
                          logdet_w: float) -> float:
        noise_var = math.exp(2 * log_s)
        prior_prec = 1.0 / self.prior_std**2
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
        logdet = 2 * np.log(np.diag(la)).sum() + np.log(self.prior_std**2).sum() + n_eff * 2 * log_s - logdet_w
        nll = 0.5 * (quad + logdet)
        # log-normal prior on σ centred on the noise floor: noise is rarely far below what the doctor measured
        nll += 0.5 * ((log_s - math.log(self.noise_floor)) / 0.5) ** 2
        return float(nll)

    def fit(self, irls_iterations: int = 3) -> None:
        self._materialise()
        if self.n == 0:
            self.mean = self.prior_mean.copy()
            return
        x, y = self._x, self._y
        w = np.ones(self.n)
        for _ in range(irls_iterations if self.robust else 1):
            xw = x * w[:, None]
            xtx, xty, yty = xw.T @ x, xw.T @ y, float((w * y) @ y)
            res = minimize_scalar(self._neg_log_evidence, bounds=(math.log(0.002), math.log(2.0)), method="bounded",
                                  args=(xtx, xty, yty, float(self.n), float(np.log(w).sum())),
                                  options={"xatol": 0.02})
            self.log_noise = float(res.x)
            noise_var = self.noise_std**2
            self.mean, la = self._posterior(xtx, xty, noise_var)
            self._weights = w  # the weights this posterior was computed with
            if not self.robust:
                break
            # Student-t weights: an outlier (straggler) gets weight (ν+1)/(ν+r²); its information is kept
            r2 = ((y - x @ self.mean) ** 2) / noise_var
            w_new = (self.nu + 1) / (self.nu + r2)
            if np.allclose(w_new, w, atol=1e-3):
                break
            w = w_new
        self._prec_chol = la

    def posterior_direct(self) -> tuple[np.ndarray, np.ndarray]:
        """Slow path: posterior mean and covariance by explicit inverses (for tests and audits)."""
        self._materialise()
        noise_var = self.noise_std**2
        w = self._weights if self._weights.size == self.n else np.ones(self.n)
        s0_inv = np.diag(1.0 / self.prior_std**2)
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
        if self.n == 0:
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
        return np.sqrt(np.maximum(np.einsum("ij,ij->j", v, v), 1e-12))

    def covariance(self) -> np.ndarray:
        if self.n == 0:
            return np.diag(self.prior_std**2)
        inv_l = solve_triangular(self._prec_chol, np.eye(self.encoder.dim), lower=True)
        return inv_l.T @ inv_l

    def effects(self) -> list[FeatureEffect]:
        sd = np.sqrt(np.diag(self.covariance()))
        return [FeatureEffect(n, float(self.prior_mean[i]), float(self.prior_std[i]), float(self.mean[i]),
                              float(sd[i])) for i, n in enumerate(self.encoder.names)]
