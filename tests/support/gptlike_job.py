"""A training repository written the way the popular single-file GPT scripts are (issue 35), for tests of
"any training script as its authors wrote it": nothing of InfraRSI in it.

``make_gptlike_repo(path)`` writes and commits a git repository with

- ``train.py``: configuration as module globals, overridden first by a config file given as a positional
  argument, then by ``--key=value`` flags read as Python literals (``--compile=False``), the way nanoGPT's
  ``configurator.py`` does; a real PyTorch bigram model trained on ``data/tiny/train.bin`` for
  ``max_iters + 1`` iterations (the loop runs ``iter 0`` … ``iter max_iters``), printing
  ``iter N: loss X, time Y.YYms`` per iteration and ``step N: train loss X, val loss Y`` at each eval;
- ``config/train_tiny.py``: the config file;
- ``prepare.py``: writes the dataset ``data/tiny/{train,val}.bin``, which ``.gitignore`` excludes — as the
  real scripts' data preparation does. ``make_gptlike_repo`` runs it (the data is there, untracked).

``GOLDEN_COMMAND`` is how the script's README would run it (on a CPU, tiny).
"""

from __future__ import annotations

from pathlib import Path

from support.user_jobs import make_job_repo

TRAIN = '''\
import ast
import os
import sys
import time

import numpy as np
import torch

# -- defaults, overridden by a config file (positional) then by --key=value (Python literals)
batch_size = 8
block_size = 16
gradient_accumulation_steps = 1
max_iters = 100
eval_interval = 4
eval_iters = 2
learning_rate = 1e-2
compile = False
device = "cpu"
seed = 1337
for arg in sys.argv[1:]:
    if not arg.startswith("--"):
        exec(open(arg).read())
    else:
        key, val = arg[2:].split("=", 1)
        assert key in globals(), f"unknown config key {key}"
        try:
            val = ast.literal_eval(val)
        except (SyntaxError, ValueError):
            pass
        globals()[key] = val
assert isinstance(compile, bool), f"compile must be a bool, got {compile!r}"

torch.manual_seed(seed)
torch.set_num_threads(1)
train = np.memmap(os.path.join("data", "tiny", "train.bin"), dtype=np.uint16, mode="r")
val = np.memmap(os.path.join("data", "tiny", "val.bin"), dtype=np.uint16, mode="r")
vocab = 64
gen = torch.Generator().manual_seed(seed)


eval_gen = torch.Generator().manual_seed(seed + 1)  # evaluation draws apart: they do not move training's data


def get_batch(split, ix=None):
    data = train if split == "train" else val
    if ix is None:  # an evaluation batch: a fixed size, so the micro-batch does not change what is evaluated
        ix = torch.randint(len(data) - block_size - 1, (8,), generator=eval_gen)
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


class Bigram(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 64)
        self.head = torch.nn.Linear(64, vocab)

    def forward(self, x, y):
        logits = self.head(self.emb(x))  # (B, T, vocab)
        return torch.nn.functional.cross_entropy(logits.view(-1, vocab), y.view(-1))


model = Bigram()
if compile:
    model = torch.compile(model)
opt = torch.optim.AdamW(model.parameters(), lr=learning_rate)


@torch.no_grad()
def estimate():
    out = {}
    for split in ("train", "val"):
        out[split] = sum(model(*get_batch(split)).item() for _ in range(eval_iters)) / eval_iters
    return out


t0 = time.time()
for it in range(max_iters + 1):
    if it % eval_interval == 0:
        losses = estimate()
        print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    total = 0.0
    # one draw of the step's whole batch, cut into micro-batches: accumulation does not change the data
    step_ix = torch.randint(len(train) - block_size - 1, (batch_size * gradient_accumulation_steps,), generator=gen)
    for micro in range(gradient_accumulation_steps):
        loss = model(*get_batch("train", step_ix[micro * batch_size : (micro + 1) * batch_size])) / gradient_accumulation_steps
        loss.backward()
        total += loss.item()
    opt.step()
    opt.zero_grad(set_to_none=True)
    time.sleep(0.04)  # a step long enough for the launcher's clock to resolve
    t1 = time.time()
    dt, t0 = t1 - t0, t1
    print(f"iter {it}: loss {total:.4f}, time {dt * 1000:.2f}ms")
'''

CONFIG = '''\
# tiny character-level run
batch_size = 8
block_size = 16
eval_interval = 4
'''

PREPARE = '''\
import os

import numpy as np

rng = np.random.default_rng(0)
os.makedirs(os.path.join("data", "tiny"), exist_ok=True)
text = (np.arange(20000) * 7 + rng.integers(0, 3, 20000)) % 64  # a learnable sequence with a little noise
text.astype(np.uint16)[:18000].tofile(os.path.join("data", "tiny", "train.bin"))
text.astype(np.uint16)[18000:].tofile(os.path.join("data", "tiny", "val.bin"))
'''

GOLDEN_COMMAND = [
    "python", "train.py", "config/train_tiny.py", "--device=cpu", "--compile=False", "--batch_size=8",
    "--gradient_accumulation_steps=1", "--max_iters=2000", "--learning_rate=1e-2",
]  # fmt: skip


def make_gptlike_repo(path: Path) -> Path:
    """The repository at ``path`` (created), committed, with its data prepared but not committed."""
    files = {"train.py": TRAIN, "prepare.py": PREPARE, "config/train_tiny.py": CONFIG}
    return make_job_repo(path, files, "a GPT-style training script")
