"""A deterministic, learnable corpus generated from a seed, laid out by global sequence index.

Every sequence is a pure function of (seed, sequence index): its first two tokens are hashed from the
index, and each next token is drawn (with a hashed uniform) from four candidates — two that depend on the
previous token and two that depend on the token before it. So a model can learn a bigram table fast and
needs attention with positions to learn the skip-gram part; the entropy floor is ≈1.28 nats.

Layout: optimiser step ``s`` trains on global sequences ``[s·G, (s+1)·G)`` (G = global batch). Data-parallel
rank ``r`` of ``W`` takes the ``r``-th contiguous slice of G/W sequences and cuts it into micro-batches in
order. So the tokens of every optimiser step are the same whatever the micro-batch, accumulation or
data-parallel split, and schedule-only knobs leave the loss curve unchanged up to floating-point rounding.
The eval batch is a fixed range of sequences far past any training index.

This module owns data generation only (numpy; torch only for the Dataset wrapper).
"""

from __future__ import annotations

import numpy as np
import torch

EVAL_OFFSET = 1 << 40
"""Eval sequences start here; training never reaches it."""

FLOP_SAMPLE_OFFSET = 1 << 39
"""The one micro-batch the FLOP count runs on (neither training nor eval data)."""

CANDIDATE_PROBS = np.array([0.4, 0.2, 0.3, 0.1])
"""P(next = bigram[prev][0]), bigram[prev][1], skip[prev2][0], skip[prev2][1]."""

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A counter-based hash (splitmix64 finaliser): uniform 64-bit output for each 64-bit input."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class MarkovCorpus:
    """Sequences of ``seq_len + 1`` tokens (inputs and shifted targets) by global index."""

    def __init__(self, seed: int, vocab_size: int, seq_len: int) -> None:
        self.seed = seed
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        rng = np.random.default_rng(seed)
        self.bigram = rng.integers(0, vocab_size, size=(vocab_size, 2))  # (V, 2)
        self.skip = rng.integers(0, vocab_size, size=(vocab_size, 2))  # (V, 2)
        self._cdf = np.cumsum(CANDIDATE_PROBS)
        self._key = np.uint64(seed) * np.uint64(0x100000001B3)

    def _uniform(self, seq_ids: np.ndarray, pos: int) -> np.ndarray:
        h = _splitmix64(_splitmix64(seq_ids ^ self._key) + np.uint64(pos))
        return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))  # [0, 1)

    def sequences(self, start: int, count: int) -> np.ndarray:
        """Global sequences ``[start, start + count)`` as int64 of shape (count, seq_len + 1)."""
        seq_ids = np.arange(start, start + count, dtype=np.uint64)
        out = np.empty((count, self.seq_len + 1), dtype=np.int64)  # (N, T+1)
        for pos in range(2):
            out[:, pos] = (self._uniform(seq_ids, pos) * self.vocab_size).astype(np.int64)
        rows = np.arange(count)
        for pos in range(2, self.seq_len + 1):
            choice = np.searchsorted(self._cdf, self._uniform(seq_ids, pos), side="right")  # (N,) in 0..3
            cands = np.concatenate([self.bigram[out[:, pos - 1]], self.skip[out[:, pos - 2]]], axis=1)  # (N, 4)
            out[:, pos] = cands[rows, np.minimum(choice, 3)]
        return out


class StepBatches(torch.utils.data.Dataset):
    """Item ``i`` = this rank's micro-batches of optimiser step ``first_step + i``: int64 (accum, micro, seq_len + 1).

    ``first_step`` > 0 resumes mid-run from a checkpoint: the data position is the step, so the resumed run
    reads exactly the sequences the uninterrupted one would have."""

    def __init__(
        self, corpus: MarkovCorpus, global_batch: int, rank: int, world_size: int, micro_batch: int, steps: int,
        first_step: int = 0,
    ) -> None:  # fmt: skip
        self.corpus = corpus
        self.global_batch = global_batch
        self.per_rank = global_batch // world_size
        self.rank = rank
        self.micro_batch = micro_batch
        self.steps = steps
        self.first_step = first_step

    def __len__(self) -> int:
        return self.steps - self.first_step

    def __getitem__(self, index: int) -> torch.Tensor:
        step = self.first_step + index
        start = step * self.global_batch + self.rank * self.per_rank
        seqs = self.corpus.sequences(start, self.per_rank)  # (per_rank, T+1)
        return torch.from_numpy(seqs).view(-1, self.micro_batch, self.corpus.seq_len + 1)


HELDOUT_OFFSET = EVAL_OFFSET + (1 << 30)
"""The downstream evaluation's held-out sequences (``evaluate.py``): neither training nor the in-run eval batch."""


def eval_sequences(corpus: MarkovCorpus, eval_batch: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's share of the fixed eval batch: int64 (eval_batch / world, seq_len + 1)."""
    per_rank = eval_batch // world_size
    return torch.from_numpy(corpus.sequences(EVAL_OFFSET + rank * per_rank, per_rank))
