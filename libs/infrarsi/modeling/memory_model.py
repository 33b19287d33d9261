"""Peak-memory model with right-censored (Tobit) fitting of OOM trials.

Owns: the structural estimate of peak bytes per GPU (model state under ZeRO sharding, Korthikanti et al. 2022
activations under recomputation/attention/sequence-parallel choices) when the workload's shape is known, the
learned multiplicative corrections (log-linear in candidate features) fitted by MAP with a censored-normal
likelihood, P(OOM) for any candidate, and the memory "price" of each setting. Without a known shape it falls
back to a pure log-linear model over features (`generic` mode), still censored.

An OOM trial is the observation ``peak > bound`` where bound is the last peak seen before the kill; it is
never dropped. Must not: do I/O or know how trials run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import minimize, minimize_scalar
from scipy.special import log_ndtr, ndtr

from infrarsi.modeling.priors import KnowledgeBase, default_knowledge_base
from infrarsi.modeling.space import Candidate, FeatureEncoder, SearchSpace

WORKSPACE_BYTES = 1.5 * 2**30


@dataclass(frozen=True)
class TransformerMeta:
    """What the structural memory formula needs to know about the workload (from the contract/doctor)."""

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    dense_params: int
    """Parameters replicated across expert-parallel ranks (everything but MoE experts), embeddings included."""
    global_batch: int
    capacity_bytes: float
    expert_params: int = 0
    experts: int = 1
    top_k: int = 1
    workspace_bytes: float = WORKSPACE_BYTES
    """Memory besides model state and activations (CUDA context and workspaces; a CPU process's runtime)."""
    roles: Mapping[str, str] = field(default_factory=dict)
    """Role -> knob name where the contract names knobs differently (roles: tp, pp, dp, ep, micro_batch,
    recompute, zero_stage, sequence_parallel, flash_attention, offload_optimizer, capacity_factor, bucket_mb,
    overlap_comm)."""
    devices: int | None = None
    """Accelerators the job runs on. With no ``dp`` knob, data-parallel = devices / (tp·pp); ``None`` (unknown)
    falls back to 1, which ignores ZeRO sharding."""
    role_values: Mapping[str, Mapping[str, bool]] = field(default_factory=dict)
    """For an on/off role held by a string knob (``attn: eager|flash`` → ``flash_attention``): value -> on.
    Common spellings (``eager``, ``flash``, ``sdpa``, ``none``...) are known without it."""

    def knob(self, c: Mapping[str, object], role: str, default: object) -> Any:
        """The value of the knob playing ``role`` (``Any``: a number, a string or a bool, as the contract holds
        it; the caller converts it to what the role means)."""
        return c.get(self.roles.get(role, role), default)

    def flag(self, c: Mapping[str, object], role: str, default: bool) -> bool:
        """An on/off role's value; a string is read through ``role_values`` or the common spellings, never as
        ``bool(str)`` (``bool("eager")`` is true)."""
        value = self.knob(c, role, default)
        if isinstance(value, str):
            mapped = self.role_values.get(role, {})
            if value in mapped:
                return bool(mapped[value])
            word = value.strip().lower()
            if word in _ON_WORDS:
                return True
            if word in _OFF_WORDS:
                return False
            raise ValueError(f"knob {self.roles.get(role, role)!r}={value!r}: cannot tell whether it turns "
                             f"{role} on; map it in TransformerMeta.role_values")
        return bool(value)


_ON_WORDS = frozenset({"true", "on", "yes", "1", "enabled", "flash", "flash2", "flash_attention", "fa2", "sdpa",
                       "cpu"})
_OFF_WORDS = frozenset({"false", "off", "no", "0", "disabled", "eager", "manual", "math", "none", ""})


def structural_components(meta: TransformerMeta, knobs: Mapping[str, object]) -> tuple[float, float]:
    """Textbook (static bytes, activation bytes) on the busiest GPU, before any learned correction."""
    tp = int(meta.knob(knobs, "tp", 1))
    pp = int(meta.knob(knobs, "pp", 1))
    dp = int(meta.knob(knobs, "dp", max(meta.devices // (tp * pp), 1) if meta.devices else 1))
    ep = int(meta.knob(knobs, "ep", 1))
    mb = int(meta.knob(knobs, "micro_batch", 1))
    recompute = str(meta.knob(knobs, "recompute", "none"))
    zero = int(meta.knob(knobs, "zero_stage", 0))
    sp = meta.flag(knobs, "sequence_parallel", False)
    flash = meta.flag(knobs, "flash_attention", True)
    offload = meta.flag(knobs, "offload_optimizer", False)
    cf = float(meta.knob(knobs, "capacity_factor", 1.25))
    bucket_mb = float(meta.knob(knobs, "bucket_mb", 25))
    overlap = meta.flag(knobs, "overlap_comm", False)

    def bytes_per_param(shards: int) -> float:  # bf16 param 2 + bf16 grad 2 + fp32 optimizer 12
        opt = 0.0 if offload else 12.0
        return (4 + opt, 4 + opt / shards, 2 + (2 + opt) / shards, (4 + opt) / shards)[min(zero, 3)]

    embed = 2 * meta.vocab * meta.hidden
    body = (meta.dense_params - embed) / pp + (embed if pp == 1 else embed / 2)
    static = body / tp * bytes_per_param(dp) + meta.expert_params / (pp * tp * ep) * bytes_per_param(max(dp // ep, 1))
    if zero >= 3:
        # ZeRO-3 gathers full (bf16) parameters ahead of use: about two layers live at once (DeepSpeed's prefetch
        # and max-live-parameter defaults)
        static += 2 * (meta.dense_params - embed + meta.expert_params / ep) / meta.layers / tp * 2
    # gradient-reduction buckets: one bucket_mb buffer, two while communication overlaps the backward pass
    static += bucket_mb * 2**20 * (2 if overlap else 1)

    s, h, a = meta.seq_len, meta.hidden, meta.heads
    sbh = s * mb * h
    mlp_scale = meta.top_k * cf if meta.experts > 1 else 1.0
    layer_full = sbh * ((10.0 / tp if sp else 10.0) + 5.0 / tp + 19.0 * mlp_scale / tp
                        + (0.0 if (flash or recompute != "none") else 5.0 * a * s / (h * tp)))
    per_layer = 2.0 * sbh / (tp if sp else 1) if recompute == "full" else layer_full
    microbatches = max(meta.global_batch // max(dp * mb, 1), 1)
    act = meta.layers / pp * min(pp, microbatches) * per_layer
    if recompute == "full":
        act += layer_full
    if pp == 1:
        act += mb * s * meta.vocab * 8 / tp  # fp32 logits and their gradient
    return static, act


@dataclass
class MemoryFit:
    theta: np.ndarray
    log_sigma: float
    cov: np.ndarray
    n_ok: int
    n_censored: int
    converged: bool
    seconds: float = 0.0


class MemoryModel:
    """Censored log-normal model of peak bytes.

    Structured mode (``meta`` given): peak = S(c)·exp(φ(c)·u) + A(c)·exp(φ(c)·v) + W·exp(w), with S, A the
    structural static/activation bytes, W a workspace constant, φ the main (non-interaction) features; u, v, w
    have zero-mean Gaussian priors (the formula is trusted unless data say otherwise).
    Generic mode: log peak = φ(c)·β with knowledge-base priors on β.
    Noise: log peak ~ N(μ(c), σ²); an OOM at bound b contributes log P(log peak > log b).
    """

    def __init__(self, space: SearchSpace, capacity_bytes: float, meta: TransformerMeta | None = None,
                 kb: KnowledgeBase | None = None, correction_std: float = 0.12, censored: bool = True,
                 interaction_std: float | None = None, two_terms: bool = False,
                 misfit_floor: float | None = None, spread_scale: float = 1.0) -> None:
        self.space = space
        self.spread_scale = 1.0 if meta is not None else spread_scale
        """Without a workload shape: the factor on the predictive std (``SearchConfig.memory_spread_scale``)."""
        if misfit_floor is not None:
            # the fitted σ of a flexible model is its in-sample residual, which hits the floor after a few trials;
            # what it mispredicts at a candidate it has not measured is larger
            self.log_sigma_bounds = (math.log(misfit_floor), math.log(1.0))
        self.capacity_bytes = float(capacity_bytes)
        self.meta = meta
        self.kb = kb or default_knowledge_base()
        self.censored = censored
        self.structured = meta is not None
        self.two_terms = two_terms and not self.structured
        """Generic mode as a sum of two log-linear terms (``_two_term_priors``) instead of one."""
        # generic mode with interaction_std: products of knob pairs too (the time model's columns), so a peak
        # that is a sum of terms — a batch-sized activation term beside a shard-split state term — is not
        # forced into one product of per-knob factors
        self.encoder = FeatureEncoder(space, interactions=interaction_std is not None and not self.structured
                                      and not self.two_terms)
        p = self.encoder.dim
        if self.structured:
            assert meta is not None
            # which knobs can correct which component: the formula's known weak spots are the activation
            # footprint of recompute/attention/sequence-parallel choices (which tensors each keeps) and the
            # model-state footprint of the sharding choices. Every other knob gets only a small correction,
            # micro-batch and capacity factor included: the formula scales activations by them exactly (b and
            # the padded expert capacity are factors of every activation tensor), so a free per-value correction
            # there only fits noise after ten trials.
            act_roles = {"recompute", "flash_attention", "sequence_parallel"}
            static_roles = {"zero_stage", "offload_optimizer"}
            by_knob = {meta.roles.get(r, r): r for r in act_roles | static_roles}
            std_s = np.full(p, 0.02)
            std_a = np.full(p, 0.02)
            for i, spec in enumerate(self.encoder.specs):
                role = by_knob.get(spec.knob or "")
                if role in act_roles:
                    std_a[i] = correction_std
                if role in static_roles:
                    std_s[i] = correction_std
                if spec.kind == "numeric" and role is None:
                    # a small correction bounds the effect across the knob's whole range, not per unit of
                    # log2(dp) (0..6 on 64 GPUs, where 0.02 per unit would allow 12%)
                    span = self.encoder.trend_span(spec.knob)
                    std_s[i] /= max(span, 1.0)
                    std_a[i] /= max(span, 1.0)
            std_s[0] = std_a[0] = 0.3
            self.prior_mean = np.zeros(2 * p + 1)
            # workspace: CUDA context, cuBLAS/NCCL workspaces; known to within tens of per cent, and poorly
            # identified next to tens of GB of states and activations, so a loose prior here lets it wander by GBs
            self.prior_std = np.concatenate([std_s, std_a, [0.2]])
        elif self.two_terms:
            self.prior_mean, self.prior_std = self._two_term_priors()
        else:
            mean, std = self.kb.memory_priors(self.encoder, interaction_std or 0.05)
            mean[0] = math.log(self.capacity_bytes * 0.6)
            std[0] = 1.0
            self.prior_mean, self.prior_std = mean, std
        self.theta = self.prior_mean.copy()
        self.log_sigma = math.log(0.03)
        self._x: list[np.ndarray] = []
        self._sa: list[tuple[float, float]] = []
        self._y: list[float] = []
        self._cens: list[bool] = []
        self.fit_result: MemoryFit | None = None
        self._cov = np.diag(self.prior_std**2)

    # ---- data
    def observe(self, c: Candidate, peak_bytes: float, oom: bool) -> None:
        """A finished trial's peak; for an OOM, ``peak_bytes`` is the censoring bound."""
        if oom and not self.censored:
            return
        self._x.append(self.encoder.encode(c))
        self._sa.append(self._components(c))
        self._y.append(math.log(max(peak_bytes, 1.0)))
        self._cens.append(oom)

    def _components(self, c: Candidate) -> tuple[float, float]:
        if self.meta is not None:
            return structural_components(self.meta, c.knobs)
        return (1.0, 1.0) if self.two_terms else (0.0, 0.0)

    @property
    def nonlinear(self) -> bool:
        """A sum of terms (the structural formula's, or the generic two-term model), not one log-linear term."""
        return self.structured or self.two_terms

    @property
    def _workspace(self) -> float:
        """The constant term's scale: the workload's workspace, or without a shape a guess of 5% of capacity."""
        return self.meta.workspace_bytes if self.meta is not None else 0.05 * self.capacity_bytes

    def _two_term_priors(self) -> tuple[np.ndarray, np.ndarray]:
        """Priors of the generic two-term model: peak = exp(φ·u) + exp(φ·v) + W·exp(w).

        A real peak is a sum — model state split by sharding beside activations growing with the batch — and one
        log-linear term misfits it where the optimum is (the batch costs little where states dominate, much
        where activations do). The knowledge base's effects on the whole peak go to the term they act on:
        activation-like settings (batch, recomputation, attention kernels, sequence parallelism) to ``v`` at
        twice their size (activations are about half the peak), state-like ones (ZeRO stage, offload) to ``u``
        likewise, and sharding-like ones (tp, pp, ep, dp) to both. Knobs the table does not know get the same
        loose prior in both terms; the terms differ by their levels (states ~½ of capacity, activations ~¼) and
        by a small fixed tilt of opposite sign on each unknown numeric trend, so the fit can tell them apart."""
        mean1, std1 = self.kb.memory_priors(self.encoder)
        p = self.encoder.dim
        mu_s, sd_s = mean1.copy(), std1.copy()
        mu_a, sd_a = mean1.copy(), std1.copy()
        act = ("micro_batch", "recompute", "flash_attention", "sequence_parallel", "capacity_factor")
        state = ("zero_stage", "offload_optimizer")
        for i, spec in enumerate(self.encoder.specs[1:], start=1):
            base = KnowledgeBase.canonical(spec.name).split("=")[0].split(":")[0]
            known = self.kb.knows_memory(spec)
            if base in act and known:
                mu_a[i], sd_a[i] = 2 * mean1[i], 2 * std1[i]
                mu_s[i], sd_s[i] = 0.0, 0.05
            elif base in state and known:
                mu_s[i], sd_s[i] = 2 * mean1[i], 2 * std1[i]
                mu_a[i], sd_a[i] = 0.0, 0.05
            elif not known and spec.kind == "numeric":
                mu_a[i], mu_s[i] = 0.1, -0.1
        cap = self.capacity_bytes
        mu_s[0], sd_s[0] = math.log(0.5 * cap), 1.0
        mu_a[0], sd_a[0] = math.log(0.25 * cap), 1.0
        assert mu_s.size == p
        return np.concatenate([mu_s, mu_a, [0.0]]), np.concatenate([sd_s, sd_a, [1.0]])

    @property
    def n(self) -> int:
        return len(self._y)

    # ---- mean function and its gradient
    def log_mean_grad(self, theta: np.ndarray, x: np.ndarray, sa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """μ (n,) and dμ/dθ (n, k) of log peak bytes at parameters θ, for encoded rows x (n, p) with structural
        components sa (n, 2) (zeros when the workload shape is unknown). With ``covariance`` it gives the
        delta-method std of any linear contrast of predictions (the modeler's per-setting effects)."""
        if not self.nonlinear:
            return x @ theta, x
        p = x.shape[1]
        u, v, w = theta[:p], theta[p:2 * p], theta[2 * p]
        s_term = sa[:, 0] * np.exp(x @ u)  # (n,)
        a_term = sa[:, 1] * np.exp(x @ v)  # (n,)
        o_term = self._workspace * math.exp(w)
        total = s_term + a_term + o_term
        grad = np.concatenate([x * (s_term / total)[:, None], x * (a_term / total)[:, None],
                               (o_term / total)[:, None]], axis=1)  # (n, 2p+1)
        log_total: np.ndarray = np.log(total)
        return log_total, grad

    def log_mean(self, theta: np.ndarray, x: np.ndarray, sa: np.ndarray) -> np.ndarray:
        """μ of ``log_mean_grad`` without the gradient (a whole pool at once: the gradient is (n, 2p+1))."""
        if not self.nonlinear:
            linear: np.ndarray = x @ theta
            return linear
        p = x.shape[1]
        o_term = self._workspace * math.exp(theta[2 * p])
        log_total: np.ndarray = np.log(sa[:, 0] * np.exp(x @ theta[:p]) + sa[:, 1] * np.exp(x @ theta[p:2 * p]) + o_term)
        return log_total

    # ---- fit
    def _nll_only(self, log_sigma: float, mu: np.ndarray, y: np.ndarray, cens: np.ndarray,
                  theta: np.ndarray) -> float:
        """Negative log posterior for fixed μ (the 1-D σ search)."""
        log_sigma = float(log_sigma)
        r = (y - mu) / math.exp(log_sigma)
        ok = ~cens
        nll = 0.5 * float(np.sum(r[ok] ** 2)) + ok.sum() * log_sigma - float(np.sum(log_ndtr(-r[cens])))
        nll += 0.5 * float(np.sum((theta - self.prior_mean) ** 2 / self.prior_std**2))
        return float(nll + 0.5 * ((log_sigma - self.log_sigma_prior[0]) / self.log_sigma_prior[1]) ** 2)

    def _nll_terms(self, theta: np.ndarray, log_sigma: float, x: np.ndarray, sa: np.ndarray, y: np.ndarray,
                   cens: np.ndarray) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """Negative log posterior and, in θ: gradient, Gauss-Newton Hessian; plus dμ/dθ rows."""
        sigma = math.exp(log_sigma)
        mu, g = self.log_mean_grad(theta, x, sa)
        r = (y - mu) / sigma
        ok = ~cens
        nll = 0.5 * float(np.sum(r[ok] ** 2)) + ok.sum() * log_sigma
        d_mu = np.zeros_like(mu)
        w = np.zeros_like(mu)
        d_mu[ok] = -r[ok] / sigma
        w[ok] = 1.0 / sigma**2
        if cens.any():
            # an OOM says log peak > y: P = Φ((μ - y)/σ)
            zc = -r[cens]
            nll -= float(np.sum(log_ndtr(zc)))
            lam = np.exp(_log_npdf(zc) - log_ndtr(zc))  # inverse Mills ratio
            d_mu[cens] = -lam / sigma
            w[cens] = lam * (lam + zc) / sigma**2
        prior_prec = 1.0 / self.prior_std**2
        diff = theta - self.prior_mean
        nll += 0.5 * float(np.sum(prior_prec * diff**2))
        nll += 0.5 * ((log_sigma - self.log_sigma_prior[0]) / self.log_sigma_prior[1]) ** 2
        grad = g.T @ d_mu + prior_prec * diff
        hess = (g * w[:, None]).T @ g
        hess[np.diag_indices_from(hess)] += prior_prec
        return nll, grad, hess, g

    log_sigma_prior = (math.log(0.03), 0.7)
    log_sigma_bounds = (math.log(0.01), math.log(1.0))

    def fit(self, max_iterations: int = 50, upto: int | None = None) -> MemoryFit:
        """MAP by damped Gauss-Newton in θ (Levenberg-Marquardt) alternating with a 1-D update of log σ,
        warm-started from the previous fit; `fit_lbfgs` is the plain reference optimiser. ``upto``: only the
        first ``upto`` observations (the searcher's refit schedule)."""
        import time

        t0 = time.perf_counter()
        if self.n == 0 or upto == 0:
            self.fit_result = MemoryFit(self.theta, self.log_sigma, np.diag(self.prior_std**2), 0, 0, True)
            self._cov = self.fit_result.cov
            return self.fit_result
        x, sa, y, cens = self._arrays()
        if upto is not None:
            x, sa, y, cens = x[:upto], sa[:upto], y[:upto], cens[:upto]
        theta, ls = self.theta.copy(), self.log_sigma
        damping = 1e-3
        nll, grad, hess, _ = self._nll_terms(theta, ls, x, sa, y, cens)
        converged = False
        for _ in range(max_iterations):
            step = np.linalg.solve(hess + damping * np.diag(np.diag(hess)), grad)
            cand = theta - step
            nll_c, grad_c, hess_c, _ = self._nll_terms(cand, ls, x, sa, y, cens)
            if nll_c <= nll:
                theta, nll, grad, hess = cand, nll_c, grad_c, hess_c
                damping = max(damping / 3, 1e-6)
            else:
                damping *= 10
                if damping > 1e6:
                    break
            # log σ: a few golden-section steps on the exact objective
            mu_fixed, _ = self.log_mean_grad(theta, x, sa)
            res = minimize_scalar(self._nll_only, method="bounded", args=(mu_fixed, y, cens, theta),
                                  bounds=self.log_sigma_bounds, options={"xatol": 0.01})
            moved = abs(res.x - ls)
            ls = float(res.x)
            nll, grad, hess, _ = self._nll_terms(theta, ls, x, sa, y, cens)
            if float(np.max(np.abs(step))) < 1e-4 and moved < 0.01:
                converged = True
                break
        self.theta, self.log_sigma = theta, ls
        self._cov = self._laplace_cov(x, sa, y, cens)
        self.fit_result = MemoryFit(self.theta, self.log_sigma, self._cov, int((~cens).sum()), int(cens.sum()),
                                    converged, time.perf_counter() - t0)
        return self.fit_result

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return np.array(self._x), np.array(self._sa).reshape(-1, 2), np.array(self._y), np.array(self._cens)

    def fit_lbfgs(self, maxiter: int = 2000) -> MemoryFit:
        """Slow reference path: L-BFGS-B on (θ, log σ) jointly with the analytic gradient."""
        x, sa, y, cens = self._arrays()
        k = self.prior_mean.size

        def objective(z: np.ndarray) -> tuple[float, np.ndarray]:
            theta, ls = z[:k], z[k]
            nll, grad, _, _ = self._nll_terms(theta, ls, x, sa, y, cens)
            sigma = math.exp(ls)
            mu, _ = self.log_mean_grad(theta, x, sa)
            r = (y - mu) / sigma
            d_ls = float((~cens).sum() - np.sum(r[~cens] ** 2))
            if cens.any():
                zc = -r[cens]
                lam = np.exp(_log_npdf(zc) - log_ndtr(zc))
                d_ls += float(np.sum(lam * zc))
            d_ls += (ls - self.log_sigma_prior[0]) / self.log_sigma_prior[1] ** 2
            return nll, np.concatenate([grad, [d_ls]])

        z0 = np.concatenate([self.theta, [self.log_sigma]])
        res = minimize(objective, z0, jac=True, method="L-BFGS-B", options={"maxiter": maxiter},
                       bounds=[(None, None)] * k + [self.log_sigma_bounds])
        self.theta, self.log_sigma = res.x[:k].copy(), float(res.x[k])
        self._cov = self._laplace_cov(x, sa, y, cens)
        self.fit_result = MemoryFit(self.theta, self.log_sigma, self._cov, int((~cens).sum()), int(cens.sum()),
                                    bool(res.success))
        return self.fit_result

    def _laplace_cov(self, x: np.ndarray, sa: np.ndarray, y: np.ndarray, cens: np.ndarray) -> np.ndarray:
        """Gauss-Newton Hessian of the negative log posterior in θ at the MAP, inverted."""
        sigma = math.exp(self.log_sigma)
        mu, g = self.log_mean_grad(self.theta, x, sa)
        w = np.full(mu.shape, 1.0 / sigma**2)
        if cens.any():
            zc = (mu[cens] - y[cens]) / sigma
            lam = np.exp(_log_npdf(zc) - log_ndtr(zc))
            w[cens] = lam * (lam + zc) / sigma**2
        h = (g * w[:, None]).T @ g + np.diag(1.0 / self.prior_std**2)
        try:
            return np.linalg.inv(h)
        except np.linalg.LinAlgError:
            return np.linalg.pinv(h)

    # ---- prediction
    @property
    def covariance(self) -> np.ndarray:
        """Laplace posterior covariance of θ (the prior's before any observation)."""
        return self._cov

    def predict_log(self, cs: Sequence[Candidate], x: np.ndarray | None = None,
                    sa: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std (parameter uncertainty + misfit and noise) of log peak bytes; ``x`` and ``sa``: the
        candidates' encoded rows and term scales (``_components``) where the caller has them."""
        if x is None:
            x = self.encoder.encode_many(cs).reshape(len(cs), self.encoder.dim)
        if sa is None:
            sa = np.array([self._components(c) for c in cs]).reshape(len(cs), 2)
        mu, g = self.log_mean_grad(self.theta, x, sa)
        var = np.sum((g @ self._cov) * g, axis=1) + math.exp(2 * self.log_sigma)
        return mu, self.spread_scale * np.sqrt(np.maximum(var, 1e-12))

    def predict_bytes(self, cs: Sequence[Candidate]) -> np.ndarray:
        mu, _ = self.predict_log(cs)
        peak: np.ndarray = np.exp(mu)
        return peak

    def p_oom(self, cs: Sequence[Candidate], x: np.ndarray | None = None) -> np.ndarray:
        mu, sd = self.predict_log(cs, x)
        p: np.ndarray = ndtr((mu - math.log(self.capacity_bytes)) / sd)
        return p

    def prices(self, base: Candidate) -> list[tuple[str, object, float]]:
        """Memory price of each single-knob change from ``base``: (knob, value, predicted Δ log peak).
        Changes are priced whether or not they are feasible alone (a price, not a proposal)."""
        out: list[tuple[str, object, float]] = []
        mu0 = float(self.predict_log([base])[0][0])
        for k in self.space.knobs:
            vals = k.values()
            if vals is None:
                continue
            for v in vals:
                if v == base[k.name]:
                    continue
                c = base.with_knob(k.name, v)
                out.append((k.name, v, float(self.predict_log([c])[0][0]) - mu0))
        for p in self.space.patches:
            c = Candidate.of(base.knobs, base.patches ^ {p.id})
            out.append((f"patch:{p.id}", p.id not in base.patches, float(self.predict_log([c])[0][0]) - mu0))
        return out


def mix_normals(weights: Sequence[float], means: Sequence[np.ndarray], stds: Sequence[np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of the mixture Σ wᵢ·N(meanᵢ, stdᵢ²) (weights summing to 1), elementwise: the mixture's
    variance is the weighted variances plus the spread of the means, so where models disagree it is wider
    than any one of them."""
    w = np.asarray(weights, dtype=float)[:, None]
    mu_i, sd_i = np.stack(means), np.stack(stds)  # (models, n)
    mu: np.ndarray = (w * mu_i).sum(axis=0)
    var = (w * (sd_i**2 + (mu_i - mu) ** 2)).sum(axis=0)
    return mu, np.sqrt(var)


def _log_npdf(z: np.ndarray) -> np.ndarray:
    return -0.5 * z**2 - 0.5 * math.log(2 * math.pi)
