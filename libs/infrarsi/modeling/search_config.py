"""``SearchConfig``: every setting of the search, each with its default and the reason for it (docs/modeling.md
measures them).
"""


from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DesignFirst = Literal["auto", "prior", "seed"]
StopNoise = Literal["fitted", "floor"]


@dataclass(frozen=True)
class SearchConfig:
    n_seeds: int = 3
    """Space-filling seeds after the prior-guided first candidate."""
    oom_exclude: float = 0.25
    """Candidates with P(OOM) above this are never proposed (known-OOM region). 0.25, not the earlier 0.35,
    since the memory model without a shape has knob-pair columns: on the robustness family's development
    models the OOM share fell 22.6% -> 17.8% at the same median best/oracle (docs/modeling.md)."""
    design_oom_exclude: float = 0.35
    """The cut-off while the initial design is drawn. Before the first trial the memory model's prior puts a
    typical candidate near P(OOM) 0.3 (without a shape it knows the level only to a factor e), so the
    acquisition's cut-off would leave no design, only least-risky probes."""
    seed_max_p_oom: float = 0.2
    """The initial design draws only from candidates with P(OOM) below this."""
    oom_risk_power: float = 2.0
    """Acquisition weight of fitting: EI × P(no OOM)^power. One factor is the chance the trial yields its
    improvement at all; the second prices the OOM itself — a failed trial the user pays for, the waste tuners
    are known for. Why 2 and not 1 (risk-neutral EI), with the measurements: docs/modeling.md."""
    invariant_exclude: float = 0.05
    """Candidates with P(invariants hold) below this are never proposed (a patch known to break the run)."""
    pairing_trigger: float = 0.5
    pairing_target: float = 0.15
    probe_max_p_oom: float | None = 0.5
    """Memory step probes (``None``: off): a one-step move of one knob from the incumbent (the next value in
    the knob's order, any level of an unordered one) that the cut-off excludes, with P(OOM) up to this, is
    proposed when its risk-neutral worth EI × P(fit) beats the best admitted candidate's acquisition. Without it
    a memory prior that overprices a knob (a micro-batch whose activations are a small share of the peak) keeps
    every move along it above the cut-off for the whole study, and the search spends its trials on knobs that
    cost no memory; one trial along the knob is what teaches the memory model its real slope. That holds for a
    knob the measured peaks have not varied yet (``probe_fresh_max_p_oom``); along a knob they have varied, the
    model's P(OOM) is the data's and probes above 0.5 paid many OOMs for little (docs/modeling.md, "The first
    trial without a workload shape, and probes by what the peaks have seen")."""
    probe_fresh_max_p_oom: float | None = 0.7
    """The probe's P(OOM) limit for a step along a knob that every measured peak so far has at one value (its
    memory slope is the prior's alone); ``None``: ``probe_max_p_oom`` for every knob."""
    oom_budget: float | None = 0.10
    """The share of trials the study may spend on OOMs (``None``: no budget). Before each proposal the searcher
    counts what is left: ``oom_budget`` × (trials so far + 1) + ``oom_budget_credit`` − OOMs observed − the
    predicted P(OOM) of trials pending. A candidate above the cut-off (a memory step probe, a lifted cut-off) is
    proposed only when its P(OOM) fits in what is left — P(OOM) is calibrated on average, so the expected OOMs
    stay within the budget — and once every candidate under the cut-off has run and none above it fits the budget,
    the study stops (``should_stop``). A ``SearchConfig`` setting rather than a contract field: the searcher is
    not told the study's trial count, so the budget is a rate over the trials run."""
    oom_budget_credit: float = 0.5
    """OOMs the budget holds before any trial: a first probe need not wait for 1/``oom_budget`` clean trials."""
    oom_budget_floor: float | None = None
    """While the budget is overspent, the cut-off for ordinary proposals falls to this (``None``: unchanged)."""
    oom_budget_fit_p_oom: float = 0.5
    """Beyond the OOM budget a lifted cut-off still admits candidates under this P(OOM) — more likely to fit than
    not; once none is left (nor any under the cut-off) the study stops: a tiny space whose fitting settings have
    all run no longer spends its last trials on OOMs."""
    design_below_baseline: bool = True
    """Space-filling seeds only among candidates whose predicted peak is at most the golden baseline's (which
    fits): a ratio to a configuration that fitted, where the memory model's absolute level is known only to a
    factor e before any trial."""
    design_first: DesignFirst = "auto"
    """The initial design's first trial: ``prior`` (the best predicted time among candidates likely to fit),
    ``seed`` (a space-filling seed like the others, below the baseline's predicted peak), ``auto`` (``prior`` with
    a workload shape, ``seed`` without). Without a shape the generic prior's fastest guess is its most
    underpredicted peak: on the robustness family 76 of 90 such guesses ran out of memory (docs/modeling.md,
    "The initial design")."""
    escape_baseline: bool = True
    """Before anything has fitted, once a trial has run out of memory or every candidate is above the cut-off:
    the golden baseline (the user's job as it runs today, which fits) when it has not run yet, rather than a
    further seed or the least risky candidate far from the OOMs (the escape probe) — a measured peak the memory
    model's level is anchored on, at no OOM risk (docs/modeling.md, "The golden baseline as the
    escape")."""
    select_tie_sigmas: float = 2.0
    """``top_candidates``: measured step times within this many noise stds of the fastest are ranked by the mean
    of measured and posterior log time, or on a noisy host by the posterior (``select_posterior_noise``); 0: by
    the measurement alone."""
    select_posterior_noise: float | None = 0.04
    """``top_candidates``: where the run-to-run noise σ of a log step time (``Searcher.race_noise``: the doctor's
    noise floor pooled with the spread of repeated runs) is at least this, the tie (``select_tie_sigmas``) is
    ranked by the time model's posterior mean log time alone — it pools every run of every candidate and the
    candidate's neighbours — instead of by the mix of it and the candidate's own runs (``None``: never). On the
    noise benchmark (``bench/noise.py``, 90 studies per host) it moved the mean chosen/oracle 0.957 → 0.960 at CV
    5%, 0.934 → 0.937 at CV 10%, 0.916 → 0.924 at CV 15%; on a quiet host a model's misfit can exceed the noise,
    and the mix kept the simulator's dense7b_h100x64 at 0.989 where the posterior alone gave 0.962
    (docs/modeling.md, "Choosing the study's best")."""
    confirm_repeats: int = 2
    """With ``race`` off: before the study stops for want of expected gain, each leader tied within noise
    (``top_candidates``' tie set, at most ``confirm_top``) is measured this many times in all (1: never
    re-measured). With ``race`` on the race replaces it."""
    confirm_top: int = 3
    race: bool = False
    """Racing (SMAC-style intensification): after the initial design, a challenger whose mean log step time is
    within noise of the incumbent's (``race_z``) is re-run, interleaved with the incumbent (the one of the pair
    with fewer runs goes next), until the difference is resolved or both have ``race_cap`` runs (then the
    challenger is dropped): when the search would stop, at the budget's end (``race_end_share``) and, with
    ``race_share``, during the search. ``top_candidates`` then never ranks a single run above a re-measured
    candidate within its noise. Off (the default): one run per candidate and the confirmation before the stop
    (``confirm_repeats``). Off because, measured at equal runs on the noise benchmark (``bench/noise.py``, 40 runs),
    every variant tried chose worse than the search without it (at CV 5/10/15% and on a drifting host, by 0.2-0.8
    points of mean chosen/oracle with the settings below): its re-runs cost new candidates and bought back less of
    the choice's loss. docs/modeling.md, "Racing on a noisy host"."""
    race_z: float = 1.5
    """A difference of mean log times is resolved when it is at least this many of its standard errors,
    σ·sqrt(1/n_c + 1/n_i) (σ: ``race_noise``): 1.5 is a one-sided 93% call. The same test keeps a single run from
    outranking a re-measured candidate in ``top_candidates``."""
    race_effect: float = 1.05
    """The speed-up a race is sized to tell apart: the cap is the doctor's ``repeats_for_effect`` of it at the
    run-to-run noise, bounded by ``race_min_cap`` and ``race_max_cap``."""
    race_min_cap: int = 2
    race_max_cap: int = 5
    """Most runs of one candidate a race asks for. At CV 2% a 5% effect needs 3 runs; at 5% and beyond the
    doctor's count (15 and more) is more than a study of tens of trials can spend on one pair, so the bound
    decides: past it the models' pooling of every run and the verification settle the rest."""
    race_share: float = 0.0
    """Races take at most this share of the trials after the initial design: a race run is proposed while the
    race runs so far (repeats of a measured candidate, run and pending) are fewer than ``race_share`` × (trials
    since the design + 1) — at 0.5 a race run and a new candidate alternate, as SMAC's intensification does, so
    exploration keeps half the budget. Not applied when nothing new is worth a trial (``should_stop``'s reason)
    or when the open race needs the trials the budget has left (``suggest``'s ``left``)."""
    race_end_share: float = 0.1
    """The budget's end gives the open race at most this share of the study's trials (run, pending and left): the
    race takes the last trials once what it needs is at least the trials left, capped here (4 of 40, 1 of 10, none
    under 10). Unbounded (1.0), a race at CV 10% (cap 5 runs each) took up to 8 of 40 and every trial after the
    design of a 10-trial study."""
    race_noise_df: float = 4.0
    """``race_noise``: the weight, in degrees of freedom, of the doctor's run-to-run noise (the time model's noise
    floor) against the spread of the study's own repeated runs (a doctor's CV from 3 runs is itself noisy)."""
    probe_margin: float = 1.0
    """A memory step probe must be worth this many times the best admitted candidate's acquisition."""
    shortlist_top: int = 600
    shortlist_random: int = 600
    max_pool: int = 200_000
    sample_pool: int = 4000
    """Candidates sampled when the space is infinite or too large to enumerate."""
    cost_power: float = 1.0
    stop_ei_fraction: float = 0.05
    """Stop when max expected improvement (log units) < this × the noise (``stop_noise``)."""
    stop_noise: StopNoise = "floor"
    """The noise the stop's threshold is a fraction of: ``floor``, the run-to-run noise the doctor measured (the
    time model's noise floor; its fitted std when that is smaller), or ``fitted``, the time model's fitted noise
    std. The fitted std holds the model's misfit too, so against it the more wrong the time model, the sooner the
    search stopped: on the held-out shaped models ``floor`` took the share of models at 0.93 of the oracle from
    87% to 93% (docs/modeling.md, "The stop against the run-to-run noise")."""
    memory_interaction_std: float | None = 0.1
    """Without a workload shape: prior std of the memory model's knob-pair columns (``None``: none). A peak is
    a sum of terms (activations growing with the batch beside states split by sharding), which per-knob factors
    alone misfit by 10-20% near the capacity; the measurements on the robustness family: docs/modeling.md."""
    memory_two_terms: bool = False
    """Without a workload shape: the memory model as a sum of two log-linear terms (``MemoryModel.two_terms``;
    the knob-pair columns are then not used). Off: on the robustness family it traded best/oracle against the
    OOM share differently on the development and the reported models (docs/modeling.md)."""
    memory_peer_weight: float | None = 0.5
    """Without a workload shape: the weight of a second memory model of the other form (the two-term model beside
    the knob-pair one, or the knob-pair one beside a two-term primary), fitted to the same peaks and mixed with
    the first (``None``: the first alone). Where the two forms agree the mixture is as sure as either; where they
    disagree — far from every measured peak, where the search's choice among many candidates picks the ones a
    model underpredicts (the optimiser's curse) — their spread widens P(OOM). On the robustness family's
    development models the standardised errors of the proposals' predicted log peaks fell from std 2.00, mean
    +0.47 to 1.43, +0.37, and the OOM share by 0.6–2.9 points on every model set (docs/modeling.md)."""
    memory_formula_weight: float | None = 0.9
    """With a workload shape: the prior weight of the structural formula in a Bayesian model average with the
    learned memory models a study without a shape uses (``memory_peer_weight`` splits the rest between them);
    ``None``: the formula alone. From there each model's weight follows its prequential likelihood — the
    predictive density, under its fit on the peaks before, of every measured peak and OOM in turn — so when the
    measurements contradict the formula (an OOM where it predicted room, a fit where it predicted an OOM, peaks
    off by more than its misfit) its weight falls within a few trials and the learned models take over, and
    where the formula predicts well it keeps it (docs/modeling.md, "The formula as a prior, not a wall")."""
    memory_formula_burn_in: int = 3
    """The first peaks that average does not score (the formula alone until then): the learned models predict
    them from their priors alone, wide, and an uncalibrated formula (a simulator scenario's) a few per cent off
    with a tight std; scored, either can outvote the other on one peak (on the simulator's dense7b_h100x64 the
    formula's weight fell to 0.35 at the first peak). Scoring from the first peak with a floor of 0.02 on every
    weight cost that scenario 2.8 points of best/oracle (0.961 against 0.989); a burn-in of two left
    dense7b_a100x64 at 0.992, three gives it 0.999 (docs/modeling.md, "The formula as a prior, not a wall")."""
    memory_recalibrate: bool = True
    """With a workload shape and that average: the memory mixture's predictive recalibrated per study from its
    own proposals — every scored peak's standardised residual under the mixture fitted on the peaks before it
    (an OOM: censored at its bound) fits a shift b and a scale s of the standard normal by maximum a posteriori
    (priors N(0, 0.5²) on b and on log s), and the mixture's mean and std become ``mu + b·sd`` and ``s·sd``. The
    search proposes what it predicts lightest for its speed, so its proposals' peaks run above their predictions
    (the optimiser's curse); without this P(OOM) ran 3–14 points under the observed OOM share in every bin below
    0.35 on the shaped family (docs/modeling.md, "The mixture recalibrated on its own proposals")."""
    oom_calibration: tuple[float, float, float, float] | None = (-0.8, 0.475, 0.5, 0.3)
    """With a workload shape and ``memory_recalibrate``: (a, c, σ_a, σ_log c) of the P(OOM) calibration map,
    logit P = a + c·logit p, p the memory predictive's P(OOM) (``None``: p itself). Fitted per study on its own
    proposals — every new candidate's outcome, OOM or not, against the p the models before it gave it (a
    prequential record, like the residuals) — as a posterior on a grid, priors N(a, σ_a²) on a and N(log c,
    σ_log c²) on log c; P(OOM) is the larger of p and the posterior's mean of the map at p: the map only raises.
    The prior's centre is the map that fits the shaped family's development models (0-29): there candidates the
    predictive put at 2-5% ran out of memory 9-11% of the time, which no shift or scale of the peaks' residuals
    corrects (the residuals are heavier-tailed than a normal). Raising only: a two-sided map also lowered the
    high P(OOM)s, and the candidates it then admitted ran out of memory 70% of the time at a predicted 41%
    (docs/modeling.md, "P(OOM) calibrated on the study's own outcomes")."""
    oom_step_calibration: tuple[float, float, float, float] | None = (-0.95, 1.2, 0.5, 0.3)
    """With ``oom_calibration``: (a, c, σ_a, σ_log c) of a second map of the same form for the candidates one step
    from the incumbent along a knob the measured fits have varied — the move a memory step probe makes
    (``None``: one map for every candidate). Fitted per study on those candidates' own outcomes; P(OOM) is then
    the posterior mean of this map, which may lower p as well as raise it. Such a step adds the formula's change
    of peak to a measured one, but the mixture's std is the same anywhere, so it overstates the step's error: on
    the shaped family the steps the search proposed at a predicted 0.2-0.5 ran out of memory at half that rate
    (6-18% at 30%, 18-23% at 42%), while every other move at those P(OOM)s was within 5 points. A slope above 1
    is a sharper P(OOM), a negative a a lower one. The prior's centre fits the development models' (0-29) steps.
    A step whose p is above ``probe_max_p_oom`` keeps the other map (no step is proposed there to calibrate it),
    and the map changes a step's P(OOM), not which rule may propose it: one the cut-off excludes before the map
    is still the step probe's (docs/modeling.md, "P(OOM) calibrated on the study's own outcomes")."""
    memory_formula_floor: float = 0.0
    """The smallest weight any member of that average keeps (0: none). A floor keeps the outvoted models'
    means in the mixture's variance (it holds the spread of its means): where the formula is right and the
    learned models far from it, P(OOM) widens for nothing (``memory_formula_burn_in`` has the measurement)."""
    memory_misfit_floor: float | None = None
    """Without a workload shape: the smallest std (log units) of the memory model's misfit term (``None``: the
    model's own bound, 0.01). A flexible fit's σ is its in-sample residual, smaller than what it mispredicts
    where it has not measured. The structural formula (a workload shape) keeps its own bound."""
    memory_anchor_spread: tuple[float, float, float] | None = (0.7, 0.6, 0.5)
    """Without a workload shape, once a peak is measured: the memory std as ``hypot(s × the mixture's std,
    b × |Δ|)`` for ``(a, b, g)``, Δ the predicted change of log peak from the nearest measured peak (fewest
    knob and patch changes, d; among those, the smallest |Δ|) and s = a within one change of it, 1 + g(d − 1)
    further. A flexible fit interpolates its measured peaks: a one-knob step it predicts to change the peak by
    1% errs by little, one it predicts to change it by 30% errs by about a third of that — the Laplace std is
    the same for both (``None``: the mixture's std; docs/modeling.md, "The memory std from the nearest measured
    peak", has the measurements behind the default)."""
    memory_spread_scale: float = 1.0
    """Without a workload shape: the memory model's predictive std times this (1: its Laplace std as fitted).
    That std (parameters plus the fitted misfit) is what it would mispredict at a candidate drawn at random; the
    search proposes the candidates it predicts lightest for their speed, whose peaks it underpredicts most (the
    optimiser's curse): on its own proposals (robustness family, development models 100-139) the standardised
    errors of the predicted log peaks have std 1.95 and mean +0.46. At 2.0 they are 0.93 and +0.19, and the
    OOM share falls by 2-4 points on every model set, but the inverted-priors arm loses 4-5 points of
    best/oracle (below its 0.93 target): not the default. The measurements: docs/modeling.md, "Memory
    settings measured and left off"."""
    prior_nu: float | None = None
    """Student-t degrees of freedom of the time model's effect priors (``TimeModel.prior_nu``): a knowledge-base
    prior the measurements contradict loses its weight. ``None`` (the default until the search benchmarks are
    re-measured with it): Gaussian priors."""
    refit_all_until: int = 500
    """Up to this many observations every one refits every model in full (noise, straggler weights, memory
    parameters): at a study's scale each trial moves the models."""
    refit_every: float = 0.02
    """Beyond ``refit_all_until``, a full refit once this share of new observations arrived since the last
    (every 100 at 5,000); in between, new time measurements enter the posterior by a rank-k update at the
    fitted noise and weights (``TimeModel.update``) and the memory model keeps its fit — one trial moves
    neither by more than ~1/n. Decision latency, docs/modeling.md."""
