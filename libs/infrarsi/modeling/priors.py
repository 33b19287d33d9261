"""Built-in knowledge base: what common knobs and patches usually do to step time and peak memory.

Owns: prior (mean, std) of each encoded feature's effect on log step time and log peak memory, keyed by knob
name + value (with aliases for the usual spellings) or patch id; patch metadata overrides the table; the
experience bank or an LLM may add overrides (`KnowledgeBase.with_overrides`). Must not: do I/O.

Invariant risk: ``KnowledgeBase.invariant`` holds Beta (a, b) priors of P(this knob setting breaks an invariant
on this workload), keyed like the invariant model's items (``"capacity_factor=1.0"``); patches carry theirs in
their metadata. The built-in table has none (every setting starts at the invariant model's small default); an
LLM may add them.

Effects are in natural-log units: -0.3 means about 26% faster (or smaller). Categorical levels carry absolute
level effects relative to a reference level of the table (e.g. recompute=none is 0), so a contract whose
baseline is another level still gets the right differences.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from infrarsi.modeling.space import FeatureEncoder, FeatureSpec

Effect = tuple[float, float]
"""(mean, std) of an effect in log units."""

ALIASES: dict[str, str] = {
    "tensor_parallel": "tp", "tensor_model_parallel_size": "tp", "tp_size": "tp",
    "pipeline_parallel": "pp", "pipeline_model_parallel_size": "pp", "pp_size": "pp",
    "data_parallel": "dp", "dp_size": "dp",
    "expert_parallel": "ep", "expert_model_parallel_size": "ep",
    "micro_batch_size": "micro_batch", "mbs": "micro_batch", "micro_batch": "micro_batch",
    "activation_checkpointing": "recompute", "recompute_granularity": "recompute", "checkpointing": "recompute",
    "grad_checkpointing": "recompute",
    "zero": "zero_stage", "zero_optimization_stage": "zero_stage",
    "flash_attn": "flash_attention", "use_flash_attn": "flash_attention",
    "sp": "sequence_parallel",
    "overlap_grad_reduce": "overlap_comm", "overlap": "overlap_comm",
    "bucket_size_mb": "bucket_mb", "bucket_cap_mb": "bucket_mb",
    "cpu_offload": "offload_optimizer", "offload": "offload_optimizer",
    "autocast_bf16": "bf16", "precision=bf16": "bf16", "amp_bf16": "bf16",
    "torch_compile": "compile",
    # the PyTorch launch keys of the reference workloads (workloads/gpt) and most plain training scripts
    "autocast_dtype=bfloat16": "bf16", "dtype=bfloat16": "bf16", "mixed_precision=bf16": "bf16",
    "attention=sdpa": "flash_attention", "attn_implementation=sdpa": "flash_attention",
    "adamw_impl": "optimizer_impl", "optim_impl": "optimizer_impl",
    # Hugging Face Trainer and Lightning flags (knobs delivered as argv or overrides)
    "per_device_train_batch_size": "micro_batch", "batch_size": "micro_batch",
    "gradient_checkpointing": "recompute",
}


@dataclass(frozen=True)
class KnowledgeBase:
    """Priors by canonical feature name. ``time``/``memory`` map names like ``"recompute=full"``,
    ``"micro_batch:log2"``, ``"flash_attention"`` or ``"patch:ID"`` to (mean, std)."""

    time: Mapping[str, Effect]
    memory: Mapping[str, Effect]
    device_kind: Literal["gpu", "cpu"] = "gpu"
    default_main: Effect = (0.0, 0.3)
    default_level: Effect = (0.0, 0.1)
    """Indicator of one value of a numeric knob: a shrunk deviation from its trend."""
    default_interaction: float = 0.06
    """Std of a pairwise interaction per unit of each factor's range (scaled by the time model)."""
    default_memory: Effect = (0.0, 0.3)
    patch_time: Mapping[str, Effect] = field(default_factory=dict)
    patch_memory: Mapping[str, Effect] = field(default_factory=dict)
    invariant: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """Beta (a, b) of P(the knob setting ``"knob=value"`` breaks an invariant on this workload)."""

    def with_overrides(self, time: Mapping[str, Effect] | None = None, memory: Mapping[str, Effect] | None = None,
                       invariant: Mapping[str, tuple[float, float]] | None = None) -> KnowledgeBase:
        """Bank or LLM priors layered over this table (later wins)."""
        return replace(self, time={**self.time, **(time or {})}, memory={**self.memory, **(memory or {})},
                       invariant={**self.invariant, **(invariant or {})})

    @staticmethod
    def canonical(name: str) -> str:
        if name in ALIASES:
            return ALIASES[name]
        for sep in ("=", ":"):
            if sep in name:
                knob, rest = name.split(sep, 1)
                return f"{ALIASES.get(knob, knob)}{sep}{rest}"
        return ALIASES.get(name, name)

    def _lookup(self, table: Mapping[str, Effect], spec: FeatureSpec) -> Effect | None:
        for key in (spec.name, self.canonical(spec.name)):
            if key in table:
                return table[key]
        return None

    def time_prior(self, spec: FeatureSpec) -> Effect:
        if spec.kind == "patch":
            pid = spec.name.removeprefix("patch:")
            if pid in self.patch_time:
                return self.patch_time[pid]
        hit = self._lookup(self.time, spec)
        if hit is not None:
            return hit
        return self.default_level if spec.kind == "level" and not _is_categorical_level(spec) else self.default_main

    def memory_prior(self, spec: FeatureSpec) -> Effect:
        if spec.kind == "patch":
            pid = spec.name.removeprefix("patch:")
            if pid in self.patch_memory:
                return self.patch_memory[pid]
        hit = self._lookup(self.memory, spec)
        return hit if hit is not None else (
            self.default_level if spec.kind == "level" and not _is_categorical_level(spec) else self.default_memory)

    def with_host(self, native_dtypes: Sequence[str]) -> KnowledgeBase:
        """This table with what the doctor measured of the trials' host laid over (``host_time_priors``): on a
        CPU the generic bf16 belief gives way to whether the host multiplies bf16 natively. No dtypes (not
        measured, or a GPU): unchanged."""
        host = host_time_priors(self.device_kind, native_dtypes)
        if not host:
            return self
        # every spelling of the same feature gives way (a bank or agent entry keyed "autocast_dtype=bfloat16")
        kept = {k: v for k, v in self.time.items() if self.canonical(k) not in host}
        return replace(self, time={**kept, **host})

    def knows_memory(self, spec: FeatureSpec) -> bool:
        """Whether the table has an entry for this feature's memory effect (not the default)."""
        return self._lookup(self.memory, spec) is not None

    def for_space(self, encoder: FeatureEncoder) -> KnowledgeBase:
        """This table with the space's patch metadata layered on (metadata beats the table)."""
        pt = {p.id: p.time_prior for p in encoder.space.patches if p.time_prior is not None}
        pm = {p.id: p.memory_prior for p in encoder.space.patches if p.memory_prior is not None}
        return replace(self, patch_time={**self.patch_time, **pt}, patch_memory={**self.patch_memory, **pm})

    def time_priors(self, encoder: FeatureEncoder) -> tuple[np.ndarray, np.ndarray]:
        kb = self.for_space(encoder)
        return _prior_vectors(encoder, kb.time_prior, kb.default_interaction)

    def memory_priors(self, encoder: FeatureEncoder, interaction_std: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
        kb = self.for_space(encoder)
        return _prior_vectors(encoder, kb.memory_prior, interaction_std)


def _prior_vectors(
    encoder: FeatureEncoder, prior: Callable[[FeatureSpec], Effect], interaction_std: float
) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) per encoded feature: a vague intercept, zero-mean interactions, ``prior`` for the rest."""
    mean = np.zeros(encoder.dim)
    std = np.zeros(encoder.dim)
    for i, spec in enumerate(encoder.specs):
        if spec.kind == "intercept":
            mean[i], std[i] = 0.0, 3.0
        elif spec.kind == "interaction":
            mean[i], std[i] = 0.0, interaction_std
        else:
            mean[i], std[i] = prior(spec)
    return mean, std


def _is_categorical_level(spec: FeatureSpec) -> bool:
    return spec.kind == "level" and isinstance(spec.value, str)


# Why these numbers: typical effects reported for Megatron-LM/DeepSpeed-style training of 1-70B models on
# A100/H100 (Korthikanti et al. 2022; Narayanan et al. 2021; the DeepSpeed ZeRO papers; FlashAttention papers),
# widened so that a workload where they do not hold is corrected after a few trials.
_GPU_TIME: dict[str, Effect] = {
    "bf16": (-0.3, 0.2),
    "compile": (-0.08, 0.1),
    "recompute=none": (0.0, 0.05),
    "recompute=selective": (0.03, 0.05),
    "recompute=full": (0.25, 0.1),
    "micro_batch:log2": (-0.04, 0.06),
    "tp:log2": (0.03, 0.15),
    "pp:log2": (0.05, 0.15),
    "dp:log2": (0.0, 0.15),
    "ep:log2": (-0.02, 0.15),
    "zero_stage:lin": (0.03, 0.08),
    "zero_stage=3": (0.08, 0.1),
    "flash_attention": (-0.15, 0.1),
    "sequence_parallel": (-0.03, 0.05),
    "overlap_comm": (-0.05, 0.05),
    "offload_optimizer": (0.3, 0.2),
    "bucket_mb:log2": (0.0, 0.02),
    "capacity_factor=1.0": (-0.04, 0.05),
    "capacity_factor=1.25": (0.0, 0.05),
    "capacity_factor=2.0": (0.12, 0.08),
    # torch.optim.AdamW: one multi-tensor kernel per group instead of a Python loop over parameters
    "optimizer_impl=foreach": (-0.03, 0.05),
    "optimizer_impl=fused": (-0.05, 0.05),
}
_GPU_MEMORY: dict[str, Effect] = {
    "bf16": (-0.2, 0.2),
    "recompute=none": (0.0, 0.05),
    "recompute=selective": (-0.3, 0.25),
    "recompute=full": (-0.6, 0.3),
    "micro_batch:log2": (0.3, 0.2),
    "tp:log2": (-0.35, 0.25),
    "pp:log2": (-0.2, 0.2),
    "dp:log2": (-0.05, 0.1),
    "ep:log2": (-0.2, 0.2),
    "zero_stage:lin": (-0.5, 0.4),
    "flash_attention": (-0.2, 0.2),
    "sequence_parallel": (-0.15, 0.15),
    "overlap_comm": (0.01, 0.02),
    "offload_optimizer": (-0.3, 0.2),
    "bucket_mb:log2": (0.005, 0.01),
    "capacity_factor=1.0": (-0.05, 0.05),
    "capacity_factor=1.25": (0.0, 0.05),
    "capacity_factor=2.0": (0.15, 0.1),
    "optimizer_impl=foreach": (0.02, 0.05),
}
# CPU hosts: bf16 autocast is faster where the CPU has bf16 dot products (AVX512-BF16/AMX; 1.45x on the
# dense reference here) and slower where it must emulate them, hence a wide prior. torch.compile holds
# Inductor's compiler workers and generated code in host memory: in the dense-1node demo every compiled trial
# exceeded a 1 GiB capacity that the same settings without compile stayed under (~0.8 GiB).
_CPU_TIME: dict[str, Effect] = {**_GPU_TIME, "bf16": (-0.1, 0.3), "flash_attention": (0.0, 0.1), "compile": (-0.1, 0.15)}
_CPU_MEMORY: dict[str, Effect] = {**_GPU_MEMORY, "compile": (0.5, 0.4)}


# Measured with the dense reference job (workloads/gpt, dense-1node, micro-batch 8, 2 threads): on a Xeon with
# AMX/AVX512-BF16, bf16 autocast 0.17 s/step against fp32's 0.32 s (log -0.63); the same host with oneDNN capped at
# AVX2 (ONEDNN_MAX_CPU_ISA=AVX2, bf16 emulated) 7.7 s (log +3.2); an AVX2-only EPYC 16.5 s against ~0.8 s (+3.0).
# A Hugging Face Trainer job on that EPYC: 32 and 52 s/step against 2.3 s (+2.6, +3.1). The std keeps a job whose
# bf16 share of the step is small (a memory-bound step) within reach of the evidence.
_HOST_BF16: dict[bool, Effect] = {True: (-0.4, 0.25), False: (2.5, 0.8)}


def host_time_priors(device_kind: Literal["gpu", "cpu"], native_dtypes: Sequence[str]) -> dict[str, Effect]:
    """Time priors that follow from the host's measured matmul dtypes (``DoctorCompleted.host_native_dtypes``):
    on a CPU, bf16 autocast is expected faster with bf16 units and far slower without them (emulated). Empty when
    nothing is known (no dtypes) or on a GPU, whose generic table already assumes bf16 tensor cores."""
    if device_kind != "cpu" or not native_dtypes:
        return {}
    return {"bf16": _HOST_BF16["bfloat16" in native_dtypes]}


def default_knowledge_base(device_kind: Literal["gpu", "cpu"] = "gpu") -> KnowledgeBase:
    return KnowledgeBase(time=dict(_CPU_TIME if device_kind == "cpu" else _GPU_TIME),
                         memory=dict(_CPU_MEMORY if device_kind == "cpu" else _GPU_MEMORY),
                         device_kind=device_kind)
