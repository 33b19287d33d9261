"""SIMULATOR physics: analytic step time and peak memory of one LLM training step on a GPU cluster.

Owns: the noise-free cost model (compute, HBM traffic, tensor/pipeline/data/expert-parallel communication,
1F1B pipeline bubbles, optimizer step, ZeRO, recomputation, offload) and the peak-memory model (2+2+12 bytes
per parameter under ZeRO sharding, Korthikanti et al. 2022 activations). Must not: draw random numbers (noise
and stragglers live in `scenarios.py`) or claim to be a measurement.

Rank layout (Megatron order): tensor-parallel ranks innermost, then expert/data-parallel, then pipeline stages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from infrarsi.sim.hardware import DeviceSpec, ModelSpec

Recompute = Literal["none", "selective", "full"]
BF16 = 2
COLLECTIVE_LATENCY_S = 20e-6
STEP_OVERHEAD_S = 0.02
WORKSPACE_BYTES = 1.5 * 2**30
CPU_ADAM_BYTES_PER_S = 40e9


@dataclass(frozen=True)
class Setting:
    """One fully specified parallel/runtime configuration (the simulator's view of a candidate)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    micro_batch: int = 1
    recompute: Recompute = "none"
    zero_stage: int = 0
    sequence_parallel: bool = False
    flash_attention: bool = True
    overlap_comm: bool = True
    bucket_mb: int = 25
    capacity_factor: float = 1.25
    offload_optimizer: bool = False
    patches: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Hidden:
    """Per-scenario corrections the analytic formulas do not know (seeded), so the textbook estimate is not the
    answer. Keys: a knob-setting such as ``"recompute=full"``; missing keys mean 1.0."""

    activation: dict[str, float] = field(default_factory=dict)
    static: dict[str, float] = field(default_factory=dict)
    fragmentation: float = 1.05
    time: dict[str, float] = field(default_factory=dict)

    def act_factor(self, s: Setting) -> float:
        return (self.activation.get(f"recompute={s.recompute}", 1.0)
                * self.activation.get(f"flash_attention={s.flash_attention}", 1.0)
                * self.activation.get(f"sequence_parallel={s.sequence_parallel}", 1.0))

    def static_factor(self, s: Setting) -> float:
        return self.static.get(f"zero_stage={s.zero_stage}", 1.0) * self.static.get(
            f"offload_optimizer={s.offload_optimizer}", 1.0)


@dataclass(frozen=True)
class Breakdown:
    step_time_s: float
    peak_bytes: float
    compute_s: float
    memory_traffic_s: float
    tp_comm_s: float
    ep_comm_s: float
    pp_comm_s: float
    bubble_fraction: float
    dp_comm_exposed_s: float
    optimizer_s: float
    static_bytes: float
    activation_bytes: float


def pipeline_bubble_fraction(pp: int, microbatches: int) -> float:
    """1F1B (non-interleaved) idle fraction: (pp - 1) / (m + pp - 1)."""
    return (pp - 1) / (microbatches + pp - 1)


def ring_allreduce_s(nbytes: float, ranks: int, bw: float) -> float:
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / bw + 2 * (ranks - 1) * COLLECTIVE_LATENCY_S


def ring_allgather_s(nbytes: float, ranks: int, bw: float) -> float:
    """All-gather (or reduce-scatter) of a tensor whose full size is nbytes."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) / ranks * nbytes / bw + (ranks - 1) * COLLECTIVE_LATENCY_S


def gemm_efficiency(rows: float, cols: float) -> float:
    """Achieved fraction of peak for a (rows x cols) activation GEMM: small GEMMs starve the tensor cores."""
    size = rows * cols / 1e6
    return 0.78 * size / (size + 0.6)


def model_state_bytes_per_param(zero_stage: int, dp: int, offload_optimizer: bool) -> float:
    """bf16 params (2) + bf16 grads (2) + fp32 master/momentum/variance (12), sharded over dp by ZeRO stage."""
    opt = 0.0 if offload_optimizer else 12.0
    if zero_stage == 0:
        return 2 + 2 + opt
    if zero_stage == 1:
        return 2 + 2 + opt / dp
    if zero_stage == 2:
        return 2 + (2 + opt) / dp
    return (2 + 2 + opt) / dp


def activation_bytes_per_layer(m: ModelSpec, s: Setting, seq: int) -> float:
    """Korthikanti et al. 2022, bytes per transformer layer per micro-batch on one tensor-parallel rank.

    No recompute: s*b*h*(10 + 24/t + 5*a*s/(h*t)); with sequence parallel the 10 becomes 10/t. Selective
    recompute or flash attention drop the 5as/h term (the attention matrix). Full recompute keeps the layer
    input only (2sbh, /t with sequence parallel); one layer's full working set is added once by the caller.
    MoE: the MLP share (19 of the 34) is multiplied by top_k * capacity_factor.
    """
    sbh = seq * s.micro_batch * m.hidden
    t = s.tp
    mlp_scale = m.top_k * s.capacity_factor if m.experts > 1 else 1.0
    replicated = 10.0 / t if s.sequence_parallel else 10.0  # norms/dropout inputs, replicated without SP
    split = 5.0 / t + 19.0 * mlp_scale / t  # attention projections, MLP
    attn_matrix = 0.0 if (s.flash_attention or s.recompute != "none") else 5.0 * m.heads * seq / (m.hidden * t)
    full_layer = sbh * (replicated + split + attn_matrix)
    if s.recompute == "full":
        return 2.0 * sbh / (t if s.sequence_parallel else 1)
    return full_layer


def _stage_params(m: ModelSpec, s: Setting) -> tuple[float, float, float]:
    """Parameters held by one GPU of the first stage: (dense part, expert part, embedding part)."""
    layers = m.layers / s.pp
    dense = layers * (m.attn_params_per_layer + (m.mlp_params_per_layer if m.experts == 1 else
                                                  m.hidden * m.experts)) / s.tp
    expert = layers * m.experts * m.expert_params_per_layer / (s.tp * s.ep) if m.experts > 1 else 0.0
    embed = (m.embedding_params if s.pp == 1 else m.embedding_params / 2) / s.tp
    return dense, expert, embed


def peak_memory_bytes(m: ModelSpec, s: Setting, global_batch: int, hidden: Hidden) -> tuple[float, float, float]:
    """(peak, static, activations) on the busiest GPU, bytes."""
    dense, expert, embed = _stage_params(m, s)
    expert_dp = max(s.dp // s.ep, 1)
    static = ((dense + embed) * model_state_bytes_per_param(s.zero_stage, s.dp, s.offload_optimizer)
              + expert * model_state_bytes_per_param(s.zero_stage, expert_dp, s.offload_optimizer))
    if s.zero_stage == 3:  # prefetched full parameters of ~2 layers
        static += 2 * (dense + expert) / (m.layers / s.pp) * BF16
    static *= hidden.static_factor(s)
    microbatches = _microbatches(s, global_batch)
    in_flight = min(s.pp, microbatches)
    layers = m.layers / s.pp
    per_layer = activation_bytes_per_layer(m, s, m.seq_len)
    act = layers * in_flight * per_layer
    if s.recompute == "full":  # the layer being recomputed holds its full working set
        act += activation_bytes_per_layer(m, Setting(**{**s.__dict__, "recompute": "selective"}), m.seq_len)
    logits = s.micro_batch * m.seq_len * m.vocab * 4 * 2 / s.tp if s.pp == 1 else 0.0  # fp32 logits + grad
    act = (act + logits) * hidden.act_factor(s)
    buffers = WORKSPACE_BYTES + (2 * s.bucket_mb * 2**20 if s.overlap_comm else s.bucket_mb * 2**20)
    peak = (static + act + buffers) * hidden.fragmentation
    return peak, static, act


def _microbatches(s: Setting, global_batch: int) -> int:
    """Micro-batches per optimizer step per pipeline (gradient accumulation steps)."""
    return max(global_batch // (s.dp * s.micro_batch), 1)


def step_time(m: ModelSpec, dev: DeviceSpec, s: Setting, global_batch: int, hidden: Hidden) -> Breakdown:
    """Noise-free seconds for one optimizer step over ``global_batch`` sequences."""
    seq, h, t = m.seq_len, m.hidden, s.tp
    tokens = s.micro_batch * seq
    microbatches = _microbatches(s, global_batch)
    layers = m.layers / s.pp
    node = dev.gpus_per_node
    fp8 = "fp8_linear" in s.patches and dev.peak_fp8_flops is not None
    linear_peak = dev.peak_fp8_flops if fp8 else dev.peak_bf16_flops
    assert linear_peak is not None
    passes = 4.0 if s.recompute == "full" else 3.0  # fwd + bwd(2x) (+ fwd again)

    # -- compute, per micro-batch per layer (one tensor-parallel rank)
    eff = gemm_efficiency(tokens, h / t)
    attn_lin = 2 * tokens * m.attn_params_per_layer / t
    t_attn_lin = attn_lin * passes / (linear_peak * eff)
    if m.experts > 1:
        expert_tokens = tokens * m.top_k * s.capacity_factor  # padded to capacity
        exp_flops = 2 * expert_tokens * m.expert_params_per_layer / t
        rows = expert_tokens if "grouped_gemm" in s.patches else expert_tokens * s.ep / m.experts
        t_mlp = exp_flops * passes / (linear_peak * gemm_efficiency(rows, m.ffn / t)) * hidden.time.get("moe", 1.0)
        t_mlp += 2 * tokens * h * m.experts * passes / (dev.peak_bf16_flops * 0.3)  # router
    else:
        t_mlp = 2 * tokens * m.mlp_params_per_layer / t * passes / (linear_peak * eff)
    core = 4 * tokens * seq * h / t  # QK^T and AV, forward, full (non-causal-skipping) matrix
    if s.flash_attention:
        t_core = 0.5 * core * (passes + 0.5) / (dev.peak_bf16_flops * 0.55)  # causal block skipping
        t_softmax = 0.0
    else:
        recompute_attn = 1 if s.recompute != "none" else 0
        t_core = core * (passes + recompute_attn) / (dev.peak_bf16_flops * 0.5)
        score_bytes = s.micro_batch * (m.heads / t) * seq * seq * BF16
        t_softmax = score_bytes * (10 + 4 * recompute_attn) / dev.hbm_bytes_per_s
    elem_share = (1.0 / t) if s.sequence_parallel else 0.5 + 0.5 / t
    elem_bytes = 40 * tokens * h * BF16 * elem_share * (passes / 3.0)
    if "fused_kernels" in s.patches:
        elem_bytes *= 0.55
    t_elem = elem_bytes / dev.hbm_bytes_per_s
    compute_layer = t_attn_lin + t_mlp + t_core
    traffic_layer = t_softmax + t_elem

    # -- tensor parallel: 2 all-reduces forward, 2 backward (+2 with full recompute), inside a node
    tp_bw = dev.nvlink_bytes_per_s if t <= node else dev.ib_bytes_per_s
    n_tp = 6 if s.recompute == "full" else 4
    tp_layer = n_tp * ring_allreduce_s(tokens * h * BF16, t, tp_bw)
    if s.sequence_parallel and s.overlap_comm:
        tp_layer *= 0.6
    # -- expert parallel all-to-all: dispatch + combine, forward and backward
    ep_layer = 0.0
    if m.experts > 1 and s.ep > 1:
        intra = t * s.ep <= node
        ep_bw = dev.nvlink_bytes_per_s * 0.7 if intra else dev.ib_bytes_per_s * 0.6
        volume = tokens * m.top_k * s.capacity_factor * h * BF16 / t * (s.ep - 1) / s.ep
        ep_layer = (6 if s.recompute == "full" else 4) * (volume / ep_bw + (s.ep - 1) * COLLECTIVE_LATENCY_S)

    t_mb = layers * (compute_layer + traffic_layer + tp_layer + ep_layer)
    # output head + loss on the last stage (bottleneck when pp == 1 or the head dominates)
    t_head = 2 * tokens * h * m.vocab / t * passes / (linear_peak * eff)
    t_mb += t_head if s.pp == 1 else t_head * 0.5  # with pp>1 the head is one stage's extra; roughly half exposed

    # -- pipeline p2p between stages
    pp_comm = 0.0
    if s.pp > 1:
        pp_bw = dev.ib_bytes_per_s if t * s.dp >= node else dev.nvlink_bytes_per_s
        act = tokens * h * BF16 / (t if s.sequence_parallel else 1)
        pp_comm = 2 * (act / pp_bw + COLLECTIVE_LATENCY_S)
        if s.overlap_comm:
            pp_comm *= 0.5
    t_mb += pp_comm

    # -- ZeRO-2/3 communicate every micro-batch: gradients are reduce-scattered as they are produced (stage 2
    # and 3), parameters all-gathered for forward and backward (stage 3); overlap hides part behind compute
    dense, expert, embed = _stage_params(m, s)
    dp_bw = dev.nvlink_bytes_per_s if t * s.dp <= node else dev.ib_bytes_per_s
    zero_mb = 0.0
    if s.zero_stage >= 2 and s.dp > 1:
        n_coll = 3 if s.zero_stage == 3 else 1
        zero_mb = n_coll * ring_allgather_s((dense + embed) * BF16, s.dp, dp_bw)
        if s.overlap_comm:
            zero_mb = max(0.0, zero_mb - 0.85 * t_mb)
        t_mb *= 1.03 if s.zero_stage == 3 else 1.01  # hook and launch overhead of sharded parameters
    t_mb += zero_mb

    bubble = pipeline_bubble_fraction(s.pp, microbatches)
    t_pipe = (microbatches + s.pp - 1) * t_mb

    # -- data-parallel sync once per step: all-reduce (ZeRO 0/1), final parameter all-gather (ZeRO 2)
    grad_bytes = (dense + embed) * BF16
    if s.zero_stage <= 1:
        t_dp = ring_allreduce_s(grad_bytes, s.dp, dp_bw)
    elif s.zero_stage == 2:
        t_dp = ring_allgather_s(grad_bytes, s.dp, dp_bw)
    else:
        t_dp = 0.0
    if m.experts > 1:
        t_dp += ring_allreduce_s(expert * BF16, max(s.dp // s.ep, 1), dp_bw)
    buckets = max(grad_bytes / (s.bucket_mb * 2**20), 1.0)
    t_dp += buckets * 2 * math.log2(max(s.dp, 2)) * COLLECTIVE_LATENCY_S
    if s.overlap_comm:
        t_bwd_last = t_mb * 2.0 / passes
        tail = (s.bucket_mb * 2**20) / dp_bw * 2
        t_dp_exposed = max(t_dp - 0.9 * t_bwd_last, 0.0) + tail
    else:
        t_dp_exposed = t_dp

    # -- optimizer step (memory bound); ZeRO >= 1 shards it over dp
    shard = s.dp if s.zero_stage >= 1 else 1
    opt_params = (dense + embed) / shard + (expert / max(s.dp // s.ep, 1) if s.zero_stage >= 1 else expert)
    if s.offload_optimizer:
        t_opt = opt_params * 16 / CPU_ADAM_BYTES_PER_S + opt_params * 6 / dev.pcie_bytes_per_s
    else:
        passes_opt = 1.0 if "fused_adam" in s.patches else 3.0
        t_opt = opt_params * 36 * passes_opt / dev.hbm_bytes_per_s

    total = (t_pipe + t_dp_exposed + t_opt + STEP_OVERHEAD_S) * hidden.time.get("global", 1.0)
    peak, static, act = peak_memory_bytes(m, s, global_batch, hidden)
    return Breakdown(
        step_time_s=total, peak_bytes=peak,
        compute_s=microbatches * layers * compute_layer, memory_traffic_s=microbatches * layers * traffic_layer,
        tp_comm_s=microbatches * layers * tp_layer, ep_comm_s=microbatches * layers * ep_layer,
        pp_comm_s=microbatches * pp_comm, bubble_fraction=bubble, dp_comm_exposed_s=t_dp_exposed,
        optimizer_s=t_opt, static_bytes=static, activation_bytes=act,
    )
