"""A real study's workload shape for the structural memory model: the contract's statement over the probe's.

Owns ``study_meta``: the ``TransformerMeta`` the search's memory model needs (``modeling.memory_model``),
built for a real (non-simulated) study from

- the shape the probe read when it attached to the model (``WorkloadShape`` in the first baseline's
  ``TrialMeasured``), each field overridden by the contract's ``workload.shape`` where it says;
- the knobs, whose canonical names (``KnowledgeBase.canonical``: ``per_device_train_batch_size`` and
  ``micro_batch_size`` → ``micro_batch``, ``activation_checkpointing`` → ``recompute``, ...) tell the formula
  which knob plays which role, where the values mean what the formula reads (recompute none/selective/full);
- the workspace (memory besides model state and activations: the CUDA context, a CPU process's runtime),
  calibrated on the baseline's measured peak once there is one, so the formula predicts the golden run
  exactly and the learned corrections start from there.

On a CPU host only a contract that states ``workload.shape`` gets the formula (``CPU_NEEDS_STATED_SHAPE``).

Simulated studies keep their scenario's shape. Pure: the same contract and events give the same meta.
Must not: read the disk, publish.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from infrarsi import events as ev
from infrarsi.modeling.memory_model import TransformerMeta, structural_components
from infrarsi.modeling.priors import KnowledgeBase
from infrarsi.modeling.space import Categorical, IntChoice, IntRange, Knob, SearchSpace
from infrarsi.study.contract import Contract

REQUIRED = ("layers", "hidden", "heads", "seq_len", "vocab", "parameters")
"""The fields without which the formula says nothing."""

CPU_WORKSPACE_BYTES = 0.4 * 2**30
"""A CPU training process's runtime before any model (Python, torch, the framework), until calibrated."""

CPU_NEEDS_STATED_SHAPE = True
"""On a CPU host the formula is used only when the contract states a ``workload.shape`` (any field): there
the capacity is the process tree's RSS, where data-loader worker processes, compile caches and the
allocator move the peak by tens of per cent, and the structured model holds every non-role knob's effect
to about 2 % — it would mispredict exactly the OOMs a CPU study meets. The generic model learns them."""

_RECOMPUTE_VALUES = {"none", "selective", "full"}
_INT_ROLES = {"micro_batch", "tp", "pp", "dp", "ep", "zero_stage"}


def merged_shape(contract: Contract, probed: ev.WorkloadShape | None) -> dict[str, Any]:
    """Field → value: the probe's reading, overridden by what the contract states."""
    values: dict[str, Any] = {}
    if probed is not None:
        values = {f: getattr(probed, f) for f in probed.__struct_fields__ if f != "sources"}
        if not probed.experts:
            values["expert_parameters"] = 0
    stated = contract.workload.shape
    if stated is not None:
        values |= {k: v for k, v in stated.model_dump().items() if v is not None}
    return {k: v for k, v in values.items() if v is not None}


def knob_roles(space: SearchSpace) -> dict[str, str]:
    """Formula role → knob name, for knobs whose canonical name is a role and whose values the formula reads."""
    roles: dict[str, str] = {}
    for knob in space.knobs:
        role = KnowledgeBase.canonical(knob.name)
        if role in _INT_ROLES and isinstance(knob, IntChoice | IntRange):
            roles[role] = knob.name
        elif role == "recompute" and _choices(knob) <= _RECOMPUTE_VALUES:
            roles[role] = knob.name
    return roles


def _choices(knob: Knob) -> set[str]:
    return {str(v) for v in knob.choices} if isinstance(knob, Categorical) else {"?"}


def study_meta(
    contract: Contract,
    space: SearchSpace,
    baseline_knobs: Mapping[str, Any],
    capacity_bytes: float,
    probed: ev.WorkloadShape | None = None,
    *,
    baseline_peak_bytes: float | None = None,
) -> TransformerMeta | None:
    """The study's ``TransformerMeta``, or ``None`` while a required field is unknown (see the module doc)."""
    on_cpu = contract.cluster.accelerator.lower() == "cpu"
    if on_cpu and contract.workload.shape is None:
        return None  # see CPU_NEEDS_STATED_SHAPE
    shape = merged_shape(contract, probed)
    if any(field not in shape for field in REQUIRED):
        return None
    roles = knob_roles(space)
    gb = contract.search_space.constraints.global_batch
    micro = baseline_knobs.get(roles.get("micro_batch", "micro_batch"), 1)
    stated = contract.workload.shape.workspace_bytes if contract.workload.shape is not None else None
    expert_params = int(shape.get("expert_parameters", 0))
    meta = TransformerMeta(
        layers=int(shape["layers"]), hidden=int(shape["hidden"]), heads=int(shape["heads"]),
        seq_len=int(shape["seq_len"]), vocab=int(shape["vocab"]),
        dense_params=int(shape["parameters"]) - expert_params, expert_params=expert_params,
        experts=int(shape.get("experts") or 1), top_k=int(shape.get("experts_per_token") or 1),
        global_batch=gb.size if gb is not None else int(micro), capacity_bytes=capacity_bytes, roles=roles,
        devices=job_devices(contract, roles),
    )  # fmt: skip
    if stated is not None:
        return _with_workspace(meta, stated)
    if baseline_peak_bytes:
        static, activations = structural_components(meta, baseline_knobs)
        # the rest of the golden run's peak; a floor keeps a formula that overshoots from a negative workspace
        return _with_workspace(meta, max(baseline_peak_bytes - static - activations, 0.1 * baseline_peak_bytes))
    return _with_workspace(meta, CPU_WORKSPACE_BYTES) if on_cpu else meta


def job_devices(contract: Contract, roles: Mapping[str, str]) -> int | None:
    """The accelerators the job spans, for the formula's data-parallel degree where no knob sets it (data-parallel
    = devices / (tp·pp)): the global-batch constraint's ``devices`` when it derives data-parallel from them; its
    fixed ``data_parallel`` when no tensor or pipeline knob divides it; else the launcher's world size
    (``nnodes × nproc_per_node``). ``None`` for one device: the formula's data-parallel is then 1."""
    gb = contract.search_space.constraints.global_batch
    if gb is not None and gb.devices is not None:
        return gb.devices
    if gb is not None and gb.data_parallel > 1 and not {"tp", "pp"} & roles.keys():
        return gb.data_parallel
    launcher = contract.workload.launcher
    world = launcher.nnodes * launcher.nproc_per_node
    return world if world > 1 else None


def unroled_knobs(space: SearchSpace, roles: Mapping[str, str]) -> list[str]:
    """The study's knobs the formula has no role for: their memory effects are the learned models' alone."""
    return [k.name for k in space.knobs if k.name not in roles.values()]


def _with_workspace(meta: TransformerMeta, workspace_bytes: float) -> TransformerMeta:
    return dataclasses.replace(meta, workspace_bytes=float(workspace_bytes))
