"""Shrinkage of bank effects toward the knowledge base, and the bank's winners as seeds (docs/bank.md §Shrinkage)."""

from __future__ import annotations

import math

import msgspec
import pytest
from infrarsi import events as ev
from infrarsi.bank.transfer import TransferConfig, bank_priors, bank_seeds, data_message, shrink

GIB = 2**30
H100 = ev.BankMeta(accelerator="H100-80G", generation="", device_memory_bytes=80 * GIB, interconnect="ib", nodes=8,
                   devices_per_node=8, parallelism={"dp": 64}, model_family="dense", model_params=7e9, seq_len=4096,
                   global_batch=512, micro_batch=1, precision="bf16")
A100 = msgspec.structs.replace(H100, accelerator="A100-80G")
NO_FLOOR = TransferConfig(floor_std=0.0)
KB = {"flash_attention": (-0.15, 0.10)}


def effect(post_mean: float = -0.25, post_std: float = 0.02, prior=(-0.15, 0.10), name="flash_attention") -> ev.Effect:
    return ev.Effect(feature=name, prior_mean=prior[0], prior_std=prior[1], post_mean=post_mean, post_std=post_std)


def entry(eid: str, meta: ev.BankMeta, *effects: ev.Effect, winners=(), failures=()) -> ev.BankEntry:
    return ev.BankEntry(entry_id=eid, origin_study=eid, meta=meta, time_effects=list(effects),
                        memory_effects=list(effects), winners=list(winners), failures=list(failures))


def test_data_message_removes_the_source_prior() -> None:
    lam, eta = data_message(effect())  # type: ignore[misc]
    assert lam == pytest.approx(2500 - 100)  # 1/0.02² − 1/0.1²
    assert eta == pytest.approx(-0.25 * 2500 + 0.15 * 100)
    assert eta / lam == pytest.approx(-0.254167, abs=1e-6)
    assert data_message(effect(post_mean=-0.15, post_std=0.10)) is None  # no trial moved it: no evidence
    assert data_message(effect(prior=(0.0, 0.0))) == pytest.approx((2500, -625))  # no prior: the posterior itself


def test_shrink_is_precision_weighted() -> None:
    mean, std = shrink((0.0, 0.1), -0.2, 0.01)  # equal precisions: halfway, std / √2
    assert (mean, std) == pytest.approx((-0.1, 0.1 / math.sqrt(2)))


def test_identical_study_recovers_its_posterior() -> None:
    p = bank_priors([entry("e", H100, effect())], H100, kb_time=KB, config=NO_FLOOR).time["flash_attention"]
    assert (p.mean, p.std) == pytest.approx((-0.25, 0.02))
    assert p.source == "bank" and p.entries == ("e",) and p.similarity == 1.0


def test_adjacent_generation_inflates_by_similarity_and_generation() -> None:
    # λ' = 2400 · 0.6 / 2 = 720 ; post precision 100 + 720 ; mean (−15 − 0.254167·720) / 820
    p = bank_priors([entry("e", A100, effect())], H100, kb_time=KB, config=NO_FLOOR).time["flash_attention"]
    assert p.mean == pytest.approx(-198 / 820, abs=1e-6)
    assert p.std == pytest.approx(math.sqrt(1 / 820))
    # memory effects inflate less across generations (c = 1.25): λ' = 2400 · 0.6 / 1.25 = 1152
    m = bank_priors([entry("e", A100, effect())], H100, kb_memory=KB, config=NO_FLOOR).memory["flash_attention"]
    assert m.std == pytest.approx(math.sqrt(1 / (100 + 1152)))


def test_floor_keeps_a_perfect_match_from_being_certain() -> None:
    p = bank_priors([entry("e", H100, effect())], H100, kb_time=KB).time["flash_attention"]  # τ = 0.02
    var_b = 1 / 2400 + 0.02**2
    prec = 100 + 1 / var_b
    assert p.mean == pytest.approx((-15 + (-0.254167 / var_b)) / prec, abs=1e-5)
    assert p.std == pytest.approx(math.sqrt(1 / prec))
    assert p.std > 0.02


def test_low_similarity_falls_back_to_the_knowledge_base() -> None:
    far = msgspec.structs.replace(H100, accelerator="V100-40G", device_memory_bytes=40 * GIB, model_params=4e9)
    s = 0.3 * math.exp(-0.5) * math.exp(-0.5 * (math.log(7 / 4) / math.log(2)) ** 2)  # gen · memory · size = 0.1314
    p = bank_priors([entry("e", far, effect(post_mean=-0.8))], H100, kb_time=KB, config=NO_FLOOR).time
    lam = 2400 * s / 4  # far generations: c = 4 -> λ' ≈ 78.8 against the knowledge base's 100
    mu = (-0.8 * 2500 + 0.15 * 100) / 2400
    assert p["flash_attention"].similarity == pytest.approx(s)
    assert p["flash_attention"].mean == pytest.approx((-15 + mu * lam) / (100 + lam))  # ≈ -0.448, not -0.8
    moe = msgspec.structs.replace(H100, model_family="moe", model_params=47e9)
    assert bank_priors([entry("e", moe, effect(post_mean=-0.8))], H100, kb_time=KB).time == {}  # below threshold


def test_several_entries_pool_and_features_filter() -> None:
    entries = [entry("e1", H100, effect(-0.25)), entry("e2", H100, effect(-0.25)),
               entry("e3", H100, effect(0.1, name="compile"))]
    p = bank_priors(entries, H100, kb_time=KB, config=NO_FLOOR, features={"flash_attention"})
    assert set(p.time) == {"flash_attention"}
    assert p.time["flash_attention"].std == pytest.approx(math.sqrt(1 / (100 + 2 * 2400)))
    assert p.seeds == ("e1", "e2")
    assert p.overrides("time") == {"flash_attention": (p.time["flash_attention"].mean, p.time["flash_attention"].std)}
    assert p.as_dicts("time")["flash_attention"]["source"] == "bank"


def test_seeds_rank_by_similarity_skip_failures_and_adapt() -> None:
    good = ev.Candidate(knobs={"micro_batch": 2}, patches=["fused_kernels"])
    second = ev.Candidate(knobs={"micro_batch": 4})
    broken = ev.Candidate(knobs={"micro_batch": 8}, patches=["fp8_linear"])
    failure = ev.BankFailure(kind="invariant_violation", candidate=broken, detail="loss")
    bank = [entry("a100", A100, winners=[good, broken], failures=[failure]),
            entry("h100", H100, winners=[second, good])]
    seeds = bank_seeds(bank, H100)
    assert [s.candidate for s in seeds] == [second, good]  # 1.0, then max(1.0·0.8, 0.6); broken never
    assert seeds[1].score == pytest.approx(0.8) and seeds[0].origin == "bank"
    only_small = bank_seeds(bank, H100, adapt=lambda c: c if c.knobs["micro_batch"] <= 2 else None)
    assert [s.candidate for s in only_small] == [good]
