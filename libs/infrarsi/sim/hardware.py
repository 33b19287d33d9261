"""SIMULATOR hardware and model catalogue: device specs, interconnects, transformer shapes.

Owns: the numbers the analytic cluster simulator uses. Must not: be mistaken for measurements; every figure is a
public datasheet value or a round estimate, used only by the `sim` launcher backend and the benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator as the simulator sees it (datasheet peak figures, dense)."""

    name: str
    peak_bf16_flops: float
    peak_fp8_flops: float | None
    """None: no FP8 tensor cores (A100)."""
    hbm_bytes_per_s: float
    memory_bytes: int
    nvlink_bytes_per_s: float
    """Per GPU, one direction, inside a node."""
    ib_bytes_per_s: float
    """Per GPU (one NIC per GPU), one direction, across nodes."""
    pcie_bytes_per_s: float = 25e9
    gpus_per_node: int = 8


A100_80G = DeviceSpec("A100-80G", 312e12, None, 2.0e12, 80 * GIB, 300e9, 25e9)
H100_80G = DeviceSpec("H100-80G", 989e12, 1979e12, 3.35e12, 80 * GIB, 450e9, 50e9)
H200_141G = DeviceSpec("H200-141G", 989e12, 1979e12, 4.8e12, 141 * GIB, 450e9, 50e9)
DEVICES = {d.name: d for d in (A100_80G, H100_80G, H200_141G)}


@dataclass(frozen=True)
class ModelSpec:
    """Decoder-only transformer with SwiGLU MLP; ``experts > 1`` makes every MLP a top-k MoE layer."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    experts: int = 1
    top_k: int = 1

    @property
    def attn_params_per_layer(self) -> int:
        h, kv = self.hidden, self.hidden * self.kv_heads // self.heads
        return h * h * 2 + 2 * h * kv + 2 * h  # q, o; k, v; two norms

    @property
    def expert_params_per_layer(self) -> int:
        return 3 * self.hidden * self.ffn  # gate, up, down of one expert

    @property
    def mlp_params_per_layer(self) -> int:
        router = self.hidden * self.experts if self.experts > 1 else 0
        return self.experts * self.expert_params_per_layer + router

    @property
    def embedding_params(self) -> int:
        return 2 * self.vocab * self.hidden  # untied input embedding and output head

    @property
    def total_params(self) -> int:
        return self.layers * (self.attn_params_per_layer + self.mlp_params_per_layer) + self.embedding_params

    @property
    def active_params(self) -> int:
        per_layer = self.attn_params_per_layer + self.top_k * self.expert_params_per_layer
        return self.layers * per_layer + self.embedding_params


DENSE_7B = ModelSpec("dense-7b", 32, 4096, 32, 32, 11008, 32000, 4096)
DENSE_13B = ModelSpec("dense-13b", 40, 5120, 40, 40, 13824, 32000, 4096)
DENSE_70B = ModelSpec("dense-70b", 80, 8192, 64, 8, 28672, 32000, 4096)
MOE_8X7B = ModelSpec("moe-8x7b", 32, 4096, 32, 8, 14336, 32000, 4096, experts=8, top_k=2)
MODELS = {m.name: m for m in (DENSE_7B, DENSE_13B, DENSE_70B, MOE_8X7B)}
