"""The ``kubernetes`` backend: each trial is a Kubeflow ``PyTorchJob`` (or an indexed ``Job`` + headless ``Service``).

UNTESTED AGAINST A LIVE CLUSTER: the tests run it against a real HTTP server speaking the Kubernetes API from a
script (``tests/support/kube_api.py``), with the manifests validated against the published API schemas.

Through the official ``kubernetes`` client (the ``kubernetes`` extra; imported in ``open``, so the core never
needs it):

- submit: create the objects ``kubernetes_manifests.render`` makes (of the volume claim, the pods mount only the
  trial's own paths); ``<state_dir>/kubernetes.json`` records them, so a restarted launcher re-attaches
  (``attach``) instead of abandoning the job;
- follow: one thread per job watches the job object (``watch=true`` from the last ``resourceVersion``,
  re-listing after a 410 ``Expired`` or a dropped stream) until the operator / job controller marks it
  ``Succeeded``/``Complete`` or ``Failed``, or it is deleted;
- collect: the pods' ends (exit codes, ``OOMKilled``, ``DisruptionTarget`` conditions) and their log tails,
  then the objects are deleted (their pods with them); probe files are read by the launcher from the shared
  volume as for every backend;
- cancel: the reason is kept in ``<state_dir>/cancel.json`` (the first one wins, a restarted launcher still knows
  it was ours), the pods' logs are kept, and the objects are deleted.

Facts, for the launcher to turn into statuses: ``OOMKilled`` or a CUDA OOM in the logs → ``oom``; a pod ended by
the infrastructure (``DisruptionTarget``: node lost, preempted, evicted) → ``infrastructure_failure``; the job
deleted by anyone but this backend → cancelled ``cancelled outside InfraRSI``. The cost is the cluster's
(``startTime`` → ``completionTime`` × GPUs, or × ranks on CPU pods), not the launcher's clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from infrarsi.backends.base import (
    JobHandle,
    JobResult,
    JobSpec,
    ScheduledBackend,
    SubmitError,
    device_oom_detail,
)
from infrarsi.backends.kubernetes_manifests import (
    CONTAINER,
    PYTORCHJOB,
    TRIAL_LABEL,
    Manifest,
    label_value,
    render,
)
from infrarsi.backends.local import TAIL_BYTES
from infrarsi.study.contract import BackendSpec

WATCH_TIMEOUT_S = 30
"""Each watch request ends after this long and is renewed from the last resourceVersion."""
LOG_LINES = 200
INFRASTRUCTURE_REASONS = {"DeletionByTaintManager", "PreemptionByScheduler", "EvictionByEvictionAPI",
                          "TerminationByKubelet", "DeletionByPodGC"}  # fmt: skip
"""``DisruptionTarget`` reasons: the pod was ended by the cluster, not by what it ran."""


@dataclass(frozen=True)
class JobState:
    """What the job object's status says."""

    ended: bool
    succeeded: bool = False
    reason: str = ""
    started: str | None = None
    completed: str | None = None


def job_state(obj: Mapping[str, Any]) -> JobState:
    """A ``PyTorchJob``'s (conditions ``Succeeded``/``Failed``) or a ``Job``'s (``Complete``/``Failed``) status."""
    status = obj.get("status") or {}
    true = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
    ends = [c for c in true if c.get("type") in ("Succeeded", "Complete", "Failed")]
    if not ends:
        return JobState(False, started=status.get("startTime"))
    last = ends[-1]
    return JobState(
        True,
        succeeded=last["type"] != "Failed",
        reason=f"{last.get('reason', '')}: {last.get('message', '')}".strip(": "),
        started=status.get("startTime"),
        completed=status.get("completionTime"),
    )


@dataclass(frozen=True)
class PodEnd:
    """One pod as collected: its container's end and its log tail."""

    name: str
    exit_code: int | None
    reason: str
    disruption: str | None
    log: str


def pod_end(pod: Mapping[str, Any], log: str) -> PodEnd:
    status = pod.get("status") or {}
    exit_code, reason = None, status.get("reason") or ""
    for container in status.get("containerStatuses") or []:
        if container.get("name") == CONTAINER and (terminated := (container.get("state") or {}).get("terminated")):
            exit_code, reason = terminated.get("exitCode"), terminated.get("reason") or reason
    disruption = next(
        (c.get("reason") for c in status.get("conditions") or []
         if c.get("type") == "DisruptionTarget" and c.get("status") == "True"),
        None,
    )  # fmt: skip
    if disruption is None and status.get("reason") in ("Evicted", "NodeLost", "Preempting"):
        disruption = status["reason"]
    return PodEnd(pod["metadata"]["name"], exit_code, reason, disruption, log)


def seconds_between(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    return (_timestamp(end) - _timestamp(start)).total_seconds()


def _timestamp(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))  # RFC 3339 as the API writes it


@dataclass
class _KubeJob:
    name: str
    state: JobState = field(default_factory=lambda: JobState(False))
    deleted: bool = False
    ended_at: float | None = None
    error: str | None = None
    objects: list[Manifest] = field(default_factory=list)
    """The trial's objects, in creation order (the job object last)."""
    watcher: threading.Thread | None = None


class KubernetesBackend(ScheduledBackend):
    """Trials as Kubernetes objects. ``owner`` is the launcher's state root (annotated on every object)."""

    name = "kubernetes"
    record_name = "kubernetes.json"

    def __init__(
        self, owner: str, options: BackendSpec | None, *, host_env: Mapping[str, str] | None = None,
        data_dir: Path | None = None,
    ) -> None:  # fmt: skip
        if options is None or options.kind != "kubernetes":
            raise ValueError("the kubernetes backend needs the contract's backend options (kind kubernetes, image)")
        self.owner = owner
        self.options = options
        self.data_dir = data_dir
        """The launcher's data directory: what ``options.volume_claim`` holds (a pod mounts only its trial's paths
        of it, ``kubernetes_manifests.volume_mounts``)."""
        self.host_env = dict(os.environ if host_env is None else host_env)
        """The launcher's own environment: a pod gets only the variables the trial's differ in."""
        self._client: Any = None
        self._live: dict[str, JobHandle] = {}
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- lifecycle

    def open(self) -> None:
        try:
            from kubernetes import client, config
        except ImportError:
            raise SubmitError("backend kind kubernetes needs the kubernetes client: pip install 'infrarsi[kubernetes]'") from None
        try:
            if self.options.kubeconfig:
                self._client = config.new_client_from_config(config_file=os.path.expanduser(self.options.kubeconfig))
            else:
                try:
                    configuration = client.Configuration()
                    config.load_incluster_config(client_configuration=configuration)
                    self._client = client.ApiClient(configuration)
                except config.ConfigException:  # not in a pod: the user's kubeconfig
                    self._client = config.new_client_from_config()
        except (config.ConfigException, OSError, ValueError) as exc:
            raise SubmitError(f"backend kind kubernetes: no usable cluster configuration: {exc}") from None

    def live_jobs(self) -> list[JobHandle]:
        with self._lock:
            return list(self._live.values())

    def close(self) -> None:
        super().close()
        if self._client is not None:
            self._client.close()

    # ---------------------------------------------------------------- jobs

    def submit(self, spec: JobSpec) -> JobHandle:
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("cancel.json", "pods.json"):  # a previous life of the same trial directory
            (spec.state_dir / stale).unlink(missing_ok=True)
        started = time.time()
        manifests = render(spec, self.options, self.owner, self.host_env, self.data_dir)
        created: list[Manifest] = []
        try:
            for manifest in manifests:
                self._call("create", manifest)
                created.append(manifest)
        except SubmitError:
            for manifest in created:  # nothing half-made stays behind
                self._delete(manifest)
            raise
        self.record_submitted(spec, {"started_at": started, "objects": manifests})
        return self._follow(spec, started, manifests)

    def attach(self, spec: JobSpec) -> JobHandle | None:
        if (record := self.submitted(spec)) is None:
            return None
        if self._get(record["objects"][-1]) is None:
            return None  # the cluster has forgotten it
        return self._follow(spec, float(record["started_at"]), record["objects"])

    def poll(self, handle: JobHandle) -> bool:
        return handle.private.ended_at is not None

    def cancel(self, handle: JobHandle, reason: str) -> None:
        job: _KubeJob = handle.private
        self.note_cancel(handle, reason)
        if job.ended_at is None:
            self._keep_pods(handle)  # their logs go with them
            for manifest in handle.private.objects:
                self._delete(manifest)
            if job.watcher is not None:
                job.watcher.join(timeout=60)

    def collect(self, handle: JobHandle) -> JobResult:
        job: _KubeJob = handle.private
        spec = handle.spec
        if job.watcher is not None:
            job.watcher.join(timeout=60)
        pods = self._keep_pods(handle) if not job.deleted else self._kept_pods(spec)
        for manifest in handle.private.objects:
            self._delete(manifest)
        with self._lock:
            self._live.pop(spec.name, None)
        output = "\n".join(f"--- pod {p.name} ---\n{p.log}" if len(pods) > 1 else p.log for p in pods)
        ours = self.cancel_note(spec)
        kind = handle.private.objects[-1]["kind"]
        cancelled = None
        if ours is not None:
            cancelled = str(ours["reason"])
        elif job.deleted and not job.state.ended:
            cancelled = f"cancelled outside InfraRSI: {kind} {job.name} was deleted"
        elif job.error is not None:
            cancelled = f"lost the job: {job.error}"
        oom = next((p for p in pods if p.reason == "OOMKilled"), None)
        oom_detail = f"pod {oom.name} OOMKilled (exit {oom.exit_code})" if oom else ""
        oom_detail = oom_detail or device_oom_detail(output)
        disrupted = next((p for p in pods if p.disruption), None)
        codes = [p.exit_code for p in pods if p.exit_code is not None]
        exit_code = next((c for c in codes if c != 0), 0) if codes else None
        elapsed = seconds_between(job.state.started, job.state.completed)
        devices = (self.options.gpus_per_node * spec.nnodes) or spec.ranks
        return JobResult(
            exit_code=exit_code,
            wall_s=(job.ended_at or time.time()) - handle.started_at,
            oom=bool(oom_detail),
            oom_detail=oom_detail,
            cancelled=cancelled,
            output_tail=output[-TAIL_BYTES:],
            accelerator_s=elapsed * devices if elapsed is not None else None,
            infrastructure_failure=(
                f"pod {disrupted.name} ended by the cluster ({disrupted.disruption})" if disrupted else None
            ),
        )

    # ---------------------------------------------------------------- following

    def _follow(self, spec: JobSpec, started: float, manifests: list[Manifest]) -> JobHandle:
        main = manifests[-1]
        job = _KubeJob(main["metadata"]["name"], objects=manifests)
        handle = JobHandle(
            job_id=f"{main['kind']}/{main['metadata']['namespace']}/{job.name}", spec=spec, host="kubernetes",
            command=_command_of(main), started_at=started, private=job,
        )  # fmt: skip
        job.watcher = threading.Thread(target=self._watch, args=(handle,), name=f"watch-{job.name}", daemon=True)
        job.watcher.start()
        with self._lock:
            self._live[spec.name] = handle
        return handle

    def _watch(self, handle: JobHandle) -> None:
        """Follow the job object until it ends or is deleted: list it, then watch from the list's resourceVersion."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        job: _KubeJob = handle.private
        main = handle.private.objects[-1]
        selector = f"metadata.name={job.name}"
        version: str | None = None
        failures = 0
        while job.ended_at is None:
            try:
                if version is None:  # list: the object now, and the version to watch from
                    listing = self._client.sanitize_for_serialization(
                        self._list_function(main)(**self._list_args(main), field_selector=selector)
                    )
                    if not listing["items"]:
                        self._observe(job, "DELETED", None)
                        return
                    version = listing["metadata"]["resourceVersion"]
                    self._observe(job, "MODIFIED", listing["items"][0])
                    continue
                stream = watch.Watch()
                for event in stream.stream(
                    self._list_function(main), **self._list_args(main),
                    field_selector=selector, resource_version=version,
                    timeout_seconds=WATCH_TIMEOUT_S, allow_watch_bookmarks=True,
                ):  # fmt: skip
                    obj = event["raw_object"]
                    version = obj["metadata"].get("resourceVersion", version)
                    if event["type"] != "BOOKMARK":
                        self._observe(job, event["type"], obj)
                    if job.ended_at is not None:
                        stream.stop()
                failures = 0
            except ApiException as exc:
                version = None  # 410 Expired (compaction) and the rest: re-read the object, then watch again
                failures += 1
                if exc.status != 410 and failures >= 10:
                    job.error = f"{exc.status} {exc.reason}"
                    job.ended_at = time.time()
                    return
                time.sleep(min(5.0, 0.2 * failures))
            except OSError as exc:  # the connection dropped (urllib3's errors are OSErrors)
                version = None
                failures += 1
                if failures >= 10:
                    job.error = f"{type(exc).__name__}: {exc}"
                    job.ended_at = time.time()
                    return
                time.sleep(min(5.0, 0.2 * failures))

    def _observe(self, job: _KubeJob, event: str, obj: Mapping[str, Any] | None) -> None:
        if event == "DELETED":
            job.deleted = True
        elif obj is not None:
            job.state = job_state(obj)
        if job.deleted or job.state.ended:
            job.ended_at = job.ended_at or time.time()

    # ---------------------------------------------------------------- pods

    def _keep_pods(self, handle: JobHandle) -> list[PodEnd]:
        """The trial's pods as they are now (ends and log tails), also written to ``<state_dir>/pods.json``."""
        from kubernetes import client

        core = client.CoreV1Api(self._client)
        namespace = self.options.namespace
        selector = f"{TRIAL_LABEL}={label_value(handle.spec.name)}"
        try:
            items = self._client.sanitize_for_serialization(
                core.list_namespaced_pod(namespace, label_selector=selector)
            )["items"]
        except Exception:  # noqa: BLE001 — an unreachable API leaves what was kept before
            return self._kept_pods(handle.spec)
        ends = []
        for pod in sorted(items, key=lambda p: p["metadata"]["name"]):
            try:
                log = core.read_namespaced_pod_log(pod["metadata"]["name"], namespace, container=CONTAINER,
                                                   tail_lines=LOG_LINES)  # fmt: skip
            except Exception as exc:  # noqa: BLE001 — a pod that never started has no log
                log = f"(no log: {exc})"
            ends.append(pod_end(pod, log))
        if ends:
            (handle.spec.state_dir / "pods.json").write_text(json.dumps([vars(e) for e in ends]))
        return ends or self._kept_pods(handle.spec)

    @staticmethod
    def _kept_pods(spec: JobSpec) -> list[PodEnd]:
        return [PodEnd(**p) for p in (_read_json_list(spec.state_dir / "pods.json"))]

    # ---------------------------------------------------------------- the API

    def _apis(self) -> tuple[Any, Any, Any]:
        from kubernetes import client

        return client.CustomObjectsApi(self._client), client.BatchV1Api(self._client), client.CoreV1Api(self._client)

    def _call(self, verb: str, manifest: Manifest) -> Any:
        """``create``/``get``/``delete`` one of the trial's objects; an API error → ``SubmitError`` (with status)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        custom, batch, core = self._apis()
        namespace, name, kind = manifest["metadata"]["namespace"], manifest["metadata"]["name"], manifest["kind"]
        group, version, plural = PYTORCHJOB
        calls: dict[tuple[str, str], Callable[[], Any]] = {
            ("create", "PyTorchJob"): lambda: custom.create_namespaced_custom_object(group, version, namespace, plural, manifest),
            ("get", "PyTorchJob"): lambda: custom.get_namespaced_custom_object(group, version, namespace, plural, name),
            ("delete", "PyTorchJob"): lambda: custom.delete_namespaced_custom_object(
                group, version, namespace, plural, name, propagation_policy="Background"),
            ("create", "Job"): lambda: batch.create_namespaced_job(namespace, client.V1Job.from_dict(manifest)),
            ("get", "Job"): lambda: batch.read_namespaced_job(name, namespace),
            ("delete", "Job"): lambda: batch.delete_namespaced_job(name, namespace, propagation_policy="Background"),
            ("create", "Service"): lambda: core.create_namespaced_service(namespace, client.V1Service.from_dict(manifest)),
            ("get", "Service"): lambda: core.read_namespaced_service(name, namespace),
            ("delete", "Service"): lambda: core.delete_namespaced_service(name, namespace),
        }  # fmt: skip
        try:
            return self._client.sanitize_for_serialization(calls[(verb, kind)]())
        except ApiException as exc:
            raise _ApiError(exc.status, f"{verb} {kind} {namespace}/{name}: {exc.status} {_api_message(exc)}") from None
        except OSError as exc:
            raise _ApiError(None, f"{verb} {kind} {namespace}/{name}: the API server is unreachable: {exc}") from None

    def _get(self, manifest: Manifest) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self._call("get", manifest)  # the object, serialised to JSON types
            return found
        except _ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _delete(self, manifest: Manifest) -> None:
        with contextlib.suppress(_ApiError):  # already gone (404), or the API is away: nothing more to do here
            self._call("delete", manifest)

    def _list_function(self, manifest: Manifest) -> Callable[..., Any]:
        custom, batch, _ = self._apis()
        function: Callable[..., Any] = (
            custom.list_namespaced_custom_object if manifest["kind"] == "PyTorchJob" else batch.list_namespaced_job
        )
        return function

    def _list_args(self, manifest: Manifest) -> dict[str, str]:
        namespace = manifest["metadata"]["namespace"]
        if manifest["kind"] == "PyTorchJob":
            group, version, plural = PYTORCHJOB
            return {"group": group, "version": version, "namespace": namespace, "plural": plural}
        return {"namespace": namespace}


class _ApiError(SubmitError):
    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status


def _command_of(manifest: Manifest) -> list[str]:
    spec = manifest["spec"]
    template = spec["template"] if "template" in spec else spec["pytorchReplicaSpecs"]["Master"]["template"]
    return list(template["spec"]["containers"][0]["command"])


def _api_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.reason)


def _read_json_list(path: Path) -> list[dict[str, Any]]:
    try:
        return list(json.loads(path.read_text()))
    except (OSError, ValueError):
        return []
