"""Checkpoints of the reference GPT job through ``torch.distributed.checkpoint`` (DCP).

One format for every wrapping: the model and AdamW state dicts come from ``get_state_dict``, which gives
plain names for a bare module and DDP, and sharded DTensors for FSDP2 (each rank writes its own shards, and
a resumed run with the same mesh reads them back in place). Beside DCP's files, ``mark_saved`` records the
optimiser steps done; the data position and the learning rate are functions of that step (``data.py``,
``train.lr_at``), so they need nothing else. The final weights for the downstream evaluation are one full,
unsharded ``model.pt`` written by rank 0.

This module owns the on-disk format; ``train.py`` decides when to save and resume.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from infrarsi.probe.checkpointing import mark_saved, read_saved_steps
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

FINAL_WEIGHTS = "model.pt"


def save_checkpoint(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps_done: int) -> None:
    """Model and optimiser state after ``steps_done`` optimiser steps (every rank calls it)."""
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(directory))
    dist.barrier()
    if dist.get_rank() == 0:
        mark_saved(directory, steps_done)


def load_checkpoint(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, with_optimizer: bool = True
) -> int:
    """Restore model (and, unless told otherwise, optimiser) state in place; returns the optimiser steps the
    checkpoint holds. ``with_optimizer=False`` leaves AdamW's moments at zero: the resumed run is then not the
    run that was interrupted (what ``checkpoint.restart`` at verify exists to catch)."""
    steps_done = read_saved_steps(directory)
    model_state, optim_state = get_state_dict(model, optimizer)  # the layout to load into
    state = {"model": model_state, "optimizer": optim_state} if with_optimizer else {"model": model_state}
    dcp.load(state, checkpoint_id=str(directory))
    if with_optimizer:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    else:
        set_model_state_dict(model, state["model"])
    return steps_done


def save_final_weights(directory: Path, model: torch.nn.Module) -> None:
    """The trained weights, unsharded and on the CPU, as ``<directory>/model.pt`` (rank 0 writes it)."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(state, directory / FINAL_WEIGHTS)
    dist.barrier()
