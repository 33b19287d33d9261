"""Similarity between study metadata: each kernel and the product, with numbers (docs/bank.md §Similarity)."""

from __future__ import annotations

import math

import msgspec
import pytest
from infrarsi import events as ev
from infrarsi.bank.similarity import explain_seeds, generation_of, similarity, similarity_terms

GIB = 2**30
H100 = ev.BankMeta(accelerator="H100-80G", generation="", device_memory_bytes=80 * GIB, interconnect="ib", nodes=8,
                   devices_per_node=8, parallelism={"tp": 1, "pp": 1, "dp": 64, "zero": 1}, model_family="dense",
                   model_params=7e9, seq_len=4096, global_batch=512, micro_batch=1, precision="bf16")


def with_(**changes: object) -> ev.BankMeta:
    return msgspec.structs.replace(H100, **changes)


@pytest.mark.parametrize(("sku", "gen"), [("H100-80G", "hopper"), ("h200-141g", "hopper"), ("A100-80G", "ampere"),
                                          ("A10G", "ampere"), ("V100-32G", "volta"), ("B200", "blackwell"),
                                          ("cpu", "cpu"), ("MI300X", "unknown")])
def test_generation_of_sku(sku: str, gen: str) -> None:
    assert generation_of(sku) == gen


def test_identical_metadata_is_one() -> None:
    assert similarity(H100, H100) == 1.0


@pytest.mark.parametrize(("other", "expected"), [
    (with_(accelerator="A100-80G"), 0.6),  # adjacent generation
    (with_(accelerator="V100-80G"), 0.3),  # two generations apart
    (with_(accelerator="B200-80G"), 0.6),
    (with_(accelerator="H800-80G"), 1.0),  # same generation, same memory
])
def test_generation_kernel(other: ev.BankMeta, expected: float) -> None:
    assert similarity(H100, other) == pytest.approx(expected)


def test_log_ratio_kernels() -> None:
    # memory 80 vs 141 GiB, ℓ = ln 2: exp(-½ (ln(141/80)/ln 2)²) = 0.71587
    assert similarity(H100, with_(accelerator="H200-141G", device_memory_bytes=141 * GIB)) == pytest.approx(0.71587, abs=1e-5)
    # model twice the size, seq len twice, micro-batch 4x (ℓ = ln 4), devices 4x (ℓ = ln 4): each exp(-½) = 0.60653
    for change in ({"model_params": 14e9}, {"seq_len": 8192}, {"micro_batch": 4}, {"nodes": 32}):
        assert similarity(H100, with_(**change)) == pytest.approx(math.exp(-0.5))


def test_parallelism_family_precision_interconnect() -> None:
    # modes {dp, zero} vs {dp, tp, zero}: Jaccard 2/3 -> 0.5 + 0.5·2/3
    assert similarity(H100, with_(parallelism={"tp": 2, "dp": 32, "zero": 1})) == pytest.approx(0.5 + 1 / 3)
    assert similarity(H100, with_(model_family="moe")) == pytest.approx(0.3)
    assert similarity(H100, with_(precision="fp16")) == pytest.approx(0.7)
    assert similarity(H100, with_(interconnect="roce")) == pytest.approx(0.8)


def test_product_of_kernels_and_unknowns_are_neutral() -> None:
    a100_14b = with_(accelerator="A100-80G", model_params=14e9)
    assert similarity(H100, a100_14b) == pytest.approx(0.6 * math.exp(-0.5))
    assert similarity(H100, with_(model_params=0.0, seq_len=0, precision="")) == 1.0
    # a CPU lesson for a GPU study: far generation × different kind (0.3 × 0.1), memory 16 GiB vs 80 GiB
    cpu = with_(accelerator="cpu", device_memory_bytes=16 * GIB)
    mem = math.exp(-0.5 * (math.log(80 / 16) / math.log(2)) ** 2)
    assert similarity(H100, cpu) == pytest.approx(0.3 * 0.1 * mem)
    assert {t.name for t in similarity_terms(H100, cpu)} >= {"generation", "kind", "memory"}


def test_explain_seeds_orders_by_similarity_and_says_why() -> None:
    def entry(eid: str, meta: ev.BankMeta) -> ev.BankEntry:
        return ev.BankEntry(entry_id=eid, origin_study=eid, meta=meta, time_effects=[], memory_effects=[])

    bank = [entry("same", H100), entry("a100", with_(accelerator="A100-80G")),
            entry("moe", with_(model_family="moe", model_params=47e9, nodes=16))]
    seeds = explain_seeds(bank, H100)
    assert [s[0] for s in seeds] == ["same", "a100"]  # moe: 0.3 × exp(-½(ln 6.7/ln 2)²) × … < 0.05
    assert seeds[0][1] == 1.0 and "same hardware" in seeds[0][2]
    assert seeds[1][1] == pytest.approx(0.6) and "adjacent generation (ampere vs hopper)" in seeds[1][2]
    assert len(explain_seeds(bank, H100, threshold=0.0)) == 3
