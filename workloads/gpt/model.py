"""A small GPT (pre-LayerNorm, tied embeddings, no biases) with a dense MLP or a token-choice MoE.

Readable reference paths stay beside the fast ones (manual attention beside SDPA, the per-expert loop
beside the batched GEMM) so a verifier has something to compare against. The MoE's capacity and its
load-balancing loss are per *sequence*, so neither depends on how sequences are grouped into
micro-batches: changing the micro-batch leaves the loss unchanged up to rounding.

Expert parallelism (``ExpertParallel``): with ``ep.size`` ranks each rank holds ``n_experts / ep.size``
experts; token slots are exchanged with ``all_to_all_single`` (autograd-aware, works on gloo and NCCL). Expert
gradients therefore already sum over every rank's tokens; the training loop divides them by the data-parallel
size, the same average DDP applies to the replicated parameters.

This module owns the network only; no data, no optimiser, no distributed setup.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from config import ModelConfig
from torch import nn
from torch.utils.checkpoint import checkpoint


class LossOutput(NamedTuple):
    loss: torch.Tensor
    """The training objective: mean cross-entropy plus the MoE load-balancing loss."""
    ce: torch.Tensor
    """Mean next-token cross-entropy over the loss tokens (what the loss curve reports)."""


@dataclass(frozen=True)
class ExpertParallel:
    """Where a MoE's experts live: over the ``size`` ranks of ``group``, this process being ``rank``. The default,
    one rank, keeps every expert here."""

    group: torch.distributed.ProcessGroup | None = None
    size: int = 1
    rank: int = 0


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, attention: Literal["manual", "sdpa"]) -> None:
        super().__init__()
        self.n_head = n_head
        self.attention = attention
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.c_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hs = C // self.n_head
        q = self.q_proj(x).view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k_proj(x).view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = self.v_proj(x).view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~causal, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d_model, hidden, bias=False)
        self.c_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.c_proj(F.gelu(self.c_fc(x))), None  # (B, T, C), no aux loss


class MoE(nn.Module):
    """Token-choice top-k routing with a per-sequence capacity, GShard-style dispatch, experts over ranks."""

    def __init__(
        self,
        d_model: int,
        hidden: int,
        n_experts: int,
        top_k: int,
        capacity_factor: float,
        expert_impl: Literal["loop", "batched"],
        ep: ExpertParallel = ExpertParallel(),
    ) -> None:
        super().__init__()
        self.n_experts = n_experts
        self.top_k = top_k
        self.capacity_factor = capacity_factor
        self.expert_impl = expert_impl
        self.ep = ep
        self.n_local = n_experts // ep.size
        self.router = nn.Linear(d_model, n_experts, bias=False)
        # Local experts only; the global expert e lives on rank e // n_local.
        self.w1 = nn.Parameter(torch.empty(self.n_local, d_model, hidden))  # (E_l, C, H)
        self.w2 = nn.Parameter(torch.empty(self.n_local, hidden, d_model))  # (E_l, H, C)

    def capacity(self, T: int) -> int:
        return max(1, math.ceil(self.capacity_factor * T * self.top_k / self.n_experts))

    def _run_experts_for_loop(self, x: torch.Tensor) -> torch.Tensor:
        # x: (E_l, N, C) — kept as the readable reference for the batched path.
        outs = [F.gelu(x[e] @ self.w1[e]) @ self.w2[e] for e in range(self.n_local)]  # each (N, C)
        return torch.stack(outs)  # (E_l, N, C)

    def _run_experts_batched(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(F.gelu(torch.bmm(x, self.w1.to(x.dtype))), self.w2.to(x.dtype))  # (E_l, N, C)

    def _exchange(self, x: torch.Tensor) -> torch.Tensor:
        """all_to_all along the expert dim: (E, N, C) of my tokens → (E_l, ep·N, C) of my experts' tokens."""
        if self.ep.size == 1:
            return x
        E, N, C = x.shape
        out = funcol.all_to_all_single_autograd(
            x.reshape(-1, C), None, None, self.ep.group
        ).wait()  # (ep·E_l·N, C) ordered (src rank, local expert, slot)
        out = out.view(self.ep.size, self.n_local, N, C).transpose(0, 1)  # (E_l, ep, N, C)
        return out.reshape(self.n_local, self.ep.size * N, C)

    def _exchange_back(self, y: torch.Tensor, N: int) -> torch.Tensor:
        """Inverse of ``_exchange``: (E_l, ep·N, C) → (E, N, C) back on the tokens' rank."""
        if self.ep.size == 1:
            return y
        C = y.shape[-1]
        y = y.view(self.n_local, self.ep.size, N, C).transpose(0, 1).contiguous()  # (ep, E_l, N, C)
        out = funcol.all_to_all_single_autograd(y.view(-1, C), None, None, self.ep.group).wait()  # (E·N, C) ordered (expert, slot)
        return out.view(self.n_experts, N, C)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, C = x.shape
        E, k = self.n_experts, self.top_k
        cap = self.capacity(T)
        probs = F.softmax(self.router(x).float(), dim=-1)  # (B, T, E)
        gate, expert = probs.topk(k, dim=-1)  # (B, T, k)
        gate = gate / gate.sum(dim=-1, keepdim=True)

        # Per-sequence queue position of each (token, choice): first choices of all tokens, then second
        # choices (GShard priority), so a sequence's dropping never depends on its micro-batch neighbours.
        chosen = F.one_hot(expert, E).transpose(1, 2).reshape(B, k * T, E)  # (B, kT, E), k-major
        position = (torch.cumsum(chosen, dim=1) - 1) * chosen  # (B, kT, E)
        kept = chosen * (position < cap)  # (B, kT, E)

        # Switch load-balancing loss per sequence: E · Σ_e (fraction of choices to e) · (mean prob of e).
        frac = chosen.float().sum(dim=1) / (k * T)  # (B, E)
        aux = E * (frac * probs.mean(dim=1)).sum(dim=-1)  # (B,)

        # Dense dispatch/combine tensors (the readable GShard formulation).
        slot = F.one_hot(position.clamp(max=cap - 1), cap).to(x.dtype) * kept.unsqueeze(-1).to(x.dtype)  # (B, kT, E, cap)
        slot = slot.view(B, k, T, E, cap).transpose(1, 2)  # (B, T, k, E, cap)
        dispatch = slot.sum(dim=2)  # (B, T, E, cap) 0/1
        combine = (slot * gate.to(x.dtype)[..., None, None]).sum(dim=2)  # (B, T, E, cap)
        expert_in = torch.einsum("btec,btd->ebcd", dispatch, x).reshape(E, B * cap, C)  # (E, B·cap, C)

        local_in = self._exchange(expert_in)  # (E_l, ep·B·cap, C)
        if self.expert_impl == "batched":
            local_out = self._run_experts_batched(local_in)
        else:
            local_out = self._run_experts_for_loop(local_in)
        expert_out = self._exchange_back(local_out, B * cap).view(E, B, cap, C)  # (E, B, cap, C)
        y = torch.einsum("btec,ebcd->btd", combine, expert_out.to(combine.dtype))  # (B, T, C)
        return y.to(x.dtype), aux


class Block(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        attention: Literal["manual", "sdpa"],
        checkpointing: Literal["none", "selective", "full"],
        ffn: nn.Module,
    ) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=False)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.n_head, attention)
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=False)
        self.ffn = ffn

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(self.ln_1(x))

    def _forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.checkpointing == "selective":
            x = x + checkpoint(self._attn, x, use_reentrant=False)
        else:
            x = x + self._attn(x)
        h, aux = self.ffn(self.ln_2(x))
        if aux is None:
            aux = x.new_zeros(x.shape[0], dtype=torch.float32)
        return x + h, aux

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.checkpointing == "full":
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class GPT(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        *,
        attention: Literal["manual", "sdpa"] = "manual",
        checkpointing: Literal["none", "selective", "full"] = "none",
        capacity_factor: float = 1.25,
        expert_impl: Literal["loop", "batched"] = "loop",
        ep: ExpertParallel = ExpertParallel(),
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)

        def ffn() -> nn.Module:
            if cfg.kind == "moe":
                return MoE(
                    cfg.d_model, cfg.expert_hidden, cfg.n_experts, cfg.top_k, capacity_factor, expert_impl, ep
                )  # fmt: skip
            return MLP(cfg.d_model, cfg.mlp_hidden)

        self.blocks = nn.ModuleList(Block(cfg, attention, checkpointing, ffn()) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=False)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying (GPT-2)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        """GPT-2 init in module order (so every rank, and every split, starts from the same weights).

        Residual output projections get std / sqrt(2·n_layer). Expert weights are drawn for *all* experts
        and each rank keeps its own slice, so expert parallelism does not change the initial model.
        """
        std = self.cfg.init_std
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and module is not self.lm_head:
                scaled = name.endswith("c_proj")
                module.weight.normal_(0.0, std / math.sqrt(2 * self.cfg.n_layer) if scaled else std)
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, std)
            elif isinstance(module, MoE):
                E, C, H = module.n_experts, self.cfg.d_model, self.cfg.expert_hidden
                lo, hi = module.ep.rank * module.n_local, (module.ep.rank + 1) * module.n_local
                w1 = torch.empty(E, C, H, device=module.w1.device).normal_(0.0, std)
                w2 = torch.empty(E, H, C, device=module.w2.device).normal_(0.0, std / math.sqrt(2 * self.cfg.n_layer))
                module.w1.copy_(w1[lo:hi])
                module.w2.copy_(w2[lo:hi])

    def expert_parameters(self) -> list[nn.Parameter]:
        """Parameters sharded by expert parallelism (not replicated, not all-reduced by DDP)."""
        return [p for m in self.modules() if isinstance(m, MoE) for p in (m.w1, m.w2)]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> LossOutput:
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        aux = x.new_zeros(B, dtype=torch.float32)  # (B,)
        for block in self.blocks:
            x, block_aux = block(x)
            aux = aux + block_aux
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        ce = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
        loss = ce + self.cfg.aux_loss_coef * aux.mean() if self.cfg.kind == "moe" else ce
        return LossOutput(loss=loss, ce=ce)
