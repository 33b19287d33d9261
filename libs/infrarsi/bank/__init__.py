"""The experience bank: distilled, transferable lessons of finished studies, shared across clusters.

- ``distil``       StudyFacts → BankEntry (the reporter publishes it with ``bank_event``)
- ``similarity``   how much an entry's metadata resembles a new study's; ``explain_seeds`` for ``infrarsi init``
- ``transfer``     bank entries → per-feature priors (source "bank") and initial candidates (origin "bank")
- ``adapt``        glue to the modeling package: knowledge-base priors per feature, winners mapped into a space
- ``federation``   hub/leaf JetStream sourcing streams, server config fragments, reading local ∪ shared
- ``store``        the DuckDB ``bank`` table (replay projection), export/import JSONL/Parquet

See docs/bank.md.
"""

from infrarsi.bank.distil import StudyFacts, TrialFact, bank_event, distil, entry_id_for, meta_from_cluster
from infrarsi.bank.federation import (
    HUB_STREAM,
    SHARED_STREAM,
    ensure_bank_federation,
    read_bank_entries,
    server_config_fragment,
)
from infrarsi.bank.similarity import explain_seeds, generation_of, similarity, similarity_terms
from infrarsi.bank.transfer import BankPriors, BankSeed, FeaturePrior, TransferConfig, bank_priors, bank_seeds

__all__ = [
    "HUB_STREAM",
    "SHARED_STREAM",
    "BankPriors",
    "BankSeed",
    "FeaturePrior",
    "StudyFacts",
    "TransferConfig",
    "TrialFact",
    "bank_event",
    "bank_priors",
    "bank_seeds",
    "distil",
    "ensure_bank_federation",
    "entry_id_for",
    "explain_seeds",
    "generation_of",
    "meta_from_cluster",
    "read_bank_entries",
    "server_config_fragment",
    "similarity",
    "similarity_terms",
]
