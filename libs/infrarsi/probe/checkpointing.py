"""What verify asks a training job to save or resume, at the import path jobs use (``infrarsi.trial.checkpoints``
holds it, torch-free, so that the launcher builds the same ``CheckpointRequest`` a job reads here)."""

from infrarsi.trial.checkpoints import (
    STEP_FILE,
    CheckpointError,
    CheckpointRequest,
    mark_saved,
    read_saved_steps,
)

__all__ = ["STEP_FILE", "CheckpointError", "CheckpointRequest", "mark_saved", "read_saved_steps"]
