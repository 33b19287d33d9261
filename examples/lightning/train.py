"""Train a small causal language model with PyTorch Lightning on synthetic text, as Lightning's docs write it.

    python train.py --max-steps 30 --batch-size 2 --accumulate-grad-batches 8 --precision 32-true

A ``LightningModule`` (model, ``training_step``, ``validation_step``, ``configure_optimizers``), a
``LightningDataModule`` that generates its data (token streams of a fixed random Markov chain: each token is
followed by one of a few likely successors, so the loss falls from ln(vocab) towards the chain's entropy),
and a ``Trainer`` configured from command-line flags. ``--batch-size × --accumulate-grad-batches`` is the
global batch. Nothing is downloaded.

The one line for InfraRSI is ``callbacks=[InfraRSICallback()]``; run by hand, the callback does nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from infrarsi.probe.integrations.lightning import InfraRSICallback, resume_checkpoint
from torch import nn


class CausalLM(nn.Module):
    """Token + position embeddings, ``n_layer`` pre-norm transformer blocks with a causal mask, a tied head."""

    def __init__(self, vocab_size: int, seq_len: int, d_model: int, n_head: int, n_layer: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        block = nn.TransformerEncoderLayer(
            d_model, n_head, dim_feedforward=4 * d_model, dropout=0.0, activation="gelu", batch_first=True,
            norm_first=True,
        )  # fmt: skip
        self.blocks = nn.TransformerEncoder(block, n_layer, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)
        for emb in (self.tok, self.pos):
            nn.init.normal_(emb.weight, std=0.02)  # GPT-2's init: N(0, 1) embeddings make the tied head's logits huge

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        T = input_ids.shape[1]
        x = self.tok(input_ids) + self.pos(torch.arange(T, device=input_ids.device))  # (B, T, C)
        x = self.blocks(x, mask=self.mask[:T, :T], is_causal=True)  # (B, T, C)
        return self.norm(x) @ self.tok.weight.T  # (B, T, V)


class LanguageModel(pl.LightningModule):
    def __init__(self, vocab_size: int, seq_len: int, d_model: int, n_head: int, n_layer: int, lr: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = CausalLM(vocab_size, seq_len, d_model, n_head, n_layer)

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = self.model(batch["input_ids"])  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch["labels"].reshape(-1))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class MarkovData(pl.LightningDataModule):
    """Training and validation sequences of one random Markov chain, generated in ``setup``."""

    def __init__(self, vocab_size: int, seq_len: int, batch_size: int, train_sequences: int, val_sequences: int,
                 successors: int = 4, num_workers: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.save_hyperparameters()

    def _sequences(self, n: int, seed: int) -> torch.Tensor:
        hp = self.hparams
        language = torch.Generator().manual_seed(1234)
        successors = torch.randint(0, hp.vocab_size, (hp.vocab_size, hp.successors), generator=language)  # (V, k)
        g = torch.Generator().manual_seed(seed)
        choice = torch.randint(0, hp.successors, (n, hp.seq_len + 1), generator=g)  # (N, T+1)
        ids = torch.empty(n, hp.seq_len + 1, dtype=torch.long)
        ids[:, 0] = torch.randint(0, hp.vocab_size, (n,), generator=g)
        for t in range(1, hp.seq_len + 1):
            ids[:, t] = successors[ids[:, t - 1], choice[:, t]]
        return ids  # (N, T+1): inputs are the first T tokens, labels the last T

    def setup(self, stage: str) -> None:
        self.train_ids = self._sequences(self.hparams.train_sequences, seed=1)
        self.val_ids = self._sequences(self.hparams.val_sequences, seed=2)

    def _loader(self, ids: torch.Tensor, loader: type[torch.utils.data.DataLoader]) -> torch.utils.data.DataLoader:
        rows = [{"input_ids": row[:-1], "labels": row[1:]} for row in ids]
        return loader(rows, batch_size=self.hparams.batch_size, shuffle=False, num_workers=self.hparams.num_workers)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return self._loader(self.train_ids, ResumableLoader)

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return self._loader(self.val_ids, torch.utils.data.DataLoader)


class ResumableLoader(torch.utils.data.DataLoader):
    """A loader Lightning can resume mid-epoch: it restores a loader's position from a checkpoint only through
    ``state_dict``/``load_state_dict``, and without them restarts the epoch's data from its first batch (a
    resumed run then trains on other sequences than the interrupted one would have). The state is the number
    of batches the training loop has taken this epoch; a resumed iteration skips that many."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._taken = 0
        self._skip = 0

    def __iter__(self) -> Iterator[Any]:
        skip, self._skip = self._skip, 0
        self._taken = skip
        for i, batch in enumerate(super().__iter__()):
            if i >= skip:
                self._taken += 1
                yield batch

    def state_dict(self) -> dict[str, int]:
        return {"batches_taken": self._taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._skip = state["batches_taken"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-steps", type=int, default=30, help="optimiser steps")
    parser.add_argument("--batch-size", type=int, default=2, help="sequences per micro-batch")
    parser.add_argument("--accumulate-grad-batches", type=int, default=8, help="micro-batches per optimiser step")
    parser.add_argument("--precision", default="32-true", help="Lightning precision: 32-true, bf16-mixed, ...")
    parser.add_argument("--val-check-interval", type=int, default=10, help="validate every N optimiser steps")
    parser.add_argument("--num-workers", type=int, default=0, help="data-loader worker processes")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--vocab-size", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per training sequence")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--val-sequences", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pl.seed_everything(args.seed, verbose=False)
    model = LanguageModel(args.vocab_size, args.seq_len, args.d_model, args.n_head, args.n_layer, args.lr)
    data = MarkovData(
        args.vocab_size, args.seq_len, args.batch_size,
        train_sequences=args.max_steps * args.batch_size * args.accumulate_grad_batches,
        val_sequences=args.val_sequences, num_workers=args.num_workers,
    )  # fmt: skip
    trainer = pl.Trainer(
        max_steps=args.max_steps,
        accumulate_grad_batches=args.accumulate_grad_batches,
        precision=args.precision,
        val_check_interval=args.val_check_interval * args.accumulate_grad_batches,  # counted in batches
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[InfraRSICallback()],
    )
    trainer.fit(model, datamodule=data, ckpt_path=resume_checkpoint())  # None unless verify resumes mid-way
    return 0


if __name__ == "__main__":
    sys.exit(main())
