"""The probe reads the model's shape from its config when it has one, from the module tree otherwise, and
learns the sequence length from the first training forward."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from infrarsi.probe import Probe, read_records
from infrarsi.probe.shape import read_shape
from torch import nn

WORKLOAD = Path(__file__).resolve().parents[2] / "workloads" / "gpt"


class PlainLM(nn.Module):
    """No config anywhere: only inspection can tell."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.pos = nn.Embedding(16, 32)
        layer = nn.TransformerEncoderLayer(32, nhead=4, dim_feedforward=64, batch_first=True)
        self.body = nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False)
        self.head = nn.Linear(32, 100)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.emb(idx)))  # (B, T, V)


def test_a_module_without_config_is_inspected() -> None:
    model = PlainLM()
    shape = read_shape(model)
    assert (shape.layers, shape.hidden, shape.heads, shape.vocab) == (3, 32, 4, 100)
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    assert shape.seq_len is None and shape.experts is None
    assert set(shape.sources.values()) == {"module"}


@pytest.fixture
def gpt_workload(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(WORKLOAD))
    for name in ("config", "model"):
        sys.modules.pop(name, None)
    from config import ModelConfig
    from model import GPT

    yield ModelConfig, GPT
    for name in ("config", "model"):
        sys.modules.pop(name, None)


def test_the_reference_gpt_dense_and_moe(gpt_workload) -> None:
    ModelConfig, GPT = gpt_workload
    dense = read_shape(GPT(ModelConfig(kind="dense", vocab_size=128, seq_len=32, n_layer=2, n_head=4, d_model=64)))
    assert (dense.layers, dense.hidden, dense.heads, dense.vocab, dense.seq_len) == (2, 64, 4, 128, 32)
    assert dense.experts is None and dense.expert_parameters == 0  # n_experts in a dense config is not MoE
    moe_model = GPT(ModelConfig(kind="moe", vocab_size=128, seq_len=32, n_layer=2, n_head=4, d_model=64,
                                n_experts=4, top_k=2, expert_hidden=32))
    moe = read_shape(moe_model)
    assert (moe.experts, moe.experts_per_token) == (4, 2)
    assert moe.expert_parameters == sum(p.numel() for p in moe_model.expert_parameters())


def test_the_first_record_carries_the_shape_with_the_sequence_length_fed(tmp_path: Path) -> None:
    model = PlainLM()
    with Probe(out_dir=tmp_path) as probe:
        probe.attach(model=model)
        for _ in range(2):
            with probe.step():
                model(torch.zeros(2, 12, dtype=torch.long))
    first, second = read_records(probe.path)
    assert first.shape is not None and first.shape.seq_len == 12 and first.shape.sources["seq_len"] == "inputs"
    assert second.shape is None
