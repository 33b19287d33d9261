"""The one place priors are adapted: the bank's and the agent's beliefs laid over a study's space and the
knowledge base, the knowledge-base prior of each encoded feature, and a bank winner mapped into a new space.

Owns: ``with_priors`` (per-feature priors over the space and knowledge base: what the bank and the agent both
feed), ``prior_overrides``/``invariant_overrides`` (an agent's accepted priors as those tables),
``knowledge_base_priors(space)`` (what ``bank_priors`` shrinks toward) and ``adapter_for_space(space)`` (what
``bank_seeds`` uses). Must not: do I/O, know where a prior came from, or change the modeling package's objects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from infrarsi import events as ev
from infrarsi.modeling.priors import KnowledgeBase, default_knowledge_base
from infrarsi.modeling.space import BoolKnob, Candidate, FeatureEncoder, SearchSpace

if TYPE_CHECKING:
    from infrarsi.modeling.search import Searcher

MeanStd = tuple[float, float]


def knowledge_base_priors(
    space: SearchSpace, kb: KnowledgeBase | None = None, *, interactions: bool = True
) -> tuple[dict[str, MeanStd], dict[str, MeanStd]]:
    """(time, memory) built-in prior of every encoded feature of ``space`` but the intercept."""
    kb = (kb or default_knowledge_base()).for_space(FeatureEncoder(space, interactions=False))
    encoder = FeatureEncoder(space, interactions=interactions)
    time: dict[str, MeanStd] = {}
    memory: dict[str, MeanStd] = {}
    for spec in encoder.specs:
        if spec.kind == "intercept":
            continue
        if spec.kind == "interaction":
            time[spec.name] = (0.0, kb.default_interaction)
            memory[spec.name] = (0.0, 0.05)
        else:
            time[spec.name] = kb.time_prior(spec)
            memory[spec.name] = kb.memory_prior(spec)
    return time, memory


def to_space_candidate(c: ev.Candidate) -> Candidate:
    return Candidate.of(c.knobs, c.patches)


def to_event_candidate(c: Candidate) -> ev.Candidate:
    return ev.Candidate(knobs=dict(c.knobs), patches=sorted(c.patches))


def adapter_for_space(space: SearchSpace, baseline: Candidate | None = None
                      ) -> Callable[[ev.Candidate], ev.Candidate | None]:
    """A winner → the same settings in ``space``: knobs it lacks take the baseline's values, knobs and patches
    ``space`` does not have are dropped, a value outside a knob's domain makes it unusable; None if infeasible."""
    base = (baseline or space.default_candidate()).knobs
    knob_names = {k.name for k in space.knobs}
    patch_ids = {p.id for p in space.patches}

    def adapt(winner: ev.Candidate) -> ev.Candidate | None:
        knobs = dict(base)
        knobs.update({k: v for k, v in winner.knobs.items() if k in knob_names})
        cand = Candidate.of(knobs, [p for p in winner.patches if p in patch_ids])
        if not space.is_feasible(cand):
            return None
        return to_event_candidate(cand)

    return adapt


# ------------------------------------------------------------------------------------- Searcher glue
# The Searcher takes its priors through a KnowledgeBase. Two gaps (asked of the modeling owner): patch
# metadata beats KnowledgeBase overrides, and interaction priors are not overridable. Until a hook exists,
# bank priors for patches are written into the space's patch metadata (``space_with_patch_priors``) and
# interaction priors are left to the Searcher's default.


def searcher_effects(searcher: Searcher) -> tuple[list[ev.Effect], list[ev.Effect]]:
    """(time, memory) effects of a fitted ``infrarsi.modeling.search.Searcher``, as ``ModelUpdated`` carries them.

    Time: every feature of the Bayesian linear model (prior and marginal posterior). Memory: the generic
    model's per-feature coefficients; the structured model's corrections are named ``static:<f>`` /
    ``activation:<f>`` (multiplicative corrections to the textbook formula's two terms).
    """
    searcher.refit()
    tm = searcher.time_model
    time = [ev.Effect(feature=e.name, prior_mean=e.prior_mean, prior_std=e.prior_std, post_mean=e.posterior_mean,
                      post_std=e.posterior_std, source="knowledge_base") for e in tm.effects()]
    mm = searcher.memory_model
    names = list(mm.encoder.names)
    sd = np.sqrt(np.maximum(np.diag(mm.covariance), 0.0))
    if mm.structured:
        labels = [f"static:{n}" for n in names] + [f"activation:{n}" for n in names] + ["workspace"]
    else:
        labels = names
    memory = [ev.Effect(feature=label, prior_mean=float(mm.prior_mean[i]), prior_std=float(mm.prior_std[i]),
                        post_mean=float(mm.theta[i]), post_std=float(sd[i]), source="knowledge_base")
              for i, label in enumerate(labels[: len(mm.theta)])]
    return time, memory


def _pair(value: MeanStd) -> MeanStd:
    """``(mean, std)`` as a tuple, whatever two-element sequence the caller held it in (a JSON list)."""
    mean, std = value
    return (mean, std)


def space_with_patch_priors(space: SearchSpace, time: Mapping[str, MeanStd], memory: Mapping[str, MeanStd],
                            invariant: Mapping[str, MeanStd] | None = None) -> SearchSpace:
    """``space`` with the patches' metadata priors replaced by ``patch:<id>`` entries of the given tables."""
    invariant = invariant or {}
    patches = []
    for p in space.patches:
        key = f"patch:{p.id}"
        patches.append(replace(p, time_prior=_pair(time[key]) if key in time else p.time_prior,
                               memory_prior=_pair(memory[key]) if key in memory else p.memory_prior,
                               invariant_prior=_pair(invariant[key]) if key in invariant else p.invariant_prior))
    return replace(space, patches=tuple(patches))


def with_priors(space: SearchSpace, kb: KnowledgeBase, time: Mapping[str, MeanStd], memory: Mapping[str, MeanStd],
                invariant: Mapping[str, MeanStd] | None = None) -> tuple[SearchSpace, KnowledgeBase]:
    """(space, knowledge base) with per-feature priors laid over: ``patch:<id>`` into the patch metadata, main
    effects as knowledge-base overrides; interaction priors (``a*b``) are not overridable and are ignored.
    ``invariant``: Beta (a, b) of P(the setting breaks an invariant), by feature name (a bool knob's feature
    is its name, stored as the invariant model's item ``knob=True``)."""

    def main(table: Mapping[str, MeanStd]) -> dict[str, MeanStd]:
        return {k: v for k, v in table.items() if not k.startswith("patch:") and "*" not in k}

    bools = {k.name for k in space.knobs if isinstance(k, BoolKnob)}
    risks = {f"{k}=True" if k in bools else k: _pair(v) for k, v in main(invariant or {}).items()}
    return (space_with_patch_priors(space, time, memory, invariant),
            kb.with_overrides(time=main(time), memory=main(memory), invariant=risks))


RISK_CONCENTRATION = 2.0
"""a + b of the Beta prior an invariant claim becomes (the invariant model reads its mean)."""


def prior_overrides(priors: list[ev.AgentPrior]) -> tuple[dict[str, tuple[float, float]], dict[str, tuple[float, float]]]:
    """(time, memory) knowledge-base overrides of a list of accepted priors (later ones win)."""
    time = {p.feature: (p.mean, p.std) for p in priors if p.target == "time"}
    memory = {p.feature: (p.mean, p.std) for p in priors if p.target == "memory"}
    return time, memory


def invariant_overrides(priors: list[ev.AgentPrior]) -> dict[str, tuple[float, float]]:
    """Beta (a, b) of P(breaks an invariant) per feature, from the accepted ``invariant`` priors (later win)."""
    return {p.feature: (p.mean * RISK_CONCENTRATION, (1.0 - p.mean) * RISK_CONCENTRATION)
            for p in priors if p.target == "invariant"}
