"""A small space with knob names no knowledge base knows and a peak that is a sum of terms (sharded states
beside batch-sized activations and a reserve): the memory models must learn it from measured peaks."""

from __future__ import annotations

import itertools

from infrarsi.modeling.space import Candidate, Categorical, IntChoice, SearchSpace

GB = 1e9
CAP = 40 * GB
SPACE = SearchSpace(knobs=(IntChoice("rows_per_slice", (1, 2, 4, 8, 16)), IntChoice("split_ways", (1, 2, 4, 8)),
                           Categorical("mode", ("a", "b", "c"))))
ALL = [Candidate.of({"rows_per_slice": b, "split_ways": s, "mode": m})
       for b, s, m in itertools.product((1, 2, 4, 8, 16), (1, 2, 4, 8), ("a", "b", "c"))]


def peak(c: Candidate) -> float:
    """States split by sharding, activations growing with the batch, a reserve ("mode" changes nothing)."""
    return 36 * GB / c["split_ways"] ** 0.9 + 2.5 * GB * c["rows_per_slice"] + 2 * GB
