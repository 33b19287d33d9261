"""Thin adapters that let a job written for a training framework report to the probe with one line.

- ``infrarsi.probe.integrations.hf``: ``InfraRSICallback``, a ``transformers.TrainerCallback``;
- ``infrarsi.probe.integrations.lightning``: ``InfraRSICallback``, a ``lightning.pytorch.Callback``;
- ``infrarsi.probe.integrations.torch``: ``instrument`` and the ``optimizer_step``/``evaluation``
  decorators for a plain PyTorch loop that already exists (beside ``Probe.step()``).

Each module imports its framework when it is itself imported; nothing in ``infrarsi.probe`` imports them,
so neither framework is a dependency of the core. All three drive the probe through ``StepTracker``
(``_steps``), which turns a framework's hook calls into the probe's begin / end / write of one optimiser
step, so every integration reports the same facts: one record per optimiser step, tokens and loss tokens
of every micro-batch, the step's loss, the evaluation that follows it, FLOPs counted once (the first
step, under ``FlopCounterMode``), peak memory, and optimiser steps counted by the optimiser's own hook.

Outside InfraRSI (neither ``INFRARSI_TRIAL`` nor ``INFRARSI_PROBE_DIR`` set, no explicit probe) every
adapter is inert: it hooks nothing and writes nothing.
"""
