"""Distillation: what a finished (or freshly verified) study leaves in the experience bank.

Owns: ``StudyFacts`` (the few numbers a study's read model already holds: the metadata that decides transfer,
the last posterior of the time and memory models, the trials' outcomes and the verifications) and the pure
function ``distil(facts) -> BankEntry``, plus ``bank_event`` that wraps an entry in its envelope with a
deterministic event id. Must not: do I/O, or copy anything that is the user's model or data — an entry holds
metadata, effect sizes, knob values, patch ids and short failure reasons, nothing else.

One entry per study: ``entry_id = derived_id(study_id, "BankEntry")``. The reporter publishes it when the study
finishes and again when a verification completes; each publication is a *revision* of the same entry (a newer
``ts`` supersedes; readers keep the latest, see ``infrarsi.bank.store``). The event id is derived from the
entry's content, so a re-publication of the same facts is dropped by JetStream's duplicate window.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from infrarsi import events as ev
from infrarsi.bank.similarity import generation_of

MAX_WINNERS = 5
"""Verified winners first (by measured speed-up), then unverified best measured candidates up to this many."""
MAX_FAILURES = 20
MAX_DETAIL_CHARS = 200
"""Failure reasons are truncated: an output tail can quote user code or data, a bank entry must not."""
FAILURE_KINDS = (
    "oom", "patch_conflict", "invariant_violation", "scope_violation", "crash", "timeout", "stopped_slow",
)  # fmt: skip
"""The trial statuses kept as failures, most transferable first. ``stopped_slow`` counts as a timeout does: a
candidate stopped early as far slower than the incumbent is evidence that its knob values are slow on that
hardware (its steps still reach the time model as a measurement, so the effects carry it too)."""


@dataclass(frozen=True)
class TrialFact:
    """One trial as the study's read model summarises it (from TrialProposed + TrialFinished + TrialMeasured)."""

    candidate: ev.Candidate
    status: ev.TrialStatus
    step_time_s: float | None = None
    """Robust steady step time (TrialMeasured.step_time_s); None for a trial that did not measure."""
    peak_memory_bytes: float | None = None
    censored_peak_bytes: float | None = None
    """For an OOM: the peak seen before the kill, a lower bound of the true peak."""
    memory_capacity_bytes: float | None = None
    reason: str = ""
    kind: ev.TrialKind = "search"


@dataclass(frozen=True)
class StudyFacts:
    """Everything ``distil`` reads. Built by the reporter from its read model (no bus access here)."""

    study_id: str
    meta: ev.BankMeta
    time_effects: Sequence[ev.Effect]
    """The last ``ModelUpdated.time_effects``: per feature, the prior and the posterior (log step time)."""
    memory_effects: Sequence[ev.Effect]
    trials: Sequence[TrialFact] = ()
    verifications: Sequence[ev.VerifyCompleted] = ()
    baseline_step_s: float | None = None
    exclude_features: frozenset[str] = field(default_factory=lambda: frozenset({"intercept"}))
    """Features that describe this workload only (the intercept: its absolute step time) and never transfer."""


def meta_from_cluster(
    cluster: ev.ClusterInfo, *, parallelism: dict[str, int], model_family: str, model_params: float, seq_len: int,
    global_batch: int, micro_batch: int, precision: str,
) -> ev.BankMeta:
    """BankMeta from the study's ``ClusterInfo`` and the baseline's launch settings (what ``init`` knows)."""
    return ev.BankMeta(
        accelerator=cluster.accelerator, generation=generation_of(cluster.accelerator),
        device_memory_bytes=cluster.memory_capacity_bytes, interconnect=cluster.interconnect, nodes=cluster.nodes,
        devices_per_node=cluster.devices_per_node, parallelism=dict(parallelism), model_family=model_family,
        model_params=float(model_params), seq_len=seq_len, global_batch=global_batch, micro_batch=micro_batch,
        precision=precision,
    )


def entry_id_for(study_id: str) -> str:
    return ev.derived_id(study_id, "BankEntry")


def _finite_effect(e: ev.Effect) -> bool:
    return all(math.isfinite(v) for v in (e.prior_mean, e.prior_std, e.post_mean, e.post_std)) and e.post_std > 0


def _effects(effects: Sequence[ev.Effect], exclude: frozenset[str]) -> list[ev.Effect]:
    kept = {e.feature: e for e in effects if e.feature not in exclude and _finite_effect(e)}
    return [kept[name] for name in sorted(kept)]


def _winners(facts: StudyFacts) -> list[ev.Candidate]:
    verified = sorted(
        (v for v in facts.verifications if v.promotable and not v.failed_invariants and v.speedup > 1.0),
        key=lambda v: (-v.speedup, v.candidate_key),
    )
    out: dict[str, ev.Candidate] = {}
    for v in verified:
        out.setdefault(v.candidate.key(), v.candidate)
    # Unverified best measured candidates fill the list: the proposer re-measures seeds anyway.
    measured = sorted(
        (t for t in facts.trials if t.status == "ok" and t.step_time_s is not None and t.kind != "verify"
         and (t.candidate.knobs or t.candidate.patches)),  # the baseline itself is no lesson
        key=lambda t: (t.step_time_s, t.candidate.key()),
    )
    rejected = {v.candidate.key() for v in facts.verifications if not v.promotable or v.failed_invariants}
    for t in measured:
        if len(out) >= MAX_WINNERS:
            break
        if facts.baseline_step_s is not None and (t.step_time_s or 0.0) >= facts.baseline_step_s:  # set: see above
            break
        key = t.candidate.key()
        if key not in rejected:
            out.setdefault(key, t.candidate)
    return list(out.values())[:MAX_WINNERS]


def _failure(kind: str, candidate: ev.Candidate, detail: str, *, censored_peak_bytes: float | None = None,
             capacity_bytes: float | None = None) -> ev.BankFailure:
    return ev.BankFailure(
        kind=kind, candidate=candidate, detail=detail[:MAX_DETAIL_CHARS],
        censored_peak_bytes=None if censored_peak_bytes is None else float(censored_peak_bytes),
        capacity_bytes=None if capacity_bytes is None else float(capacity_bytes),
    )


def _failures(facts: StudyFacts) -> list[ev.BankFailure]:
    out: dict[tuple[str, str], ev.BankFailure] = {}
    for t in facts.trials:
        if t.status not in FAILURE_KINDS:
            continue
        key = (t.status, t.candidate.key())
        if key in out:
            continue
        if t.status == "oom":
            out[key] = _failure("oom", t.candidate, t.reason or "out of memory",
                                censored_peak_bytes=t.censored_peak_bytes, capacity_bytes=t.memory_capacity_bytes)
        else:
            out[key] = _failure(t.status, t.candidate, t.reason or t.status)
    for v in facts.verifications:
        if v.failed_invariants:
            key = ("invariant_violation", v.candidate.key())
            out.setdefault(key, _failure("invariant_violation", v.candidate,
                                         "verify: " + ", ".join(sorted(v.failed_invariants))))
    # OOM boundaries are the most transferable failures (memory does not depend on the chip's speed).
    order = {k: i for i, k in enumerate(FAILURE_KINDS)}
    ranked = sorted(out.values(), key=lambda f: (order.get(f.kind, 99), f.detail, str(msgspec.to_builtins(f.candidate))))
    return ranked[:MAX_FAILURES]


def distil(facts: StudyFacts) -> ev.BankEntry:
    """The study's transferable lesson: metadata, effects with their uncertainty, winners and failures.

    Deterministic: the same facts give the same entry (effects sorted by feature name; ties broken by keys).
    """
    return ev.BankEntry(
        entry_id=entry_id_for(facts.study_id),
        origin_study=facts.study_id,
        meta=facts.meta,
        time_effects=_effects(facts.time_effects, facts.exclude_features),
        memory_effects=_effects(facts.memory_effects, facts.exclude_features),
        winners=_winners(facts),
        failures=_failures(facts),
    )


def bank_event(entry: ev.BankEntry, *, cluster_id: str, source: str = "reporter") -> ev.Event:
    """The envelope to publish: subject ``bank.<cluster_id>.<entry_id>``, event id derived from the content."""
    digest = hashlib.sha256(msgspec.json.encode(entry)).hexdigest()[:16]
    return ev.make_event(entry, study_id=entry.origin_study, source=source, cluster_id=cluster_id,
                         event_id=ev.derived_id(entry.entry_id, digest))
