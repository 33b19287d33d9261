"""A plain PyTorch loop that already exists → the probe, without re-indenting it.

``Probe.step()`` (``infrarsi.probe.core``) is the explicit form for a loop written with the probe in mind.
For a loop that already exists, decorate the function that does one optimiser step and, if there is one,
the function that evaluates::

    from infrarsi.probe.integrations.torch import track

    with track(model, optimizer) as tracked:      # inert outside InfraRSI

        @tracked.step                              # one call = one optimiser step
        def train_step(batch):
            loss = model(batch["input_ids"], batch["labels"])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss                            # the step's mean loss (a tensor, a float, or {"loss": …})

        @tracked.evaluation                        # the evaluation after the last step
        def evaluate():
            return eval_loss

        for batch in loader:                       # the existing loop, unchanged
            train_step(batch)

A step's clock starts when the previous step (or evaluation) returned, so the loop's data fetch is inside
it (phase ``data``); an optimiser pre-hook splits ``forward_backward`` from ``optimizer``. Tokens come from
a forward pre-hook on ``model`` (as ``Probe.attach``), FLOPs from the first step (``FlopCounterMode``).
When an evaluation function is decorated, each step is written when the next begins, when an evaluation
ends, or at exit, so that an evaluation belongs to the step it followed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import torch

from infrarsi.probe.core import Probe, TokenCounter, count_tokens_default
from infrarsi.probe.integrations._steps import StepTracker, innermost_optimizer

P = ParamSpec("P")
R = TypeVar("R")


def loss_of(result: Any) -> Any:
    """The loss in what a step function returned: itself, ``result["loss"]`` or ``result.loss``."""
    if isinstance(result, Mapping):
        return result.get("loss")
    return getattr(result, "loss", result)


class Tracked:
    """The decorators of one probe; a no-op pair when ``probe`` is ``None`` (outside InfraRSI)."""

    def __init__(self, probe: Probe | None, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.probe = probe
        self.tracker = StepTracker(probe) if probe is not None else None
        self._evaluates = False
        self._hooks: list[Any] = []
        if self.tracker is not None and optimizer is not None:
            tracker = self.tracker
            self._hooks.append(
                innermost_optimizer(optimizer).register_step_pre_hook(lambda *_: tracker.before_optimizer())
            )

    def step(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Decorate a function that performs exactly one optimiser step."""
        tracker = self.tracker
        if tracker is None:
            return fn

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            tracker.begin()
            try:
                result = fn(*args, **kwargs)
            except BaseException:
                tracker.abandon()
                raise
            tracker.micro_batch_loss(loss_of(result))
            tracker.end(hold=self._evaluates)
            return result

        return wrapper

    def evaluation(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Decorate a function that evaluates after a step and returns the mean eval loss."""
        tracker = self.tracker
        if tracker is None:
            return fn
        self._evaluates = True

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            tracker.open_evaluation()
            try:
                result = fn(*args, **kwargs)
            finally:
                tracker.probe.close_evaluation()
            tracker.close_evaluation(loss_of(result))
            return result

        return wrapper

    def close(self) -> None:
        """Write the last step, remove hooks and close the probe. Idempotent."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if self.tracker is not None:
            self.tracker.close(close_probe=True)
            self.tracker = None

    def __enter__(self) -> Tracked:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def track(
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    probe: Probe | None = None,
    device: torch.device | str | None = None,
    out_dir: Path | str | None = None,
    count_tokens: TokenCounter = count_tokens_default,
) -> Tracked:
    """Hook ``model`` (tokens) and ``optimizer`` (steps) to a probe from the launcher's environment (or
    ``probe``/``out_dir``), and return the decorators; outside InfraRSI they leave functions unchanged."""
    if probe is None:
        if device is None and model is not None:
            device = next((p.device for p in model.parameters()), None)
        probe = Probe.launched(device=device, out_dir=out_dir)
    if probe is not None:
        probe.attach(model=model, optimizer=optimizer, count_tokens=count_tokens)
    return Tracked(probe, optimizer)
