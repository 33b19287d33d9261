"""A toy plain-PyTorch training job for tests that need a real training process with its knobs as argparse flags:
a seeded two-layer MLP fitting y = 2·x₀ on 512 random samples with SGD, one thread.

``toy_job_script(flags, body)`` writes its ``train.py``: ``--batch_size`` (16) and ``--max_steps`` (100) plus
``flags``; the script defines ``args``, ``model``, ``opt`` and ``sgd_step(i)`` (one optimiser step on the i-th
batch, returning the loss), then runs ``body``: the loop, plain or through an integration. ``TRACKED_LOOP`` is
that loop through the probe's ``track`` decorator (import ``TRACK_IMPORT`` with it).
"""

from __future__ import annotations

import textwrap

_SETUP = """
p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=16)
p.add_argument("--max_steps", type=int, default=100)
{flags}args = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
hidden = getattr(args, "hidden", 64)
model = torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(512, 32)
y = x[:, :1] * 2.0


def sgd_step(i):
    b = (i * args.batch_size) % 512
    loss = torch.nn.functional.mse_loss(model(x[b : b + args.batch_size]), y[b : b + args.batch_size])
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss

"""


TRACK_IMPORT = "from infrarsi.probe.integrations.torch import track"
TRACKED_LOOP = """
with track(model, opt) as tracked:

    @tracked.step
    def train_step(i):
        return sgd_step(i)

    for i in range(args.max_steps):
        train_step(i)
"""


def toy_job_script(*, flags: dict[str, int], body: str, imports: str = "") -> str:
    """The job's ``train.py``: ``flags`` are further integer flags (name → default; ``hidden`` sets the MLP's
    width, 64 without it), ``imports`` further import lines, ``body`` the training loop (dedented)."""
    flag_lines = "".join(f'p.add_argument("--{name}", type=int, default={default})\n' for name, default in flags.items())
    head = "import argparse\nimport torch\n" + (imports.strip() + "\n" if imports else "")
    return head + _SETUP.format(flags=flag_lines) + textwrap.dedent(body).lstrip("\n")
