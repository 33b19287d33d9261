"""Train a small causal language model with a plain PyTorch loop, launched by torchrun, configured by flags.

    torchrun --standalone --nproc-per-node 1 train.py --max_steps 30 --batch_size 4 --grad_accum 4

Written the way such scripts usually are: ``argparse`` flags, a hand-written loop, one ``print`` of the
loss per optimiser step (``step 0 | loss 5.5452 | 812.3 ms``), ``DistributedDataParallel`` when torchrun
starts more than one process. Nothing of InfraRSI is imported: a study of this job measures it coarsely,
from outside (wall time, exit status, process-tree memory, and the steps counted in that log line by the
contract's ``step_regex``). The data is generated here, not downloaded: token streams from a fixed random
Markov chain whose next token is one of a few likely successors, so the loss falls from ln(vocab) towards
the chain's entropy and every run draws the same sequences. ``--batch_size × --grad_accum × world size``
is the global batch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max_steps", type=int, default=100, help="optimiser steps")
    p.add_argument("--batch_size", type=int, default=4, help="sequences per micro-batch, per process")
    p.add_argument("--grad_accum", type=int, default=4, help="micro-batches per optimiser step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bf16", type=int, default=0, help="1: autocast the forward pass to bfloat16")
    p.add_argument("--attention", choices=["manual", "sdpa"], default="manual", help="attention implementation")
    p.add_argument("--fused_adam", type=int, default=0, help="1: AdamW(fused=True)")
    p.add_argument("--num_workers", type=int, default=0, help="data-loader worker processes")
    p.add_argument("--d_model", type=int, default=128)
    p.add_argument("--n_layer", type=int, default=2)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--vocab_size", type=int, default=256)
    p.add_argument("--seq_len", type=int, default=64)
    return p.parse_args()


class MarkovText(torch.utils.data.Dataset):
    """``n`` sequences of a random Markov chain over the vocabulary, drawn once from ``seed``."""

    def __init__(self, vocab_size: int, seq_len: int, n: int, seed: int, successors: int = 4) -> None:
        language = torch.Generator().manual_seed(1234)
        table = torch.randint(0, vocab_size, (vocab_size, successors), generator=language)
        g = torch.Generator().manual_seed(seed)
        choice = torch.randint(0, successors, (n, seq_len), generator=g)  # (N, T)
        ids = torch.empty(n, seq_len, dtype=torch.long)
        ids[:, 0] = torch.randint(0, vocab_size, (n,), generator=g)
        for t in range(1, seq_len):
            ids[:, t] = table[ids[:, t - 1], choice[:, t]]
        self.ids = ids  # (N, T)

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.ids[i]


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, attention: str) -> None:
        super().__init__()
        self.n_head, self.attention = n_head, attention
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / (k.shape[-1] ** 0.5)  # (B, H, T, T)
            att = att.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            y = att.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attend(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CausalLM(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.tok = nn.Embedding(args.vocab_size, args.d_model)
        self.pos = nn.Embedding(args.seq_len, args.d_model)
        self.blocks = nn.ModuleList(Block(args.d_model, args.n_head, args.attention) for _ in range(args.n_layer))
        self.norm = nn.LayerNorm(args.d_model)
        for emb in (self.tok, self.pos):
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.tok.weight.T  # (B, T, V)


def main() -> int:
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(args.seed)

    model: nn.Module = CausalLM(args)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=bool(args.fused_adam) or None)
    data = MarkovText(args.vocab_size, args.seq_len, n=4096, seed=1)
    sampler = torch.utils.data.DistributedSampler(data, world, rank, seed=args.seed) if world > 1 else None
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, sampler=sampler,
                                         shuffle=sampler is None, num_workers=args.num_workers, drop_last=True,
                                         generator=torch.Generator().manual_seed(args.seed))  # fmt: skip
    batches = iter(loader)

    def next_batch() -> torch.Tensor:
        nonlocal batches
        try:
            return next(batches)
        except StopIteration:
            batches = iter(loader)
            return next(batches)

    for step in range(args.max_steps):
        t0 = time.perf_counter()
        total = 0.0
        for micro in range(args.grad_accum):
            ids = next_batch()  # (B, T)
            last = micro == args.grad_accum - 1
            no_sync = model.no_sync() if world > 1 and not last else contextlib.nullcontext()  # all-reduce once
            with no_sync, torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(args.bf16)):
                logits = model(ids[:, :-1])  # (B, T-1, V)
                loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
            (loss / args.grad_accum).backward()
            total += loss.item() / args.grad_accum
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"step {step} | loss {total:.4f} | {1000 * (time.perf_counter() - t0):.1f} ms", flush=True)

    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
