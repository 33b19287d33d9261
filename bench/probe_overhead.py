"""Probe overhead: step time of the reference dense GPT with and without the probe, interleaved in one run.

    python bench/probe_overhead.py --json OUT.json [--steps 40] [--launch-file ...] [--set KEY=VALUE ...]

Even steps run inside ``probe.step()`` with phase timers (records written to a scratch JSONL file); odd
steps run the same work timed by a bare ``perf_counter``. Interleaving cancels drift (thermal, other
processes). Prints and writes the median ratio; the target is < 1% overhead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

WORKLOAD = Path(__file__).resolve().parent.parent / "workloads" / "gpt"
sys.path.insert(0, str(WORKLOAD))

from config import load_launch, parse_override  # noqa: E402
from data import MarkovCorpus, StepBatches  # noqa: E402
from infrarsi.probe import Probe  # noqa: E402
from model import GPT  # noqa: E402


class _NoPhases:
    def phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def loss(self, value: object) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=40, help="steps per arm (after 2 warm-up steps each)")
    parser.add_argument("--launch-file", type=Path, default=WORKLOAD / "launch" / "dense-1node.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()

    cfg = load_launch(args.launch_file, dict(parse_override(o) for o in args.overrides))
    torch.set_num_threads(cfg.knobs.intra_op_threads)
    torch.manual_seed(cfg.run.seed)
    model = GPT(cfg.model, attention=cfg.knobs.attention, checkpointing=cfg.knobs.activation_checkpointing)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.run.lr, foreach=False)
    accum = cfg.accumulation_steps(1)
    total = 2 * (args.steps + 2)
    batches = StepBatches(
        MarkovCorpus(cfg.run.seed, cfg.model.vocab_size, cfg.model.seq_len),
        cfg.run.global_batch_size, 0, 1, cfg.knobs.micro_batch_size, total,
    )  # fmt: skip

    def train_step(step: int, s: object) -> None:
        with s.phase("data"):
            mbs = batches[step]
        loss_sum = torch.zeros(())
        for i in range(accum):
            with s.phase("forward"):
                out = model(mbs[i][:, :-1], mbs[i][:, 1:])
            with s.phase("backward"):
                (out.loss / accum).backward()
            loss_sum += out.ce.detach()
        s.loss(loss_sum / accum)
        with s.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)

    with_probe: list[float] = []
    without: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, Probe(out_dir=Path(tmp)) as probe:
        probe.attach(model=model, optimizer=opt)
        for step in range(total):
            if step % 2 == 0:
                t0 = time.perf_counter()
                with probe.step() as s:
                    train_step(step, s)
                elapsed = time.perf_counter() - t0  # outer clock: includes the probe's own record writing
                with_probe.append(elapsed)
            else:
                t0 = time.perf_counter()
                train_step(step, _NoPhases())
                without.append(time.perf_counter() - t0)
    with_probe, without = with_probe[2:], without[2:]
    ratio = statistics.median(with_probe) / statistics.median(without)
    # Paired ratios of neighbouring steps are less sensitive to slow drift than the ratio of medians.
    paired = statistics.median(w / o for w, o in zip(with_probe, without, strict=True))
    result = {
        "steps_per_arm": len(with_probe),
        "median_step_s_with_probe": statistics.median(with_probe),
        "median_step_s_without_probe": statistics.median(without),
        "ratio_of_medians": ratio,
        "median_paired_ratio": paired,
        "overhead_pct": (ratio - 1) * 100,
        "target_overhead_pct": 1.0,
        "launch_file": str(args.launch_file),
        "overrides": args.overrides,
        "torch_threads": torch.get_num_threads(),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    print(
        f"probe overhead: with {result['median_step_s_with_probe'] * 1e3:.1f} ms, "
        f"without {result['median_step_s_without_probe'] * 1e3:.1f} ms, ratio {ratio:.4f} "
        f"({result['overhead_pct']:+.2f}%), paired ratio {paired:.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
