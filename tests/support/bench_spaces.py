"""``bench/search_vs_peers.py`` for tests: imported without its environment side effect, and a toy space with no
oracle (``--extra-space support.bench_spaces:toy_space``) whose outcomes are known numbers.

The toy space: micro-batch 1/2/4/8 × impl slow/fast × an optional ``hack`` patch. Step time is
``1 / mb ** 0.25`` (× 0.8 for ``fast``); micro-batch 8 runs out of memory; ``hack`` halves the step time but
breaks an invariant — so the fastest *measured* time is a hack's, and the reference must not be it.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from infrarsi.modeling.pool import CandidatePool
from infrarsi.modeling.space import Candidate, Categorical, IntChoice, Patch, SearchSpace

BENCH = Path(__file__).resolve().parents[2] / "bench"
CAPACITY = 1000.0


def import_bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` as the module ``name`` (bench/ on sys.path, as when it runs as a script). A bench's
    import sets single-threaded BLAS variables for its own process; they are taken back here so jobs that later
    tests start do not inherit them."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    before = {n: os.environ.get(n) for n in names}
    try:
        return importlib.import_module(name)
    finally:
        for env_name, value in before.items():
            if value is None:
                os.environ.pop(env_name, None)
            else:
                os.environ[env_name] = value


def load_bench() -> ModuleType:
    """``bench/search_vs_peers.py`` as the module ``search_vs_peers``."""
    return import_bench_module("search_vs_peers")


TOY_SPACE = SearchSpace(knobs=(IntChoice("mb", (1, 2, 4, 8)), Categorical("impl", ("slow", "fast"))),
                        patches=(Patch("hack"),))


@dataclass(frozen=True)
class ToyOutcome:
    status: str
    step_time_s: float | None
    peak_bytes: float | None
    cost_seconds: float


def toy_time(c: Candidate) -> float:
    """The toy's step time, hack included (as a measurement would report it)."""
    t = 1.0 / float(c["mb"]) ** 0.25 * (0.8 if c["impl"] == "fast" else 1.0)  # type: ignore[arg-type]
    return 0.5 * t if "hack" in c.patches else t


def valid_times() -> set[float]:
    """Every step time a candidate that runs ok (fits, no hack) can measure."""
    return {toy_time(Candidate.of({"mb": mb, "impl": impl})) for mb in (1, 2, 4) for impl in ("slow", "fast")}


def toy_space() -> Any:  # -> search_vs_peers.BenchSpace
    bench = load_bench()

    def evaluate(c: Candidate, _rng: np.random.Generator) -> Any:
        if c["mb"] == 8:
            return ToyOutcome("oom", None, 1.2 * CAPACITY, 1.0)  # the censoring bound
        status = "invariant_violation" if "hack" in c.patches else "ok"
        return ToyOutcome(status, toy_time(c), 100.0 * float(c["mb"]), 2.0)  # type: ignore[arg-type]

    return bench.BenchSpace("toy (toy)", TOY_SPACE, CAPACITY, evaluate, None, None,
                            pool=CandidatePool.build(TOY_SPACE), kind="toy")
