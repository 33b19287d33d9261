"""What verify asks a training job to save or resume (``verify.checkpoint_restart``, ``verify.downstream``).

The launcher tells a verify run through ``JobEnv`` (``INFRARSI_CHECKPOINT_DIR`` and ``INFRARSI_CHECKPOINT_STEP``:
save a checkpoint after that many optimiser steps and go on; ``INFRARSI_RESUME_FROM``: resume from that
checkpoint instead of starting at step zero; ``INFRARSI_FINAL_WEIGHTS_DIR``: save the final weights there). The
job saves and loads through its own mechanism (``torch.distributed.checkpoint``, a Trainer's
``resume_from_checkpoint``, Lightning's ``ckpt_path``); this module only says what was asked, and keeps the one
fact every format needs beside its files: the optimiser steps done when it was saved (``STEP_FILE``).

One type from the launcher's decision (``CheckpointRequest`` for a verify trial, put in its ``JobEnv``) to the
job's reading of it (``CheckpointRequest.from_env``). No torch here: the launcher builds it, and a job reads it
at the probe's stable import path, ``infrarsi.probe.checkpointing``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infrarsi.runtime.settings import JobEnv

STEP_FILE = "infrarsi-step.json"
"""Written into a checkpoint directory by ``mark_saved``: ``{"steps_done": N}``."""


class CheckpointError(Exception):
    """A checkpoint to resume from is missing or unreadable."""


@dataclass(frozen=True)
class CheckpointRequest:
    """The checkpoint work verify asks of a run (all ``None``: a plain run; the job does nothing extra)."""

    save_dir: Path | None = None
    save_after_steps: int | None = None
    """Save once this many optimiser steps are done (then go on: the run is not interrupted)."""
    resume_from: Path | None = None
    final_weights_dir: Path | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CheckpointRequest:
        job = JobEnv.from_env(environ)
        return cls(job.checkpoint_dir, job.checkpoint_step, job.resume_from, job.final_weights_dir)

    def job_env(self) -> dict[str, Any]:
        """``JobEnv``'s fields that carry this request to the job (``from_env`` reads them back)."""
        return {"checkpoint_dir": self.save_dir, "checkpoint_step": self.save_after_steps,
                "resume_from": self.resume_from, "final_weights_dir": self.final_weights_dir}  # fmt: skip

    def saves_after(self, steps_done: int) -> bool:
        return self.save_dir is not None and self.save_after_steps == steps_done

    def resume_step(self) -> int:
        """Optimiser steps already done by the checkpoint to resume from (0 without one)."""
        return 0 if self.resume_from is None else read_saved_steps(self.resume_from)


def mark_saved(directory: Path, steps_done: int) -> None:
    """Record, beside a checkpoint's files, how many optimiser steps it holds (written last: a checkpoint
    without it is an incomplete one)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / STEP_FILE).write_text(json.dumps({"steps_done": steps_done}))


def read_saved_steps(directory: Path) -> int:
    marker = directory / STEP_FILE
    try:
        steps = json.loads(marker.read_text())["steps_done"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{directory} is not a complete checkpoint ({marker.name}: {exc})") from None
    if not isinstance(steps, int) or steps < 1:
        raise CheckpointError(f"{marker}: steps_done={steps!r} is not a positive integer")
    return steps
