"""Real studies get the structural memory formula from the workload's shape: the probe's reading with the
first good baseline, the contract's statement over it, the workspace calibrated on the baseline's peak."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from infrarsi import events as ev
from infrarsi.modeling.memory_model import structural_components
from infrarsi.study.contract import contract_from_dict
from infrarsi.study.model import StudyModel, adopt_shape
from infrarsi.study.shape import CPU_WORKSPACE_BYTES
from infrarsi.study.space import StudySpace

GIB = 2**30
LAUNCH = {"knobs": {"micro_batch_size": 4, "activation_checkpointing": "none", "compile": False}}
PROBED = ev.WorkloadShape(parameters=2_000_000, layers=4, hidden=192, heads=6, seq_len=128, vocab=512,
                          sources={"layers": "config"})


def contract_dict(repo: Path, shape: dict[str, Any] | None = None, accelerator: str = "H100-80G") -> dict[str, Any]:
    workload: dict[str, Any] = {"repo": str(repo), "command": ["{python}", "train.py", "{launch_file}"],
                                "launch_file": "launch.yaml", "steps": 10, "verify_steps": 20}
    if shape is not None:
        workload["shape"] = shape
    return {
        "name": "shaped", "goal": "faster", "workload": workload,
        "cluster": {"id": accelerator, "accelerator": accelerator, "memory_capacity_bytes": GIB},
        "scope": {"files": [], "launch_keys": ["knobs.micro_batch_size", "knobs.activation_checkpointing",
                                               "knobs.compile"]},
        "search_space": {
            "knobs": {"knobs.micro_batch_size": {"type": "int", "choices": [1, 2, 4, 8, 16]},
                      "knobs.activation_checkpointing": {"type": "choice", "choices": ["none", "selective", "full"]},
                      "knobs.compile": {"type": "bool"}},
            "constraints": {"global_batch": {"size": 16, "micro_batch_key": "knobs.micro_batch_size"}},
        },
        "invariants": {"loss": {"tolerance": 0.05}},
        "budget": {"trials": 10, "accelerator_hours": 1.0},
    }  # fmt: skip


def study(repo: Path, shape: dict[str, Any] | None = None, accelerator: str = "H100-80G") -> StudySpace:
    contract = contract_from_dict(contract_dict(repo, shape, accelerator), check=False)
    return StudySpace.from_contract(contract, baseline_launch=LAUNCH)


def baseline_measured(peak: int, shape: ev.WorkloadShape | None = PROBED, kind: str = "doctor") -> ev.TrialMeasured:
    return ev.TrialMeasured(
        candidate_key=ev.Candidate().key(), kind=kind, status="ok", steps=10, warmup_steps=1, step_time_s=0.5,
        step_time_mad_s=0.0, step_time_with_warmup_s=0.5, tokens_per_s=1.0, mfu=None, flops_per_step=None,
        phases={}, peak_memory_bytes=[peak], per_rank_step_s=[0.5], stragglers=[], loss_curve=[], eval_curve=[],
        optimizer_steps=10, tokens=100, invariants=[], invariants_ok=True, shape=shape,
    )  # fmt: skip


def test_a_real_study_without_a_shape_keeps_the_generic_memory_model(tmp_path: Path) -> None:
    space = study(tmp_path)
    assert space.meta is None
    assert adopt_shape(space, baseline_measured(GIB // 2, shape=None)) is None
    assert adopt_shape(space, baseline_measured(GIB // 2, kind="search")) is None  # only a baseline's shape


def test_the_probes_shape_with_the_first_baseline_gives_the_formula_calibrated_on_its_peak(tmp_path: Path) -> None:
    space = adopt_shape(study(tmp_path), baseline_measured(600 * 2**20))
    assert space is not None and space.meta is not None
    meta = space.meta
    assert (meta.layers, meta.hidden, meta.heads, meta.seq_len, meta.vocab) == (4, 192, 6, 128, 512)
    assert (meta.dense_params, meta.expert_params, meta.global_batch) == (2_000_000, 0, 16)
    assert meta.roles == {"micro_batch": "micro_batch_size", "recompute": "activation_checkpointing"}
    static, act = structural_components(meta, space.baseline.knobs)
    assert static + act + meta.workspace_bytes == 600 * 2**20  # the golden run, exactly
    bigger = structural_components(meta, {**space.baseline.knobs, "micro_batch_size": 16})
    assert bigger[1] == 4 * act  # activations scale with the micro-batch
    assert adopt_shape(space, baseline_measured(GIB)) is None  # adopted once


def test_the_contract_states_or_overrides_the_shape(tmp_path: Path) -> None:
    stated = {"parameters": 2_000_000, "layers": 4, "hidden": 192, "heads": 6, "seq_len": 64, "vocab": 512}
    space = study(tmp_path, stated)
    assert space.meta is not None and space.meta.seq_len == 64  # no probe needed (a coarse job)
    assert space.meta.workspace_bytes == 1.5 * GIB  # the GPU default until a baseline is measured
    shaped = adopt_shape(space, baseline_measured(600 * 2**20))
    assert shaped is not None and shaped.meta is not None and shaped.meta.seq_len == 64  # the contract wins
    partial = adopt_shape(study(tmp_path, {"seq_len": 256}), baseline_measured(600 * 2**20))
    assert partial is not None and partial.meta is not None and partial.meta.seq_len == 256


def test_the_modeler_refits_with_the_structural_formula_once_the_baseline_reports_a_shape(tmp_path: Path) -> None:
    space = study(tmp_path)
    model = StudyModel(space, "st")
    base = ev.Candidate()
    events = [
        ev.make_event(ev.TrialProposed(candidate=base, candidate_key=base.key(), kind="doctor", origin="baseline"), study_id="st",
                      trial_id="t0", source="proposer"),
        ev.make_event(ev.TrialFinished(status="ok", steps_completed=10, wall_s=6.0, accelerator_s=6.0),
                      study_id="st", trial_id="t0", source="launcher"),
        ev.make_event(baseline_measured(600 * 2**20), study_id="st", trial_id="t0", source="telemetry"),
    ]  # fmt: skip
    for event in events:
        model.apply(event)
    assert model.space.meta is not None and model.searcher is not None
    assert model.searcher.memory_model.structured
    (predicted,) = model.searcher.predict([model.space.baseline])
    assert math.isclose(math.exp(predicted.log_peak_bytes), 600 * 2**20, rel_tol=0.05)


def test_a_cpu_study_uses_the_formula_only_when_its_contract_states_a_shape(tmp_path: Path) -> None:
    probed_only = adopt_shape(study(tmp_path, accelerator="cpu"), baseline_measured(600 * 2**20))
    assert probed_only is not None and probed_only.meta is None and probed_only.probed_shape == PROBED
    stated = study(tmp_path, {"seq_len": 128, "parameters": 2_000_000, "layers": 4, "hidden": 192, "heads": 6,
                              "vocab": 512}, accelerator="cpu")
    assert stated.meta is not None and stated.meta.workspace_bytes == CPU_WORKSPACE_BYTES


def test_the_layout_reaches_the_formula_and_unroled_knobs_are_named(tmp_path: Path) -> None:
    """Issue 33: the data-parallel degree the formula divides ZeRO states by comes from the contract's layout —
    the global batch's ``devices`` (data-parallel = devices / (tp·pp)), else its fixed ``data_parallel``, else the
    launcher's world size — and a knob the formula has no role for is named in the study's notes."""
    data = contract_dict(tmp_path)
    data["search_space"]["constraints"]["global_batch"] = {"size": 64, "micro_batch_key": "knobs.micro_batch_size",
                                                           "data_parallel": 4}
    contract = contract_from_dict(data, check=False)
    shaped = StudySpace.from_contract(contract, baseline_launch=LAUNCH).with_shape(PROBED, baseline_peak_bytes=GIB // 2)
    assert shaped.meta is not None and shaped.meta.devices == 4
    assert any("no role for compile" in note for note in shaped.notes), shaped.notes

    data["search_space"]["constraints"]["global_batch"] = {"size": 64, "micro_batch_key": "knobs.micro_batch_size"}
    data["workload"]["launcher"] = {"kind": "torchrun", "nnodes": 2, "nproc_per_node": 4}
    contract = contract_from_dict(data, check=False)
    meta = StudySpace.from_contract(contract, baseline_launch=LAUNCH).with_shape(PROBED, baseline_peak_bytes=GIB).meta
    assert meta is not None and meta.devices == 8

    one = study(tmp_path).with_shape(PROBED, baseline_peak_bytes=GIB // 2).meta
    assert one is not None and one.devices is None  # one device: data-parallel 1
