"""What several benchmarks share: the simulator scenarios' candidate pools (cached per process) and writing a
result as JSON. Nothing here measures anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infrarsi.modeling.search import CandidatePool
from infrarsi.modeling.space import SearchSpace
from infrarsi.sim.scenarios import get_scenario

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
