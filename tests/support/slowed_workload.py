"""A tiny real PyTorch training job slowed on purpose for one knob value, as a workload repo with a contract.

The job trains a small next-token model (embedding + linear, CPU, one thread) on fixed random tokens (an eval
every 5 steps) with the real probe (``Probe.from_env``: steps published live on the bus and written to the probe file). Two knobs
change how long a step takes and nothing of what it computes: ``knobs.autocast_dtype`` (``float32`` |
``bfloat16``; the math stays in float32 — only the sleep depends on it) and ``knobs.dataloader_workers``
(0, 1, 2, 4). Each step sleeps ``run.step_s`` × the workers' factor × (``run.bf16_factor`` for ``bfloat16``):
with ``bf16_factor`` 10 the built-in prior (bf16 faster) is 10× wrong — the trap; with 0.8 it is right.

Used by the stop-as-slow integration test, the real-job trap study (``tests/e2e/test_slow_trap.py``) and
``bench/slow_trap.py``. Nothing here is a mock: the launcher runs the job as a subprocess in a git worktree.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import yaml

JOB = textwrap.dedent(
    """
    import sys, time
    import torch, yaml
    from infrarsi.probe import Probe

    launch = yaml.safe_load(open(sys.argv[1]))
    knobs, run = launch["knobs"], launch["run"]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    vocab, seq, batch = 64, 16, 8
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, vocab))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.randint(0, vocab, (run["steps"], batch, seq + 1), generator=torch.Generator().manual_seed(1))
    held = torch.randint(0, vocab, (4, seq + 1), generator=torch.Generator().manual_seed(2))
    workers = {0: 1.0, 1: 0.9, 2: 0.8, 4: 0.85}[knobs["dataloader_workers"]]
    slow = run["bf16_factor"] if knobs["autocast_dtype"] == "bfloat16" else 1.0
    delay = run["step_s"] * workers * slow
    probe = Probe.from_env(device=torch.device("cpu"))
    probe.attach(model=model, optimizer=opt)
    for step in range(run["steps"]):
        with probe.step() as s:
            x, y = data[step, :, :-1], data[step, :, 1:]
            loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            time.sleep(delay)
            s.loss(loss)
            if (step + 1) % 5 == 0 or step == run["steps"] - 1:
                with s.evaluation() as e, torch.no_grad():
                    e.loss(torch.nn.functional.cross_entropy(model(held[:, :-1]).reshape(-1, vocab), held[:, 1:].reshape(-1)))
    probe.close()
    """
)


def make_slowed_workload(root: Path, *, bf16_factor: float, steps: int = 12, step_s: float = 0.1,
                         trials: int = 6, timeout_s: float = 120.0, stop_slow_factor: float | None = 2.0) -> Path:
    """A git repo under ``root/workload`` with the job and its golden launch file; returns the contract's path."""
    repo = root / "workload"
    repo.mkdir(parents=True)
    (repo / "job.py").write_text(JOB)
    launch = {"run": {"steps": steps, "step_s": step_s, "bf16_factor": bf16_factor},
              "knobs": {"autocast_dtype": "float32", "dataloader_workers": 0}}
    (repo / "launch.yaml").write_text(yaml.safe_dump(launch))
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "job"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    contract = {
        "name": "slowed-on-purpose",
        "goal": "a tiny real job whose bf16 setting is slowed on purpose",
        "workload": {
            "repo": "workload",
            "command": ["{python}", "job.py", "{launch_file}"],
            "launch_file": "launch.yaml",
            "steps": steps,
            "steps_key": "run.steps",
            "verify_steps": steps,
            "env": {"OMP_NUM_THREADS": "1"},
        },
        "cluster": {"id": "test-cpu", "accelerator": "cpu", "memory_capacity_bytes": 2 << 30},
        "backend": {"kind": "local", "timeout_s": timeout_s},
        "scope": {"files": [], "launch_keys": ["knobs.autocast_dtype", "knobs.dataloader_workers"]},
        "search_space": {"knobs": {
            "knobs.autocast_dtype": {"type": "choice", "choices": ["float32", "bfloat16"]},
            "knobs.dataloader_workers": {"type": "int", "choices": [0, 1, 2, 4]},
        }},
        "invariants": {"loss": {"tolerance": 0.01, "at": "every_step"}, "timing_tolerance": 0.25},
        "budget": {"trials": trials, "accelerator_hours": 1.0, "stop_slow_factor": stop_slow_factor},
        "doctor": {"repeats": 2},
        "verify": {"top_k": 1, "repeats": 1, "passes_required": 1},
    }
    path = root / "contract.yaml"
    path.write_text(yaml.safe_dump(contract, sort_keys=False))
    return path
