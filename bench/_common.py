"""What several benchmarks share: the space a tuner is benchmarked on (``BenchSpace``: simulated, shaped or
real), the simulator scenarios' candidate pools (cached per process) and writing a result as JSON. Nothing here
measures anything."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from infrarsi.modeling.memory_model import MemoryModel, TransformerMeta
from infrarsi.modeling.pool import CandidatePool
from infrarsi.modeling.priors import KnowledgeBase
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import Candidate, SearchSpace
from infrarsi.sim.scenarios import get_scenario


class Outcome(Protocol):
    status: str
    step_time_s: float | None
    peak_bytes: float | None
    cost_seconds: float


@dataclass
class BenchSpace:
    name: str
    space: SearchSpace
    capacity_bytes: float
    evaluate: Callable[[Candidate, np.random.Generator], Outcome]
    true_time: Callable[[Candidate], float] | None
    """Noise-free step time; None for a real space (then the measured time stands in)."""
    oracle_time: float | None
    meta: TransformerMeta | None = None
    pool: CandidatePool | None = None
    kind: str = "simulator"
    """How trials are measured, as the table labels it: ``simulator`` (infrarsi.sim) or ``real, CPU``."""
    kb: KnowledgeBase | None = None
    """The knowledge base InfraRSI's study would use (a real space: the contract's device kind)."""
    baseline: Candidate | None = None
    """The golden baseline, where the space has one (a real space: the launch file)."""
    info: Callable[[], dict[str, Any]] | None = None
    """Facts about the space for the JSON, read after every tuner ran (a real space: trials run, cache hits)."""
    close: Callable[[], None] | None = None
    """Releases what the space holds (a real space: its temporary workload repo and trial directories)."""
    search_config: SearchConfig | None = None
    """InfraRSI's ``SearchConfig`` (None: the defaults); bench/robustness.py's ``--search-config`` sets it."""
    memory_model: Callable[[Searcher], MemoryModel] | None = None
    """Replaces the Searcher's memory model (bench/robustness.py's ``--memory-oracle`` reference arms)."""
    doctor_runs: int = 0
    """Measured runs of the golden baseline every tuner is told before its first trial (``doctor_baseline``):
    what the doctor stage measures before a study's search, which the product's proposer observes. Not trials
    of the budget, not scored (bench/robustness.py ``--doctor-baseline N``)."""
    noise_floor: float | None = None
    """InfraRSI's noise floor, σ of log step time, as a study's doctor would report it (``None``: the Searcher's
    default, 0.03); bench/noise.py sets it from the doctor's runs of the baseline."""

    @property
    def has_oracle(self) -> bool:
        """A known optimum and noise-free times (a simulator space); else scored against a measured reference."""
        return self.true_time is not None and self.oracle_time is not None


_POOLS: dict[tuple, CandidatePool] = {}


def pool_for(name: str, space: SearchSpace) -> CandidatePool:
    """One candidate pool per (scenario, patch priors) and process: a pool's encoder reads its space's patches,
    so a space with other patch priors needs its own pool."""
    key = (name, tuple((p.id, p.time_prior, p.memory_prior) for p in space.patches))
    if key not in _POOLS:
        _POOLS[key] = CandidatePool.build(space, get_scenario(name).memory_meta())
    return _POOLS[key]


def write_json(path: str | Path | None, result: Any, **dump: Any) -> None:
    """``result`` as indented JSON at ``path``; nothing when no ``--json`` was given."""
    if path:
        Path(path).write_text(json.dumps(result, indent=2, **dump))
