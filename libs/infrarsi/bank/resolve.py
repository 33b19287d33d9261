"""Resolving the bank for a new study, once, at ``init``: which entries inform it, the priors they give its
features, and the winners it starts from.

Owns: ``study_meta`` (the study's ``BankMeta``, from its contract and golden launch file) and the pure
``resolve_bank(entries, study, meta) -> events.BankResolution`` that ``init`` records in ``StudyCreated.bank``.
Must not: do I/O (``init`` reads the bank with ``federation.read_bank_entries`` and passes the entries in).

Why at ``init`` and not in the modeler or the proposer: bank entries live in ``IRSI_BANK``, the study's lifecycle
in ``IRSI``; a service that read both could not replay them in one deterministic order, so two lives of the same
service (or the modeler and the proposer) could start the same study from different priors. Resolved here and
recorded in ``StudyCreated``, the bank is one more fact of the lifecycle log: every replay sees the same priors.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from infrarsi import events as ev
from infrarsi.bank.distil import meta_from_cluster
from infrarsi.bank.similarity import explain_seeds
from infrarsi.bank.transfer import TransferConfig, bank_priors, bank_seeds
from infrarsi.modeling.adapt import knowledge_base_priors
from infrarsi.modeling.priors import KnowledgeBase
from infrarsi.modeling.space import Categorical, FeatureEncoder
from infrarsi.sim.scenarios import get_scenario
from infrarsi.study.space import StudySpace

PARALLEL_DIMENSIONS = ("tp", "pp", "dp", "ep")
SIM_PRECISION = "bf16"
"""The simulator models bf16 training (its peak rates are the bf16 ones)."""


def study_meta(study: StudySpace, cluster: ev.ClusterInfo) -> ev.BankMeta:
    """What a study is matched on: the cluster, and what the golden launch file and contract say about the
    parallelism and batch (knobs recognised by their knowledge-base names: ``tp``, ``micro_batch``, …). Model
    family, size and sequence length are known for simulator scenarios only; unknown values are neutral in
    ``similarity``."""
    baseline = {KnowledgeBase.canonical(name): value for name, value in study.baseline.knobs.items()}
    parallelism = {dim: int(baseline[dim]) for dim in PARALLEL_DIMENSIONS if isinstance(baseline.get(dim), int)}
    gb = study.contract.search_space.constraints.global_batch
    if gb is not None and gb.data_parallel > 1:
        parallelism.setdefault("dp", gb.data_parallel)
    if isinstance(baseline.get("zero_stage"), int):
        parallelism["zero"] = int(baseline["zero_stage"])
    micro_batch = baseline.get("micro_batch")
    meta = meta_from_cluster(
        cluster, parallelism=parallelism, model_family="", model_params=0.0, seq_len=0,
        global_batch=gb.size if gb is not None else 0,
        micro_batch=int(micro_batch) if isinstance(micro_batch, int) else 0, precision="",
    )
    if study.scenario is None:
        return meta
    sc = get_scenario(study.scenario)
    return ev.BankMeta(**{
        **{f: getattr(meta, f) for f in meta.__struct_fields__},
        "model_family": "moe" if sc.model.experts > 1 else "dense", "model_params": float(sc.model.total_params),
        "seq_len": sc.model.seq_len, "global_batch": sc.global_batch, "precision": SIM_PRECISION,
    })


def transferable_features(study: StudySpace) -> dict[str, str]:
    """Effect name in a bank entry → the encoded feature of ``study`` whose prior it is.

    Entries distilled by the reporter carry ``ModelUpdated`` effects: the change of log step time (or peak
    memory) when only one setting moves off the baseline (``attention=sdpa``, ``compile=True``,
    ``micro_batch_size=8``, ``patch:<id>``). That change *is* the coefficient of a patch, a bool and a
    categorical level; it is not the coefficient of an integer knob's level feature (a deviation from the
    knob's log2/linear trend), so those are not transferred. Entries that already carry encoded features
    (``micro_batch_size:log2``, ``compile``: ``adapt.searcher_effects``) map to themselves.
    """
    out: dict[str, str] = {}
    for spec in FeatureEncoder(study.space, interactions=False).specs:
        match spec.kind:
            case "patch" | "numeric":
                out[spec.name] = spec.name
            case "bool":
                out[spec.name] = spec.name
                out[f"{spec.name}=True"] = spec.name
            case "level" if spec.knob is not None and isinstance(study.space.knob(spec.knob), Categorical):
                out[spec.name] = spec.name
    return out


def _renamed(entry: ev.BankEntry, names: dict[str, str]) -> ev.BankEntry:
    def effects(table: list[ev.Effect]) -> list[ev.Effect]:
        return [msgspec.structs.replace(e, feature=names[e.feature]) for e in table if e.feature in names]

    return msgspec.structs.replace(entry, time_effects=effects(entry.time_effects),
                                   memory_effects=effects(entry.memory_effects))


def resolve_bank(entries: Iterable[ev.BankEntry], study: StudySpace, meta: ev.BankMeta, *,
                 config: TransferConfig | None = None) -> ev.BankResolution:
    """Everything the study takes from the bank: the similar entries and why, the shrunk priors of its own
    encoded features (``transferable_features``; interactions excluded: the Searcher cannot take them), and
    the winners mapped into its space (``StudySpace.adapt_event``). Deterministic: the same entries (in any order) and the same study give the same resolution."""
    config = config or TransferConfig()
    entries = sorted(entries, key=lambda e: e.entry_id)
    matches = [ev.BankMatch(entry_id=i, similarity=s, why=w)
               for i, s, w in explain_seeds(entries, meta, threshold=config.threshold)]
    kb_time, kb_memory = knowledge_base_priors(study.space, study.kb, interactions=False)
    names = transferable_features(study)
    priors = bank_priors([_renamed(e, names) for e in entries], meta, kb_time=kb_time, kb_memory=kb_memory,
                         features=set(names.values()), config=config)
    seeds = bank_seeds(entries, meta, adapt=study.adapt_event, config=config)

    def table(target: str) -> dict[str, ev.BankPrior]:
        chosen = priors.time if target == "time" else priors.memory
        return {name: ev.BankPrior(mean=p.mean, std=p.std, entries=list(p.entries), similarity=p.similarity)
                for name, p in sorted(chosen.items())}

    return ev.BankResolution(
        meta=meta, matches=matches, time_priors=table("time"), memory_priors=table("memory"),
        seeds=[ev.BankSeedCandidate(candidate=s.candidate, entry_id=s.entry_id, similarity=s.similarity,
                                    score=s.score, reason=s.reason) for s in seeds],
    )
