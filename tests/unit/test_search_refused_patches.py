"""A trial refused as ``scope_violation`` is refused for its patches: the searcher never proposes a candidate
holding the same patch set again, whatever its knobs (before, it learnt nothing from a refusal but the key)."""

import math

from infrarsi.modeling.observations import Observation
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.space import Candidate, IntChoice, Patch, SearchSpace

GIB = 2**30
# both patches promise a large speed-up: without the refusal the search keeps proposing them together
SPACE = SearchSpace(knobs=(IntChoice("micro_batch", (1, 2, 4, 8)), IntChoice("lanes", (1, 2, 3, 4))),
                    patches=(Patch("fast-a", time_prior=(-0.3, 0.05)), Patch("fast-b", time_prior=(-0.3, 0.05)),
                             Patch("slow-c", time_prior=(0.1, 0.05))))


def _ok(c: Candidate) -> Observation:
    t = 1.0 / math.sqrt(c["micro_batch"]) * (0.7 if "fast-a" in c.patches else 1.0)
    return Observation(c, "ok", t, 10 * GIB, 30 * t)


def test_no_candidate_holding_a_refused_patch_set_is_proposed_again():
    s = Searcher(SPACE, 80 * GIB, seed=0)
    pair = frozenset({"fast-a", "fast-b"})
    refused: list[frozenset[str]] = []
    for _ in range(16):
        [sug] = s.suggest(1)
        c = sug.candidate
        assert not any(r <= c.patches for r in refused), f"{c} holds a refused patch set"
        if pair <= c.patches:  # the launcher refuses the pair, whatever else the candidate holds
            s.observe(Observation(c, "scope_violation", None, None, 0.1))
            refused.append(c.patches)
        else:
            s.observe(_ok(c))
    assert refused and s._refused == refused and len(refused) <= 2  # the set, then at most the pair alone
    proposed = [o.candidate.patches for o in s.observations]
    assert any("fast-a" in p and "fast-b" not in p for p in proposed)  # each alone is still proposed
    # a refused set blocks its supersets, not its subsets
    mask = s._refused_mask()
    rows = {c.key: i for i, c in enumerate(s.pool.candidates)}
    base = {"micro_batch": 1, "lanes": 1}
    assert mask[rows[Candidate.of(base, frozenset({"fast-a", "fast-b", "slow-c"})).key]]
    assert not mask[rows[Candidate.of(base, frozenset({"fast-a", "slow-c"})).key]]
