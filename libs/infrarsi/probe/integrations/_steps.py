"""``StepTracker``: one optimiser step at a time, from the hooks a framework calls; ``ProbedCallback``: the probe
and tracker a framework's callback holds.

Frameworks tell their callbacks about a step in pieces: its data is fetched before anyone hears that it
began, the optimiser runs between two hooks, and the loss and the evaluation arrive only after the step
ended (Hugging Face logs and evaluates after ``on_step_end``; Lightning validates after the batch ends).
The tracker keeps the probe's definitions over that shape:

- the step's clock starts when the job was last *idle*, i.e. at the end of the previous step or of the
  logging, evaluation or checkpoint that followed it (``idle()``), so the step covers its data fetch and
  the report never covers an evaluation (phases ``data``, ``forward_backward``, ``optimizer``);
- the clock stops at the framework's end of step, synchronised (``end()``);
- an ended step stays *pending* until its loss and evaluation arrived, then is written; a pending step is
  written anyway when the next step begins or the tracker closes, so no step is lost or written twice;
- FLOPs are counted once, over the whole first step (every micro-batch, forward and backward) under
  ``FlopCounterMode``, and reported for every step after it.

This module must not import a training framework.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from infrarsi.probe.checkpointing import CheckpointRequest
from infrarsi.probe.core import EvalContext, Probe, StepContext, TokenCounter, count_tokens_default


def innermost_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimiser under framework wrappers (accelerate's ``AcceleratedOptimizer``, Lightning's
    ``LightningOptimizer``): its step hook fires only when parameters really are updated."""
    for _ in range(8):  # wrappers of wrappers, never a cycle
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None or not callable(getattr(inner, "step", None)):
            break
        optimizer = inner
    return cast(torch.optim.Optimizer, optimizer)


def scalar(value: Any) -> torch.Tensor | float | None:
    """A loss as the probe takes it: a detached tensor (no sync now) or a float; ``None`` if not a number."""
    if isinstance(value, torch.Tensor):
        return value.detach() if value.numel() == 1 else None
    if isinstance(value, int | float):
        return float(value)
    return None


def _sum(parts: list[torch.Tensor | float]) -> torch.Tensor | float:
    """The sum of a step's loss parts: one stacked sum for same-shaped tensors, else added one by one."""
    tensors = [p for p in parts if isinstance(p, torch.Tensor)]
    if len(parts) > 1 and len(tensors) == len(parts):
        try:
            return torch.stack(tensors).sum()
        except RuntimeError:  # shapes or devices differ
            pass
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


class StepTracker:
    """Drives one ``Probe`` from begin/end hooks; see the module docstring for the rules."""

    def __init__(self, probe: Probe, *, count_flops: bool = True) -> None:
        self.probe = probe
        self.current: StepContext | None = None
        """The step in progress, between ``begin`` and ``end``."""
        self.pending: StepContext | None = None
        """The last ended step, not yet written (waiting for its loss or evaluation)."""
        self._idle_since = time.perf_counter()
        self._began = 0.0
        self._optimizer_at: float | None = None
        self._wait_loss = self._wait_eval = self._hold = False
        self._micro_losses: list[torch.Tensor | float] = []
        """The step's micro-batch losses × their weights, summed once at ``end`` (one tensor op per step, not
        one or two per micro-batch: on a small CPU step each op is a measurable share of the probe's cost)."""
        self._flops = None
        if count_flops and probe.flops_per_step is None:
            from torch.utils.flop_counter import FlopCounterMode

            self._flops = FlopCounterMode(display=False)

    def idle(self) -> None:
        """The job is between steps from now on (the next step's clock starts here at the latest)."""
        self._idle_since = time.perf_counter()

    def begin(self, index: int | None = None) -> StepContext:
        """The framework started an optimiser step (its data already fetched); ``index``: the framework's own
        count of the steps done before it (a run resumed from a checkpoint does not start at 0)."""
        self.flush()
        now = time.perf_counter()
        s = self.probe.begin_step(index, started_at=self._idle_since)
        s.add_phase("data", max(0.0, now - self._idle_since))
        self._began, self._optimizer_at, self._micro_losses = now, None, []
        self.current = s
        if self._flops is not None:
            self._flops.__enter__()  # type: ignore[no-untyped-call]  # unannotated in torch 2.13
        return s

    def before_optimizer(self) -> None:
        """Forward and backward of every micro-batch are done; the optimiser runs next."""
        self._optimizer_at = time.perf_counter()

    def micro_batch_loss(self, value: Any, *, weight: float = 1.0) -> None:
        """Add one micro-batch's loss × ``weight`` to the step's loss (sum the parts of the step's mean)."""
        loss = scalar(value)
        if loss is not None and self.current is not None:
            self._micro_losses.append(loss if weight == 1.0 else loss * weight)

    def end(self, *, loss_follows: bool = False, eval_follows: bool = False, hold: bool = False) -> None:
        """The optimiser step is over: stop the clock; write now unless a loss or an evaluation follows, or
        (``hold``) the framework decides only later whether to evaluate after it."""
        s = self.current
        if s is None:
            return
        self.probe._clock.sync()
        now = time.perf_counter()
        if self._flops is not None:
            self._flops.__exit__(None, None, None)  # type: ignore[no-untyped-call]  # unannotated in torch 2.13
            self.probe.flops_per_step = float(self._flops.get_total_flops())
            self._flops = None
        self.probe.end_step(s)
        split = self._optimizer_at if self._optimizer_at is not None else now
        s.add_phase("forward_backward", split - self._began)
        s.add_phase("optimizer", now - split)
        if self._micro_losses:
            s.loss(_sum(self._micro_losses))
        self.current, self.pending = None, s
        self._wait_loss, self._wait_eval, self._hold = loss_follows, eval_follows, hold
        if eval_follows:
            self.probe.open_evaluation(s)
        self._maybe_write()

    def loss(self, value: Any) -> None:
        """The loss of the pending step, reported after it ended (a Trainer's log)."""
        loss = scalar(value)
        if self.pending is not None and loss is not None:
            self.pending.loss(loss)
        self._wait_loss = False
        self._maybe_write()

    def open_evaluation(self) -> EvalContext | None:
        """An evaluation starts after the pending step (the framework said so only now)."""
        if self.pending is None:
            return None
        self._wait_eval = True
        return self.pending.eval if self.pending.eval is not None else self.probe.open_evaluation(self.pending)

    def eval_tokens(self, tokens: int) -> None:
        if self.pending is not None and self.pending.eval is not None:
            self.pending.eval.tokens += tokens

    def close_evaluation(self, eval_loss: Any) -> None:
        """The evaluation after the pending step finished with this mean loss."""
        s = self.pending
        self.probe.close_evaluation()
        if s is not None and s.eval is not None:
            loss = scalar(eval_loss)
            if loss is not None:
                s.eval.loss(loss)
        self._wait_eval = self._hold = False
        self._maybe_write()

    def _maybe_write(self) -> None:
        if not (self._wait_loss or self._wait_eval or self._hold):
            self.flush()
        self.idle()

    def flush(self) -> None:
        """Write the pending step, whatever it still waits for."""
        s = self.pending
        if s is None:
            return
        self.probe.close_evaluation()
        self.pending = None
        self._wait_loss = self._wait_eval = self._hold = False
        self.probe.write_step(s)

    def abandon(self) -> None:
        """The step in progress failed: it is not a step (nothing written, as ``Probe.step`` on an exception)."""
        if self.current is None:
            return
        if self._flops is not None:  # count again on the next step
            self._flops.__exit__(None, None, None)  # type: ignore[no-untyped-call]  # unannotated in torch 2.13
            from torch.utils.flop_counter import FlopCounterMode

            self._flops = FlopCounterMode(display=False)
        self.probe.close_evaluation()
        self.current = None

    def close(self, *, close_probe: bool = False) -> None:
        """Write what is pending (a step still in progress when training stopped is not a step); with
        ``close_probe``, close the probe too (an integration closes the probe it built, not one it was given)."""
        self.abandon()
        self._flops = None
        self.flush()
        if close_probe:
            self.probe.close()


class ProbedCallback:
    """What a framework's callback holds (Hugging Face's, Lightning's): the probe it was given (tests,
    benchmarks) or builds from the launcher's environment when training starts, and that probe's
    ``StepTracker``. A probe it built itself it also closes; outside InfraRSI it has none and does nothing.

    ``out_dir``: where to write records when not launched (forces the probe on). ``count_tokens``: (args,
    kwargs) → (tokens, loss tokens), for inputs that are not ``input_ids``/``labels``."""

    def __init__(
        self,
        probe: Probe | None = None,
        *,
        out_dir: Path | str | None = None,
        count_tokens: TokenCounter = count_tokens_default,
    ) -> None:
        super().__init__()
        self._given = probe
        self._out_dir = out_dir
        self._count_tokens = count_tokens
        self.probe: Probe | None = None
        self.tracker: StepTracker | None = None
        self.checkpoints = CheckpointRequest()
        """What verify asks of this run (``verify.checkpoint_restart``, ``verify.downstream``), read at the start."""

    def _start(self, device: Any, attach: Callable[[Probe], None]) -> None:
        """Training starts on ``device``: take the probe, ``attach`` it to the framework's model and optimisers,
        then track its steps."""
        self.checkpoints = CheckpointRequest.from_env()
        probe = self._given or Probe.launched(device=device, out_dir=self._out_dir)
        if probe is not None:
            attach(probe)
            self.probe, self.tracker = probe, StepTracker(probe)

    def _finish(self) -> None:
        """Training ended: write what is pending, close a probe of our own."""
        if self.tracker is not None:
            self.tracker.close(close_probe=self._given is None)
            self.tracker = None
