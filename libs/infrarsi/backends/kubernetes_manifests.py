"""A trial as Kubernetes objects: a Kubeflow ``PyTorchJob``, or an indexed ``batch/v1 Job`` with a headless ``Service``.

Pure rendering (dicts in the API's wire format, no client import), so the manifests are validated in the tests
against the published API schemas (``tests/data/kubernetes/api-schemas.json``) and the backend
(``backends/kubernetes.py``) only sends them. What every pod gets:

- one container per node (``pytorch``: the name the training operator requires), ``restartPolicy: Never`` — a
  trial that failed is a result, never retried by the cluster (``backoffLimit: 0``);
- the command is the rank's argv with the launcher's interpreter replaced by the image's (``image_python``);
  ``torchrun`` jobs run one agent per pod with a c10d rendezvous on node 0's DNS name (``<name>-master-0`` for
  a PyTorchJob; ``<name>-0.<name>`` for the indexed Job, whose pods get that hostname through the headless
  Service): the rendezvous assigns ranks, so one pod template serves every node;
- the trial's own environment (what the launcher set for it, not the launcher's host environment), never
  through a shell: Kubernetes passes ``command`` as argv;
- of the shared volume (``volume_claim``, which holds the launcher's data directory), only the trial's own paths,
  each a ``subPath`` mounted at the same path as on the launcher (``volume_mounts``): its worktree and its
  writable directories (the probe directory, a verify run's checkpoint) read-write, its read-only inputs that lie
  on the claim (the launch file, a checkpoint to resume from, the workload's inputs) read-only — never the
  claim's root, so ``creds/``, the analyst database and the other trials' directories are not in the pod;
- labels ``infrarsi.dev/trial`` (to find the pods) and ``app.kubernetes.io/managed-by: infrarsi``, and the
  launcher's state root in the ``infrarsi.dev/owner`` annotation.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from infrarsi.backends.base import JobSpec, SubmitError
from infrarsi.backends.local import torchrun_argv
from infrarsi.study.contract import BackendSpec

Manifest = dict[str, Any]

TRIAL_LABEL = "infrarsi.dev/trial"
OWNER_ANNOTATION = "infrarsi.dev/owner"
MANAGED_BY = {"app.kubernetes.io/managed-by": "infrarsi"}
CONTAINER = "pytorch"
RDZV_PORT = 29400
PYTORCHJOB = ("kubeflow.org", "v1", "pytorchjobs")
"""Group, version and plural of the training operator's PyTorchJob."""
MAX_NAME = 45
"""Object names stay short enough for the operator's derived names (``<name>-worker-12``) to be DNS labels."""
VOLUME = "infrarsi-data"
"""The pod's name for the claim."""


class ManifestError(SubmitError):
    """The trial cannot be rendered as asked (a path it needs is not on the volume claim)."""


def object_name(trial: str) -> str:
    """A DNS-1035 label for ``trial`` (``irsi-<trial>``; shortened with a digest when it had to change)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", trial.lower()).strip("-")
    name = f"irsi-{slug}"
    if name == f"irsi-{trial}" and len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(trial.encode()).hexdigest()[:8]
    return f"irsi-{slug[: MAX_NAME - 14].strip('-')}-{digest}"


def label_value(trial: str) -> str:
    """``trial`` as a label value (63 characters of ``[A-Za-z0-9._-]``, alphanumeric at both ends)."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", trial)[:63].strip("-._")
    return value or "trial"


def trial_env(env: Mapping[str, str], host_env: Mapping[str, str]) -> list[dict[str, str]]:
    """The variables the launcher set for the trial: those that differ from its own host environment (a pod has
    the image's PATH, HOME…, not the launcher host's)."""
    return [{"name": k, "value": v} for k, v in sorted(env.items()) if host_env.get(k) != v]


def pod_command(spec: JobSpec, options: BackendSpec, rendezvous_host: str) -> list[str]:
    argv = list(spec.argv)
    if argv and Path(argv[0]).name.startswith("python"):
        argv[0] = options.image_python
    if spec.launcher == "python":
        return argv
    in_pod = JobSpec(**{**vars(spec), "argv": argv})
    return torchrun_argv(in_pod, None, f"{rendezvous_host}:{RDZV_PORT}")


def _on_claim(path: str, data_dir: Path) -> str | None:
    """``path``'s place on the claim (relative to the data directory it holds), or ``None`` when it is not on it."""
    normal, root = PurePosixPath(os.path.normpath(path)), PurePosixPath(os.path.normpath(data_dir))
    if normal == root or root in normal.parents:
        return str(normal.relative_to(root))
    return None


def volume_mounts(spec: JobSpec, data_dir: Path) -> list[Manifest]:
    """The claim's mounts of ``spec``: one ``subPath`` per path the trial may use, at its launcher path.

    The worktree and ``spec.writable`` are read-write and must lie on the claim (``ManifestError`` otherwise: the
    job would write where the launcher never reads); ``spec.read_only`` paths on the claim are read-only, those
    elsewhere are the image's business and not mounted. A path that is the claim's root is refused: it would put
    the whole data directory, ``creds/`` included, in the pod."""
    mounts: list[Manifest] = []
    seen: set[str] = set()
    paths = [(str(spec.workdir), True), *((p, True) for p in spec.writable), *((p, False) for p in spec.read_only)]
    for path, writable in paths:
        sub = _on_claim(path, data_dir)
        if sub is None:
            if writable:
                raise ManifestError(f"{path} is not on the volume claim (it holds the data directory {data_dir})")
            continue
        if sub == ".":
            raise ManifestError(f"{path} is the data directory itself: a pod must not mount the whole claim")
        mount_path = os.path.normpath(path)
        if mount_path in seen:
            continue
        seen.add(mount_path)
        mounts.append({"name": VOLUME, "mountPath": mount_path, "subPath": sub, **({} if writable else {"readOnly": True})})
    return mounts


def pod_template(
    spec: JobSpec, options: BackendSpec, owner: str, rendezvous_host: str, host_env: Mapping[str, str],
    data_dir: Path | None = None, **pod: Any,
) -> Manifest:  # fmt: skip
    """The pod every node of ``spec`` runs; ``pod`` adds fields to the pod spec (``subdomain``). ``data_dir`` is the
    launcher's data directory, which ``options.volume_claim`` holds (required with a claim)."""
    assert options.image is not None  # the contract requires it for kind kubernetes
    container: Manifest = {
        "name": CONTAINER,
        "image": options.image,
        "command": pod_command(spec, options, rendezvous_host),
        "workingDir": str(spec.workdir),
        "env": trial_env(spec.env, host_env),
        "ports": [{"name": "rdzv", "containerPort": RDZV_PORT}],
    }
    if options.gpus_per_node:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(options.gpus_per_node)}}
    pod_spec: Manifest = {"restartPolicy": "Never", "containers": [container], **pod}
    if options.volume_claim:
        if data_dir is None:
            raise ManifestError("volume_claim: the backend was not told which data directory the claim holds")
        container["volumeMounts"] = volume_mounts(spec, data_dir)
        pod_spec["volumes"] = [{"name": VOLUME, "persistentVolumeClaim": {"claimName": options.volume_claim}}]
    if options.service_account:
        pod_spec["serviceAccountName"] = options.service_account
    return {"metadata": {"labels": labels(spec)}, "spec": pod_spec}


def labels(spec: JobSpec) -> dict[str, str]:
    return {TRIAL_LABEL: label_value(spec.name), **MANAGED_BY}


def metadata(spec: JobSpec, options: BackendSpec, owner: str) -> Manifest:
    return {
        "name": object_name(spec.name),
        "namespace": options.namespace,
        "labels": labels(spec),
        "annotations": {OWNER_ANNOTATION: owner},
    }


def render_pytorchjob(
    spec: JobSpec, options: BackendSpec, owner: str, host_env: Mapping[str, str], data_dir: Path | None = None
) -> Manifest:
    """A Kubeflow ``PyTorchJob``: a ``Master`` pod and ``nnodes - 1`` ``Worker`` pods; ``cleanPodPolicy: None``
    keeps the ended pods (their exit codes and logs) until the backend deletes the job."""
    name = object_name(spec.name)
    template = pod_template(spec, options, owner, f"{name}-master-0", host_env, data_dir)
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if spec.nnodes > 1:
        replicas["Worker"] = {"replicas": spec.nnodes - 1, "restartPolicy": "Never", "template": template}
    group, version, _ = PYTORCHJOB
    return {
        "apiVersion": f"{group}/{version}",
        "kind": "PyTorchJob",
        "metadata": metadata(spec, options, owner),
        "spec": {
            "nprocPerNode": str(spec.nproc_per_node),
            "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": 0},
            "pytorchReplicaSpecs": replicas,
        },
    }


def render_indexed_job(
    spec: JobSpec, options: BackendSpec, owner: str, host_env: Mapping[str, str], data_dir: Path | None = None
) -> tuple[Manifest, Manifest]:
    """A headless ``Service`` and an indexed ``Job`` of ``nnodes`` pods, for clusters without the training
    operator: pod ``i`` is ``<name>-i.<name>`` in DNS (``subdomain``), node 0 hosts the rendezvous."""
    name = object_name(spec.name)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(spec, options, owner),
        "spec": {
            "clusterIP": "None",
            "selector": labels(spec),
            "publishNotReadyAddresses": True,  # node 0's name resolves before any readiness
            "ports": [{"name": "rdzv", "port": RDZV_PORT}],
        },
    }
    template = pod_template(spec, options, owner, f"{name}-0.{name}", host_env, data_dir, subdomain=name)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(spec, options, owner),
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.nnodes,
            "parallelism": spec.nnodes,
            "backoffLimit": 0,
            "template": template,
        },
    }
    return service, job


def render(
    spec: JobSpec, options: BackendSpec, owner: str, host_env: Mapping[str, str], data_dir: Path | None = None
) -> list[Manifest]:
    """Every object of the trial, in the order they are created (``ManifestError``: it cannot be rendered)."""
    if options.manifest == "pytorchjob":
        return [render_pytorchjob(spec, options, owner, host_env, data_dir)]
    return list(render_indexed_job(spec, options, owner, host_env, data_dir))
