"""SIMULATOR scenarios: named (cluster, model, search space) triples with noise, OOMs and a known optimum.

Owns: the mapping candidate -> `Setting`, seeded hidden corrections, run-to-run noise and stragglers, OOM with a
censoring bound (the peak seen before the kill), invariant violations of risky settings, trial cost, and the
oracle (exhaustive enumeration with noise-free time). Must not: do I/O. Every outcome says it is simulated.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from infrarsi.modeling.memory_model import TransformerMeta
from infrarsi.modeling.observations import Status
from infrarsi.modeling.space import (
    BoolKnob,
    Candidate,
    Categorical,
    Constraint,
    IntChoice,
    Knob,
    MemoryDirection,
    Patch,
    SearchSpace,
)
from infrarsi.sim.hardware import (
    A100_80G,
    DENSE_7B,
    DENSE_13B,
    H100_80G,
    H200_141G,
    MOE_8X7B,
    DeviceSpec,
    ModelSpec,
)
from infrarsi.sim.physics import Breakdown, Hidden, Recompute, Setting, step_time

STARTUP_S = 120.0
MEASURED_STEPS = 30


@dataclass(frozen=True)
class SimOutcome:
    """What a simulated trial reports, shaped like a real trial's result (``bench/real_space.py`` reports its
    real trials in it too, ``simulated=False``)."""

    status: Status
    """A simulated trial ends ``ok``, ``oom``, ``crash`` or ``invariant_violation``."""
    step_time_s: float | None
    """Steady-state median (warm-up excluded, as telemetry measures it); ``None`` when nothing was measured."""
    peak_bytes: float | None
    """Observed peak; for an OOM the last peak seen before the kill (a lower bound: the censoring bound)."""
    cost_seconds: float
    """Accelerator-seconds, failed trials included."""
    simulated: bool = True
    detail: str = ""


@dataclass(frozen=True)
class Scenario:
    """A simulated cluster + model + search space. ``evaluate`` is the `sim` launcher backend's physics."""

    name: str
    device: DeviceSpec
    n_devices: int
    model: ModelSpec
    global_batch: int
    space: SearchSpace
    hidden: Hidden
    violates: Callable[[Candidate], str | None]
    noise_sigma: float = 0.02
    straggler_p: float = 0.05
    crash_p: float = 0.01
    description: str = field(default="")

    @property
    def capacity_bytes(self) -> float:
        return float(self.device.memory_bytes)

    def setting(self, c: Candidate) -> Setting:
        kv = c.knobs
        return Setting(
            tp=int(kv.get("tp", 1)), pp=int(kv.get("pp", 1)), dp=int(kv.get("dp", 1)), ep=int(kv.get("ep", 1)),
            micro_batch=int(kv.get("micro_batch", 1)), recompute=cast(Recompute, kv.get("recompute", "none")),
            zero_stage=int(kv.get("zero_stage", 0)), sequence_parallel=bool(kv.get("sequence_parallel", False)),
            flash_attention=bool(kv.get("flash_attention", True)), overlap_comm=bool(kv.get("overlap_comm", True)),
            bucket_mb=int(kv.get("bucket_mb", 25)), capacity_factor=float(kv.get("capacity_factor", 1.25)),
            offload_optimizer=bool(kv.get("offload_optimizer", False)), patches=c.patches,
        )

    def breakdown(self, c: Candidate) -> Breakdown:
        return step_time(self.model, self.device, self.setting(c), self.global_batch, self.hidden)

    def true_step_time(self, c: Candidate) -> float:
        return self.breakdown(c).step_time_s

    def true_peak_bytes(self, c: Candidate) -> float:
        return self.breakdown(c).peak_bytes

    def fits(self, c: Candidate) -> bool:
        return self.true_peak_bytes(c) <= self.capacity_bytes

    def evaluate(self, c: Candidate, rng: np.random.Generator) -> SimOutcome:
        """One simulated trial. Draws from ``rng`` in a fixed order, so a seeded rng replays exactly."""
        if not self.space.is_feasible(c):
            raise ValueError(f"infeasible candidate for {self.name}: {self.space.violated(c)}")
        b = self.breakdown(c)
        u_noise, u_strag, u_strag_mag, u_crash, u_peak, u_kill = rng.random(6)
        noise = math.exp(self.noise_sigma * _norm_ppf(u_noise))
        straggler = 1.0 + 0.05 + 0.25 * u_strag_mag if u_strag < self.straggler_p else 1.0
        t = b.step_time_s * noise * straggler
        n = self.n_devices
        if b.peak_bytes > self.capacity_bytes:
            bound = self.capacity_bytes * (0.95 + 0.05 * u_kill)
            return SimOutcome("oom", None, bound, n * (STARTUP_S + 2 * t), detail="simulated CUDA OOM")
        if u_crash < self.crash_p:
            return SimOutcome("crash", None, None, n * (STARTUP_S + 5 * t), detail="simulated NCCL timeout")
        peak = b.peak_bytes * (1.0 + 0.005 * _norm_ppf(u_peak))
        cost = n * (STARTUP_S + MEASURED_STEPS * t)
        reason = self.violates(c)
        if reason is not None:
            return SimOutcome("invariant_violation", t, peak, cost, detail=reason)
        return SimOutcome("ok", t, peak, cost)

    def valid(self, c: Candidate) -> bool:
        """Fits in memory and keeps every invariant: what the oracle ranges over."""
        return self.fits(c) and self.violates(c) is None

    def memory_meta(self) -> TransformerMeta:
        m = self.model
        return TransformerMeta(
            layers=m.layers, hidden=m.hidden, heads=m.heads, seq_len=m.seq_len, vocab=m.vocab,
            dense_params=m.total_params - (m.layers * m.experts * m.expert_params_per_layer if m.experts > 1 else 0),
            expert_params=m.layers * m.experts * m.expert_params_per_layer if m.experts > 1 else 0,
            experts=m.experts, top_k=m.top_k, global_batch=self.global_batch, capacity_bytes=self.capacity_bytes,
            devices=self.n_devices,
        )


@functools.cache
def _table(name: str) -> tuple[tuple[Candidate, ...], np.ndarray, np.ndarray, np.ndarray]:
    """(candidates, noise-free step time, true peak, valid mask) over the whole space of a named scenario."""
    sc = get_scenario(name)
    cands = tuple(sc.space.enumerate())
    times = np.empty(len(cands))
    peaks = np.empty(len(cands))
    valid = np.empty(len(cands), dtype=bool)
    for i, c in enumerate(cands):
        b = sc.breakdown(c)
        times[i], peaks[i] = b.step_time_s, b.peak_bytes
        valid[i] = b.peak_bytes <= sc.capacity_bytes and sc.violates(c) is None
    return cands, times, peaks, valid


def enumerate_scenario(name: str) -> tuple[tuple[Candidate, ...], np.ndarray, np.ndarray, np.ndarray]:
    return _table(name)


def oracle(name: str) -> tuple[Candidate, float]:
    """Best valid candidate and its noise-free step time (exhaustive)."""
    cands, times, _, valid = _table(name)
    masked = np.where(valid, times, np.inf)
    i = int(np.argmin(masked))
    return cands[i], float(times[i])


# ------------------------------------------------------------------------------------------ scenario builders


def _norm_ppf(u: float) -> float:
    from scipy.special import ndtri

    return float(ndtri(min(max(u, 1e-12), 1 - 1e-12)))


def _hidden(seed_name: str, moe: bool) -> Hidden:
    rng = np.random.default_rng(zlib.crc32(seed_name.encode()))

    def ordered(keys: list[str]) -> dict[str, float]:
        # factors sorted so a setting the formulas call leaner is never fatter than its neighbour: the hidden
        # truth is "formula off by a few per cent", not "memory ordering reversed"
        draws = sorted(rng.uniform(0.9, 1.25, size=len(keys)))
        return dict(zip(keys, (float(d) for d in draws), strict=True))

    act = ordered(["recompute=full", "recompute=selective", "recompute=none"])
    act |= ordered(["flash_attention=True", "flash_attention=False"])
    act |= ordered(["sequence_parallel=True", "sequence_parallel=False"])
    static = ordered(["zero_stage=3", "zero_stage=2", "zero_stage=1", "zero_stage=0"])
    static |= ordered(["offload_optimizer=True", "offload_optimizer=False"])
    time = {"moe": float(rng.uniform(0.9, 1.2))} if moe else {}
    return Hidden(activation=act, static=static, fragmentation=float(rng.uniform(1.02, 1.10)), time=time)


def _pow2_upto(n: int) -> tuple[int, ...]:
    return tuple(2**i for i in range(int(math.log2(n)) + 1))


def _dense_space(n_devices: int, global_batch: int, model: ModelSpec, patches: tuple[Patch, ...],
                 offload: bool, bucket: bool) -> SearchSpace:
    knobs: list[Knob] = [
        IntChoice("tp", (1, 2, 4, 8), default=1),
        IntChoice("pp", (1, 2, 4, 8), default=1),
        IntChoice("dp", _pow2_upto(n_devices), default=n_devices),
        IntChoice("micro_batch", (1, 2, 4, 8), default=1),
        Categorical("recompute", ("none", "selective", "full"), default="full",
                    memory_order=("full", "selective", "none")),
        IntChoice("zero_stage", (0, 1, 2, 3), default=1),
        BoolKnob("sequence_parallel"),
        BoolKnob("flash_attention", default=False),
        BoolKnob("overlap_comm", default=False),
    ]
    if bucket:
        knobs.append(IntChoice("bucket_mb", (25, 200), default=25))
    if offload:
        knobs.append(BoolKnob("offload_optimizer"))
    return SearchSpace(
        knobs=tuple(knobs), patches=patches, constraints=_parallel_constraints(n_devices, global_batch, model),
        memory_direction=_MEMORY_DIRECTION,
    )


_MEMORY_DIRECTION: dict[str, MemoryDirection] = {"tp": -1, "pp": -1, "dp": -1, "ep": -1, "micro_batch": 1, "zero_stage": -1,
                     "sequence_parallel": -1, "flash_attention": -1, "offload_optimizer": -1, "bucket_mb": 1,
                     "capacity_factor": 1}


def _parallel_constraints(n_devices: int, global_batch: int, model: ModelSpec) -> tuple[Constraint, ...]:
    # ``kv`` as ``Any``: these knobs are the ints and bools the scenario's own space declares.
    def devices(kv: Mapping[str, Any], _p: frozenset[str]) -> bool:
        return bool(kv["tp"] * kv["pp"] * kv["dp"] * 1 == n_devices)

    def batch(kv: Mapping[str, Any], _p: frozenset[str]) -> bool:
        return bool(global_batch % (kv["dp"] * kv["micro_batch"]) == 0)

    def sp_needs_tp(kv: Mapping[str, Any], _p: frozenset[str]) -> bool:
        return bool(not kv["sequence_parallel"] or kv["tp"] > 1)

    def offload_needs_zero(kv: Mapping[str, Any], _p: frozenset[str]) -> bool:
        return bool(not kv.get("offload_optimizer", False) or kv["zero_stage"] >= 1)

    def layers(kv: Mapping[str, Any], _p: frozenset[str]) -> bool:
        return bool(model.layers % kv["pp"] == 0)

    def zero_needs_dp(kv: Mapping[str, Any], _p: frozenset[str]) -> bool:
        return bool(kv["zero_stage"] == 0 or kv["dp"] > 1)

    cons = [Constraint("tp*pp*dp == devices", devices), Constraint("micro_batch*dp divides global batch", batch),
            Constraint("sequence_parallel needs tp > 1", sp_needs_tp),
            Constraint("offload needs zero >= 1", offload_needs_zero), Constraint("layers % pp == 0", layers),
            Constraint("zero needs dp > 1", zero_needs_dp)]
    if model.experts > 1:
        def expert_parallel(kv: Mapping[str, Any], _p: frozenset[str]) -> bool:
            return bool(kv["dp"] % kv["ep"] == 0 and model.experts % kv["ep"] == 0)

        cons.append(Constraint("ep divides dp and experts", expert_parallel))
    return tuple(cons)


FUSED_KERNELS = Patch("fused_kernels", "fused RMSNorm/RoPE/SwiGLU kernels", time_prior=(-0.04, 0.05),
                      memory_prior=(-0.01, 0.03))
FUSED_ADAM = Patch("fused_adam", "multi-tensor fused Adam", time_prior=(-0.02, 0.04), memory_prior=(0.0, 0.02))
FP8_LINEAR = Patch("fp8_linear", "FP8 (e4m3) GEMMs in linear layers via TransformerEngine", time_prior=(-0.2, 0.15),
                   memory_prior=(0.0, 0.05), invariant_prior=(0.6, 1.4), risk="high")
GROUPED_GEMM = Patch("grouped_gemm", "grouped GEMM for MoE experts", time_prior=(-0.05, 0.08),
                     memory_prior=(0.0, 0.03))


def _dense(name: str, device: DeviceSpec, n: int, model: ModelSpec, gb: int, patches: tuple[Patch, ...],
           fp8_breaks_loss: bool, offload: bool = False, bucket: bool = True) -> Scenario:
    def violates(c: Candidate) -> str | None:
        if fp8_breaks_loss and "fp8_linear" in c.patches:
            return "loss: FP8 run diverges from the bf16 baseline beyond epsilon (simulated)"
        return None

    return Scenario(name, device, n, model, gb, _dense_space(n, gb, model, patches, offload, bucket),
                    _hidden(name, False), violates, description=f"SIMULATOR: {model.name} on {n}x {device.name}")


def _moe(name: str, device: DeviceSpec, n: int, model: ModelSpec, gb: int) -> Scenario:
    knobs = (
        IntChoice("tp", (1, 2, 4, 8), default=1),
        IntChoice("pp", (1, 2, 4), default=1),
        IntChoice("dp", _pow2_upto(n), default=n),
        IntChoice("ep", (1, 2, 4, 8), default=1),
        IntChoice("micro_batch", (1, 2, 4), default=1),
        Categorical("recompute", ("none", "selective", "full"), default="full",
                    memory_order=("full", "selective", "none")),
        IntChoice("zero_stage", (0, 1, 2), default=1),
        BoolKnob("sequence_parallel"),
        BoolKnob("overlap_comm", default=False),
        Categorical("capacity_factor", ("1.0", "1.25", "2.0"), default="1.25", memory_order=("1.0", "1.25", "2.0")),
    )
    space = SearchSpace(knobs=knobs, patches=(GROUPED_GEMM, FUSED_KERNELS),
                        constraints=_parallel_constraints(n, gb, model), memory_direction=_MEMORY_DIRECTION)

    def violates(c: Candidate) -> str | None:
        if c["capacity_factor"] == "1.0":
            return "loss: token dropping at capacity factor 1.0 moves the loss beyond epsilon (simulated)"
        return None

    return Scenario(name, device, n, model, gb, space, _hidden(name, True), violates,
                    description=f"SIMULATOR: {model.name} on {n}x {device.name}")


@functools.cache
def get_scenario(name: str) -> Scenario:
    builders: dict[str, Callable[[], Scenario]] = {
        "dense7b_h100x64": lambda: _dense("dense7b_h100x64", H100_80G, 64, DENSE_7B, 512,
                                          (FUSED_KERNELS, FP8_LINEAR), fp8_breaks_loss=True),
        "dense7b_a100x64": lambda: _dense("dense7b_a100x64", A100_80G, 64, DENSE_7B, 512,
                                          (FUSED_KERNELS, FUSED_ADAM), fp8_breaks_loss=False),
        "dense7b_h200x64": lambda: _dense("dense7b_h200x64", H200_141G, 64, DENSE_7B, 512,
                                          (FUSED_KERNELS, FP8_LINEAR), fp8_breaks_loss=False),
        "dense13b_a100x32": lambda: _dense("dense13b_a100x32", A100_80G, 32, DENSE_13B, 256,
                                           (FUSED_KERNELS, FUSED_ADAM), fp8_breaks_loss=False, offload=True,
                                           bucket=False),
        "moe8x7b_h100x128": lambda: _moe("moe8x7b_h100x128", H100_80G, 128, MOE_8X7B, 1024),
    }
    if name not in builders:
        raise KeyError(f"unknown simulator scenario {name!r}; known: {sorted(builders)}")
    return builders[name]()


SCENARIOS = ("dense7b_h100x64", "moe8x7b_h100x128", "dense13b_a100x32", "dense7b_a100x64", "dense7b_h200x64")
