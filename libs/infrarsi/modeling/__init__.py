"""Pure-math modeling core: search space, priors, time and censored memory models, acquisition, Searcher.

No I/O here; the proposer/modeler services wrap `Searcher` and feed it observations replayed from the event log.
"""

from infrarsi.modeling.memory_model import MemoryModel, TransformerMeta
from infrarsi.modeling.observations import Observation, Prediction, Suggestion
from infrarsi.modeling.pool import CandidatePool
from infrarsi.modeling.priors import KnowledgeBase, default_knowledge_base
from infrarsi.modeling.search import Searcher
from infrarsi.modeling.search_config import SearchConfig
from infrarsi.modeling.space import (
    BoolKnob,
    Candidate,
    Categorical,
    Constraint,
    FeatureEncoder,
    FloatRange,
    IntChoice,
    IntRange,
    Patch,
    SearchSpace,
)
from infrarsi.modeling.time_model import FeatureEffect, TimeModel

__all__ = [
    "BoolKnob", "Candidate", "CandidatePool", "Categorical", "Constraint", "FeatureEffect", "FeatureEncoder",
    "FloatRange", "IntChoice", "IntRange", "KnowledgeBase", "MemoryModel", "Observation", "Patch", "Prediction", "SearchConfig",
    "SearchSpace", "Searcher", "Suggestion", "TimeModel", "TransformerMeta", "default_knowledge_base",
]
