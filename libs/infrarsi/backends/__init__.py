"""Launcher backends: one small interface (``Backend``) and its implementations.

``make_backend`` picks one by the contract's ``backend.kind``; the verifier and doctor reuse the same
backends through this package. ``local`` runs real processes (on loopback, or one network namespace per
node); ``sim`` plays trials out on the analytic cluster simulator (``infrarsi.sim``, labelled as such);
``slurm`` submits batch jobs to a Slurm cluster; ``kubernetes`` creates a PyTorchJob or an indexed Job per trial
(untested against a live cluster; ``docs/backends.md``).
"""

from __future__ import annotations

from pathlib import Path

from infrarsi.backends.base import DEVICE_OOM, Backend, JobHandle, JobResult, JobSpec, SubmitError
from infrarsi.backends.local import LocalBackend
from infrarsi.runtime.settings import Settings
from infrarsi.study.contract import BackendSpec

__all__ = ["DEVICE_OOM", "Backend", "JobHandle", "JobResult", "JobSpec", "LocalBackend", "SubmitError", "backend_class", "make_backend"]


def backend_class(kind: str) -> type[Backend]:
    match kind:
        case "local":
            return LocalBackend
        case "sim":
            from infrarsi.backends.sim import SimBackend  # imports the simulator only when asked for

            return SimBackend
        case "slurm":
            from infrarsi.backends.slurm import SlurmBackend

            return SlurmBackend
        case "kubernetes":
            from infrarsi.backends.kubernetes import KubernetesBackend  # the client is imported in open()

            return KubernetesBackend
        case _:
            raise ValueError(f"backend {kind!r} is not available in this launcher")


def make_backend(
    kind: str, state_root: Path, options: BackendSpec | None = None, settings: Settings | None = None,
    *, data_dir: Path | None = None,
) -> Backend:  # fmt: skip
    """The backend for a contract's ``backend`` (``kind`` and its options); ``state_root`` holds its per-job files;
    ``settings``: the process's (the Slurm backend takes its ``sacct`` switch from them); ``data_dir``: the
    launcher's data directory (what a Kubernetes ``volume_claim`` holds)."""
    cls = backend_class(kind)
    owner = str(Path(state_root).absolute())
    if cls is LocalBackend:
        return LocalBackend(owner, netns=options.netns if options else None)
    if kind == "slurm":
        from infrarsi.backends.slurm import SlurmBackend

        completion = settings.slurm_sacct_completion if settings is not None else None
        return SlurmBackend(owner, options, sacct_completion=completion)
    if kind == "kubernetes":
        from infrarsi.backends.kubernetes import KubernetesBackend

        return KubernetesBackend(owner, options, data_dir=data_dir)
    if kind == "sim":
        from infrarsi.backends.sim import SimBackend

        return SimBackend(owner)
    raise ValueError(f"backend {kind!r} has no constructor call in make_backend")
