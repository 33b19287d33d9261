"""Probe overhead: step time with and without the probe, paired in one run — the hand-written probe on the
reference GPT, and each framework integration on a small GPT-2 job.

    python bench/probe_overhead.py --json OUT.json [--steps 40] [--only core,torch,hf,lightning]
                                   [--rounds 4] [--round-steps 44] [--launch-file ...] [--set KEY=VALUE ...]

``core``: even steps of the reference dense GPT run inside ``probe.step()`` with phase timers (records
written to a scratch JSONL file); odd steps run the same work timed by a bare ``perf_counter``.
Interleaving cancels drift (thermal, other processes).

``torch``, ``hf``, ``lightning``: a GPT-2 (2 layers, width 128, sequence 64, global batch 16 as 4 × 4
accumulated) trained by a plain loop with ``track``, by ``transformers.Trainer`` with the callback, and by a
Lightning ``Trainer`` with the callback. Within one run the integration is on for every other optimiser step:
the loop calls the ``track``-decorated step or the bare one, and the framework calls the probe's callback
through a gate that forwards its step hooks only on integrated steps (the probe's hooks stay installed: on a
plain step the forward hook finds no open step and returns, the optimiser hooks still count the update, so
that small part is in both arms). An outer clock that is not the probe's
(a timing callback placed before the probe's, or the loop's own marks) takes every step's full interval,
so the probe's own work (hooks, records) is inside it. Each integrated step is paired with the mean of the
plain steps either side of it (which cancels a linear drift); the result is the median paired ratio over
every pair of every run, and successive runs swap which steps are integrated. Neighbouring steps share the host's state of the moment: whole runs
with and without the integration, compared run against run, moved ±5% on this shared host, more than the
1% target. The target is < 1% overhead.

Beside the paired ratio, a direct figure with far less noise: the thread CPU time spent inside the
integration's own code on each integrated step (the callback's hooks as the gate forwards them, or for
``track`` the decorated call less the step function inside it, plus the probe's model and optimiser hooks
while the step is integrated), as a share of a plain step's CPU time.

Each step is timed twice: wall time (``perf_counter``) and the process's CPU time (``process_time``: user and
system time of all its threads, the probe's record writing and any helper thread included). On a shared host
the wall time also holds the time other processes took the core; the CPU time holds only this process's own
work, so it is the figure that can resolve a 1% difference there (both are reported; run with
``OMP_NUM_THREADS=1`` so the CPU time is one core's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


def measure_core(args: argparse.Namespace) -> dict[str, object]:
    """The hand-written probe on the reference GPT, steps interleaved with and without it."""
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
    print(
        f"core probe: with {result['median_step_s_with_probe'] * 1e3:.1f} ms, "
        f"without {result['median_step_s_without_probe'] * 1e3:.1f} ms, ratio {ratio:.4f} "
        f"({result['overhead_pct']:+.2f}%), paired ratio {paired:.4f}"
    )
    return result


# --------------------------------------------------------------------------------------------------------
# The integrations: a small GPT-2 job per framework, each step timed by a clock that is not the probe's
# --------------------------------------------------------------------------------------------------------

VOCAB, SEQ_LEN, MICRO, ACCUM = 256, 64, 4, 4


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ_LEN, n_embd=128, n_layer=2, n_head=4,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def _rows(n: int) -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, VOCAB, (n, SEQ_LEN), generator=torch.Generator().manual_seed(1))  # (N, T)
    return [{"input_ids": row, "labels": row} for row in ids]


Mark = tuple[float, float]
"""A step boundary: (wall clock, process CPU time), both in seconds."""

WARMUP = 4
"""Steps dropped at the start of a run: the first integrated step counts FLOPs, and the first steps warm up."""


def _mark() -> Mark:
    return time.perf_counter(), time.process_time()


def _intervals(marks: list[Mark]) -> list[Mark]:
    """Each step's (wall, CPU) duration between consecutive marks."""
    return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:], strict=False)]


def _on(step: int, parity: int) -> bool:
    """Whether optimiser step ``step`` (0-based) runs with the integration: every other step."""
    return step % 2 == parity


class OwnTime:
    """The thread CPU time of the integration's own code on each integrated step: its calls (callback hooks,
    the decorator around the step) and the probe's model and optimiser hooks while the step is integrated."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self.active = False

    def begin(self) -> None:
        """An integrated step starts."""
        self.steps.append(0.0)
        self.active = True

    def add(self, seconds: float) -> None:
        if self.active:
            self.steps[-1] += seconds

    def timed(self, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(time.thread_time() - t0)

        return wrapper

    def probe(self, out_dir: Path) -> Any:
        """A probe whose model and optimiser hooks are timed (set before ``attach`` registers them)."""
        probe = Probe(out_dir=out_dir)
        for hook in ("_on_forward", "_before_optimizer_step", "_on_optimizer_step"):
            setattr(probe, hook, self.timed(getattr(probe, hook)))
        return probe


def _run_torch(steps: int, parity: int, out_dir: Path, own: OwnTime) -> list[Mark]:
    from infrarsi.probe.integrations.torch import track

    model = _gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(_rows(steps * MICRO * ACCUM), batch_size=MICRO * ACCUM)
    tracked = track(model, opt, probe=own.probe(out_dir))

    def train_step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        total = torch.zeros(())
        for micro in range(ACCUM):
            part = {k: v[micro * MICRO : (micro + 1) * MICRO] for k, v in batch.items()}
            loss = model(**part).loss
            (loss / ACCUM).backward()
            total += loss.detach() / ACCUM
        opt.step()
        opt.zero_grad()
        return total

    inner: list[float] = []

    def timed_step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        t0 = time.thread_time()
        try:
            return train_step(batch)
        finally:
            inner.append(time.thread_time() - t0)

    tracked_step = tracked.step(timed_step)
    marks = [_mark()]
    with tracked:
        for step, batch in enumerate(loader):
            if _on(step, parity):
                own.begin()
                t0 = time.thread_time()
                tracked_step(batch)
                own.add(time.thread_time() - t0 - inner[-1])  # the decorator's work around the step
            else:
                own.active = False
                train_step(batch)
            marks.append(_mark())
    return _intervals(marks)


def _run_hf(steps: int, parity: int, out_dir: Path, own: OwnTime) -> list[Mark]:
    from infrarsi.probe.integrations.hf import InfraRSICallback
    from transformers import Trainer, TrainerCallback, TrainingArguments

    marks: list[Mark] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003 — the Trainer's signature
            marks.append(_mark())

        def on_train_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
            marks.append(_mark())

    class EveryOtherStep(TrainerCallback):
        """The probe's callback on every other optimiser step: the Trainer calls it only then (its thread
        CPU time in those calls summed per step into ``own``)."""

        def __init__(self, inner: InfraRSICallback) -> None:
            self.inner, self.active = inner, False

        def _forward(self, hook: str, *a, **kw) -> None:  # noqa: ANN002, ANN003
            if self.active:
                own.timed(getattr(self.inner, hook))(*a, **kw)

        def on_train_begin(self, *a, **kw):  # noqa: ANN002, ANN003
            self.inner.on_train_begin(*a, **kw)

        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001, ANN003
            self.active = _on(state.global_step, parity)
            if self.active:
                own.begin()
            else:
                own.active = False
            self._forward("on_step_begin", args, state, control, **kw)

        def on_pre_optimizer_step(self, *a, **kw):  # noqa: ANN002, ANN003
            self._forward("on_pre_optimizer_step", *a, **kw)

        def on_step_end(self, *a, **kw):  # noqa: ANN002, ANN003
            self._forward("on_step_end", *a, **kw)

        def on_log(self, *a, **kw):  # noqa: ANN002, ANN003
            self._forward("on_log", *a, **kw)

        def on_train_end(self, *a, **kw):  # noqa: ANN002, ANN003
            self.inner.on_train_end(*a, **kw)

    args = TrainingArguments(
        output_dir=str(out_dir / "hf"), per_device_train_batch_size=MICRO, gradient_accumulation_steps=ACCUM,
        max_steps=steps, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    callbacks = [StepClock(), EveryOtherStep(InfraRSICallback(own.probe(out_dir)))]
    Trainer(model=_gpt2(), args=args, train_dataset=_rows(steps * MICRO * ACCUM), callbacks=callbacks).train()
    return _intervals(marks)


def _run_lightning(steps: int, parity: int, out_dir: Path, own: OwnTime) -> list[Mark]:
    import lightning.pytorch as pl
    from infrarsi.probe.integrations.lightning import InfraRSICallback

    marks: list[Mark] = []

    class StepClock(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # noqa: ANN001
            if batch_idx % ACCUM == 0:
                marks.append(_mark())

        def on_train_end(self, trainer, pl_module):  # noqa: ANN001
            marks.append(_mark())

    class EveryOtherStep(pl.Callback):
        """The probe's callback on every other optimiser step (all its micro-batches): Lightning calls it only
        then (its thread CPU time in those calls summed per step into ``own``)."""

        def __init__(self, inner: InfraRSICallback) -> None:
            self.inner, self.active = inner, False

        def _forward(self, hook: str, *a) -> None:  # noqa: ANN002
            if self.active:
                own.timed(getattr(self.inner, hook))(*a)

        def on_train_start(self, trainer, pl_module):  # noqa: ANN001
            self.inner.on_train_start(trainer, pl_module)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # noqa: ANN001
            if batch_idx % ACCUM == 0:
                self.active = _on(batch_idx // ACCUM, parity)
                if self.active:
                    own.begin()
                else:
                    own.active = False
            self._forward("on_train_batch_start", trainer, pl_module, batch, batch_idx)

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):  # noqa: ANN001
            self._forward("on_before_optimizer_step", trainer, pl_module, optimizer)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001
            self._forward("on_train_batch_end", trainer, pl_module, outputs, batch, batch_idx)

        def on_train_end(self, trainer, pl_module):  # noqa: ANN001
            self.inner.on_train_end(trainer, pl_module)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _gpt2()

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return self.model(**batch).loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    callbacks = [StepClock(), EveryOtherStep(InfraRSICallback(own.probe(out_dir)))]
    trainer = pl.Trainer(max_steps=steps, accumulate_grad_batches=ACCUM, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=callbacks)  # fmt: skip
    loader = torch.utils.data.DataLoader(_rows(steps * MICRO * ACCUM), batch_size=MICRO)
    trainer.fit(Module(), loader)
    return _intervals(marks)


RUNNERS = {"torch": _run_torch, "hf": _run_hf, "lightning": _run_lightning}


def measure_integration(name: str, rounds: int, steps: int) -> dict[str, object]:
    """``rounds`` runs of the job, each with the integration on every other optimiser step (on even steps in
    even rounds, odd steps in odd rounds); each integrated step paired with the plain steps either side."""
    run = RUNNERS[name]
    pairs: dict[str, list[tuple[float, float]]] = {"wall": [], "cpu": []}
    own_s: list[float] = []
    for r in range(rounds):
        parity = r % 2
        own = OwnTime()
        with tempfile.TemporaryDirectory() as tmp:
            durations = run(steps, parity, Path(tmp), own)
        own_s += own.steps[2:]  # after the first integrated step (FLOP counting) and the next
        for step in range(WARMUP + 1, len(durations) - 1):
            if _on(step, parity):  # (integrated step, the mean of the plain steps before and after it)
                for i, clock in enumerate(("wall", "cpu")):
                    pairs[clock].append((durations[step][i], (durations[step - 1][i] + durations[step + 1][i]) / 2))
    result: dict[str, object] = {"rounds": rounds, "steps_per_run": steps, "pairs": len(pairs["cpu"]),
                                 "target_overhead_pct": 1.0}  # fmt: skip
    for clock in ("wall", "cpu"):
        ratios = [w / o for w, o in pairs[clock]]
        paired = statistics.median(ratios)
        q = statistics.quantiles(ratios, n=4)
        rng = random.Random(0)  # the median's 95% interval: 2,000 bootstrap resamples of the pairs
        medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
        result[clock] = {
            "median_step_s_with_probe": statistics.median(w for w, _ in pairs[clock]),
            "median_step_s_without_probe": statistics.median(o for _, o in pairs[clock]),
            "median_paired_ratio": paired, "overhead_pct": (paired - 1) * 100,
            "paired_ratio_quartiles": [q[0], q[2]], "median_ci95": [medians[49], medians[1949]],
        }  # fmt: skip
    own_median = statistics.median(own_s)
    result["probe_cpu_s_per_step"] = own_median
    result["probe_cpu_pct_of_step"] = 100 * own_median / result["cpu"]["median_step_s_without_probe"]  # type: ignore[index]
    wall, cpu = result["wall"], result["cpu"]
    print(f"{name}: the integration's own code (calls and hooks) {own_median * 1e3:.3f} ms CPU per step "
          f"({result['probe_cpu_pct_of_step']:.2f}% of a plain step)", flush=True)
    print(f"{name}: {result['pairs']} step pairs in {rounds} runs; CPU time with {cpu['median_step_s_with_probe'] * 1e3:.1f} ms, "
          f"without {cpu['median_step_s_without_probe'] * 1e3:.1f} ms, median paired ratio {cpu['median_paired_ratio']:.4f} "
          f"({cpu['overhead_pct']:+.2f}%; 95% CI {cpu['median_ci95'][0]:.4f}–{cpu['median_ci95'][1]:.4f}; quartiles "
          f"{cpu['paired_ratio_quartiles'][0]:.3f}–{cpu['paired_ratio_quartiles'][1]:.3f}); "
          f"wall with {wall['median_step_s_with_probe'] * 1e3:.1f} ms, without {wall['median_step_s_without_probe'] * 1e3:.1f} ms, "
          f"median paired ratio {wall['median_paired_ratio']:.4f} ({wall['overhead_pct']:+.2f}%)", flush=True)  # fmt: skip
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--only", default="core,torch,hf,lightning", help="comma-separated: core,torch,hf,lightning")
    parser.add_argument("--steps", type=int, default=40, help="core: steps per arm (after 2 warm-up steps each)")
    parser.add_argument("--rounds", type=int, default=4, help="integrations: runs (alternating which steps are integrated)")
    parser.add_argument("--round-steps", type=int, default=44, help="integrations: optimiser steps per run")
    parser.add_argument("--launch-file", type=Path, default=WORKLOAD / "launch" / "dense-1node.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = sorted(set(wanted) - {"core", *RUNNERS})
    if unknown:
        parser.error(f"unknown --only entries {unknown}; choose from core, {', '.join(RUNNERS)}")
    result: dict[str, object] = {}
    for name in wanted:
        result[name] = measure_core(args) if name == "core" else measure_integration(name, args.rounds, args.round_steps)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
