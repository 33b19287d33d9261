"""The launch file of the reference GPT job: one pydantic model per concern, loaded and validated once.

A launch file is YAML with three sections:

- ``model``: the network (dense or MoE). Locked by every contract: changing it changes what is trained.
- ``run``: the work (seed, steps, global batch, sequence length, eval batch and interval, optimiser
  hyper-parameters). Locked by every contract: these are what the work and loss invariants compare.
- ``knobs``: schedule-only settings. A contract lists which of them a study may change. Each changes how
  fast the same work runs and/or how much memory it needs, never which tokens are trained on.

Overrides come as dotted keys (``knobs.micro_batch_size=8``) whose values are parsed as YAML scalars,
then the whole file is validated again; nothing reaches the job through a shell string.
This module owns parsing and validation only; it must not import torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator


class ModelConfig(BaseModel):
    """The network. Dense and MoE share everything but the feed-forward block."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["dense", "moe"] = "dense"
    """``dense``: a GELU MLP in every block. ``moe``: a token-choice top-k Mixture-of-Experts in every block."""
    vocab_size: int = Field(512, ge=8)
    """Tokens of the synthetic corpus (see ``data.py``)."""
    seq_len: int = Field(128, ge=4)
    """Tokens per training sequence; the model's context length."""
    n_layer: int = Field(4, ge=1)
    n_head: int = Field(6, ge=1)
    d_model: int = Field(192, ge=8)
    """Residual width; must be divisible by ``n_head``."""
    mlp_hidden: int = Field(768, ge=8)
    """Hidden width of the dense MLP (4 × d_model, as in GPT-2)."""
    n_experts: int = Field(4, ge=1)
    """MoE only: experts per layer; must be divisible by the number of ranks (expert parallelism)."""
    top_k: int = Field(2, ge=1)
    """MoE only: experts each token is routed to (token choice)."""
    expert_hidden: int = Field(384, ge=8)
    """MoE only: hidden width of each expert. 4 experts × 384 with top-2 ≈ the dense MLP's active FLOPs."""
    aux_loss_coef: float = Field(0.01, ge=0.0)
    """MoE only: weight of the Switch-style load-balancing loss (E · Σ_e f_e · P_e), per sequence."""
    init_std: float = 0.02

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if self.kind == "moe" and self.top_k > self.n_experts:
            raise ValueError(f"top_k={self.top_k} > n_experts={self.n_experts}")
        return self


class RunConfig(BaseModel):
    """The work: what the invariants hold fixed (steps, tokens per step, data order, eval batch and interval)."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 1234
    """Seeds the weights (identical on every rank) and the corpus."""
    steps: int = Field(30, ge=1)
    """Optimiser steps of a trial."""
    global_batch_size: int = Field(32, ge=1)
    """Sequences per optimiser step over all ranks. micro_batch × accumulation × data-parallel ranks = this."""
    lr: float = 3e-3
    warmup_steps: int = Field(5, ge=0)
    min_lr_ratio: float = 0.1
    """Cosine decay from ``lr`` to ``lr × min_lr_ratio`` at ``steps``."""
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = Field(1.0, ge=0.0)
    """Global gradient-norm clip; 0 disables it."""
    eval_every: int = Field(10, ge=1)
    """Evaluate the fixed eval batch after every ``eval_every``-th optimiser step (and after the last)."""
    eval_batch_size: int = Field(16, ge=1)
    """Sequences of the fixed, held-out eval batch (the same sequences at every eval)."""


class Knobs(BaseModel):
    """Schedule-only settings: each changes speed and/or memory, none changes the tokens of a step.

    Numerical effects are limited to floating-point rounding, except where a docstring says otherwise
    (``autocast_dtype`` rounds in bf16; ``moe_capacity_factor`` changes which tokens an expert drops).
    """

    model_config = ConfigDict(extra="forbid")

    micro_batch_size: int = Field(4, ge=1)
    """Sequences per forward/backward on one rank. Gradient accumulation is derived:
    global_batch_size / (micro_batch_size × data-parallel ranks). Speed: larger micro-batches use the cores
    better (fewer, bigger GEMMs; fewer optimiser-free passes). Memory: activations grow linearly with it."""
    activation_checkpointing: Literal["none", "selective", "full"] = "none"
    """Recompute activations in the backward pass instead of keeping them. ``selective`` recomputes only
    the attention sub-block (its T×T score matrices are the biggest activations under manual attention);
    ``full`` recomputes every transformer block. Memory: lower peak. Speed: ~+1/3 forward FLOPs for full."""
    attention: Literal["manual", "sdpa"] = "manual"
    """``manual``: explicit QKᵀ, mask, softmax, ·V (materialises B×H×T×T scores, kept for backward).
    ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-efficient kernels).
    Speed: faster on CPU and GPU. Memory: no T×T matrices kept (CPU measured ~20% less peak RSS)."""
    compile: bool = False
    """``torch.compile`` each transformer block (torchtitan style). Speed: fuses element-wise ops after a
    compile warm-up of tens of seconds on CPU (counted in the trial's cost). Memory: fewer intermediates."""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    """Inductor mode when ``compile`` is on. ``reduce-overhead`` uses CUDA graphs (GPU only: more memory)."""
    autocast_dtype: Literal["float32", "bfloat16"] = "float32"
    """Autocast the forward pass to this dtype (weights, grads and optimiser state stay float32).
    Speed: bf16 GEMMs are ~1.4× faster on an AVX512-BF16 CPU and far faster on tensor cores.
    Memory: activations halve. Numerics: bf16 rounding — checked by the loss invariant's tolerance."""
    optimizer_impl: Literal["for_loop", "foreach", "fused"] = "for_loop"
    """AdamW implementation: ``for_loop`` (one kernel chain per parameter), ``foreach`` (multi-tensor
    ops), ``fused`` (one fused kernel; CPU and CUDA in torch ≥ 2.4). Speed only; memory: foreach keeps a
    few temporary tensor lists."""
    intra_op_threads: int = Field(2, ge=1)
    """``torch.set_num_threads`` for this rank. Speed on CPU: more threads per rank until the cores are
    oversubscribed (ranks × threads > cores is slower). Little effect on GPU."""
    ddp_bucket_cap_mb: float = Field(25.0, gt=0)
    """DDP gradient bucket size. Speed (several ranks only): small buckets overlap all-reduce with backward
    sooner but launch more collectives. No effect with one rank (DDP is not used)."""
    gradient_as_bucket_view: bool = False
    """Let DDP gradients alias its all-reduce buckets. Memory: saves one copy of the gradients.
    Speed: saves a copy per bucket. Several ranks only."""
    sharding: Literal["ddp", "fsdp2", "fsdp2_no_reshard", "fsdp1"] = "ddp"
    """Data-parallel wrapper. ``ddp``: replicated weights/optimiser state. ``fsdp2``: per-block
    ``fully_shard`` (params, grads and AdamW state sharded over ranks; re-gathered for backward) — a memory
    saver that costs communication. ``fsdp2_no_reshard``: keep gathered params between forward and backward
    (more memory, less communication). ``fsdp1``: refused on CPU (FSDP1 needs CUDA). Dense model only."""
    moe_capacity_factor: float = Field(1.25, gt=0)
    """MoE only: each expert takes at most ceil(factor × T × top_k / n_experts) tokens per sequence; the rest
    skip the expert (residual only). Speed and memory: smaller factor → fewer padded expert slots. Numerics:
    changes which tokens are dropped, so the loss invariant decides whether a smaller factor is acceptable."""
    moe_expert_impl: Literal["loop", "batched"] = "loop"
    """MoE only: ``loop`` runs the local experts one GEMM pair at a time (readable reference);
    ``batched`` runs all local experts as one batched GEMM (``torch.bmm``). Speed only."""
    dataloader_workers: int = Field(0, ge=0)
    """Worker processes that generate batches ahead of the step. 0 = in the training process (its time
    shows as the ``data`` phase). Speed: hides data time; on a host with few cores workers compete with
    the compute threads. Memory: each worker is a process (RSS)."""


class LaunchConfig(BaseModel):
    """The whole launch file."""

    model_config = ConfigDict(extra="forbid")

    model: ModelConfig = ModelConfig()
    run: RunConfig = RunConfig()
    knobs: Knobs = Knobs()
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """``auto``: CUDA (NCCL) when available, else CPU (gloo)."""

    def accumulation_steps(self, data_parallel: int) -> int:
        """Micro-batches per optimiser step on each rank; raises when the global batch does not split."""
        per_rank, rest = divmod(self.run.global_batch_size, data_parallel)
        if rest:
            raise ValueError(f"global_batch_size={self.run.global_batch_size} does not split over {data_parallel} ranks")
        accum, rest = divmod(per_rank, self.knobs.micro_batch_size)
        if rest:
            raise ValueError(
                f"micro_batch_size={self.knobs.micro_batch_size} does not divide the {per_rank} sequences per rank"
            )
        return accum

    def check_world(self, world_size: int, on_cuda: bool) -> None:
        """Rules that depend on where the job runs; called once the process group exists."""
        self.accumulation_steps(world_size)
        if self.run.eval_batch_size % world_size:
            raise ValueError(f"eval_batch_size={self.run.eval_batch_size} does not split over {world_size} ranks")
        if self.model.kind == "moe":
            if self.model.n_experts % world_size:
                raise ValueError(f"n_experts={self.model.n_experts} does not split over {world_size} ranks")
            if self.knobs.sharding != "ddp":
                raise ValueError("the MoE workload supports sharding=ddp only (experts are already sharded by EP)")
        if self.knobs.sharding == "fsdp1" and not on_cuda:
            raise ValueError("sharding=fsdp1 needs CUDA; on CPU use fsdp2")


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for name in parents:
        node = node.setdefault(name, {})
        if not isinstance(node, dict):
            raise ValueError(f"{dotted}: {name} is not a section")
    node[leaf] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``knobs.micro_batch_size=8`` → ("knobs.micro_batch_size", 8); the value is a YAML scalar."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ValueError(f"override {text!r} is not KEY=VALUE")
    return key.strip(), yaml.safe_load(raw)


def load_launch(path: str | Path | None, overrides: dict[str, Any] | None = None) -> LaunchConfig:
    """Read a launch file (or the defaults when ``path`` is None), apply dotted overrides, validate."""
    tree: dict[str, Any] = {}
    if path is not None:
        tree = yaml.safe_load(Path(path).read_text()) or {}
    for key, value in (overrides or {}).items():
        _set_dotted(tree, key, value)
    return LaunchConfig.model_validate(tree)
