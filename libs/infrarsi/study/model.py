"""One study's models: trial outcomes as observations, the study's ``Searcher``, and the modeler's fold.

Owns:

- ``build_searcher``: the one place a study's ``Searcher`` is built (seed = the study id, noise floor = the
  doctor's, the bank's winners queued first, every outcome so far observed in order) — the proposer and the
  modeler both call it, so they hold the same model;
- ``observation``: a ``TrialOutcome`` as a modeling ``Observation``; ``noise_floor`` from ``DoctorCompleted``;
- ``prediction``: ``Searcher.predict`` as the event catalog's ``Prediction``;
- ``StudyModel``/``replay_model``: the modeler's per-study fold, events → ``ModelUpdated``;
- ``StudiesFold``: the skeleton the proposer's and the modeler's states share (a state per created study);
- ``model_update``/``setting_effects``: per knob setting and patch, prior vs posterior effects on time and memory.

Pure given the study's ``StudySpace``. Must not: read the disk (``study.space.load_study_space`` does), publish.
"""

from __future__ import annotations

import math
import time
import zlib
from abc import abstractmethod
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

import numpy as np

from infrarsi import events as ev
from infrarsi.modeling.memory_model import structural_components
from infrarsi.modeling.observations import Observation
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import Candidate, FloatRange, KnobValue
from infrarsi.runtime.service import Emission, Fold
from infrarsi.study.ledger import TrialLedger, TrialOutcome
from infrarsi.study.space import CandidateOutsideSpace, StudyLoader, StudySpace, load_study_space


def observation(study: StudySpace, outcome: TrialOutcome) -> Observation | None:
    """The modeling observation of a trial outcome; ``None`` when its candidate is unknown or outside the
    study's space (a manual candidate, say), or when the harness, not the candidate, failed."""
    if outcome.candidate is None or outcome.infrastructure:
        return None  # an infrastructure failure is not the candidate's: the models learn nothing from it
    try:
        c = study.from_event(outcome.candidate)
    except CandidateOutsideSpace:
        return None
    return Observation(c, outcome.status, outcome.step_time_s, outcome.peak_bytes,
                       outcome.accelerator_s or None)


def adopt_shape(study: StudySpace, measured: ev.TrialMeasured) -> StudySpace | None:
    """The study with the workload shape its first good baseline reported (``StudySpace.with_shape``), or
    ``None`` when this measurement changes nothing (not a baseline, no shape, or a shape already adopted)."""
    if (study.scenario is not None or study.probed_shape is not None or measured.shape is None
            or measured.kind not in ("baseline", "doctor") or measured.status != "ok"):  # fmt: skip
        return None
    return study.with_shape(measured.shape, baseline_peak_bytes=max(measured.peak_memory_bytes, default=0) or None)


def noise_floor(doctor: ev.DoctorCompleted | None, default: float = 0.03) -> float:
    """The time model's noise floor (σ of log step time) from the doctor's run-to-run CV."""
    if doctor is None or not doctor.run_to_run_cv > 0:
        return default
    return max(math.log1p(doctor.run_to_run_cv), 0.005)


def build_searcher(study: StudySpace, study_id: str, *, doctor: ev.DoctorCompleted | None = None,
                   outcomes: Sequence[TrialOutcome] = (), bank: ev.BankResolution | None = None,
                   config: SearchConfig | None = None, pool_from: Searcher | None = None) -> Searcher:
    """The study's ``Searcher``: seeded by the study id, noise floor from the doctor, the bank's winners
    (``bank.seeds``, best first; one that no longer fits this space is skipped) queued as origin ``bank``,
    then every outcome so far observed in completion order. ``pool_from``: reuse that searcher's candidate pool
    (a rebuild after the doctor reported). The doctor's facts about the host are laid over the priors last
    (``StudySpace.with_host``)."""
    if doctor is not None:
        study = study.with_host(doctor.host_native_dtypes)
    searcher = Searcher(study.space, study.capacity_bytes, meta=study.meta, kb=study.kb, baseline=study.baseline,
                        seed=zlib.crc32(study_id.encode()), noise_floor=noise_floor(doctor), config=config,
                        pool=pool_from.pool if pool_from is not None else None)
    for seed in bank.seeds if bank is not None else ():
        try:
            candidate = study.from_event(seed.candidate)
        except CandidateOutsideSpace:
            continue
        searcher.enqueue([candidate], "bank", seed.reason)
    for outcome in outcomes:
        obs = observation(study, outcome)
        if obs is not None:
            searcher.observe(obs)
    return searcher


def prediction(searcher: Searcher, c: Candidate) -> ev.Prediction:
    """What ``searcher``'s current models expect of ``c``: step time (latent median), its log std, peak
    memory, P(OOM), P(invariants hold) and expected improvement over the incumbent (log units)."""
    p = searcher.predict([c])[0]
    return ev.Prediction(step_time_s=math.exp(p.log_time), step_time_std_log=p.log_time_std,
                         peak_memory_bytes=math.exp(p.log_peak_bytes), p_oom=p.p_oom, p_invariants=p.p_invariants,
                         expected_improvement=p.expected_improvement)


MAX_LEVELS = 16
"""Settings reported per integer-range knob (evenly spaced) — a readable table, not every value."""


class StudyModel:
    """The time and censored memory models of one study, refitted on every trial outcome.

    ``apply(event)`` takes the study's ``DoctorCompleted``, ``TrialProposed``, ``TrialFinished`` and
    ``TrialMeasured`` and returns a ``ModelUpdated`` when a trial's outcome completed (else ``None``). Pure
    given its ``StudySpace``: the same events in the same order give the same models.
    """

    def __init__(self, space: StudySpace, study_id: str, *, config: SearchConfig | None = None) -> None:
        self.space = space
        self.study_id = study_id
        self.config = config
        self.ledger = TrialLedger()
        self.outcomes: list[TrialOutcome] = []
        self.doctor: ev.DoctorCompleted | None = None
        self.searcher: Searcher | None = None
        self.last: ev.ModelUpdated | None = None

    def apply(self, event: ev.Event) -> ev.ModelUpdated | None:
        tid = event.trial_id
        match event.payload:
            case ev.DoctorCompleted() as done:
                self.doctor = done
                self.space = self.space.with_host(done.host_native_dtypes)  # the report's prior sources say "host"
                if self.searcher is not None:
                    self.searcher = self._build(pool_from=self.searcher)  # the doctor's noise floor
                return None
            case ev.TrialProposed() as proposed if tid:
                self.ledger.proposed(tid, proposed)
                return None
            case ev.TrialFinished() as finished if tid:
                return self._on_outcome(self.ledger.finished(tid, finished))
            case ev.TrialMeasured() as measured if tid:
                if (shaped := adopt_shape(self.space, measured)) is not None:
                    self.space, self.searcher = shaped, None  # rebuilt below with the structural formula
                return self._on_outcome(self.ledger.measured(tid, measured))
            case _:
                return None

    def _build(self, pool_from: Searcher | None = None) -> Searcher:
        return build_searcher(self.space, self.study_id, doctor=self.doctor, outcomes=self.outcomes,
                              config=self.config, pool_from=pool_from)

    def _on_outcome(self, outcome: TrialOutcome | None) -> ev.ModelUpdated | None:
        if outcome is None:
            return None
        self.outcomes.append(outcome)
        obs = observation(self.space, outcome)
        if self.searcher is None:
            self.searcher = self._build()  # observes every outcome so far, this one included
        elif obs is not None:
            self.searcher.observe(obs)
        unmodelled = sum(1 for o in self.outcomes if observation(self.space, o) is None)
        self.last = model_update(self.space, self.searcher, unmodelled=unmodelled)
        return self.last


def replay_model(events: Iterable[ev.Event], study_id: str, loader: StudyLoader | None = None
                 ) -> ev.ModelUpdated | None:
    """The latest ``ModelUpdated`` a modeler would have published for ``study_id``, refitted from its events."""
    model: StudyModel | None = None
    for event in events:
        if event.study_id != study_id:
            continue
        if isinstance(event.payload, ev.StudyCreated):
            if model is None:
                space = (loader or load_study_space)(event.payload).with_bank(event.payload.bank)
                model = StudyModel(space, study_id)
        elif model is not None:
            model.apply(event)
    return model.last if model is not None else None


StudyT = TypeVar("StudyT")


class StudiesFold(Fold, Generic[StudyT]):
    """The proposer's and the modeler's fold: one state per study, made from its first ``StudyCreated`` (a
    repeat changes nothing); the events of a study never seen created are ignored."""

    def __init__(self, *, load_study: StudyLoader = load_study_space, config: SearchConfig | None = None) -> None:
        super().__init__()
        self.load_study = load_study
        self.config = config
        self.studies: dict[str, StudyT] = {}

    def _apply(self, event: ev.Event) -> list[Emission]:
        study = self.studies.get(event.study_id)
        match event.payload:
            case ev.StudyCreated() as created:
                if study is None:
                    self.studies[event.study_id] = self._new_study(event.study_id, created)
                return []
            case _ if study is None:
                return []
            case _:
                return self._apply_to(study, event)

    def load_space(self, created: ev.StudyCreated) -> tuple[StudySpace | None, str | None]:
        """The study's space with the bank's priors laid over, or why this build cannot search it (the service
        reports it in its status and keeps serving the other studies)."""
        try:
            return self.load_study(created).with_bank(created.bank), None
        except Exception as exc:  # noqa: BLE001 — reported, not raised
            return None, f"{type(exc).__name__}: {exc}"

    @abstractmethod
    def _new_study(self, study_id: str, created: ev.StudyCreated) -> StudyT:
        """The state of a study just created."""

    @abstractmethod
    def _apply_to(self, study: StudyT, event: ev.Event) -> list[Emission]:
        """Fold one event of a known study; return what to publish."""


# --------------------------------------------------------------------------------------------------
# The update: per-setting effects, prior vs posterior
# --------------------------------------------------------------------------------------------------


def model_update(study: StudySpace, searcher: Searcher, *, unmodelled: int = 0) -> ev.ModelUpdated:
    """Refit and summarise ``searcher``'s models as a ``ModelUpdated``."""
    t0 = time.perf_counter()
    searcher.refit()
    time_effects, memory_effects = setting_effects(study, searcher)
    observations = searcher.observations
    top = searcher.top_candidates(1)
    baseline = prediction(searcher, study.baseline)
    diagnostics: dict[str, float] = {
        "n_ok": float(sum(o.status == "ok" for o in observations)),
        "n_invariant_violations": float(sum(o.status == "invariant_violation" for o in observations)),
        "n_failed": float(sum(o.status in ("crash", "timeout", "scope_violation") for o in observations)),
        "n_unmodelled": float(unmodelled),
        "baseline_predicted_step_s": baseline.step_time_s,
        "baseline_p_oom": baseline.p_oom,
    }
    fit = searcher.memory_model.fit_result
    if fit is not None:
        diagnostics |= {"memory_sigma_log": float(math.exp(fit.log_sigma)), "memory_converged": float(fit.converged),
                        "memory_censored": float(fit.n_censored)}
    best_key = best_step = None
    if top:
        best, best_step, _sd = top[0]
        best_key = study.to_event(best).key()
        diagnostics["best_predicted_speedup"] = baseline.step_time_s / best_step
    return ev.ModelUpdated(
        n_trials=len(observations),
        n_oom=sum(o.status == "oom" for o in observations),
        fit_seconds=time.perf_counter() - t0,
        noise_std_log=float(searcher.time_model.noise_std),
        time_effects=time_effects,
        memory_effects=memory_effects,
        best_candidate_key=best_key,
        best_predicted_step_s=best_step,
        diagnostics=diagnostics,
    )


def single_changes(study: StudySpace) -> list[tuple[str, Candidate, str | None, object]]:
    """(feature name, the baseline with only that changed, knob name or None for a patch, value)."""
    base = study.baseline
    out: list[tuple[str, Candidate, str | None, object]] = []
    for k in study.space.knobs:
        if isinstance(k, FloatRange):
            values: list[KnobValue] = [k.low, k.high]
        else:
            values = list(k.values())
            if len(values) > MAX_LEVELS:
                idx = np.unique(np.linspace(0, len(values) - 1, MAX_LEVELS).round().astype(int))
                values = [values[i] for i in idx]
        for v in values:
            if v == base[k.name]:
                continue
            out.append((f"{k.name}={v}", base.with_knob(k.name, v), k.name, v))
    for p in study.space.patches:
        out.append((f"patch:{p.id}", Candidate.of(base.knobs, base.patches | {p.id}), None, p.id))
    return out


def setting_effects(study: StudySpace, searcher: Searcher) -> tuple[list[ev.Effect], list[ev.Effect]]:
    """Per knob setting and patch: Δ log step time and Δ log peak memory vs the baseline, prior vs posterior."""
    changes = single_changes(study)
    if not changes:
        return [], []
    cands = [c for _, c, _, _ in changes]

    # time: Δx·w with w ~ N(m0, diag(s0²)) a priori, N(m, Σ) a posteriori
    tm = searcher.time_model
    enc = tm.encoder
    dx = enc.encode_many(cands) - enc.encode(study.baseline)  # (n, p)
    prior_t = dx @ tm.prior_mean
    prior_t_sd = np.sqrt((dx**2) @ (tm.prior_std**2))
    cov = tm.covariance()
    post_t = dx @ tm.mean
    post_t_sd = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", dx, cov, dx), 0.0))

    # memory: Δμ(θ) with the delta-method std, at the prior (θ0, diag(s0²)) and at the MAP (θ, Laplace Σ)
    mm = searcher.memory_model
    rows = mm.encoder.encode_many([study.baseline, *cands])  # (n+1, p): the pair columns too, where it has them
    if study.meta is not None:
        sa = np.array([structural_components(study.meta, c.knobs) for c in [study.baseline, *cands]])  # (n+1, 2)
    else:
        sa = np.zeros((rows.shape[0], 2))

    def delta(theta: np.ndarray, cov_theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mu, g = mm.log_mean_grad(theta, rows, sa)
        dmu = mu[1:] - mu[0]
        dg = g[1:] - g[0]  # (n, k)
        return dmu, np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", dg, cov_theta, dg), 0.0))

    prior_m, prior_m_sd = delta(mm.prior_mean, np.diag(mm.prior_std**2))
    post_m, post_m_sd = delta(mm.theta, mm.covariance)

    time_effects, memory_effects = [], []
    for i, (name, _c, knob, value) in enumerate(changes):
        source = _source(study, searcher, knob, value)
        time_effects.append(ev.Effect(feature=name, prior_mean=float(prior_t[i]), prior_std=float(prior_t_sd[i]),
                                      post_mean=float(post_t[i]), post_std=float(post_t_sd[i]), source=source))
        memory_effects.append(ev.Effect(
            feature=name, prior_mean=float(prior_m[i]), prior_std=float(prior_m_sd[i]), post_mean=float(post_m[i]),
            post_std=float(post_m_sd[i]), source="formula" if mm.structured else source))
    return time_effects, memory_effects


def _source(study: StudySpace, searcher: Searcher, knob: str | None, value: object) -> str:
    specs = searcher.time_model.encoder.specs
    if knob is None:
        spec = next(s for s in specs if s.name == f"patch:{value}")
        return study.prior_source(spec)
    for spec in specs:
        if spec.knob == knob and spec.kind in ("level", "bool", "numeric"):
            if spec.kind == "level" and spec.value != value:
                continue
            source = study.prior_source(spec)
            if source != "flat":
                return source
    return "flat"
