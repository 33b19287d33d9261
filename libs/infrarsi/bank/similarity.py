"""How much a bank entry's lesson applies to a new study: a similarity in [0, 1] between two ``BankMeta``.

Owns: the accelerator generation table, the per-attribute kernels, their product (``similarity``), the
per-attribute breakdown that says *why* (``similarity_terms``), and ``explain_seeds`` that ``infrarsi init``
calls to report which entries will seed a new study. Must not: do I/O or know the search space.

The formula (docs/bank.md §Similarity)::

    s(new, entry) = k_gen · k_kind · k_mem · k_params · k_seq · k_mbs · k_scale · k_par · k_family
                    · k_precision · k_interconnect

    k_gen      = 1.0 same accelerator generation, 0.6 adjacent, 0.3 two or more apart
    k_kind     = 1.0 same device kind (gpu/cpu), 0.1 otherwise (an emulated CPU lesson says little about a GPU)
    k_x        = exp(-½ (ln(x_new / x_entry) / ℓ_x)²)   for memory (ℓ = ln 2), model size (ℓ = ln 2),
                 sequence length (ℓ = ln 2), micro-batch (ℓ = ln 4), devices = nodes × devices_per_node (ℓ = ln 4)
    k_par      = 0.5 + 0.5 · Jaccard(parallel modes)  — modes are the dimensions with degree > 1
                 (dp, tp, pp, ep, cp; "zero" counts when zero_stage > 0)
    k_family   = 1.0 same model family, 0.3 otherwise (dense vs MoE: different bottlenecks)
    k_precision= 1.0 same, 0.7 otherwise;  k_interconnect = 1.0 same, 0.8 otherwise

An unknown value (0 or "") on either side gives that kernel 1.0 — it neither helps nor hurts — and
``similarity_terms`` says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from infrarsi import events as ev

# Ordinal generations; adjacent = 1 apart. Keys are matched case-insensitively as SKU prefixes.
GENERATIONS: dict[str, int] = {"volta": 0, "ampere": 1, "ada": 1, "hopper": 2, "blackwell": 3}
_SKU_GENERATION: tuple[tuple[str, str], ...] = (
    ("v100", "volta"),
    ("a100", "ampere"), ("a10", "ampere"), ("a30", "ampere"), ("a40", "ampere"),
    ("l40", "ada"), ("l4", "ada"),
    ("h100", "hopper"), ("h200", "hopper"), ("h800", "hopper"), ("gh200", "hopper"),
    ("b100", "blackwell"), ("b200", "blackwell"), ("gb200", "blackwell"),
)

GEN_SAME, GEN_ADJACENT, GEN_FAR = 1.0, 0.6, 0.3
KIND_MISMATCH = 0.1
FAMILY_MISMATCH = 0.3
PRECISION_MISMATCH = 0.7
INTERCONNECT_MISMATCH = 0.8
LENGTH_SCALES: dict[str, float] = {
    "memory": math.log(2.0),
    "params": math.log(2.0),
    "seq_len": math.log(2.0),
    "micro_batch": math.log(4.0),
    "devices": math.log(4.0),
}


def generation_of(accelerator: str) -> str:
    """Generation name of an accelerator SKU (``H100-80G`` → ``hopper``); ``cpu`` for CPU hosts, else ``unknown``."""
    sku = accelerator.lower()
    if sku.startswith("cpu"):
        return "cpu"
    # longest prefix first so that "gh200" is not read as "h200"'s neighbour by accident
    for prefix, gen in sorted(_SKU_GENERATION, key=lambda p: -len(p[0])):
        if sku.startswith(prefix):
            return gen
    return "unknown"


def generation_distance(a: str, b: str) -> int | None:
    """|ordinal(a) − ordinal(b)|; None when either is unknown or a CPU."""
    if a not in GENERATIONS or b not in GENERATIONS:
        return None
    return abs(GENERATIONS[a] - GENERATIONS[b])


def _gen(meta: ev.BankMeta) -> str:
    return meta.generation.lower() if meta.generation else generation_of(meta.accelerator)


def _kind(meta: ev.BankMeta) -> str:
    return "cpu" if _gen(meta) == "cpu" else "gpu"


def log_ratio_kernel(x_new: float, x_entry: float, length_scale: float) -> float:
    """exp(-½ (ln(x_new/x_entry)/ℓ)²); 1.0 when either value is unknown (≤ 0)."""
    if x_new <= 0 or x_entry <= 0:
        return 1.0
    z = math.log(x_new / x_entry) / length_scale
    return math.exp(-0.5 * z * z)


def parallel_modes(meta: ev.BankMeta) -> frozenset[str]:
    """Parallelism dimensions in use: those with degree > 1 (``zero`` when a ZeRO stage is set)."""
    modes = set()
    for name, degree in meta.parallelism.items():
        key = name.lower()
        if key in ("zero", "zero_stage"):
            if degree > 0:
                modes.add("zero")
        elif degree > 1:
            modes.add(key)
    return frozenset(modes)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


@dataclass(frozen=True)
class SimilarityTerm:
    """One factor of the product, with the values that produced it."""

    name: str
    value: float
    detail: str


def cross_generation_distance(new: ev.BankMeta, entry: ev.BankMeta) -> int:
    """Generations apart (0 same; 1 adjacent; 2+ far); a CPU/GPU or unknown pairing counts as far (2)."""
    if _kind(new) != _kind(entry):
        return 2
    if _gen(new) == _gen(entry):
        return 0
    d = generation_distance(_gen(new), _gen(entry))
    return 2 if d is None else d


def similarity_terms(new: ev.BankMeta, entry: ev.BankMeta) -> list[SimilarityTerm]:
    """Every kernel of the product, in the order of the module docstring."""
    terms: list[SimilarityTerm] = []
    g_new, g_entry = _gen(new), _gen(entry)
    if _kind(new) != _kind(entry):
        terms.append(SimilarityTerm("generation", GEN_FAR, f"{g_entry} vs {g_new}"))
        terms.append(SimilarityTerm("kind", KIND_MISMATCH, f"{_kind(entry)} lesson for a {_kind(new)} study"))
    else:
        d = cross_generation_distance(new, entry)
        k = GEN_SAME if d == 0 else GEN_ADJACENT if d == 1 else GEN_FAR
        label = "same generation" if d == 0 else "adjacent generation" if d == 1 else "generations far apart"
        terms.append(SimilarityTerm("generation", k, f"{label} ({g_entry} vs {g_new})"))
    ls = LENGTH_SCALES
    gib = 2**30
    terms.append(SimilarityTerm(
        "memory", log_ratio_kernel(new.device_memory_bytes, entry.device_memory_bytes, ls["memory"]),
        f"{entry.device_memory_bytes / gib:.0f} GiB vs {new.device_memory_bytes / gib:.0f} GiB"))
    terms.append(SimilarityTerm(
        "model_size", log_ratio_kernel(new.model_params, entry.model_params, ls["params"]),
        f"{entry.model_params / 1e9:.1f}B vs {new.model_params / 1e9:.1f}B params"))
    terms.append(SimilarityTerm(
        "seq_len", log_ratio_kernel(new.seq_len, entry.seq_len, ls["seq_len"]), f"{entry.seq_len} vs {new.seq_len}"))
    terms.append(SimilarityTerm(
        "micro_batch", log_ratio_kernel(new.micro_batch, entry.micro_batch, ls["micro_batch"]),
        f"{entry.micro_batch} vs {new.micro_batch}"))
    n_new, n_entry = new.nodes * new.devices_per_node, entry.nodes * entry.devices_per_node
    terms.append(SimilarityTerm(
        "devices", log_ratio_kernel(n_new, n_entry, ls["devices"]), f"{n_entry} vs {n_new} devices"))
    m_new, m_entry = parallel_modes(new), parallel_modes(entry)
    terms.append(SimilarityTerm(
        "parallelism", 0.5 + 0.5 * jaccard(m_new, m_entry),
        f"{'+'.join(sorted(m_entry)) or 'none'} vs {'+'.join(sorted(m_new)) or 'none'}"))
    terms.append(_categorical("model_family", new.model_family, entry.model_family, FAMILY_MISMATCH))
    terms.append(_categorical("precision", new.precision, entry.precision, PRECISION_MISMATCH))
    terms.append(_categorical("interconnect", new.interconnect, entry.interconnect, INTERCONNECT_MISMATCH))
    return terms


def _categorical(name: str, new: str, entry: str, mismatch: float) -> SimilarityTerm:
    if not new or not entry:
        return SimilarityTerm(name, 1.0, "unknown")
    same = new.lower() == entry.lower()
    return SimilarityTerm(name, 1.0 if same else mismatch, f"{entry} vs {new}")


def similarity(new: ev.BankMeta, entry: ev.BankMeta) -> float:
    """Product of the per-attribute kernels (module docstring), in [0, 1]; 1.0 for identical metadata."""
    return math.prod(t.value for t in similarity_terms(new, entry))


def why(terms: Sequence[SimilarityTerm], top: int = 3) -> str:
    """A one-line reason: the weakest factors (those that cost the most similarity), or 'same setting'."""
    weak = sorted((t for t in terms if t.value < 0.999), key=lambda t: t.value)[:top]
    if not weak:
        return "same hardware, model, parallelism and batch"
    return "; ".join(f"{t.name} {t.value:.2f} ({t.detail})" for t in weak)


SEED_THRESHOLD = 0.05
"""Entries below this similarity contribute nothing (their shrunk effect would be the knowledge base anyway)."""


def explain_seeds(
    bank_entries: Iterable[ev.BankEntry], study_meta: ev.BankMeta, *, threshold: float = SEED_THRESHOLD,
    limit: int | None = None,
) -> list[tuple[str, float, str]]:
    """Which entries will seed a study with ``study_meta``, most similar first: ``(entry_id, similarity, why)``.

    Ties are broken by entry id, so the answer is deterministic. ``infrarsi init`` prints this list and records
    the ids in ``StudyCreated.bank_seeds``.
    """
    out = []
    for entry in bank_entries:
        terms = similarity_terms(study_meta, entry.meta)
        s = math.prod(t.value for t in terms)
        if s >= threshold:
            out.append((entry.entry_id, s, why(terms)))
    out.sort(key=lambda r: (-r[1], r[0]))
    return out[:limit] if limit is not None else out
