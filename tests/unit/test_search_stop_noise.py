"""The stop's threshold is a fraction of the run-to-run noise, not of the time model's fitted noise
(``SearchConfig.stop_noise``): a fitted std that holds the model's misfit would stop the search sooner the more
wrong its model is."""

from __future__ import annotations

import math
import zlib

import numpy as np
from infrarsi.modeling.observations import Observation
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import Candidate, Categorical, IntChoice, SearchSpace

SPACE = SearchSpace(knobs=(IntChoice("micro_batch", (1, 2, 4, 8)), IntChoice("workers", (1, 2, 4, 8)),
                           Categorical("kernel", ("a", "b", "c"))))


def step_time(c: Candidate) -> float:
    """A ragged surface, noise-free: each setting its own factor (15% spread) that no smooth model fits."""
    rng = np.random.default_rng(zlib.crc32(repr(sorted(c.knobs.items())).encode()))
    return math.exp(0.15 * rng.standard_normal())


def measured(config: SearchConfig) -> Searcher:
    """30 of the 48 settings measured on a host whose run-to-run noise is 1%."""
    cands = SPACE.enumerate()
    s = Searcher(SPACE, 1e12, seed=0, noise_floor=0.01, config=config)
    for i in np.random.default_rng(3).permutation(len(cands))[:30]:
        s.observe(Observation(cands[i], "ok", step_time(cands[i]), 1e9, 10.0))
    return s


def test_a_misfit_model_does_not_stop_while_its_gain_is_above_the_run_to_run_noise() -> None:
    on, off = measured(SearchConfig(confirm_repeats=1)), measured(SearchConfig(confirm_repeats=1, stop_noise="fitted"))
    ei, fitted = on.max_expected_improvement(), on.time_model.noise_std
    # the fitted std is the misfit (about 8%), eight times the host's noise; the gain left lies between the two
    assert fitted > 5 * on.time_model.noise_floor and 0.05 * 0.01 < ei < 0.05 * fitted, (ei, fitted)
    unmeasured = {c.key for c in SPACE.enumerate()} - {o.candidate.key for o in on.observations}
    best_measured = min(o.step_time_s or math.inf for o in on.observations)
    assert min(step_time(c) for c in SPACE.enumerate() if c.key in unmeasured) < best_measured  # gain is left
    assert off.should_stop()[0]  # against the fitted std the search would stop here
    stop, why = on.should_stop()
    assert not stop, why
