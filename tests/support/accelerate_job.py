"""A training repository run with Hugging Face Accelerate's launcher, the way Accelerate's documentation
writes one (issue 35, item 5): ``accelerate launch [--cpu --num_processes 1] train.py --flags``, the script
building an ``Accelerator(gradient_accumulation_steps=…, mixed_precision=…)``, wrapping model, optimiser and
loader with ``accelerator.prepare``, accumulating with ``accelerator.accumulate`` and printing through
``accelerator.print``. Nothing of InfraRSI in it; Accelerate is the project's pinned ``accelerate`` (the
``dev`` extra).

``make_accelerate_repo(path)`` writes and commits the repository and writes its token file
``data/tokens.npy`` (ignored by ``.gitignore``, as prepared data is). ``GOLDEN_COMMAND`` is how its README
would start it on a CPU: four micro-batches of 2 per optimiser step, so a larger micro-batch is a real
speed-up for the search to find.
"""

from __future__ import annotations

from pathlib import Path

from support.user_jobs import make_job_repo

TRAIN = '''\
import argparse
import time

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

p = argparse.ArgumentParser()
p.add_argument("--per_device_train_batch_size", type=int, default=8)
p.add_argument("--gradient_accumulation_steps", type=int, default=1)
p.add_argument("--mixed_precision", choices=["no", "bf16"], default="no")
p.add_argument("--max_steps", type=int, default=100)
p.add_argument("--learning_rate", type=float, default=1e-2)
p.add_argument("--seq_len", type=int, default=16)
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()

accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps,
                          mixed_precision=args.mixed_precision)
set_seed(args.seed)
torch.set_num_threads(1)
tokens = torch.from_numpy(np.load("data/tokens.npy").astype(np.int64))
windows = tokens[: len(tokens) // (args.seq_len + 1) * (args.seq_len + 1)].view(-1, args.seq_len + 1)
loader = torch.utils.data.DataLoader(windows, batch_size=args.per_device_train_batch_size, shuffle=True,
                                     generator=torch.Generator().manual_seed(args.seed))
vocab = 64
model = torch.nn.Sequential(torch.nn.Embedding(vocab, 64), torch.nn.Linear(64, vocab))
optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

step, t0, total = 0, time.time(), 0.0
while step < args.max_steps:
    for batch in loader:
        with accelerator.accumulate(model):
            logits = model(batch[:, :-1])  # (B, T, vocab)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            total += loss.item() / args.gradient_accumulation_steps
        if accelerator.sync_gradients:
            time.sleep(0.01)  # a step long enough for the launcher's clock to resolve
            t1 = time.time()
            accelerator.print(f"step {step} | loss {total:.4f} | {(t1 - t0) * 1000:.1f} ms")
            step, t0, total = step + 1, t1, 0.0
            if step >= args.max_steps:
                break
'''

PREPARE = '''\
import os

import numpy as np

os.makedirs("data", exist_ok=True)
rng = np.random.default_rng(0)
np.save(os.path.join("data", "tokens.npy"), ((np.arange(40000) * 5 + rng.integers(0, 3, 40000)) % 64).astype(np.uint16))
'''

GOLDEN_COMMAND = [
    "OMP_NUM_THREADS=1", "accelerate", "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
    "--dynamo_backend", "no", "train.py", "--per_device_train_batch_size", "2",
    "--gradient_accumulation_steps", "4", "--mixed_precision", "no", "--max_steps", "100",
]  # fmt: skip


def make_accelerate_repo(path: Path) -> Path:
    """The repository at ``path`` (created), committed, with its data prepared but not committed."""
    return make_job_repo(path, {"train.py": TRAIN, "prepare.py": PREPARE}, "an Accelerate training script")
