"""Transfer: from bank entries to priors and initial candidates for a new study.

Owns: turning each entry's per-feature posterior into the evidence its trials carried (the "data message"),
inflating that evidence by dissimilarity and by the distance between accelerator generations, pooling it across
entries and combining it with the built-in knowledge-base prior by precision weighting; and choosing the
bank's transferable winners for the proposer's initial design (origin ``bank``). Must not: do I/O.

The maths (docs/bank.md §Shrinkage), per feature f, log units:

1. Data message of entry i. Its effect has prior N(m₀ᵢ, s₀ᵢ²) (what *that* study started from) and posterior
   N(mᵢ, sᵢ²). The evidence its trials added is  λᵢ = 1/sᵢ² − 1/s₀ᵢ²,  ηᵢ = mᵢ/sᵢ² − m₀ᵢ/s₀ᵢ²  (so the mean of
   the evidence is ηᵢ/λᵢ). Using the posterior itself would count the knowledge base twice: it is already in
   the new study's prior. With no usable prior (s₀ᵢ ≤ 0 or ∞) the posterior is the message. λᵢ ≤ 0 → nothing.
2. Inflation. The entry's evidence variance is multiplied by cᵢ/σᵢ, σᵢ the similarity (bank.similarity) and
   cᵢ the cross-generation factor (time: 1 same, 2 adjacent, 4 far; memory: 1, 1.25, 1.5 — peak memory is set by
   shapes and sharding more than by the chip): λ'ᵢ = λᵢ·σᵢ/cᵢ.
3. Pooling over the (at most ``max_entries``) most similar entries above ``threshold``:
   λ_b = Σ λ'ᵢ,  μ_b = Σ λ'ᵢ·(ηᵢ/λᵢ) / λ_b,  v_b = 1/λ_b + τ²  (τ = ``floor_std``: two studies never agree exactly).
4. Shrinkage toward the knowledge base N(μ_kb, s_kb²):
   post precision  = 1/s_kb² + 1/v_b,   post mean = (μ_kb/s_kb² + μ_b/v_b) / post precision.
   Low similarity → small λ'ᵢ → the knowledge base wins; a close, confident entry → the bank wins.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from infrarsi import events as ev
from infrarsi.bank.similarity import (
    SEED_THRESHOLD,
    cross_generation_distance,
    similarity,
    similarity_terms,
    why,
)
from infrarsi.modeling.adapt import with_priors
from infrarsi.modeling.priors import KnowledgeBase, default_knowledge_base
from infrarsi.modeling.space import SearchSpace

Target = Literal["time", "memory"]
MeanStd = tuple[float, float]


@dataclass(frozen=True)
class TransferConfig:
    """Knobs of the transfer; the defaults are the documented ones (docs/bank.md)."""

    threshold: float = SEED_THRESHOLD
    """Entries less similar than this contribute nothing."""
    max_entries: int = 5
    """At most this many entries (the most similar) are pooled per feature."""
    time_generation_inflation: tuple[float, float, float] = (1.0, 2.0, 4.0)
    """Variance factor c for time effects by generation distance 0, 1, ≥2."""
    memory_generation_inflation: tuple[float, float, float] = (1.0, 1.25, 1.5)
    floor_std: float = 0.02
    """τ: the spread left between two studies even with identical metadata (log units, ~2%)."""
    default_prior: MeanStd = (0.0, 0.3)
    """Knowledge-base prior for a feature the table does not know."""
    seed_threshold: float = 0.3
    """Winners are proposed only from entries at least this similar."""
    max_seeds: int = 4
    seed_rank_decay: float = 0.8
    """Score of an entry's r-th winner (0-based) = similarity × decay^r."""


@dataclass(frozen=True)
class FeaturePrior:
    """A prior the Searcher accepts for one feature, with its provenance."""

    mean: float
    std: float
    source: str = "bank"
    entries: tuple[str, ...] = ()
    similarity: float = 0.0
    """Highest similarity among the contributing entries."""

    def as_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std, "source": self.source, "entries": list(self.entries),
                "similarity": self.similarity}


@dataclass(frozen=True)
class BankPriors:
    """Per-feature priors for the time and memory models, built from the bank (only features it informs)."""

    time: dict[str, FeaturePrior] = field(default_factory=dict)
    memory: dict[str, FeaturePrior] = field(default_factory=dict)
    seeds: tuple[str, ...] = ()
    """Entry ids that contributed (for ``StudyCreated.bank_seeds``)."""

    def overrides(self, target: Target) -> dict[str, MeanStd]:
        """``{feature: (mean, std)}``, the shape of ``KnowledgeBase.with_overrides``."""
        table = self.time if target == "time" else self.memory
        return {name: (p.mean, p.std) for name, p in table.items()}

    def as_dicts(self, target: Target) -> dict[str, dict[str, Any]]:
        """``{feature: {"mean", "std", "source": "bank", ...}}``."""
        table = self.time if target == "time" else self.memory
        return {name: p.as_dict() for name, p in table.items()}


def data_message(effect: ev.Effect) -> tuple[float, float] | None:
    """(λ, η) = the precision and precision-weighted mean the study's trials added to its prior; None if none."""
    if not (effect.post_std > 0 and math.isfinite(effect.post_std)):
        return None
    lam = 1.0 / effect.post_std**2
    eta = effect.post_mean / effect.post_std**2
    if effect.prior_std > 0 and math.isfinite(effect.prior_std):
        lam -= 1.0 / effect.prior_std**2
        eta -= effect.prior_mean / effect.prior_std**2
    if lam <= 1e-9:
        return None
    return lam, eta


def shrink(kb: MeanStd, bank_mean: float, bank_var: float) -> MeanStd:
    """Precision-weighted combination of the knowledge-base prior and a (pooled, inflated) bank estimate."""
    kb_mean, kb_std = kb
    kb_prec = 1.0 / kb_std**2
    prec = kb_prec + 1.0 / bank_var
    return (kb_mean * kb_prec + bank_mean / bank_var) / prec, math.sqrt(1.0 / prec)


def inflation(config: TransferConfig, target: Target, generation_distance: int) -> float:
    table = config.time_generation_inflation if target == "time" else config.memory_generation_inflation
    return table[min(generation_distance, 2)]


@dataclass(frozen=True)
class _Scored:
    entry: ev.BankEntry
    similarity: float
    generation_distance: int


def _scored(entries: Iterable[ev.BankEntry], study_meta: ev.BankMeta, config: TransferConfig) -> list[_Scored]:
    out = [_Scored(e, similarity(study_meta, e.meta), cross_generation_distance(study_meta, e.meta)) for e in entries]
    out = [s for s in out if s.similarity >= config.threshold]
    out.sort(key=lambda s: (-s.similarity, s.entry.entry_id))
    return out


def _pool(scored: Sequence[_Scored], target: Target, config: TransferConfig,
          kb: Callable[[str], MeanStd | None]) -> dict[str, FeaturePrior]:
    by_feature: dict[str, list[tuple[_Scored, float, float]]] = {}
    for s in scored:
        effects = s.entry.time_effects if target == "time" else s.entry.memory_effects
        for effect in effects:
            msg = data_message(effect)
            if msg is not None:
                by_feature.setdefault(effect.feature, []).append((s, *msg))
    out: dict[str, FeaturePrior] = {}
    for feature in sorted(by_feature):
        contributions = by_feature[feature][: config.max_entries]  # already most-similar first
        lam_b = 0.0
        weighted_mean = 0.0
        for s, lam, eta in contributions:
            lam_i = lam * s.similarity / inflation(config, target, s.generation_distance)
            lam_b += lam_i
            weighted_mean += lam_i * (eta / lam)
        mean_b = weighted_mean / lam_b
        var_b = 1.0 / lam_b + config.floor_std**2
        prior = kb(feature) or config.default_prior
        mean, std = shrink(prior, mean_b, var_b)
        out[feature] = FeaturePrior(mean=mean, std=std, source="bank",
                                    entries=tuple(s.entry.entry_id for s, _, _ in contributions),
                                    similarity=max(s.similarity for s, _, _ in contributions))
    return out


def bank_priors(
    entries: Iterable[ev.BankEntry],
    study_meta: ev.BankMeta,
    *,
    kb_time: Mapping[str, MeanStd] | Callable[[str], MeanStd | None] | None = None,
    kb_memory: Mapping[str, MeanStd] | Callable[[str], MeanStd | None] | None = None,
    features: Iterable[str] | None = None,
    config: TransferConfig = TransferConfig(),
) -> BankPriors:
    """Per-feature priors for a new study with ``study_meta``: the knowledge base shrunk toward the bank.

    ``kb_time``/``kb_memory`` give the built-in prior of each feature (a mapping or a lookup; see
    ``knowledge_base_priors``); ``features`` restricts the output to the new study's encoded features.
    Features no similar entry informs are left out: the Searcher keeps its own prior for them.
    """
    scored = _scored(entries, study_meta, config)
    wanted = set(features) if features is not None else None

    def lookup(table: Mapping[str, MeanStd] | Callable[[str], MeanStd | None] | None) -> Callable[[str], MeanStd | None]:
        if table is None:
            return lambda _name: None
        if callable(table):
            return table
        return table.get

    time = _pool(scored, "time", config, lookup(kb_time))
    memory = _pool(scored, "memory", config, lookup(kb_memory))
    if wanted is not None:
        time = {k: v for k, v in time.items() if k in wanted}
        memory = {k: v for k, v in memory.items() if k in wanted}
    used = sorted({e for p in (*time.values(), *memory.values()) for e in p.entries})
    return BankPriors(time=time, memory=memory, seeds=tuple(used))


# ------------------------------------------------------------------------------------------------ winners


@dataclass(frozen=True)
class BankSeed:
    """A winner from a similar study, proposed as part of the new study's initial design."""

    candidate: ev.Candidate
    entry_id: str
    similarity: float
    score: float
    reason: str
    origin: str = "bank"


def _failed_keys(entry: ev.BankEntry) -> set[str]:
    keys = set()
    for f in entry.failures:
        if f.kind in ("invariant_violation", "patch_conflict", "scope_violation"):
            keys.add(f.candidate.key())
    return keys


def bank_seeds(
    entries: Iterable[ev.BankEntry],
    study_meta: ev.BankMeta,
    *,
    adapt: Callable[[ev.Candidate], ev.Candidate | None] | None = None,
    config: TransferConfig = TransferConfig(),
) -> list[BankSeed]:
    """The bank's best transferable winners for the new study's initial design, best first, deduplicated.

    ``adapt`` maps a winner into the new study's space (fill knobs it lacks with the baseline's values, drop
    patches its library lacks) and returns None when the result is infeasible there; see
    ``adapter_for_space``. A winner that any similar entry saw break an invariant is never proposed.
    """
    scored = [s for s in _scored(entries, study_meta, config) if s.similarity >= config.seed_threshold]
    failed = set().union(*(_failed_keys(s.entry) for s in scored)) if scored else set()
    best: dict[str, BankSeed] = {}
    for s in scored:
        reason = why(similarity_terms(study_meta, s.entry.meta))
        for rank, winner in enumerate(s.entry.winners):
            cand = adapt(winner) if adapt is not None else winner
            if cand is None or cand.key() in failed or winner.key() in failed:
                continue
            score = s.similarity * config.seed_rank_decay**rank
            key = cand.key()
            if key not in best or score > best[key].score:
                best[key] = BankSeed(cand, s.entry.entry_id, s.similarity, score,
                                     f"winner #{rank + 1} of {s.entry.entry_id} (similarity {s.similarity:.2f}: {reason})")
    ranked = sorted(best.values(), key=lambda b: (-b.score, b.candidate.key()))
    return ranked[: config.max_seeds]


def searcher_priors(space: SearchSpace, priors: BankPriors, kb: KnowledgeBase | None = None
                    ) -> tuple[SearchSpace, KnowledgeBase]:
    """(space, knowledge base) to construct a Searcher with: the built-in table overridden by the bank."""
    return with_priors(space, kb or default_knowledge_base(), priors.overrides("time"), priors.overrides("memory"))
