"""A seeded family of transformer training jobs with known shapes and an independent memory truth
(bench/robustness.py ``--family shaped``).

Every model is a transformer (layers, hidden, heads, sequence, vocabulary; a mixture of experts in some) on a
number of devices, with a global batch fixed by the contract and data-parallel = devices / (tp·pp). The search
can be told its shape exactly as the probe reports it (``WorkloadShape``, through ``StudySpace.with_shape`` with
the golden baseline's measured peak), which turns the search's memory model into the structural formula of
``infrarsi.modeling.memory_model``. The point of this family is to measure that path on a memory truth the
formula was not written against, so the true peak comes from accountings written here, from the published
formulas, each drawn with its own deviations (docs/modeling.md, "The shaped family (`bench/shaped_family.py`)"):

- model states (Rajbhandari et al. 2020, ZeRO, §3/§5): 2Ψ bf16 parameters, gradients of 2Ψ (or 4Ψ where the
  framework accumulates them in fp32), KΨ optimizer states (K = 12 with fp32 master weights, 8 without), each
  divided by the data-parallel degree from the stage that shards it; the busiest pipeline stage's parameters
  (its layers plus the embedding or the output layer), divided by tp (experts by tp·ep);
- communication buckets and workspace by ZeRO stage (all-gather and reduce buckets; stage 3's live-parameter
  budget; DDP's gradient buckets at stage 0, a full gradient copy in some models), optimizer offload's staging;
- activations per layer and micro-batch (Korthikanti et al. 2022, §4): sbh(34 + 5as/h) unsplit,
  sbh(10 + 24/t + 5as/(ht)) under tensor parallelism, sbh/t·(34 + 5as/h) with sequence parallelism, the 5as/h
  term gone under selective recomputation or a fused attention kernel, 2sbh (/t with sequence parallelism)
  per layer under full recomputation plus one layer's working set; 1F1B pipelining keeps min(pp, micro-batches)
  micro-batches in flight on the first stage (Narayanan et al. 2021); the output logits on the last stage;
  MoE: the MLP's share scaled by top-k × capacity factor, plus all-to-all dispatch buffers;
- each constant (34, 5, 2, K, the bucket sizes) off by up to ±40% per model, allocator fragmentation 0–25% of
  the activations and a smaller share of the states, CUDA context and NCCL buffers per communicator, and in a
  share of models terms the formula does not have at all (fp32 gradient accumulation buffers held only while
  accumulating, a fp32 copy of the loss's logits, an allocator-mode knob that changes fragmentation, a full
  gradient copy in DDP's buckets).

Time: the model FLOPs per step 72·B·s·L·h²·(1 + s/6h + V/12hL) (Narayanan et al. 2021) at a drawn utilisation
that falls with small micro-batches and with tensor splitting, the pipeline bubble (pp-1)/m, tensor-parallel
all-reduces over NVLink, data-parallel gradient traffic by ZeRO stage (stages 2 and 3 communicate per
micro-batch) partly hidden behind the backward pass by a bucket size with its own sweet spot, recomputation's
extra forward, a fused-attention speed-up, optimizer offload's host traffic, and an opaque categorical.

Knob names are the spellings real launchers use (``micro_batch_size``, ``tensor_model_parallel_size``, ``zero``,
``recompute_granularity``...), so the study maps them to the formula's roles as it would a real contract.

Must not: import ``infrarsi.sim``, ``infrarsi.modeling.memory_model`` or ``infrarsi.study.shape``, nor copy
their formulas (the point of the family is independence). The harness (bench/robustness.py) builds the
shape-known study through ``StudySpace.with_shape``, the product's path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from infrarsi import events as ev
from infrarsi.study.contract import contract_from_dict
from infrarsi.study.space import StudySpace
from robust_family import FamilyModel, _place_cliff, family_contract  # bench/ is the script's directory

GB = 1e9
H100_BF16_FLOPS = 989e12

# (layers, hidden, heads): the GPT-3 paper's and Llama's sizes
_DENSE_SHAPES = ((24, 2048, 16), (32, 2560, 32), (32, 4096, 32), (40, 5120, 40), (48, 6144, 48), (60, 6656, 52),
                 (80, 8192, 64))


@dataclass
class ShapedModel(FamilyModel):
    """A family model with a transformer shape: what the probe reports and the golden run's measured peak."""

    probed: ev.WorkloadShape | None = None
    """The shape as the probe reports it (``WorkloadShape``): the whole model's parameters, experts' share."""
    golden_peak_bytes: float = 0.0
    """The golden baseline's measured peak (what ``StudySpace.with_shape`` calibrates the formula's workspace on)."""
    accounting: Mapping[str, float] | None = None
    """The drawn constants of this model's memory accounting (for the report and the tests)."""


def _off(rng: np.random.Generator, spread: float) -> float:
    """A constant's factor: off by up to ``spread`` either way."""
    return float(1.0 + rng.uniform(-spread, spread))


def draw_model(seed: int) -> ShapedModel:
    """The shaped job of ``seed`` (reproducible)."""
    rng = np.random.default_rng([20_261_207, seed])
    features: list[str] = []

    # ---------------------------------------------------------------- shape and layout
    size = int(rng.integers(0, len(_DENSE_SHAPES)))
    layers, hidden, heads = _DENSE_SHAPES[size]
    seq = int(rng.choice([2048, 4096, 8192]))
    vocab = int(rng.choice([32_000, 50_304, 128_256]))
    moe = rng.random() < 0.25 and size <= 4
    experts, top_k = (int(rng.choice([8, 16])), int(rng.choice([1, 2]))) if moe else (1, 1)
    tied = rng.random() < 0.3
    per_layer_attn = 4 * hidden**2 + 4 * hidden  # QKV + output projection, two layer norms
    per_layer_mlp = 8 * hidden**2  # h -> 4h -> h
    embed = vocab * hidden
    dense_params = layers * (per_layer_attn + (0 if moe else per_layer_mlp)) + embed * (1 if tied else 2)
    expert_params = layers * experts * per_layer_mlp if moe else 0
    params = dense_params + expert_params
    devices = int(rng.choice([8, 16, 32, 64, 128][min(size // 2, 2): min(size // 2, 2) + 3]))
    gb_per_device = int(rng.choice([2, 4, 8]))
    global_batch = devices * gb_per_device
    if moe:
        features.append("moe")

    # ---------------------------------------------------------------- knobs: (role, name, spec, golden value)
    knobs: dict[str, tuple[str, dict[str, Any], Any]] = {}

    def spell(options: list[str]) -> str:
        return str(rng.choice(options))

    knobs["mb"] = (spell(["micro_batch_size", "micro_batch", "mbs"]),
                   {"type": "int", "choices": [1, 2, 4, 8, 16][: int(rng.integers(3, 6))]}, 1)
    if rng.random() < 0.85:
        knobs["tp"] = (spell(["tensor_model_parallel_size", "tp"]), {"type": "int", "choices": [1, 2, 4, 8]}, 4)
    if rng.random() < 0.5 and size >= 2:
        knobs["pp"] = (spell(["pipeline_model_parallel_size", "pp"]), {"type": "int", "choices": [1, 2, 4]}, 2)
    if rng.random() < 0.75:
        knobs["zero"] = (spell(["zero_stage", "zero", "zero_optimization_stage"]),
                         {"type": "int", "choices": [0, 1, 2, 3]}, 1)
    if rng.random() < 0.85:
        knobs["recompute"] = (spell(["recompute", "recompute_granularity"]),
                              {"type": "choice", "choices": ["none", "selective", "full"]}, "full")
    if "tp" in knobs and rng.random() < 0.45:
        knobs["sp"] = (spell(["sequence_parallel", "sp"]), {"type": "bool"}, False)
    if rng.random() < 0.4:
        knobs["flash"] = (spell(["flash_attention", "use_flash_attn"]), {"type": "bool"}, False)
    if rng.random() < 0.25:
        knobs["offload"] = (spell(["offload_optimizer", "cpu_offload"]), {"type": "bool"}, False)
    if rng.random() < 0.35:
        knobs["bucket"] = (spell(["bucket_mb", "bucket_cap_mb"]), {"type": "int", "choices": [25, 100, 400]}, 25)
    if moe and rng.random() < 0.7:
        knobs["ep"] = (spell(["expert_model_parallel_size", "ep"]), {"type": "int", "choices": [1, 2, 4, 8]}, 1)
    fused_attention = rng.random() < 0.8  # without a knob: whether the job's attention is a fused kernel
    if "flash" not in knobs and not fused_attention:
        features.append("unfused_attention")
    opaque_levels: list[str] = []
    if rng.random() < 0.4:
        opaque_levels = [str(x) for x in rng.choice(["native", "cached", "expandable", "pooled"], size=3,
                                                     replace=False)]
        knobs["opaque"] = ("alloc_mode", {"type": "choice", "choices": opaque_levels}, opaque_levels[0])

    # ---------------------------------------------------------------- memory accounting constants
    spread = float(rng.uniform(0.1, 0.4))
    master = rng.random() < 0.75
    acc = {
        "k_optimizer": (12.0 if master else 8.0) * _off(rng, spread),
        "grad_bytes": 4.0 if rng.random() < 0.3 else 2.0,
        "act_34": 34.0 * _off(rng, spread),
        "act_5": 5.0 * _off(rng, spread),
        "act_full": 2.0 * _off(rng, spread),
        "logit_bytes": float(rng.uniform(4.0, 12.0)),
        "logits_split_by_tp": float(rng.random() < 0.7),
        "allgather_bucket": float(rng.uniform(0.1, 1.0)) * GB,
        "reduce_bucket": float(rng.uniform(0.1, 1.0)) * GB,
        "live_params": float(rng.uniform(1e8, 1e9)),
        "offload_staging": float(rng.uniform(0.5, 1.5)),
        "bucket_copies": float(rng.uniform(1.0, 3.0)),
        "capacity_factor": float(rng.uniform(1.0, 1.5)),
        "dispatch": float(rng.uniform(1.0, 3.0)),
        "fragment_act": float(rng.uniform(0.0, 0.25)),
        "fragment_state": float(rng.uniform(0.0, 0.08)),
        "context": float(rng.uniform(0.5, 1.2)) * GB,
        "nccl_per_group": float(rng.uniform(0.05, 0.4)) * GB,
    }
    unmodelled = [t for t in ("fp32_accumulation", "fp32_loss_copy", "ddp_grad_copy", "alloc_mode_fragments")
                  if rng.random() < 0.2]
    if "alloc_mode_fragments" in unmodelled and not opaque_levels:
        unmodelled.remove("alloc_mode_fragments")
    alloc_fragment = {lvl: float(rng.uniform(0.0, 0.3)) for lvl in opaque_levels}
    if unmodelled:
        features.append("unmodelled:" + "+".join(unmodelled))
    if spread > 0.3:
        features.append("constants_off_30pct")

    # ---------------------------------------------------------------- time constants
    mfu = float(rng.uniform(0.35, 0.6))
    mb_overhead = float(rng.uniform(0.05, 0.4))
    tp_inefficiency = float(rng.uniform(0.03, 0.12))
    nvlink = float(rng.uniform(150, 400)) * GB
    network = float(rng.uniform(12, 50)) * GB
    exposed_comm = float(rng.uniform(0.2, 0.7))
    bucket_best = int(rng.choice([25, 100, 400]))
    recompute_cost = {"none": 0.0, "selective": float(rng.uniform(0.01, 0.06)), "full": float(rng.uniform(0.25, 0.4))}
    flash_gain = float(rng.uniform(0.03, 0.15)) * seq / 4096
    sp_gain = float(rng.uniform(-0.01, 0.03))
    host_bw = float(rng.uniform(10, 25)) * GB
    opaque_effect = {lvl: float(rng.normal(0, 0.05)) for lvl in opaque_levels}
    noise_sigma = float(rng.uniform(0.02, 0.06))

    def get(role: str, kv: Mapping[str, Any], default: Any) -> Any:
        return kv[knobs[role][0]] if role in knobs else default

    def layout(kv: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
        """(tp, pp, dp, micro-batch, micro-batches per step per replica)."""
        tp, pp, mb = int(get("tp", kv, 1)), int(get("pp", kv, 1)), int(kv[knobs["mb"][0]])
        dp = max(devices // (tp * pp), 1)
        return tp, pp, dp, mb, max(global_batch // (mb * dp), 1)

    def _stage_peak_of(kv: Mapping[str, Any], first: bool, last: bool) -> float:
        tp, pp, dp, mb, m = layout(kv)
        stage = int(get("zero", kv, 0))
        recompute = str(get("recompute", kv, "none"))
        sp = bool(get("sp", kv, False)) and tp > 1
        flash = bool(get("flash", kv, fused_attention))
        offload = bool(get("offload", kv, False))
        ep = min(int(get("ep", kv, 1)), dp)
        stage_layers = math.ceil(layers / pp)
        # --- model states (ZeRO paper): per-GPU parameter count psi, then bytes by stage
        embeddings = (embed if first else 0) + (embed if last and not tied else 0)
        if tied and last and not first:
            embeddings += embed  # the output layer keeps its own copy of a tied embedding on another stage
        psi = (stage_layers * (per_layer_attn + (0 if moe else per_layer_mlp)) + embeddings) / tp
        psi_e = stage_layers * experts * per_layer_mlp / (tp * ep) if moe else 0.0
        grad_b, k_opt = acc["grad_bytes"], 0.0 if offload else acc["k_optimizer"]

        def states(n: float, replicas: int) -> float:
            p = 2 * n / (replicas if stage >= 3 else 1)
            g = grad_b * n / (replicas if stage >= 2 else 1)
            o = k_opt * n / (replicas if stage >= 1 else 1)
            return p + g + o

        static = states(psi, dp) + states(psi_e, max(dp // ep, 1))
        shards = dp if stage >= 1 else 1
        if offload:
            static += acc["offload_staging"] * 2 * (psi + psi_e) / shards
        bucket = float(get("bucket", kv, 25)) * 1e6
        if stage == 0:
            static += acc["bucket_copies"] * bucket
            if "ddp_grad_copy" in unmodelled:
                static += 2 * (psi + psi_e)
        elif stage in (1, 2):
            static += acc["allgather_bucket"] + acc["reduce_bucket"] * (bucket / 25e6) ** 0.3
        else:
            static += 2 * min(acc["live_params"], (psi + psi_e) * tp) / tp + acc["reduce_bucket"]
        if "fp32_accumulation" in unmodelled and m > 1:
            static += 4 * (psi + psi_e) / (dp if stage >= 2 else 1)
        # --- activations (Korthikanti et al.): bytes per layer per micro-batch
        sbh = seq * mb * hidden
        attn_scores = 0.0 if (flash or recompute == "selective") else acc["act_5"] * heads * seq / hidden
        mlp_share = 19.0 / 34.0 * acc["act_34"]
        rest = acc["act_34"] - mlp_share
        scale = top_k * acc["capacity_factor"] if moe else 1.0
        if sp:
            layer = sbh / tp * (rest + mlp_share * scale + attn_scores)
        elif tp > 1:
            # 10 of the 34 (layer norms, dropout masks, the attention and MLP inputs) are not split by tp
            layer = sbh * (10.0 * acc["act_34"] / 34 + (rest - 10.0 * acc["act_34"] / 34 + mlp_share * scale) / tp
                           + attn_scores / tp)
        else:
            layer = sbh * (rest + mlp_share * scale + attn_scores)
        if moe:
            layer += acc["dispatch"] * 2 * sbh * top_k * acc["capacity_factor"] / (tp if sp else 1)
        in_flight = min(pp, m) if first else 1
        if recompute == "full":
            stored = acc["act_full"] * sbh / (tp if sp else 1)
            act = stage_layers * in_flight * stored + layer
        else:
            act = stage_layers * in_flight * layer
        if last:
            split = tp if acc["logits_split_by_tp"] else 1
            act += acc["logit_bytes"] * seq * mb * vocab / split
            if "fp32_loss_copy" in unmodelled:
                act += 4 * seq * mb * vocab / split
        # --- what surrounds them
        fragment = acc["fragment_act"]
        if "alloc_mode_fragments" in unmodelled:
            fragment = alloc_fragment[str(kv[knobs["opaque"][0]])]
        groups = (tp > 1) + (pp > 1) + (dp > 1) + (moe and ep > 1)
        return (static * (1 + acc["fragment_state"]) + act * (1 + fragment) + acc["context"]
                + groups * acc["nccl_per_group"])

    def memory_of_kv(kv: Mapping[str, Any]) -> float:
        """Peak bytes on the busiest GPU: the first pipeline stage (most activations in flight, the embedding)
        or the last (the output layer and the logits)."""
        pp = int(get("pp", kv, 1))
        if pp == 1:
            return _stage_peak_of(kv, True, True)
        return max(_stage_peak_of(kv, True, False), _stage_peak_of(kv, False, True))

    def time_of(kv: Mapping[str, Any]) -> float:
        tp, pp, dp, mb, m = layout(kv)
        stage = int(get("zero", kv, 0))
        recompute = str(get("recompute", kv, "none"))
        ep = min(int(get("ep", kv, 1)), dp)
        active_layer = per_layer_attn + per_layer_mlp * (top_k if moe else 1)
        # model FLOPs per step (Narayanan et al. 2021, eq. 3 with the active MLP of an MoE layer)
        flops = (72 * global_batch * seq * layers * hidden**2 * (active_layer / (12 * hidden**2))
                 * (1 + seq / (6 * hidden) + vocab / (12 * hidden * layers)))
        efficiency = mfu / (1 + mb_overhead * 2048 / (mb * seq)) / (1 + tp_inefficiency * math.log2(tp))
        compute = flops / (devices * H100_BF16_FLOPS * efficiency)
        compute *= 1 + recompute_cost[recompute] * (1.0 if recompute == "full" else seq / 4096)
        if get("flash", kv, fused_attention):
            compute *= 1 - flash_gain
        if bool(get("sp", kv, False)) and tp > 1:
            compute *= 1 - sp_gain
        compute *= 1 + (pp - 1) / m  # the 1F1B bubble
        t = compute
        if tp > 1:  # four all-reduces of the layer's activations per layer per micro-batch (2 forward, 2 backward)
            t += 4 * math.ceil(layers / pp) * m * 2 * (tp - 1) / tp * seq * mb * hidden * 2 / nvlink
        if moe and ep > 1:  # all-to-all dispatch and combine, forward and backward
            t += 4 * math.ceil(layers / pp) * m * seq * mb * hidden * 2 * top_k * (ep - 1) / ep / network
        psi_bytes = 2 * params / (tp * pp)
        if dp > 1:
            ring = 2 * (dp - 1) / dp * psi_bytes / network
            bucket = int(get("bucket", kv, 25))
            hidden_share = 1 - exposed_comm * (1 + 0.25 * abs(math.log2(bucket / bucket_best)))
            per_step = {0: 1.0, 1: 1.0, 2: float(m), 3: 1.5 * m}[stage]  # stages 2-3 communicate per micro-batch
            t += ring * per_step * max(1 - hidden_share, 0.05)
        if get("offload", kv, False):
            shards = dp if stage >= 1 else 1
            t += 16 * params / (tp * pp * shards) / host_bw
        if opaque_levels:
            t *= math.exp(opaque_effect[str(kv["alloc_mode"])])
        return t

    knob_keys = {role: f"train.{name}" for role, (name, _, _) in knobs.items()}
    parallel = [knob_keys[r] for r in ("tp", "pp") if r in knobs]
    global_batch_rule = {"size": global_batch, "micro_batch_key": knob_keys["mb"], "devices": devices,
                         "parallel_keys": parallel}
    contract = family_contract(f"shaped-{seed}", {knob_keys[r]: spec for r, (_, spec, _) in knobs.items()},
                               constraints={"global_batch": global_batch_rule})
    built = contract_from_dict(contract, check=False)
    golden_values = {role: value for role, (_, _, value) in knobs.items()}
    launch = {"train": {name: golden_values[r] for r, (name, _, _) in knobs.items()}}
    study = StudySpace.from_contract(built, baseline_launch=launch, capacity_bytes=80 * 2**30)
    probed = ev.WorkloadShape(parameters=int(params), expert_parameters=int(expert_params), layers=layers,
                              hidden=hidden, heads=heads, seq_len=seq, vocab=vocab,
                              experts=experts if moe else None, experts_per_token=top_k if moe else None,
                              sources={"parameters": "module", "seq_len": "inputs"})
    model = ShapedModel(seed, study, devices, noise_sigma, memory_of_kv, time_of, tuple(features), probed=probed,
                        accounting=acc)
    golden = _place_cliff(model, rng)
    launch = {"train": {b.launch_key.removeprefix("train."): b.launch_value(golden[b.name])
                        for b in model.study.bindings}}
    model.study = StudySpace.from_contract(built, baseline_launch=launch, capacity_bytes=model.capacity_bytes)
    # the doctor's first measured run of the golden baseline: the peak the product calibrates the formula on
    model.golden_peak_bytes = memory_of_kv(golden.knobs) * (1 + 0.003 * float(rng.standard_normal()))
    return model


def shape_known_study(model: ShapedModel) -> StudySpace:
    """The model's study as the product builds it once the probe reported the shape with the first baseline."""
    assert model.probed is not None
    return model.study.with_shape(model.probed, baseline_peak_bytes=model.golden_peak_bytes)
