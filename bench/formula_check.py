"""The structural memory formula against measured peaks: what a study that knows the workload's shape predicts
for a few layouts of the reference job, next to what the device measured.

A real study on a GPU gets the model's shape from the probe with its first baseline (``TrialMeasured.shape``)
and from then on predicts peaks with the structural formula calibrated on that baseline's peak
(``StudySpace.with_shape``, ``study.shape.study_meta``). ``predict_peaks`` does exactly that — the study's own
``build_searcher`` after the shape is adopted — so the comparison measures the formula as the search uses it.
``bench/gpu_check.py`` measures the peaks on a CUDA device and calls it; nothing here needs a device.

    rows = compare(measured_peaks, predict_peaks(contract, launch, shape, baseline_peak, capacity, layouts))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infrarsi import events as ev
from infrarsi.study.contract import Contract
from infrarsi.study.model import build_searcher
from infrarsi.study.space import StudySpace

LAYOUTS: dict[str, dict[str, Any]] = {
    "golden": {},
    "micro-batch x4": {"knobs.micro_batch_size": 16},
    "micro-batch x8": {"knobs.micro_batch_size": 32},
    "full recompute": {"knobs.activation_checkpointing": "full"},
    "selective recompute": {"knobs.activation_checkpointing": "selective"},
    "micro-batch x8 + full recompute": {"knobs.micro_batch_size": 32, "knobs.activation_checkpointing": "full"},
    "bf16 autocast": {"knobs.autocast_dtype": "bfloat16"},
    "micro-batch x8 + bf16": {"knobs.micro_batch_size": 32, "knobs.autocast_dtype": "bfloat16"},
}
"""Launch-key overrides of the golden ``dense-1node`` launch file (micro-batch 4): the knobs the formula has a
role for (micro-batch, recomputation) alone and paired, and one it has none for (autocast: the learned model's)."""


@dataclass(frozen=True)
class Row:
    layout: str
    measured_bytes: float
    predicted_bytes: float

    @property
    def ratio(self) -> float:
        """Predicted / measured: above 1 the formula overestimates (a fitting layout looks like an OOM)."""
        return self.predicted_bytes / self.measured_bytes


def device_contract(contract: Contract, accelerator: str, capacity_bytes: float) -> Contract:
    """``contract`` on a device of ``capacity_bytes``: the formula applies there without a stated shape."""
    cluster = contract.cluster.model_copy(update={"accelerator": accelerator,
                                                  "memory_capacity_bytes": int(capacity_bytes)})
    return contract.model_copy(update={"cluster": cluster})


def predict_peaks(contract: Contract, launch: Mapping[str, Any], shape: ev.WorkloadShape, baseline_peak_bytes: float,
                  layouts: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Layout → the peak a study of ``contract`` predicts once its baseline (``launch``'s knobs) measured
    ``baseline_peak_bytes`` with ``shape``: the study's searcher, built as the proposer builds it."""
    study = StudySpace.from_contract(contract, baseline_launch=launch)
    study = study.with_shape(shape, baseline_peak_bytes=baseline_peak_bytes)
    if study.meta is None:
        raise ValueError("the shape lacks a field the formula needs (layers, hidden, heads, seq_len, vocab, parameters)")
    searcher = build_searcher(study, "formula-check")
    candidates = [study.from_event(ev.Candidate(knobs=dict(overrides))) for overrides in layouts.values()]
    return {name: math.exp(p.log_peak_bytes) for name, p in zip(layouts, searcher.predict(candidates), strict=True)}


def compare(measured: Mapping[str, float], predicted: Mapping[str, float]) -> list[Row]:
    return [Row(name, measured[name], predicted[name]) for name in measured if name in predicted]


def table(rows: Sequence[Row]) -> str:
    lines = [f"{'layout':34s} {'measured':>10s} {'formula':>10s} {'ratio':>7s}"]
    for r in rows:
        lines.append(f"{r.layout:34s} {r.measured_bytes / 2**30:9.2f}G {r.predicted_bytes / 2**30:9.2f}G {r.ratio:7.3f}")
    return "\n".join(lines)
