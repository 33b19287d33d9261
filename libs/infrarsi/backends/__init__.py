"""Launcher backends: one small interface (``Backend``) and its implementations.

``make_backend`` picks one by the contract's ``backend.kind``; the verifier and doctor reuse the same
backends through this package. ``local`` runs real processes; ``sim`` plays trials out on the analytic cluster simulator
(``infrarsi.sim``, labelled as such). Slurm and Kubernetes will implement the same calls.
"""

from __future__ import annotations

from pathlib import Path

from infrarsi.backends.base import DEVICE_OOM, Backend, JobHandle, JobResult, JobSpec
from infrarsi.backends.local import LocalBackend

__all__ = ["DEVICE_OOM", "Backend", "JobHandle", "JobResult", "JobSpec", "LocalBackend", "make_backend"]


def make_backend(kind: str, state_root: Path) -> Backend:
    """The backend for a contract's ``backend.kind``; ``state_root`` holds its per-job files."""
    match kind:
        case "local":
            return LocalBackend(str(Path(state_root).absolute()))
        case "sim":
            from infrarsi.backends.sim import SimBackend  # imports the simulator only when asked for

            return SimBackend(str(Path(state_root).absolute()))
        case _:
            raise ValueError(f"backend {kind!r} is not available in this launcher")
