"""bench/shaped_family.py (transformer jobs with known shapes and an independent memory truth) and the
shape-known arm of bench/robustness.py."""

from __future__ import annotations

import ast
import json
import math

import numpy as np
import pytest
from infrarsi.modeling.memory_model import structural_components
from support.bench_spaces import BENCH, import_bench_module

robustness = import_bench_module("robustness")
shaped = import_bench_module("shaped_family")


def test_the_family_is_written_apart_from_the_formula_it_measures() -> None:
    tree = ast.parse((BENCH / "shaped_family.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m.startswith(("infrarsi.sim", "infrarsi.modeling", "infrarsi.study.shape"))}


def test_a_model_is_reproducible_with_its_optimum_at_the_cliff_and_its_shape_as_the_probe_reports_it() -> None:
    a, b = shaped.draw_model(3), shaped.draw_model(3)
    assert (a.oracle, a.capacity_bytes, a.golden_peak_bytes) == (b.oracle, b.capacity_bytes, b.golden_peak_bytes)
    assert 0.97 <= a.oracle_memory_fraction <= 1.0
    shape = a.probed
    assert shape.parameters > shape.expert_parameters >= 0 and shape.layers and shape.hidden and shape.vocab
    baseline = a.study.baseline
    assert a.fits(baseline) and a.memory_of(baseline.knobs) <= 0.8 * a.capacity_bytes
    assert a.golden_peak_bytes == pytest.approx(a.memory_of(baseline.knobs), rel=0.02)
    for c in a.study.space.enumerate():  # every candidate keeps micro-batch x dp dividing the global batch
        assert math.isfinite(a.memory_of(c.knobs)) and a.time_of(c.knobs) > 0


def test_the_memory_truth_moves_the_way_the_published_accountings_say() -> None:
    # model 1: MoE, 16 devices, zero_stage, recompute_granularity, micro_batch_size knobs
    model = shaped.draw_model(1)
    base = {k.name: k.values()[0] for k in model.study.space.knobs} | {"tp": 2, "zero_stage": 0}
    mem = model.memory_of
    recompute = [mem(base | {"recompute_granularity": r}) for r in ("none", "selective", "full")]
    # full recomputation keeps 2sbh per layer; selective drops the 5as/h scores, which this model's fused
    # attention kernel never kept
    assert recompute[0] == recompute[1] > recompute[2]
    batches = [mem(base | {"micro_batch_size": b}) for b in (1, 2, 4)]
    assert batches[0] < batches[1] < batches[2]
    stages = [mem(base | {"zero_stage": s}) for s in (0, 1, 2, 3)]
    assert stages[0] > stages[1] > stages[2] > stages[3]  # ZeRO: optimizer, then gradients, then parameters sharded


def test_the_shape_known_study_is_the_products_with_the_formula_calibrated_on_the_golden_peak() -> None:
    model = shaped.draw_model(3)
    study = shaped.shape_known_study(model)
    meta = study.meta
    assert meta is not None and model.study.meta is None
    assert meta.roles["micro_batch"] == "mbs" and meta.roles["zero_stage"] == "zero"
    # the layout reaches the formula: data-parallel = the job's devices / (tp·pp), as the contract states
    devices = model.study.contract.search_space.constraints.global_batch.devices
    assert devices is not None and meta.devices == devices
    static, act = structural_components(meta, study.baseline.knobs)
    # the workspace is what the golden peak leaves beside the formula's terms, floored at a tenth of it
    golden = model.golden_peak_bytes
    assert meta.workspace_bytes == pytest.approx(max(golden - static - act, 0.1 * golden))
    # the truth is not the formula: over the space the two disagree by more than any calibration absorbs
    cands = model.study.space.enumerate()
    ratio = np.log([(sum(structural_components(meta, c.knobs)) + meta.workspace_bytes) / model.memory_of(c.knobs)
                    for c in cands])
    assert np.quantile(np.abs(ratio), 0.75) > 0.1  # a quarter of the space off by more than 10%


def test_robustness_runs_both_shape_arms_side_by_side_and_scores_the_shape_targets(tmp_path, capsys) -> None:
    out = tmp_path / "s.json"
    assert robustness.main(["--family", "shaped", "--models", "1", "--first-model", "3", "--seeds", "1",
                            "--budget", "8", "--tuners", "infrarsi", "random", "--arms", "default",
                            "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["family"] == "bench/shaped_family.py" and data["shape_arms"] == ["none", "known"]
    assert set(data["summary"]) == {"infrarsi[default]", "infrarsi[default+shape]", "random"}
    bins = data["summary"]["infrarsi[default+shape]"]["p_oom_bins"]
    assert sum(n for n, _, _ in bins) == 8
    assert {"shape_median_within_0.01_of_no_shape", "shape_p_oom_calibrated_within_5_points"} <= set(data["targets"])
    with pytest.raises(SystemExit, match="needs --family shaped"):
        robustness.main(["--models", "1", "--shape", "known"])
    with pytest.raises(SystemExit, match="is not --family robust"):
        robustness.main(["--seeds", "1", "--budget", "8", "--merge", str(out)])
    capsys.readouterr()
