"""The workload's shape, read from the model when the probe attaches: what the structural memory formula needs.

``read_shape(model)`` returns an ``events.WorkloadShape``: parameters (all, and in MoE experts), layers,
hidden size, attention heads, vocabulary, experts and experts per token, and where each came from.
Two sources, in order:

1. the model's config, as Hugging Face models (``model.config``) and nanoGPT-style models (``model.cfg``,
   ``model.config`` dataclasses or pydantic models) keep it, under the names those libraries use
   (``num_hidden_layers``/``n_layer``, ``hidden_size``/``n_embd``/``d_model``, ...);
2. inspection of the ``nn.Module`` for what the config did not say: the largest embedding (vocabulary ×
   hidden), the longest ``ModuleList`` of blocks of one type (layers), an ``n_head``/``num_heads``
   attribute or ``nn.MultiheadAttention`` (heads), a module with an ``n_experts``/``num_experts``
   attribute (experts; its parameters but its router's are expert parameters).

The sequence length is what the model is fed, not what it could take: the probe fills it in from the first
training forward (``Probe._on_forward``); a config's context length is only a fallback. A field that
neither source can tell stays ``None``; the contract may state or override any of them
(``workload.shape``). This module must not import anything heavier than torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from infrarsi import events

_CONFIG_NAMES: dict[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model", "dim"),
    "heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "vocab": ("vocab_size", "n_vocab"),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
    "experts_per_token": ("num_experts_per_tok", "moe_top_k", "num_experts_per_token"),
    "context": ("max_position_embeddings", "n_positions", "seq_len", "block_size", "max_seq_len", "n_ctx"),
}
"""Shape field → the config attribute names that hold it, most common first."""

_EXPERT_ATTRS = ("n_experts", "num_experts", "num_local_experts")
_HEAD_ATTRS = ("n_head", "num_heads", "n_heads", "num_attention_heads")


def _config_of(model: nn.Module) -> Any:
    """The model's config, or its direct child's (a LightningModule holding a Hugging Face model)."""
    for owner in (model, *model.children()):
        for name in ("config", "cfg"):
            config = getattr(owner, name, None)
            if config is not None and not isinstance(config, nn.Module):
                return config
    return None


def _config_int(config: Any, names: Iterable[str]) -> int | None:
    for name in names:
        value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _numel(params: Iterable[torch.Tensor]) -> int:
    return int(sum(p.numel() for p in params))


def _inspect(model: nn.Module) -> dict[str, int]:
    """What the module tree says, field by field (only fields it can tell)."""
    found: dict[str, int] = {}
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    if embeddings:
        largest = max(embeddings, key=lambda m: m.num_embeddings)
        found["vocab"], found["hidden"] = largest.num_embeddings, largest.embedding_dim
    block_lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 1
                   and len({type(b) for b in m}) == 1 and not any(hasattr(b, a) for b in m for a in _EXPERT_ATTRS)]
    if block_lists:
        found["layers"] = len(max(block_lists, key=len))
    for m in model.modules():
        heads = m.num_heads if isinstance(m, nn.MultiheadAttention) else next(
            (v for a in _HEAD_ATTRS if isinstance(v := getattr(m, a, None), int) and v > 0), None)
        if heads:
            found["heads"] = heads
            break
    expert_modules = [m for m in model.modules() if any(isinstance(getattr(m, a, None), int) for a in _EXPERT_ATTRS)]
    if expert_modules:
        found["experts"] = next(getattr(expert_modules[0], a) for a in _EXPERT_ATTRS
                                if isinstance(getattr(expert_modules[0], a, None), int))
        routers = {id(p) for m in expert_modules for name, sub in m.named_children() if name in ("router", "gate")
                   for p in sub.parameters()}
        found["expert_parameters"] = _numel(p for m in expert_modules for p in m.parameters() if id(p) not in routers)
        top_k = getattr(expert_modules[0], "top_k", None)
        if isinstance(top_k, int) and top_k > 0:
            found["experts_per_token"] = top_k
    return found


def read_shape(model: nn.Module, *, seq_len: int | None = None) -> events.WorkloadShape:
    """The shape of ``model`` (see the module docstring); ``seq_len`` when already known."""
    config = _config_of(model)
    inspected = _inspect(model)
    values: dict[str, int | None] = {}
    sources: dict[str, str] = {}
    for field in ("layers", "hidden", "heads", "vocab", "experts", "experts_per_token"):
        value = _config_int(config, _CONFIG_NAMES[field]) if config is not None else None
        if value is not None:
            values[field], sources[field] = value, "config"
        elif field in inspected:
            values[field], sources[field] = inspected[field], "module"
    if seq_len is None and config is not None and (context := _config_int(config, _CONFIG_NAMES["context"])):
        seq_len = context
        sources["seq_len"] = "config"
    if "experts" in values and values["experts"] == 1:
        values.pop("experts")  # one "expert" is a dense model (configs that default num_experts to 1)
    return events.WorkloadShape(
        parameters=_numel(model.parameters()),
        expert_parameters=inspected.get("expert_parameters", 0) if "experts" in values else 0,
        layers=values.get("layers"),
        hidden=values.get("hidden"),
        heads=values.get("heads"),
        seq_len=seq_len,
        vocab=values.get("vocab"),
        experts=values.get("experts"),
        experts_per_token=values.get("experts_per_token") if "experts" in values else None,
        sources=sources,
    )
