"""``CandidatePool``: the candidates a searcher scores, with their encoded features, built once per space and
shared across searchers (benchmarks, replays).
"""


from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from infrarsi.modeling.memory_model import TransformerMeta, structural_components
from infrarsi.modeling.space import (
    Candidate,
    FeatureEncoder,
    SearchSpace,
)


@dataclass
class CandidatePool:
    """Candidates the searcher scores, with encoded features; build once per space and share across
    Searchers (benchmarks, replays)."""

    space: SearchSpace
    candidates: list[Candidate]
    x_time: np.ndarray
    x_main: np.ndarray
    index: dict[str, int]
    encoder: FeatureEncoder
    meta: TransformerMeta | None = None
    mem_components: np.ndarray | None = None
    """(N, 2) structural (static, activation) bytes when the workload shape is known."""
    codes: np.ndarray | None = None
    """(N, knobs + patches) value codes: Hamming distance between candidates."""
    complete: bool = False
    """True when the pool is the whole (finite) space."""

    @staticmethod
    def build(space: SearchSpace, meta: TransformerMeta | None = None, seed: int = 0,
              max_pool: int = 200_000, sample: int = 4000) -> CandidatePool:
        if space.is_finite and space.size_upper_bound() <= 4 * max_pool:
            cands = space.enumerate(limit=max_pool)
        else:
            cands = space.sample(sample, np.random.default_rng(seed))
        enc = FeatureEncoder(space)
        pool = CandidatePool(space, [], np.zeros((0, enc.dim)), np.zeros((0, enc.n_main)), {}, enc, meta)
        pool.complete = space.is_finite and space.size_upper_bound() <= 4 * max_pool
        pool.extend(cands)
        return pool

    def extend(self, cands: Iterable[Candidate]) -> list[int]:
        """Add candidates not yet in the pool; pool indices of all given candidates."""
        cands = list(cands)
        new = list({c.key: c for c in cands if c.key not in self.index}.values())
        if new:
            x = self.encoder.encode_many(new)
            start = len(self.candidates)
            self.candidates.extend(new)
            self.x_time = np.vstack([self.x_time, x])
            self.x_main = np.vstack([self.x_main, x[:, : self.encoder.n_main]])
            for i, c in enumerate(new):
                self.index[c.key] = start + i
            codes = np.array([self._code(c) for c in new], dtype=float)
            self.codes = codes if self.codes is None else np.vstack([self.codes, codes])
            if self.meta is not None:
                comps = np.array([structural_components(self.meta, c.knobs) for c in new])  # (n_new, 2)
                self.mem_components = comps if self.mem_components is None else np.vstack([self.mem_components,
                                                                                           comps])
        return [self.index[c.key] for c in cands]

    def _code(self, c: Candidate) -> list[float]:
        row: list[float] = []
        for k in self.space.knobs:
            v = c[k.name]
            vals = k.values()
            row.append(float(vals.index(v)) if vals is not None else float(v))
        return row + [float(p.id in c.patches) for p in self.space.patches]

    def neighbour_indices(self, i: int, max_changes: int = 2) -> np.ndarray:
        """Pool rows within ``max_changes`` knob/patch changes of row i (i excluded)."""
        if not self.complete:
            return np.array(self.extend(self.space.neighbours(self.candidates[i], two_step=max_changes >= 2)),
                            dtype=int)
        assert self.codes is not None
        d = (self.codes != self.codes[i]).sum(axis=1)
        return np.flatnonzero((d > 0) & (d <= max_changes))
