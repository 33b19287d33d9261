"""bench/formula_check.py: the formula as a study with the shape uses it — calibrated on the golden peak."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from infrarsi import events as ev
from infrarsi.study.contract import load_contract
from support.bench_spaces import import_bench_module

formula_check = import_bench_module("formula_check")
WORKLOAD = Path(__file__).resolve().parents[2] / "workloads" / "gpt"
SHAPE = ev.WorkloadShape(parameters=110_000_000, layers=8, hidden=1024, heads=16, seq_len=1024, vocab=512)


def _predict(shape: ev.WorkloadShape = SHAPE) -> dict[str, float]:
    contract = formula_check.device_contract(load_contract(WORKLOAD / "contracts" / "dense-1node.yaml"), "cuda", 80e9)
    launch = yaml.safe_load((WORKLOAD / "launch" / "dense-1node.yaml").read_text())
    return formula_check.predict_peaks(contract, launch, shape, 6e9, formula_check.LAYOUTS)


def test_the_formula_predicts_the_golden_peak_it_was_calibrated_on_and_orders_the_layouts() -> None:
    p = _predict()
    assert p["golden"] == pytest.approx(6e9, rel=1e-6)
    assert p["micro-batch x8"] > p["micro-batch x4"] > p["golden"] > p["full recompute"]
    assert p["micro-batch x8 + full recompute"] < p["micro-batch x8"]
    rows = formula_check.compare({"golden": 6e9, "micro-batch x4": 7e9}, p)
    assert [r.layout for r in rows] == ["golden", "micro-batch x4"] and rows[0].ratio == pytest.approx(1.0)
    assert "micro-batch x4" in formula_check.table(rows)


def test_a_shape_without_what_the_formula_needs_is_refused() -> None:
    with pytest.raises(ValueError, match="shape lacks"):
        _predict(ev.WorkloadShape(parameters=110_000_000))


def test_the_gpu_checks_formula_path_runs_end_to_end_on_a_cpu(tmp_path: Path) -> None:
    """bench/gpu_check.py's formula comparison, run on this CPU with a tiny model (RSS peaks, not CUDA's): the
    jobs run, the probe's shape reaches the formula, every layout gets a row, the golden one at ratio 1."""
    import os

    gpu_check = import_bench_module("gpu_check")
    results: dict[str, object] = {}
    failures: list[str] = []
    tiny = {"model.d_model": 64, "model.n_head": 2, "model.n_layer": 2, "model.mlp_hidden": 128,
            "model.seq_len": 64, "run.eval_batch_size": 4, "run.steps": 2}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("INFRARSI_NATS_URL", None)
    layouts = {k: formula_check.LAYOUTS[k] for k in ("golden", "micro-batch x8", "full recompute")}
    gpu_check.formula_vs_cuda(tmp_path, env, results, failures, device="cpu", model=tiny, capacity_bytes=8 * 2**30,
                              layouts=layouts)
    assert not failures, failures
    rows = {r["layout"]: r for r in results["formula_vs_measured"]}
    assert set(rows) == set(layouts)
    assert rows["golden"]["ratio"] == pytest.approx(1.0, rel=1e-6)
    assert all(r["measured_bytes"] > 0 and r["predicted_bytes"] > 0 for r in rows.values())
