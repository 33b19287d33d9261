"""Sandbox overhead: what the trial sandbox (bubblewrap, ``backend.isolation: sandbox``) costs a trial's start and
its step time, against the same job unisolated, paired and interleaved in one run.

    python bench/sandbox_overhead.py [--pairs 6] [--steps 60] [--json out/sandbox_overhead.json]

Both arms go through the local backend's real ``submit`` (``LocalBackend``; ``JobSpec.isolation`` ``none`` or
``sandbox``), as the launcher starts a trial. Each pair runs the two arms back to back, in alternating order, so
drift in the host's load falls on both:

- **start**: a job whose first statement prints the wall clock; start = that time minus the submit's (the
  sandbox's mounts and namespaces, the interpreter's start), median over the pairs, and the paired difference;
- **step**: a plain-PyTorch loop (a two-layer MLP, one thread, ``--steps`` optimiser steps) timing each step
  with ``perf_counter``; per run the median step after 5 warm-up steps; the paired ratio sandbox/none, against
  the noise of the unisolated arm itself (the spread of its runs' medians, as a ratio to their median).

Targets (issue 38): start overhead < 1 s; the step-time ratio within the noise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infrarsi.backends import JobSpec, LocalBackend  # noqa: E402
from infrarsi.trial import sandbox  # noqa: E402

START_JOB = "import time; print('STARTED', time.time(), flush=True)\n"

STEP_JOB = textwrap.dedent(
    """
    import sys, time
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randn(64, 1)
    for i in range(int(sys.argv[1])):
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print("STEP", time.perf_counter() - t0, flush=True)
    """
)

WARMUP_STEPS = 5


def run(backend: LocalBackend, work: Path, name: str, isolation: str, argv: list[str]) -> tuple[float, str]:
    """Submit one job through the backend; the submit's wall clock and the job's output."""
    spec = JobSpec(
        name=name, argv=argv, workdir=work, env={**os.environ, "OMP_NUM_THREADS": "1"},
        state_dir=Path(backend.owner) / name, isolation=isolation,  # type: ignore[arg-type]
    )  # fmt: skip
    submitted = time.time()
    handle = backend.submit(spec)
    while not backend.poll(handle):
        time.sleep(0.01)
    result = backend.collect(handle)
    if result.exit_code != 0:
        raise RuntimeError(f"{name} ({isolation}) failed: {result.output_tail[-2000:]}")
    return submitted, (spec.state_dir / "node0.log").read_text()


def start_s(backend: LocalBackend, work: Path, name: str, isolation: str) -> float:
    submitted, output = run(backend, work, name, isolation, [sys.executable, str(work / "start.py")])
    started = next(float(line.split()[1]) for line in output.splitlines() if line.startswith("STARTED"))
    return started - submitted


def step_s(backend: LocalBackend, work: Path, name: str, isolation: str, steps: int) -> float:
    _, output = run(backend, work, name, isolation, [sys.executable, str(work / "steps.py"), str(steps)])
    times = [float(line.split()[1]) for line in output.splitlines() if line.startswith("STEP")]
    return statistics.median(times[WARMUP_STEPS:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if (reason := sandbox.unavailable_reason()) is not None:
        print(f"error: no sandbox on this host: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="irsi-sandbox-bench-") as tmp:
        work, state = Path(tmp) / "work", Path(tmp) / "state"
        work.mkdir()
        (work / "start.py").write_text(START_JOB)
        (work / "steps.py").write_text(STEP_JOB)
        backend = LocalBackend(str(state))
        starts: dict[str, list[float]] = {"none": [], "sandbox": []}
        steps: dict[str, list[float]] = {"none": [], "sandbox": []}
        for pair in range(args.pairs):
            order = ("none", "sandbox") if pair % 2 == 0 else ("sandbox", "none")
            for arm in order:
                starts[arm].append(start_s(backend, work, f"start-{pair}-{arm}", arm))
            for arm in order:
                steps[arm].append(step_s(backend, work, f"steps-{pair}-{arm}", arm, args.steps))
            print(f"pair {pair + 1}/{args.pairs}: start none {starts['none'][-1]:.3f} s sandbox "
                  f"{starts['sandbox'][-1]:.3f} s; step none {steps['none'][-1] * 1e3:.2f} ms sandbox "
                  f"{steps['sandbox'][-1] * 1e3:.2f} ms", file=sys.stderr)  # fmt: skip
    start_diff = [s - n for s, n in zip(starts["sandbox"], starts["none"], strict=True)]
    step_ratio = [s / n for s, n in zip(steps["sandbox"], steps["none"], strict=True)]
    none_median = statistics.median(steps["none"])
    noise = (max(steps["none"]) - min(steps["none"])) / none_median
    result = {
        "pairs": args.pairs,
        "steps": args.steps,
        "start_s": {arm: statistics.median(v) for arm, v in starts.items()},
        "start_overhead_s": {"median": statistics.median(start_diff), "max": max(start_diff)},
        "step_s": {arm: statistics.median(v) for arm, v in steps.items()},
        "step_ratio_sandbox_over_none": {"median": statistics.median(step_ratio), "min": min(step_ratio),
                                         "max": max(step_ratio)},  # fmt: skip
        "unisolated_noise_range_ratio": noise,
        "start_under_1s": statistics.median(start_diff) < 1.0,
        "step_within_noise": abs(statistics.median(step_ratio) - 1.0) <= noise,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
