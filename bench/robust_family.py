"""A seeded family of training-job cost models that the search was not written for (bench/robustness.py).

Each model is drawn from its seed: which knobs exist (some under the knowledge base's names, some under names
it has never seen), their physics, a memory capacity that puts the optimum within 3% of the cliff, and the
measurement noise. Nothing here comes from ``infrarsi.sim`` or ``infrarsi.modeling.memory_model``; the
physics are written in their own terms so a shared mistake cannot make the search look right:

- memory = weights + optimizer states (both split by a sharding knob with its own efficiency exponent, the
  states also by a ZeRO-like stage over the data-parallel replicas, and a stage that fragments: in some models
  the highest stage *adds* memory) + activations (batch^a, a per-level recompute factor, a kernel toggle that
  may save or cost memory) + a fixed runtime reserve;
- time = (compute with a per-batch overhead + sharding communication + stage communication + offload traffic)
  × recompute slowdown × kernel speed-up × a plateau knob (flat past a threshold) × an opaque categorical
  (no prior anywhere) × in some models a bonus that only a joint setting of two or three knobs earns;
- each known-name effect is the textbook direction scaled by a factor in [½, 2]; unknown names are random.

A model exposes its space the way a user declares it: a contract (launch keys ``train.<knob>``) turned into a
``StudySpace`` by ``StudySpace.from_contract``, with a golden launch file (a conservative configuration that
fits). Spaces are small enough to enumerate, so the oracle is exact.

Must not: import ``infrarsi.sim`` or the memory model (the point of the family is independence).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from infrarsi.modeling.space import Candidate
from infrarsi.sim.scenarios import SimOutcome
from infrarsi.study.contract import contract_from_dict
from infrarsi.study.space import StudySpace

GB = 1e9
STARTUP_S = 60.0
"""Accelerator-seconds a trial spends before its first measured step (per device)."""
MEASURED_STEPS = 20


@dataclass
class FamilyModel:
    """One drawn cost model: its study space, its physics and its exact optimum."""

    seed: int
    study: StudySpace
    devices: int
    noise_sigma: float
    memory_of: Callable[[Mapping[str, Any]], float]
    time_of: Callable[[Mapping[str, Any]], float]
    features: tuple[str, ...]
    """What this model exercises (for the report): ``unknown_names``, ``synergy3``, ``fragmenting_stage``..."""
    oracle: Candidate | None = None
    oracle_time: float = math.inf
    oracle_memory_fraction: float = 0.0

    @property
    def capacity_bytes(self) -> float:
        return self.study.capacity_bytes

    def true_time(self, c: Candidate) -> float:
        return self.time_of(c.knobs)

    def fits(self, c: Candidate) -> bool:
        return self.memory_of(c.knobs) <= self.capacity_bytes

    def evaluate(self, c: Candidate, rng: np.random.Generator) -> SimOutcome:
        """One measured trial; draws from ``rng`` in a fixed order."""
        u_noise, u_kill = rng.standard_normal(), rng.random()
        t = self.time_of(c.knobs) * math.exp(self.noise_sigma * u_noise)
        if not self.fits(c):
            # killed while allocating: the last peak seen is a lower bound (the censoring bound)
            return SimOutcome("oom", None, self.capacity_bytes * (0.95 + 0.05 * u_kill),
                              self.devices * (STARTUP_S + 2 * t))
        return SimOutcome("ok", t, self.memory_of(c.knobs) * (1 + 0.003 * u_noise),
                          self.devices * (STARTUP_S + MEASURED_STEPS * t))


def _pick(rng: np.random.Generator, options: list[str], p_unknown: float) -> tuple[str, bool]:
    """A knob name: the first option is the knowledge base's spelling, the rest are names it has never seen."""
    if rng.random() < p_unknown:
        return str(rng.choice(options[1:])), True
    return options[0], False


def _maybe_pick(
    rng: np.random.Generator, p_present: float, options: list[str], p_unknown: float
) -> tuple[str | None, bool]:
    """With probability ``p_present`` a knob of this role (``_pick``); otherwise none (``None``, known)."""
    if rng.random() >= p_present:
        return None, False
    return _pick(rng, options, p_unknown)


def _scale(rng: np.random.Generator) -> float:
    """A coefficient off by up to ×2 either way."""
    return float(2.0 ** rng.uniform(-1.0, 1.0))


def draw_model(seed: int) -> FamilyModel:
    """The cost model of ``seed`` (reproducible)."""
    rng = np.random.default_rng([20_260_313, seed])
    features: list[str] = []
    devices = int(rng.choice([8, 16, 32, 64]))
    p_unknown = float(rng.uniform(0.2, 0.7))

    # --- knobs: (role, name, contract spec, golden value)
    knobs: dict[str, tuple[str, dict[str, Any], Any]] = {}
    batch, unk = _pick(rng, ["micro_batch", "rows_per_slice", "tile_batch"], p_unknown)
    top = int(rng.choice([8, 16, 32]))
    knobs["batch"] = (batch, {"type": "int", "choices": [2**i for i in range(int(math.log2(top)) + 1)]}, 1)
    shard, u_shard = _maybe_pick(rng, 0.8, ["tp", "split_ways", "slab_split"], p_unknown)
    if shard:
        knobs["shard"] = (shard, {"type": "int", "choices": [1, 2, 4, 8]}, 2)
    remat, u_remat = _maybe_pick(rng, 0.85, ["recompute", "stash_policy", "keep_mode"], p_unknown)
    if remat:
        levels = ["none", "selective", "full"] if remat == "recompute" else ["keep", "partial", "drop"]
        knobs["remat"] = (remat, {"type": "choice", "choices": levels}, levels[2])
    stage, u_stage = _maybe_pick(rng, 0.6, ["zero_stage", "state_split_level", "opt_spread"], p_unknown)
    if stage:
        knobs["stage"] = (stage, {"type": "int", "choices": [0, 1, 2, 3]}, 1)
    kernel, u_kernel = _maybe_pick(rng, 0.7, ["flash_attention", "fast_mixer", "fused_scan"], p_unknown)
    if kernel:
        knobs["kernel"] = (kernel, {"type": "bool"}, False)
    offload, u_offload = _maybe_pick(rng, 0.4, ["offload_optimizer", "spill_host", "park_states"], p_unknown)
    if offload:
        knobs["offload"] = (offload, {"type": "bool"}, False)
    unk |= u_shard or u_remat or u_stage or u_kernel or u_offload
    plateau, _ = _maybe_pick(rng, 0.5, ["bucket_mb", "prefetch_depth", "io_lanes"], 1.0)  # never the KB's name
    if plateau:
        knobs["plateau"] = (plateau, {"type": "int", "choices": [1, 2, 3, 4, 6, 8]}, 1)
    opaque = None
    if rng.random() < 0.6:
        opaque = str(rng.choice(["sched_policy", "ring_layout", "alloc_mode"]))
        levels = [str(x) for x in rng.choice(["a", "b", "c", "d", "e"], size=int(rng.integers(3, 5)), replace=False)]
        knobs["opaque"] = (opaque, {"type": "choice", "choices": levels}, levels[0])
    if unk:
        features.append("unknown_names")

    # --- memory physics (bytes)
    weights = rng.uniform(4, 30) * GB
    states = weights * rng.uniform(1.5, 4.0)
    act1 = rng.uniform(0.6, 5.0) * GB * _scale(rng)
    reserve = rng.uniform(1.0, 4.0) * GB
    shard_w_exp, shard_a_exp = rng.uniform(0.6, 1.0), rng.uniform(0.4, 1.0)
    batch_exp = rng.uniform(0.8, 1.2)
    remat_mem = {0: 1.0, 1: rng.uniform(0.3, 0.75), 2: rng.uniform(0.06, 0.3)}
    kernel_mem = rng.uniform(0.55, 1.25)  # > 1: a kernel that costs memory (the prior says it saves some)
    fragment = rng.uniform(0.15, 0.45) if rng.random() < 0.35 and stage else 0.0
    if fragment:
        features.append("fragmenting_stage")
    if kernel_mem > 1:
        features.append("kernel_costs_memory")
    # --- time physics (seconds)
    compute = rng.uniform(0.5, 4.0)
    batch_overhead = rng.uniform(0.15, 1.2) * _scale(rng)
    comm_shard = rng.uniform(0.03, 0.25) * _scale(rng)
    comm_stage = rng.uniform(0.01, 0.08) * _scale(rng)
    offload_cost = rng.uniform(0.15, 0.6)
    remat_time = {0: 1.0, 1: 1 + rng.uniform(0.01, 0.08) * _scale(rng), 2: 1 + rng.uniform(0.12, 0.35) * _scale(rng)}
    kernel_time = 1 - rng.uniform(0.03, 0.2) * _scale(rng)
    plateau_at, plateau_gain = int(rng.choice([2, 3, 4, 6])), rng.uniform(0.03, 0.15)
    opaque_effect = {lvl: float(rng.normal(0, 0.06)) for lvl in (knobs["opaque"][1]["choices"] if opaque else [])}
    synergy: dict[str, Any] = {}
    synergy_gain = 0.0
    roles = [r for r in ("batch", "shard", "remat", "kernel", "opaque", "plateau") if r in knobs]
    if rng.random() < 0.5 and len(roles) >= 3:
        k = 3 if rng.random() < 0.5 else 2
        for role in rng.choice(roles, size=k, replace=False):
            name, spec, _ = knobs[str(role)]
            choices = spec.get("choices", [False, True])
            synergy[name] = choices[int(rng.integers(1, len(choices)))] if len(choices) > 1 else choices[0]
        synergy_gain = rng.uniform(0.06, 0.15)
        features.append(f"synergy{k}")
    noise_sigma = float(rng.uniform(0.02, 0.08))

    def level(role: str, kv: Mapping[str, Any]) -> int:
        name, spec, _ = knobs[role]
        return list(spec["choices"]).index(kv[name])

    def get(role: str, kv: Mapping[str, Any], default: Any) -> Any:
        return kv[knobs[role][0]] if role in knobs else default

    def dp_of(kv: Mapping[str, Any]) -> int:
        return max(devices // int(get("shard", kv, 1)), 1)

    def memory_of(kv: Mapping[str, Any]) -> float:
        s = int(get("shard", kv, 1))
        st = int(get("stage", kv, 0))
        dp = dp_of(kv)
        w = weights / s**shard_w_exp
        o = states / s**shard_w_exp
        if get("offload", kv, False):
            o *= 0.08
        if st >= 1:
            o /= dp
        if st >= 2:
            w = w * (0.5 + 0.5 / dp)  # gradients
        if st >= 3:
            w = w / dp + fragment * (weights + states) / s**shard_w_exp
        r = remat_mem[level("remat", kv)] if "remat" in knobs else 1.0
        k = kernel_mem if get("kernel", kv, False) else 1.0
        a = act1 * float(kv[batch]) ** batch_exp * r * k / s**shard_a_exp
        return w + o + a + reserve

    def time_of(kv: Mapping[str, Any]) -> float:
        s = int(get("shard", kv, 1))
        st = int(get("stage", kv, 0))
        mb = float(kv[batch])
        t = compute / s * (1 + batch_overhead / mb)
        t += compute * comm_shard * math.log2(s) * (1 + 0.3 / mb)
        t += compute * comm_stage * st**1.3 * math.log2(max(dp_of(kv), 2))
        if get("offload", kv, False):
            t += compute * offload_cost
        if "remat" in knobs:
            t *= remat_time[level("remat", kv)]
        if get("kernel", kv, False):
            t *= kernel_time
        if plateau:
            t *= 1 + plateau_gain * max(0, plateau_at - int(kv[plateau])) / plateau_at
        if opaque:
            t *= math.exp(opaque_effect[kv[opaque]])
        if synergy:
            t *= math.exp(-synergy_gain) if all(kv[n] == v for n, v in synergy.items()) else 1.0
        return t

    contract = family_contract(f"robust-{seed}", {f"train.{n}": spec for n, spec, _ in knobs.values()})
    built = contract_from_dict(contract, check=False)
    study = StudySpace.from_contract(built, baseline_launch=None, capacity_bytes=80 * 2**30)
    model = FamilyModel(seed, study, devices, noise_sigma, memory_of, time_of, tuple(features))
    golden = _place_cliff(model, rng)
    launch = {"train": {b.launch_key.removeprefix("train."): b.launch_value(v) for b in study.bindings
                        for v in [golden[b.name]]}}
    model.study = StudySpace.from_contract(built, baseline_launch=launch, capacity_bytes=model.capacity_bytes)
    return model


def family_contract(name: str, knobs: Mapping[str, Any], constraints: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A family member's contract (as a document): ``knobs`` (launch key → knob spec) its whole search space and
    scope, under ``constraints`` if any; the workload, an 80 GB H100 and the budget are every member's."""
    space: dict[str, Any] = {"knobs": dict(knobs)}
    if constraints:
        space["constraints"] = dict(constraints)
    return {
        "name": name, "goal": "faster",
        "workload": {"repo": "/nonexistent", "command": ["{python}", "train.py", "{launch_file}"],
                     "launch_file": "launch.yaml", "steps": 30, "verify_steps": 30},
        "cluster": {"id": "family", "accelerator": "H100-80G", "memory_capacity_bytes": 80 * 2**30},
        "backend": {"kind": "local", "parallel": 1},
        "scope": {"files": [], "launch_keys": list(knobs)},
        "search_space": space,
        "invariants": {"loss": {"tolerance": 0.05}},
        "budget": {"trials": 40, "accelerator_hours": 1e6},
    }  # fmt: skip


def _place_cliff(model: FamilyModel, rng: np.random.Generator) -> Candidate:
    """Sets the capacity so that the exact optimum uses 97–100% of it, and returns a golden configuration: an
    untuned one that fits with room to spare (at most 80% of capacity, slower than the median that fits)."""
    cands = model.study.space.enumerate()
    mem = np.array([model.memory_of(c.knobs) for c in cands])
    t = np.array([model.time_of(c.knobs) for c in cands])
    cap = float(np.quantile(mem, rng.uniform(0.25, 0.6)))
    best = int(np.argmin(np.where(mem <= cap, t, np.inf)))
    # the capacity goes just above the optimum's peak, and stays below every faster candidate's (raising it by up
    # to 3% must not let a faster one fit: the oracle would no longer be the optimum)
    faster = mem[t < t[best]]
    cap = float(mem[best]) / (1 - rng.uniform(0.0, 0.03))
    if faster.size:
        cap = min(cap, float(faster.min()) * (1 - 1e-9))
    model.study = dataclasses.replace(model.study, capacity_bytes=cap)
    model.oracle, model.oracle_time = cands[best], float(t[best])
    model.oracle_memory_fraction = float(mem[best] / cap)
    fits = mem <= cap
    roomy = np.flatnonzero((mem <= 0.8 * cap) & (t >= np.median(t[fits])))
    if roomy.size == 0:
        roomy = np.flatnonzero(fits)
    return cands[int(rng.choice(roomy))]
