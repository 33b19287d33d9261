"""Verification: interleaved baseline/candidate plans, the paired bootstrap CI, and the promotion decision.

Owns the pure logic of the verify stage (ARCHITECTURE.md §1, §7):

- ``plan_round``: one round = ``repeats`` interleaved pairs A B A B … (A = the untouched baseline,
  B = the candidate) at the verify horizon; trial ids are derived from the verify id, round, pair and arm,
  so a re-planned round has the same ids and JetStream drops the duplicates.
- ``bootstrap_speedup_ci``: speed-up = median(baseline) / median(candidate) with a bootstrap CI that
  resamples *pairs* (position i of A with position i of B — they ran next to each other, so they share
  the drift of the host), seeded, percentile or BCa.
- ``pair_invariants`` / ``decide``: every invariant on every run — telemetry's verdicts, plus the checks
  verify adds against the *paired* baseline run at the longer horizon (loss within ε at every checkpoint,
  no gap to the baseline that grows towards ε over the horizon (``loss.trend``, ``TrendRule``), same
  optimiser steps and tokens, same eval work) — and the round verdict: passed if every invariant holds
  on every run and the CI lower bound is above 1. Promotable after ``passes_required`` passed rounds.
- ``plan_restarts`` / ``restart_check`` (``verify.checkpoint_restart``): after a round's first pair, the
  candidate resumed in a fresh process from that pair's mid-run checkpoint (its own: ``checkpoint.restart``;
  the baseline's: ``checkpoint.across_change``) must continue the uninterrupted candidate run within ε.
- ``downstream_check`` (``verify.downstream``): the contract's evaluation of each pair's final weights, the
  candidate no more than the tolerance worse than its paired baseline.
- ``select_candidates``: the top-K search candidates to verify.

No I/O and no bus here: the verifier service (``infrarsi_services.verifier``) and ``infrarsi verify`` call it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np
from scipy import stats

from infrarsi import events as ev

if TYPE_CHECKING:
    from infrarsi.study.contract import Contract, DownstreamSpec, Invariants

Arm = Literal["baseline", "candidate"]
RestartSource = Literal["candidate", "baseline"]
"""Whose checkpoint a restart trial resumes under the candidate: its own run's, or the paired baseline run's."""
CiMethod = Literal["percentile", "bca", "auto"]

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20240607
CONFIDENCE = 0.95
BASELINE_CANDIDATE = ev.Candidate()
"""The untouched baseline as a candidate: no knob overrides, no patches."""


# --------------------------------------------------------------------------------------------------
# Ids and plans
# --------------------------------------------------------------------------------------------------


def verify_id_for(request_event_id: str, candidate_key: str) -> str:
    """The verification of one candidate of one ``VerifyRequested`` (deterministic, so the CLI can wait on it)."""
    return ev.derived_id(request_event_id, "verify", candidate_key)


def trial_id_for(verify_id: str, round_no: int, pair: int, arm: Arm) -> str:
    return ev.derived_id(verify_id, f"round{round_no}", f"pair{pair}", arm)


def restart_trial_id_for(verify_id: str, round_no: int, source: RestartSource) -> str:
    return ev.derived_id(verify_id, f"round{round_no}", "restart", source)


@dataclass(frozen=True)
class PlannedTrial:
    """One run of a verification plan: the ``TrialProposed`` to publish and where it sits in the plan."""

    trial_id: str
    verify_id: str
    round_no: int
    pair: int
    arm: Arm
    payload: ev.TrialProposed
    resumes: RestartSource | None = None
    """A restart trial (the candidate resumed from this source's checkpoint), not a run of a pair."""


def plan_round(
    verify_id: str,
    candidate: ev.Candidate,
    *,
    round_no: int,
    repeats: int,
    steps: int | None,
) -> list[PlannedTrial]:
    """``repeats`` interleaved pairs A B A B … for round ``round_no`` (1-based), in launch order.

    Interleaving spreads slow drifts of the host (thermal, page cache, a noisy neighbour) over both
    arms instead of charging them to whichever arm ran second.
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    key = candidate.key()
    plan = []
    for pair in range(repeats):
        for arm in ("baseline", "candidate"):
            cand = BASELINE_CANDIDATE if arm == "baseline" else candidate
            payload = ev.TrialProposed(
                candidate=cand,
                candidate_key=cand.key(),
                kind="verify",
                origin="baseline" if arm == "baseline" else "verify",
                reason=f"verify {key} round {round_no} pair {pair + 1}/{repeats} ({arm})",
                repeat=(round_no - 1) * repeats + pair,
                steps=steps,
                verify_id=verify_id,
            )
            plan.append(
                PlannedTrial(trial_id_for(verify_id, round_no, pair, arm), verify_id, round_no, pair, arm, payload)
            )
    return plan


def plan_restarts(
    verify_id: str,
    candidate: ev.Candidate,
    *,
    round_no: int,
    sources: dict[RestartSource, str],
    steps: int | None,
) -> list[PlannedTrial]:
    """Round ``round_no``'s restart trials: the candidate, in a fresh process, resumed from the checkpoint the
    trial ``sources[source]`` saved mid-run (``TrialProposed.resume_from``), run to the verify horizon."""
    key = candidate.key()
    plan = []
    for source, from_trial in sources.items():
        payload = ev.TrialProposed(
            candidate=candidate,
            candidate_key=key,
            kind="verify",
            origin="verify",
            reason=f"verify {key} round {round_no}: resume the {source} run's checkpoint under the candidate",
            repeat=round_no - 1,
            steps=steps,
            verify_id=verify_id,
            resume_from=from_trial,
        )
        trial_id = restart_trial_id_for(verify_id, round_no, source)
        plan.append(PlannedTrial(trial_id, verify_id, round_no, 0, "candidate", payload, resumes=source))
    return plan


# --------------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunMeasurement:
    """What verify needs of one run, from its ``TrialMeasured`` (or its ``TrialFinished`` if it died)."""

    trial_id: str
    arm: Arm
    pair: int
    status: ev.TrialStatus
    step_time_s: float | None = None
    mfu: float | None = None
    optimizer_steps: int | None = None
    tokens: int | None = None
    loss_curve: tuple[ev.LossPoint, ...] = ()
    eval_curve: tuple[ev.LossPoint, ...] = ()
    invariants: tuple[ev.InvariantResult, ...] = ()
    reason: str = ""
    coarse: bool = False
    """Measured from outside (no probe): tokens and evals only as its output and the contract give them, and a
    loss curve only when the job printed one (``loss_from_log``)."""
    loss_from_log: bool = False
    """Coarse: the loss curves were read from the job's printed output."""
    unchecked: tuple[str, ...] = ()
    """Invariants telemetry could not check on this run."""
    deterministic: bool | None = None
    """Torch's deterministic algorithms on at every step the probe reported (``None``: not said)."""
    downstream: ev.DownstreamResult | None = None
    """The downstream evaluation of this run's final weights (``verify.downstream``), from its ``TrialFinished``."""

    @property
    def usable(self) -> bool:
        return self.status == "ok" and self.step_time_s is not None and self.step_time_s > 0

    @classmethod
    def from_measured(cls, trial_id: str, arm: Arm, pair: int, m: ev.TrialMeasured) -> RunMeasurement:
        return cls(
            trial_id=trial_id,
            arm=arm,
            pair=pair,
            status=m.status,
            step_time_s=m.step_time_s,
            mfu=m.mfu,
            optimizer_steps=m.optimizer_steps,
            tokens=m.tokens,
            loss_curve=tuple(m.loss_curve),
            eval_curve=tuple(m.eval_curve),
            invariants=tuple(m.invariants),
            coarse=m.coarse,
            loss_from_log=m.loss_from_log,
            unchecked=tuple(u.name for u in m.unchecked_invariants),
            deterministic=m.deterministic,
        )

    @classmethod
    def from_finished(cls, trial_id: str, arm: Arm, pair: int, f: ev.TrialFinished) -> RunMeasurement:
        return cls(trial_id=trial_id, arm=arm, pair=pair, status=f.status, reason=f.reason, downstream=f.downstream)


# --------------------------------------------------------------------------------------------------
# Bootstrap
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeedupCI:
    speedup: float
    low: float
    high: float
    method: str
    n_pairs: int


def _ratio_of_medians(baseline: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """Row-wise median(baseline) / median(candidate); inputs (B, n)."""
    ratios: np.ndarray = np.median(baseline, axis=-1) / np.median(candidate, axis=-1)  # (B,)
    return ratios


def bootstrap_speedup_ci(
    baseline_s: Sequence[float],
    candidate_s: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
    method: CiMethod = "auto",
) -> SpeedupCI:
    """Speed-up median(A)/median(B) with a paired bootstrap CI (pairs resampled together by position).

    ``auto`` uses BCa from 5 pairs up and the percentile interval below: with 2–4 pairs the jackknife
    behind BCa's acceleration has too few points to mean anything. With few pairs the percentile
    interval is deliberately conservative: with 3 pairs, 1/27 of resamples repeat the worst pair three
    times, so the 2.5% bound is that pair's own ratio.
    """
    a = np.asarray(baseline_s, dtype=float)  # (n,)
    b = np.asarray(candidate_s, dtype=float)  # (n,)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"need equal, non-empty paired samples, got {a.size} and {b.size}")
    n = a.size
    point = float(np.median(a) / np.median(b))
    if n == 1:
        return SpeedupCI(point, point, point, "single-pair", 1)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))  # (B, n) pair indices
    boot = _ratio_of_medians(a[idx], b[idx])  # (B,)
    alpha = 1.0 - confidence
    chosen = ("bca" if n >= 5 else "percentile") if method == "auto" else method
    lo_q, hi_q = alpha / 2, 1 - alpha / 2
    if chosen == "bca":
        # Work on the log scale, where the ratio is a difference and the distribution nearer symmetric.
        log_boot = np.log(boot)
        log_point = math.log(point)
        frac_below = float(np.mean(log_boot < log_point))
        jack = np.array([math.log(np.median(np.delete(a, i)) / np.median(np.delete(b, i))) for i in range(n)])
        d = jack.mean() - jack
        denom = 6.0 * float(np.sum(d**2)) ** 1.5
        if 0.0 < frac_below < 1.0 and denom > 0:
            z0 = stats.norm.ppf(frac_below)
            acc = float(np.sum(d**3)) / denom
            z = stats.norm.ppf([lo_q, hi_q])
            adj = stats.norm.cdf(z0 + (z0 + z) / (1 - acc * (z0 + z)))
            lo_q, hi_q = float(adj[0]), float(adj[1])
        else:
            chosen = "percentile"  # degenerate bootstrap distribution: BCa's bias term is infinite
    low, high = np.quantile(boot, [lo_q, hi_q])
    return SpeedupCI(point, float(low), float(high), chosen, n)


# --------------------------------------------------------------------------------------------------
# Invariants at verify
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrendRule:
    """When a loss gap that grows step after step fails (``loss.trend``), though every point is inside ε.

    The gap at each compared step, in units of that step's ε, is ``r = (candidate − baseline) / ε``. An
    ordinary least-squares line ``r ≈ a + b·step`` is fitted over the compared steps and extrapolated to
    ``horizon_multiple`` × the last compared step. The candidate fails when the extrapolated gap is beyond
    ε (``|r̂| > 1``) *and* the one-sided t-test that the slope points away from zero (the sign of ``r̂``)
    rejects a flat gap at level ``alpha``. Both are needed: the extrapolation alone would fail a candidate
    whose gap merely wobbles, the test alone one whose gap grows by a harmless 1e-6 per step.
    """

    horizon_multiple: float = 2.0
    """Extrapolate the fitted gap to this multiple of the verify horizon (the last compared step)."""
    alpha: float = 0.05
    """One-sided level of the slope test."""
    min_points: int = 6
    """Fewer compared steps than this: the trend is unchecked (named, never passed)."""


@dataclass(frozen=True)
class ParityRule:
    """The contract's numeric parity mode (``invariants.parity``), checked at verify as ``loss.parity``.

    ``tight``: every baseline step (train and eval) is in the candidate's curve with
    ``|Δ| ≤ max_abs + max_rel·|baseline|``. ``bitwise``: every one is exactly equal, and both runs of the pair
    reported torch's deterministic algorithms on at every step (``parity.deterministic``)."""

    mode: Literal["none", "tight", "bitwise"] = "none"
    max_abs: float = 1e-6
    max_rel: float = 1e-4


@dataclass(frozen=True)
class LossRule:
    """The contract's loss invariant: tolerance, relative (fraction of the baseline loss) or absolute."""

    tolerance: float = 0.02
    mode: Literal["relative", "absolute"] = "relative"
    trend: TrendRule | None = TrendRule()
    """The divergence check over the horizon; ``None`` = off."""
    parity: ParityRule = ParityRule()
    """Numeric parity beyond ε (off by default)."""
    eval_only_when_coarse: bool = False
    """The contract compares the loss at every eval (``invariants.loss.at: every_eval``): a coarse pair whose
    baseline printed eval losses is compared on those (and their trend) only. A job measured from outside
    prints the train loss of whichever batches it drew, and a candidate that deals the same samples in
    another order (LitGPT's litdata at another micro-batch) trains on other batches first: its per-step train
    loss differs by the batches' noise while its held-out loss does not (docs/own-job.md)."""

    def allowed(self, baseline_loss: float) -> float:
        return self.tolerance * abs(baseline_loss) if self.mode == "relative" else self.tolerance


def loss_rule_of(invariants: Invariants) -> LossRule:
    """The contract's ``invariants.loss`` and ``invariants.parity`` as the verifier's rule."""
    loss, trend, tight = invariants.loss, invariants.loss.trend, invariants.parity_tight
    return LossRule(
        tolerance=loss.tolerance,
        mode=loss.mode,
        trend=None if trend is None else TrendRule(trend.horizon_multiple, trend.alpha, trend.min_points),
        parity=ParityRule(invariants.parity, tight.max_abs, tight.max_rel),
        eval_only_when_coarse=loss.at == "every_eval",
    )


@dataclass(frozen=True)
class GapTrend:
    """The fitted trend of a candidate's loss gap to its paired baseline, in units of ε (``TrendRule``)."""

    points: int
    slope_per_step: float
    """d(gap/ε)/d(step)."""
    gap_last: float
    """The fitted gap/ε at the last compared step."""
    projected_step: float
    projected_gap: float
    """The fitted gap/ε at ``projected_step`` (= horizon_multiple × last compared step)."""
    p_value: float
    """One-sided: P(a slope this far from zero, pointing away from zero, | the gap is flat)."""

    def diverges(self, rule: TrendRule) -> bool:
        return abs(self.projected_gap) > 1.0 and self.p_value < rule.alpha


def gap_trend(
    base: Sequence[ev.LossPoint], cand: Sequence[ev.LossPoint], loss: LossRule, trend: TrendRule
) -> GapTrend | None:
    """The least-squares trend of (candidate − baseline)/ε over the steps both curves have (finite values
    and ε > 0 only); ``None`` below ``trend.min_points`` such steps."""
    b = {p.step: p.loss for p in base}
    steps_, gaps_ = [], []
    for p in sorted(cand, key=lambda q: q.step):
        if p.step not in b or not (math.isfinite(p.loss) and math.isfinite(b[p.step])):
            continue
        allowed = loss.allowed(b[p.step])
        if allowed <= 0:
            continue
        steps_.append(float(p.step))
        gaps_.append((p.loss - b[p.step]) / allowed)
    n = len(steps_)
    if n < max(trend.min_points, 3):
        return None
    x = np.asarray(steps_)  # (n,)
    r = np.asarray(gaps_)  # (n,) gap in units of ε
    sxx = float(np.sum((x - x.mean()) ** 2))
    if sxx <= 0:
        return None
    slope = float(np.sum((x - x.mean()) * (r - r.mean())) / sxx)
    intercept = float(r.mean() - slope * x.mean())
    resid = r - (intercept + slope * x)  # (n,)
    se = math.sqrt(float(np.sum(resid**2)) / (n - 2) / sxx)
    last = float(x[-1])
    projected_step = trend.horizon_multiple * last
    projected = intercept + slope * projected_step
    away = math.copysign(1.0, projected) * slope  # > 0: the gap grows in magnitude
    if se > 0:
        p_value = float(stats.t.sf(away / se, df=n - 2))
    else:  # an exact line: a non-zero slope away from zero is certain, a flat one is not a trend
        p_value = 0.0 if away > 0 else 1.0
    return GapTrend(n, slope, intercept + slope * last, projected_step, projected, p_value)


def _trend_check(
    what: str, base: Sequence[ev.LossPoint], cand: Sequence[ev.LossPoint], loss: LossRule, trend: TrendRule
) -> ev.InvariantResult | None:
    fit = gap_trend(base, cand, loss, trend)
    if fit is None:
        return None
    ok = not fit.diverges(trend)
    return ev.InvariantResult(
        name="loss.trend",
        ok=ok,
        detail=(
            f"{what}: gap/ε {fit.gap_last:+.3f} at the last of {fit.points} steps, slope {fit.slope_per_step:+.3g}/step"
            f" (one-sided p={fit.p_value:.3g}), projected {fit.projected_gap:+.3f} at step {fit.projected_step:g}"
            f" ({trend.horizon_multiple:g}× the horizon); fails when |projected| > 1 and p < {trend.alpha:g}"
        ),
        observed=abs(fit.projected_gap),
        expected=0.0,
        tolerance=1.0,
    )


def _curve_check(
    name: Literal["loss"],
    what: str,
    base: Sequence[ev.LossPoint],
    cand: Sequence[ev.LossPoint],
    rule: LossRule,
    *,
    require_all: bool = True,
) -> ev.InvariantResult:
    """Every checkpoint of the baseline curve must lie within ε in the candidate's (and exist there, when
    ``require_all``; eval checkpoints that are missing are ``work.eval``'s finding, not a second ``loss``)."""
    b = {p.step: p.loss for p in base}
    c = {p.step: p.loss for p in cand}
    missing = sorted(set(b) - set(c))
    if not require_all:
        b = {s: v for s, v in b.items() if s in c}
    elif missing:
        return ev.InvariantResult(
            name=name, ok=False, detail=f"{what}: candidate lacks checkpoints {missing[:5]}", observed=float(len(missing))
        )
    worst_step, worst_excess, worst_dev, worst_allowed = None, -math.inf, 0.0, 0.0
    for step, loss in sorted(b.items()):
        dev = abs(c[step] - loss)
        allowed = rule.allowed(loss)
        if not math.isfinite(c[step]):
            dev = math.inf
        if dev - allowed > worst_excess:
            worst_step, worst_excess, worst_dev, worst_allowed = step, dev - allowed, dev, allowed
    if worst_step is None:
        return ev.InvariantResult(name=name, ok=True, detail=f"{what}: no checkpoints to compare")
    ok = worst_excess <= 0
    return ev.InvariantResult(
        name=name,
        ok=ok,
        detail=f"{what}: worst |Δ|={worst_dev:.4g} at step {worst_step} (allowed {worst_allowed:.4g})",
        observed=worst_dev if math.isfinite(worst_dev) else None,
        expected=b[worst_step],
        tolerance=worst_allowed,
    )


def _parity_check(
    base: RunMeasurement, cand: RunMeasurement, parity: ParityRule
) -> ev.InvariantResult:
    """``loss.parity``: every baseline step (train, then eval) in the candidate's curve within the parity
    mode's tolerance (exactly equal under ``bitwise``), over the whole horizon; the evidence is the largest
    absolute and relative deviation and where the first step out of tolerance is."""
    bitwise = parity.mode == "bitwise"
    max_abs = max_rel = 0.0
    first_bad: str | None = None
    compared = 0
    for what, b_curve, c_curve in (("train", base.loss_curve, cand.loss_curve), ("eval", base.eval_curve, cand.eval_curve)):
        c = {p.step: p.loss for p in c_curve}
        for p in b_curve:
            if p.step not in c:
                first_bad = first_bad or f"{what} step {p.step} missing from the candidate"
                continue
            compared += 1
            dev = abs(c[p.step] - p.loss)
            if not math.isfinite(dev):
                dev = math.inf
            rel = dev / abs(p.loss) if p.loss else (0.0 if dev == 0 else math.inf)
            max_abs, max_rel = max(max_abs, dev), max(max_rel, rel)
            ok = c[p.step] == p.loss if bitwise else dev <= parity.max_abs + parity.max_rel * abs(p.loss)
            if not ok and first_bad is None:
                first_bad = f"{what} step {p.step}: {c[p.step]!r} vs {p.loss!r}"
    allowed = "identical" if bitwise else f"|Δ| ≤ {parity.max_abs:g} + {parity.max_rel:g}·|baseline|"
    detail = (
        f"{parity.mode}: max |Δ| {max_abs:.3g}, max relative {max_rel:.3g} over {compared} steps ({allowed})"
        + (f"; first out: {first_bad}" if first_bad else "")
    )
    return ev.InvariantResult(
        name="loss.parity", ok=first_bad is None, detail=detail,
        observed=max_abs if math.isfinite(max_abs) else None, expected=0.0,
        tolerance=0.0 if bitwise else parity.max_abs,
    )


def _determinism_check(base: RunMeasurement, cand: RunMeasurement) -> ev.InvariantResult:
    """``parity.deterministic``: under ``bitwise`` both runs of the pair kept torch's deterministic algorithms on
    at every step; a run that turned them off, or whose probe never said, is refused."""
    said = {"baseline": base.deterministic, "candidate": cand.deterministic}
    bad = [f"{arm} {'had them off at some step' if v is False else 'never reported them'}" for arm, v in said.items() if v is not True]
    return ev.InvariantResult(
        name="parity.deterministic", ok=not bad,
        detail="deterministic algorithms on at every step of both runs" if not bad
        else "bitwise parity needs deterministic algorithms: " + "; ".join(bad),
    )


def coarse_pair_unchecked(run: RunMeasurement) -> tuple[str, ...]:
    """What a coarse run leaves unchecked at verify: the loss (and its trend) unless its curve was read from
    the job's log; its tokens and evals where telemetry could not check them on the run (nothing printed and
    nothing stated in the contract: ``stats.measure_coarse``)."""
    return (() if run.loss_from_log else ("loss",)) + tuple(n for n in ("work.tokens", "work.eval") if n in run.unchecked)


def pair_invariants(baseline: RunMeasurement, candidate: RunMeasurement, rule: LossRule) -> list[ev.InvariantResult]:
    """What verify checks of a candidate run against the baseline run it was paired with.

    A coarse pair (a job without a probe) compares what both runs' outputs gave: the optimiser steps counted,
    the tokens (printed, or derived from the steps and what the contract states), the steps after which an
    eval loss was printed, and the loss curves read from the job's log (and their trend); the rest is
    unchecked (``coarse_pair_unchecked``), never compared as empty."""
    if baseline.coarse or candidate.coarse:
        out = []
        either = baseline.unchecked + candidate.unchecked
        if "work.optimizer_steps" not in either:
            out.append(_steps_pair_check(baseline, candidate))
        if "work.tokens" not in either and baseline.tokens and candidate.tokens is not None:
            out.append(_tokens_pair_check(baseline, candidate))
        if "work.eval" not in either and _checked(baseline, "work.eval") and _checked(candidate, "work.eval"):
            out.append(_eval_pair_check(baseline, candidate))
        if baseline.loss_from_log and candidate.loss_from_log:
            out += _loss_pair_checks(baseline, candidate, rule)
        return out
    out = _loss_pair_checks(baseline, candidate, rule)
    if rule.parity.mode != "none":
        out.append(_parity_check(baseline, candidate, rule.parity))
    if rule.parity.mode == "bitwise":
        out.append(_determinism_check(baseline, candidate))
    out.append(_steps_pair_check(baseline, candidate))
    out.append(_tokens_pair_check(baseline, candidate))
    out.append(_eval_pair_check(baseline, candidate))
    return out


def _checked(run: RunMeasurement, name: str) -> bool:
    """Telemetry gave a verdict on ``name`` for this run."""
    return any(r.name == name for r in run.invariants)


def _count_pair_check(name: ev.InvariantName, what: str, baseline: int | None, candidate: int | None) -> ev.InvariantResult:
    """A work count of the candidate run (``what``: optimizer steps, tokens) equal to its baseline run's."""
    return ev.InvariantResult(
        name=name,
        ok=candidate == baseline,
        detail=f"{what} {candidate} vs baseline {baseline}",
        observed=_num(candidate),
        expected=_num(baseline),
    )


def _steps_pair_check(baseline: RunMeasurement, candidate: RunMeasurement) -> ev.InvariantResult:
    return _count_pair_check("work.optimizer_steps", "optimizer steps", baseline.optimizer_steps,
                             candidate.optimizer_steps)  # fmt: skip


def _tokens_pair_check(baseline: RunMeasurement, candidate: RunMeasurement) -> ev.InvariantResult:
    return _count_pair_check("work.tokens", "tokens", baseline.tokens, candidate.tokens)


def _eval_pair_check(baseline: RunMeasurement, candidate: RunMeasurement) -> ev.InvariantResult:
    b_evals = [p.step for p in baseline.eval_curve]
    c_evals = [p.step for p in candidate.eval_curve]
    return ev.InvariantResult(
        name="work.eval",
        ok=b_evals == c_evals,
        detail=f"{len(c_evals)} evals vs baseline {len(b_evals)}"
        + ("" if b_evals == c_evals else f" (steps {c_evals[:5]} vs {b_evals[:5]})"),
        observed=float(len(c_evals)),
        expected=float(len(b_evals)),
    )


def _loss_pair_checks(baseline: RunMeasurement, candidate: RunMeasurement, rule: LossRule) -> list[ev.InvariantResult]:
    """The train loss curve (and the eval curve, where the baseline has one) with their trends; a coarse
    baseline that printed no train loss is not compared on an empty curve, and a coarse pair under
    ``eval_only_when_coarse`` is compared on its printed eval losses alone."""
    out = []
    eval_only = rule.eval_only_when_coarse and (baseline.coarse or candidate.coarse) and bool(baseline.eval_curve)
    if (baseline.loss_curve or not baseline.coarse) and not eval_only:
        out.append(_curve_check("loss", "train loss", baseline.loss_curve, candidate.loss_curve, rule))
    if baseline.eval_curve:
        out.append(
            _curve_check("loss", "eval loss", baseline.eval_curve, candidate.eval_curve, rule, require_all=False)
        )
    if rule.trend is not None:
        for what, base_curve, cand_curve in (
            *((("train loss", baseline.loss_curve, candidate.loss_curve),) if not eval_only else ()),
            ("eval loss", baseline.eval_curve, candidate.eval_curve),
        ):
            trend = _trend_check(what, base_curve, cand_curve, rule, rule.trend)
            if trend is not None:
                out.append(trend)
    return out


def _num(value: int | None) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class ExtraChecks:
    """Verify's checks beyond the pairs' own: ``verify.checkpoint_restart`` and ``verify.downstream``."""

    restart_at: int | None = None
    """Optimiser steps in the mid-run checkpoint the restart trials resume from; ``None``: no restart check."""
    across_change: bool = False
    """Also resume the baseline run's checkpoint under the candidate (``checkpoint.across_change``)."""
    downstream: DownstreamSpec | None = None

    def restart_sources(self) -> tuple[RestartSource, ...]:
        if self.restart_at is None:
            return ()
        return ("candidate", "baseline") if self.across_change else ("candidate",)


RESTART_INVARIANT: dict[RestartSource, ev.InvariantName] = {"candidate": "checkpoint.restart", "baseline": "checkpoint.across_change"}


def restart_check(
    source: RestartSource, uninterrupted: RunMeasurement, resumed: RunMeasurement | None, rule: LossRule, at_step: int
) -> ev.InvariantResult:
    """A restart trial against the uninterrupted candidate run it continues: it must start at the checkpoint's
    step and report every later step the uninterrupted run did (train and eval), each within the loss
    invariant's ε. ``observed`` is the largest gap in units of ε (``tolerance`` 1.0)."""
    name = RESTART_INVARIANT[source]
    whose = "its own run's" if source == "candidate" else "the baseline run's"
    where = f"resumed from {whose} checkpoint after {at_step} steps"

    def failed(detail: str, observed: float | None = None) -> ev.InvariantResult:
        return ev.InvariantResult(name=name, ok=False, detail=f"{where}: {detail}", observed=observed, tolerance=1.0)

    if resumed is None:
        return failed("no restart run reported")
    # Telemetry's verdicts on the restart trial (its steps owed, its timing) are not its restart verdict: an
    # ``invariant_violation`` there still leaves its curve to compare here.
    if resumed.status not in ("ok", "invariant_violation"):
        return failed(f"the resumed run ended {resumed.status}: {resumed.reason or 'no reason given'}")
    steps = sorted(p.step for p in resumed.loss_curve)
    if not steps:
        return failed("the resumed run reported no loss")
    if steps[0] != at_step:
        return failed(f"its first step is {steps[0]}, not {at_step}: it did not continue from the checkpoint")
    worst, worst_at, compared, missing, beyond = 0.0, "", 0, [], []
    for what, reference, curve in (
        ("train", uninterrupted.loss_curve, resumed.loss_curve),
        ("eval", uninterrupted.eval_curve, resumed.eval_curve),
    ):
        got = {p.step: p.loss for p in curve}
        for point in reference:
            if point.step < at_step:
                continue
            if point.step not in got:
                missing.append(f"{what} {point.step}")
                continue
            gap = abs(got[point.step] - point.loss)
            allowed = rule.allowed(point.loss)
            ratio = gap / allowed if allowed > 0 and math.isfinite(gap) else (0.0 if gap == 0 else math.inf)
            compared += 1
            if ratio > 1.0:
                beyond.append((point.step, what))
            if ratio > worst or not worst_at:
                worst = ratio
                worst_at = f"{what} loss at step {point.step}: {got[point.step]:.6g} vs {point.loss:.6g} uninterrupted"
    if missing:
        return failed(f"the resumed run lacks steps the uninterrupted run has ({', '.join(missing[:5])})")
    if compared == 0:
        return failed("no step after the checkpoint to compare")
    detail = f"{where}: {compared} steps compared, largest gap {worst:.3g} ε ({worst_at})"
    if beyond:
        step, what = min(beyond)
        detail += f"; {len(beyond)} beyond ε, the first at {what} step {step}"
    return ev.InvariantResult(name=name, ok=worst <= 1.0, detail=detail, observed=worst, tolerance=1.0)


def downstream_check(baseline: RunMeasurement, candidate: RunMeasurement, spec: DownstreamSpec) -> ev.InvariantResult:
    """The candidate's downstream metric against its paired baseline run's, within ``spec``'s tolerance.
    ``observed`` is how much worse the candidate is (negative: better), ``tolerance`` what is allowed."""
    results = {"candidate": candidate.downstream, "baseline": baseline.downstream}
    for arm, result in results.items():
        if result is None:
            return ev.InvariantResult(name="downstream", ok=False,
                                      detail=f"the {arm} run's final weights were not evaluated (no result)")  # fmt: skip
        if result.value is None:
            return ev.InvariantResult(name="downstream", ok=False,
                                      detail=f"the {arm} run's evaluation gave no {spec.metric}: {result.error}")  # fmt: skip
    b, c = baseline.downstream, candidate.downstream
    assert b is not None and c is not None and b.value is not None and c.value is not None  # checked above
    worse = spec.worse_by(b.value, c.value)
    allowed = spec.allowed(b.value)
    better = "higher" if spec.higher_is_better else "lower"
    relative = f" ({worse / abs(b.value):+.2%} of it)" if b.value else ""
    limit = f"{spec.tolerance:.2%} relative" if spec.mode == "relative" else f"{spec.tolerance:g} absolute"
    return ev.InvariantResult(
        name="downstream",
        ok=worse <= allowed,
        detail=f"{spec.metric} {c.value:.6g} vs baseline {b.value:.6g}: worse by {worse:.4g}{relative}, "
        f"allowed {limit} ({better} is better)",
        observed=worse,
        tolerance=allowed,
    )


# Telemetry judges a verify *baseline* run against the study's trial-horizon baseline; of those verdicts
# only the ones about the measurement itself (timing, scope) say something about a baseline run.
_BASELINE_ARM_INVARIANTS = frozenset({"timing", "scope"})


# --------------------------------------------------------------------------------------------------
# The decision
# --------------------------------------------------------------------------------------------------


@dataclass
class Round:
    """One round's runs of one candidate."""

    verify_id: str
    candidate: ev.Candidate
    round_no: int
    repeats: int
    runs: dict[str, RunMeasurement] = field(default_factory=dict)
    """By trial id (the pairs' runs)."""
    restarts_expected: int = 0
    """Restart trials planned (``plan_restarts``) once the first pair was in."""
    restarts: dict[RestartSource, RunMeasurement] = field(default_factory=dict)
    """The restart trials' runs, by whose checkpoint they resumed."""

    def complete(self) -> bool:
        return len(self.runs) >= 2 * self.repeats and len(self.restarts) >= self.restarts_expected

    def first_pair(self) -> dict[Arm, RunMeasurement]:
        return {run.arm: run for run in self.runs.values() if run.pair == 0}


def decide(
    round_: Round,
    *,
    passes_before: int,
    passes_required: int,
    loss_rule: LossRule,
    checks: ExtraChecks = ExtraChecks(),
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> ev.VerifyCompleted:
    """The ``VerifyCompleted`` of one finished round.

    Round passes ⇔ every run finished ok, every invariant holds on every run (telemetry's verdicts and the
    paired checks), and the CI's lower bound > 1. ``passes`` counts passed rounds so far; the candidate is
    promotable once ``passes >= passes_required``. Invariants no run could check (coarse runs of a job
    without a probe; timing over too few steady steps) are listed in ``unchecked_invariants``; the round is
    judged on the others. One held on some runs and unchecked on others says so in its detail.
    """
    by_pair: dict[int, dict[Arm, RunMeasurement]] = {}
    for run in round_.runs.values():
        by_pair.setdefault(run.pair, {})[run.arm] = run
    verdicts: dict[str, list[tuple[str, ev.InvariantResult]]] = {}
    failed_runs: list[str] = []

    def note(where: str, result: ev.InvariantResult) -> None:
        verdicts.setdefault(result.name, []).append((where, result))

    unchecked: set[str] = set()
    unchecked_runs: dict[str, int] = {}
    for run in sorted(round_.runs.values(), key=lambda r: (r.pair, r.arm)):
        where = f"pair {run.pair + 1} {run.arm}"
        for name in run.unchecked:
            if run.arm == "candidate" or name in _BASELINE_ARM_INVARIANTS:
                unchecked.add(name)
                unchecked_runs[name] = unchecked_runs.get(name, 0) + 1
        if run.coarse:
            from_log = run.loss_from_log
            unchecked.update(coarse_pair_unchecked(run) + (("loss.trend",) if loss_rule.trend is not None and not from_log else ()))
            unchecked.update({"none": (), "tight": ("loss.parity",),
                              "bitwise": ("loss.parity", "parity.deterministic")}[loss_rule.parity.mode])
        if run.status != "ok":
            failed_runs.append(f"run.{run.status}")
        for result in run.invariants:
            if run.arm == "candidate" or result.name in _BASELINE_ARM_INVARIANTS:
                note(where, result)
    a_times: list[float] = []
    b_times: list[float] = []
    a_mfu: list[float] = []
    b_mfu: list[float] = []
    for pair in sorted(by_pair):
        arms = by_pair[pair]
        base, cand = arms.get("baseline"), arms.get("candidate")
        if base is None or cand is None or not (base.usable and cand.usable):
            continue
        assert base.step_time_s is not None and cand.step_time_s is not None  # both usable
        paired = pair_invariants(base, cand, loss_rule)
        if checks.downstream is not None:
            paired.append(downstream_check(base, cand, checks.downstream))
        for result in paired:
            note(f"pair {pair + 1}", result)
        compares_loss = not (base.coarse or cand.coarse) or (base.loss_from_log and cand.loss_from_log)
        if loss_rule.trend is not None and compares_loss:
            if not any(r.name == "loss.trend" for r in paired):
                unchecked.add("loss.trend")  # too few compared steps to fit a trend
        a_times.append(base.step_time_s)
        b_times.append(cand.step_time_s)
        if base.mfu is not None:
            a_mfu.append(base.mfu)
        if cand.mfu is not None:
            b_mfu.append(cand.mfu)

    first_pair = round_.first_pair()
    for source in checks.restart_sources():
        name = RESTART_INVARIANT[source]
        uninterrupted, origin = first_pair.get("candidate"), first_pair.get(source)
        if uninterrupted is None or origin is None or not (uninterrupted.usable and origin.usable):
            continue  # a run of the first pair failed: named as run.<status>, nothing was resumed
        if uninterrupted.coarse:
            unchecked.add(name)  # no loss curve to continue
            continue
        assert checks.restart_at is not None  # restart_sources() is empty without it
        note("pair 1", restart_check(source, uninterrupted, round_.restarts.get(source), loss_rule, checks.restart_at))

    invariants = []
    failed: list[str] = []
    for name in sorted(verdicts):
        results = verdicts[name]
        bad = [(w, r) for w, r in results if not r.ok]
        if bad:
            failed.append(name)
            where, first = bad[0]
            detail = f"failed on {len(bad)}/{len(results)} checks; first: {where}: {first.detail}"
            invariants.append(ev.InvariantResult(
                name=first.name, ok=False, detail=detail,
                observed=first.observed, expected=first.expected, tolerance=first.tolerance,
            ))
        else:
            also = f"; not checked on {unchecked_runs[name]} run(s)" if name in unchecked_runs else ""
            where, closest = _closest(results)
            invariants.append(ev.InvariantResult(
                name=closest.name, ok=True, detail=f"held on {len(results)} checks{also}; closest: {where}: {closest.detail}",
                observed=closest.observed, expected=closest.expected, tolerance=closest.tolerance,
            ))
    for run_failure in sorted(set(failed_runs)):
        failed.append(run_failure)

    if a_times:
        ci = bootstrap_speedup_ci(a_times, b_times, resamples=resamples, seed=seed)
        speedup, low, high = ci.speedup, ci.low, ci.high
        base_s, cand_s = float(np.median(a_times)), float(np.median(b_times))
    else:
        speedup = low = high = base_s = cand_s = 0.0  # nothing comparable: reads as "no speed-up shown"
    passed = not failed and low > 1.0
    passes = passes_before + (1 if passed else 0)
    return ev.VerifyCompleted(
        verify_id=round_.verify_id,
        candidate=round_.candidate,
        candidate_key=round_.candidate.key(),
        passes=passes,
        promotable=passed and passes >= passes_required,
        speedup=speedup,
        ci_low=low,
        ci_high=high,
        baseline_step_s=base_s,
        candidate_step_s=cand_s,
        mfu_before=float(np.median(a_mfu)) if a_mfu else None,
        mfu_after=float(np.median(b_mfu)) if b_mfu else None,
        invariants=invariants,
        failed_invariants=failed,
        trial_ids=sorted(round_.runs, key=lambda t: (round_.runs[t].pair, round_.runs[t].arm)),
        unchecked_invariants=sorted(unchecked - set(verdicts)),
    )


def _closest(results: list[tuple[str, ev.InvariantResult]]) -> tuple[str, ev.InvariantResult]:
    """The held check nearest its limit (largest observed / tolerance, else largest observed deviation from
    expected), so a held invariant keeps its evidence: how much room was left, and where."""

    def margin(item: tuple[str, ev.InvariantResult]) -> float:
        r = item[1]
        if r.observed is None:
            return -math.inf
        if r.tolerance:
            return abs(r.observed) / r.tolerance
        return abs(r.observed - (r.expected or 0.0))

    return max(results, key=margin)


def round_passed(done: ev.VerifyCompleted) -> bool:
    """Whether the round a ``VerifyCompleted`` reports passed (the event carries the inputs, not a flag)."""
    return not done.failed_invariants and done.ci_low > 1.0


def is_final(done: ev.VerifyCompleted) -> bool:
    """The last ``VerifyCompleted`` of a verification: promotable, or a round failed (which ends it)."""
    return done.promotable or not round_passed(done)


# --------------------------------------------------------------------------------------------------
# What verification will cost
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyCost:
    """The accelerator time a verification will take at most, predicted before it starts: every round passes
    (a failed round ends a verification early), every run takes the doctor's baseline step time."""

    candidates: int
    rounds: int
    """``verify.passes_required``: rounds a promotable candidate runs."""
    repeats: int
    """Interleaved pairs per round."""
    steps: int
    """The verify horizon, ``workload.verify_steps``."""
    step_time_s: float
    """The doctor's robust step time of the untouched baseline."""
    accelerators: int
    """Devices one run holds (nodes × devices per node)."""
    restarts: int = 0
    """Restart trials per round (``verify.checkpoint_restart``: 1, or 2 ``across_change``)."""
    restart_steps: int = 0
    """Steps a restart trial runs: from the checkpoint to the verify horizon."""

    @property
    def runs(self) -> int:
        return self.candidates * self.rounds * self.repeats * 2

    @property
    def accelerator_s(self) -> float:
        restart_steps = self.candidates * self.rounds * self.restarts * self.restart_steps
        return (self.runs * self.steps + restart_steps) * self.step_time_s * self.accelerators

    def line(self) -> str:
        runs = (f"{self.candidates} candidate(s) × {self.rounds} round(s) × {self.repeats} pair(s) × 2 runs × "
                f"{self.steps} steps")  # fmt: skip
        if self.restarts:
            runs = (f"({runs} + {self.candidates} candidate(s) × {self.rounds} round(s) × {self.restarts} restart "
                    f"run(s) × {self.restart_steps} steps)")  # fmt: skip
        return (
            f"verify cost (predicted, at most): {runs} × {self.step_time_s * 1e3:.1f} ms/step (doctor)"
            f" × {self.accelerators} accelerator(s) = {self.accelerator_s:,.0f} accelerator-s"
        )


def predicted_verify_cost(
    contract: Contract, step_time_s: float, *, candidates: int | None = None, repeats: int | None = None
) -> VerifyCost:
    """``VerifyCost`` of verifying ``candidates`` (default ``verify.top_k``) under ``contract``."""
    launcher = contract.workload.launcher
    restart, horizon = contract.verify.checkpoint_restart, contract.workload.verify_steps
    return VerifyCost(
        candidates=contract.verify.top_k if candidates is None else candidates,
        rounds=contract.verify.passes_required,
        repeats=contract.verify.repeats if repeats is None else repeats,
        steps=contract.workload.verify_steps,
        step_time_s=step_time_s,
        accelerators=launcher.nnodes * launcher.nproc_per_node,
        restarts=0 if restart is None else 2 if restart.across_change else 1,
        restart_steps=0 if restart is None else horizon - restart.step_for(horizon),
    )


# --------------------------------------------------------------------------------------------------
# Which candidates to verify
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankedCandidate:
    candidate: ev.Candidate
    candidate_key: str
    step_time_s: float
    """Median over the candidate's invariant-passing ok search runs."""
    runs: int
    trial_ids: tuple[str, ...]


def select_candidates(
    search_runs: Iterable[tuple[str, ev.TrialProposed, ev.TrialMeasured]],
    k: int,
    *,
    baseline_step_s: float | None = None,
) -> list[RankedCandidate]:
    """Top-``k`` search candidates by median step time among ok, invariant-passing runs.

    A candidate with any invariant-violating run is excluded outright (a violation ends candidacy,
    ARCHITECTURE.md §7); the untouched baseline and anything not faster than ``baseline_step_s`` are skipped.
    """
    times: dict[str, list[float]] = {}
    trials: dict[str, list[str]] = {}
    cands: dict[str, ev.Candidate] = {}
    disqualified: set[str] = set()
    baseline_key = BASELINE_CANDIDATE.key()
    for trial_id, proposed, measured in search_runs:
        if measured.kind != "search":
            continue
        key = proposed.candidate.key()
        if key == baseline_key:
            continue
        if not measured.invariants_ok or measured.status == "invariant_violation":
            disqualified.add(key)
            continue
        if measured.status != "ok" or measured.step_time_s <= 0:
            continue
        cands[key] = proposed.candidate
        times.setdefault(key, []).append(measured.step_time_s)
        trials.setdefault(key, []).append(trial_id)
    ranked = [
        RankedCandidate(cands[key], key, float(np.median(ts)), len(ts), tuple(trials[key]))
        for key, ts in times.items()
        if key not in disqualified
    ]
    if baseline_step_s is not None:
        ranked = [r for r in ranked if r.step_time_s < baseline_step_s]
    ranked.sort(key=lambda r: (r.step_time_s, r.candidate_key))
    return ranked[:k]
