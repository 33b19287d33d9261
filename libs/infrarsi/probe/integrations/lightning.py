"""PyTorch Lightning → the probe: ``Trainer(..., callbacks=[InfraRSICallback()])``.

How a Lightning step maps onto the probe (lightning 2.x, automatic or manual optimisation):

- an optimiser step is ``Trainer(accumulate_grad_batches=k)`` training batches (the last batch of an epoch
  closes a shorter one, as Lightning steps there); it begins at the first batch's ``on_train_batch_start``
  (its clock starts when the job was last idle, so the fetch of that batch is inside: phase ``data``),
  ``on_before_optimizer_step`` splits ``forward_backward`` from ``optimizer``, and the last batch's
  ``on_train_batch_end`` stops the clock;
- tokens and loss tokens are counted from each batch as it arrives (``input_ids``/``labels`` of a dict
  batch, else its first and second tensors; ``count_tokens`` overrides), so the step has all k micro-batches;
- the step's loss is the sum of the micro-batches' ``outputs["loss"]`` (Lightning divides each by k, so
  the sum is their mean) — the same whatever ``precision=`` is;
- a validation run after the step (``val_check_interval``) counts as that step's evaluation: its batches'
  tokens, and ``trainer.callback_metrics[eval_metric]`` (default ``val_loss``) as the eval loss. Because
  Lightning decides to validate only after the batch ended, a step is written when the next one begins,
  when its validation ends, or when training ends. The sanity check before training is not an evaluation;
- optimiser steps are counted by a hook on each of ``trainer.optimizers``.

Verify's checkpoint restart goes through Lightning's own mechanism: asked to save after k optimiser steps, the
callback calls ``trainer.save_checkpoint`` (``CHECKPOINT_FILE`` in the directory the launcher named) when step k
ends; a resumed run passes ``resume_checkpoint()`` as ``trainer.fit(..., ckpt_path=...)``. Steps are reported by
``trainer.global_step``, so a resumed run's first step is k. Asked for final weights, ``on_train_end`` writes the
weights with ``trainer.save_checkpoint(..., weights_only=True)`` as ``FINAL_WEIGHTS_FILE``.

Outside InfraRSI (no ``INFRARSI_TRIAL``/``INFRARSI_PROBE_DIR``) the callback does nothing at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback

from infrarsi.probe.checkpointing import CheckpointRequest, mark_saved
from infrarsi.probe.core import Probe, TokenCounter, count_tokens_default, model_inputs
from infrarsi.probe.integrations._steps import ProbedCallback, innermost_optimizer

CHECKPOINT_FILE = "lightning.ckpt"
FINAL_WEIGHTS_FILE = "model.ckpt"
"""Lightning's own format (weights and hyper-parameters): ``LightningModule.load_from_checkpoint`` reads it."""


def resume_checkpoint() -> str | None:
    """``trainer.fit(..., ckpt_path=resume_checkpoint())``: the checkpoint verify asks this run to resume from,
    else ``None`` (start at step zero)."""
    resume_from = CheckpointRequest.from_env().resume_from
    return None if resume_from is None else str(resume_from / CHECKPOINT_FILE)


def as_call(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A batch as the (args, kwargs) of a forward: a mapping as keyword arguments, a sequence as positional
    ones (inputs first, targets second), anything else as the one argument."""
    if isinstance(batch, Mapping):
        return (), dict(batch)
    return (tuple(batch) if isinstance(batch, list | tuple) else (batch,)), {}


class InfraRSICallback(ProbedCallback, Callback):
    """Report every optimiser step of a ``lightning.pytorch.Trainer`` to InfraRSI's probe.

    ``probe``: an explicit probe (tests, benchmarks); by default one is built from the launcher's
    environment at ``on_train_start``. ``out_dir``: where to write records when not launched (forces the
    probe on). ``eval_metric``: the logged validation metric that is the eval loss. ``count_tokens``:
    (args, kwargs) → (tokens, loss tokens), applied to each batch.
    """

    def __init__(
        self,
        probe: Probe | None = None,
        *,
        out_dir: Path | str | None = None,
        eval_metric: str = "val_loss",
        count_tokens: TokenCounter = count_tokens_default,
    ) -> None:
        super().__init__(probe, out_dir=out_dir, count_tokens=count_tokens)
        self.eval_metric = eval_metric

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        def attach(probe: Probe) -> None:
            probe.attach(count_tokens=self._count_tokens)  # tokens come from the batches, not a forward hook
            probe.describe(pl_module)
            for optimizer in trainer.optimizers:
                probe.attach(optimizer=innermost_optimizer(optimizer), count_tokens=self._count_tokens)

        self._start(pl_module.device, attach)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        tracker = self.tracker
        if tracker is None:
            return
        step = tracker.current or tracker.begin(trainer.global_step)
        call = as_call(batch)
        step.add_tokens(*self._count_tokens(*call))
        tracker.probe.saw_inputs(model_inputs(*call))

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.tracker is not None:
            self.tracker.before_optimizer()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        tracker = self.tracker
        if tracker is None:
            return
        tracker.micro_batch_loss(outputs.get("loss") if isinstance(outputs, Mapping) else outputs)
        ready = batch_idx + 1
        if ready % trainer.accumulate_grad_batches == 0 or ready == trainer.num_training_batches:
            tracker.end(hold=True)  # Lightning decides whether to validate after this hook
            save_dir = self.checkpoints.save_dir
            if save_dir is not None and self.checkpoints.saves_after(trainer.global_step):
                trainer.save_checkpoint(save_dir / CHECKPOINT_FILE)
                if trainer.is_global_zero:
                    mark_saved(save_dir, trainer.global_step)
                tracker.idle()  # a checkpoint is not part of the next step

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.tracker is not None and not trainer.sanity_checking:
            self.tracker.open_evaluation()

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.tracker is not None and not trainer.sanity_checking:
            self.tracker.eval_tokens(self._count_tokens(*as_call(batch))[0])

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.tracker is not None and not trainer.sanity_checking and self.tracker.pending is not None:
            self.tracker.close_evaluation(trainer.callback_metrics.get(self.eval_metric))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        final = self.checkpoints.final_weights_dir
        if final is not None:  # every rank calls it; Lightning writes on rank 0
            trainer.save_checkpoint(final / FINAL_WEIGHTS_FILE, weights_only=True)
        self._finish()
