"""Hugging Face ``Trainer`` → the probe: ``Trainer(..., callbacks=[InfraRSICallback()])``.

How a Trainer step maps onto the probe (transformers ≥ 5, ``Trainer._inner_training_loop``):

- ``on_step_begin`` fires once per optimiser step, after the step's micro-batches were fetched: the
  step's clock starts when the job was last idle (the end of the previous step, log, evaluation or save),
  so the data fetch is inside the step (phase ``data``);
- ``on_pre_optimizer_step`` splits ``forward_backward`` from ``optimizer``; ``on_step_end`` stops the clock.
  One probe step per optimiser step, so with ``gradient_accumulation_steps=k`` the tokens of all k
  micro-batches (counted by a forward pre-hook on the model as ``input_ids`` enter it) are one step's;
- the loss is the Trainer's own logged ``loss`` (``on_log``; it averages the steps since the previous log,
  so ``logging_steps=1`` gives one per step; steps without a log report none);
- when ``control.should_evaluate`` is set at ``on_step_end``, the model's forwards until ``on_evaluate``
  count as that step's eval tokens and ``metrics["eval_loss"]`` is its eval loss; the step is written then;
- optimiser steps are counted by a hook on the torch optimiser under accelerate's wrapper, so a step the
  optimiser skipped is not counted.

Verify's checkpoint restart goes through the Trainer's own mechanism: asked to save after k steps, the callback
sets ``control.should_save`` at step k (whatever ``save_strategy`` says), and on that save copies the Trainer's
``checkpoint-k`` folder (weights, optimiser, scheduler, RNG and ``trainer_state.json``) to where the launcher
asked; a resumed run passes ``resume_checkpoint()`` to ``trainer.train(resume_from_checkpoint=...)``, and the
Trainer restores the state and skips the data already seen. Steps are reported by the Trainer's
``global_step``, so a resumed run's first step is k. Asked for final weights, ``on_train_end`` writes them
with ``save_pretrained``.

Outside InfraRSI (no ``INFRARSI_TRIAL``/``INFRARSI_PROBE_DIR``) the callback does nothing at all.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from infrarsi.probe.checkpointing import CheckpointRequest, mark_saved
from infrarsi.probe.core import Probe
from infrarsi.probe.integrations._steps import ProbedCallback, innermost_optimizer


class InfraRSICallback(ProbedCallback, TrainerCallback):
    """Report every optimiser step of a ``transformers.Trainer`` to InfraRSI's probe.

    ``probe``: an explicit probe (tests, benchmarks); by default one is built from the launcher's
    environment at ``on_train_begin``. ``out_dir``: where to write records when not launched (forces the
    probe on). ``count_tokens``: (forward args, kwargs) → (tokens, loss tokens), for models whose inputs
    are not ``input_ids``/``labels``.
    """

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        optimizer = kwargs.get("optimizer")

        def attach(probe: Probe) -> None:
            probe.attach(
                model=kwargs.get("model"),
                optimizer=innermost_optimizer(optimizer) if optimizer is not None else None,
                count_tokens=self._count_tokens,
            )

        self._start(args.device, attach)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.tracker is not None:
            self.tracker.begin(state.global_step)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.tracker is not None:
            self.tracker.before_optimizer()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # DefaultFlowCallback ran first (the Trainer puts it first) and set what follows this step
        if self.checkpoints.saves_after(state.global_step):
            control.should_save = True
        if self.tracker is not None:
            self.tracker.end(loss_follows=control.should_log, eval_follows=control.should_evaluate)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.tracker is not None and logs and "loss" in logs:
            self.tracker.loss(logs["loss"])

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.tracker is not None and self.tracker.pending is not None:
            self.tracker.close_evaluation((metrics or {}).get("eval_loss"))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        save_dir = self.checkpoints.save_dir
        if save_dir is not None and self.checkpoints.saves_after(state.global_step) and state.is_world_process_zero:
            saved = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            shutil.copytree(saved, save_dir, dirs_exist_ok=True)
            mark_saved(save_dir, state.global_step)
        if self.tracker is not None:
            self.tracker.idle()  # a checkpoint is not part of the next step

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        final = self.checkpoints.final_weights_dir
        model = kwargs.get("model")
        if final is not None and model is not None and state.is_world_process_zero:
            model.save_pretrained(final)
        self._finish()


def resume_checkpoint() -> str | None:
    """``trainer.train(resume_from_checkpoint=resume_checkpoint())``: the checkpoint verify asks this run to
    resume from (a Trainer ``checkpoint-k`` folder the callback saved), else ``None`` (start at step zero)."""
    resume_from = CheckpointRequest.from_env().resume_from
    return None if resume_from is None else str(resume_from)
