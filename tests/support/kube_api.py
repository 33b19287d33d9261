"""A real HTTP server speaking the Kubernetes API for the Kubernetes backend's tests (no cluster can run here).

It serves the requests the backend makes through the official ``kubernetes`` client, in the API's wire format:

- ``POST`` a ``PyTorchJob`` (``/apis/kubeflow.org/v1/namespaces/NS/pytorchjobs``), a ``Job``
  (``/apis/batch/v1/…/jobs``) or a ``Service`` (``/api/v1/…/services``): the body is validated against the
  bundled API schemas (``tests/data/kubernetes/api-schemas.json``; 422 ``Invalid`` as with strict field
  validation), a name taken answers 409 ``AlreadyExists``; the object gets a uid, a ``resourceVersion`` and a
  creation timestamp;
- ``GET`` an object (404 ``NotFound`` once deleted) or a list (``fieldSelector=metadata.name=…``,
  ``labelSelector=k=v``); ``GET …?watch=true&resourceVersion=N&timeoutSeconds=T`` streams the object's events
  after ``N`` as newline-delimited ``{"type", "object"}`` JSON over a chunked response, holding it open for new
  ones until the timeout; a ``resourceVersion`` older than the last ``compact()`` gets an ``ERROR`` event with
  a 410 ``Expired`` status, as after etcd compaction;
- ``DELETE`` an object (a ``DELETED`` event; its pods go with it); ``GET /api/v1/…/pods?labelSelector=`` and
  ``…/pods/NAME/log``.

What the cluster does with a job is the test's *story* for it (``Story``): the job's phases as the training
operator / job controller would write them into ``status`` (``Created`` → ``Running`` → ``Succeeded`` or
``Failed``), the pods' ends (exit code, ``OOMKilled``, a ``DisruptionTarget`` condition when a node is lost)
and their logs, and whether someone deletes the job from outside. Every request is kept in ``requests``.
The exchange is scripted from the API reference, not captured from a live cluster.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import jsonschema

SCHEMAS = json.loads((Path(__file__).parent.parent / "data" / "kubernetes" / "api-schemas.json").read_text())
TRIAL_LABEL = "infrarsi.dev/trial"
RESOURCES = {
    ("kubeflow.org/v1", "pytorchjobs"): "PyTorchJob",
    ("batch/v1", "jobs"): "Job",
    ("v1", "services"): "Service",
    ("v1", "pods"): "Pod",
}


@dataclass(frozen=True)
class PodEnd:
    exit_code: int = 0
    reason: str = "Completed"
    """The container's terminated reason: ``Completed``, ``Error``, ``OOMKilled``."""
    log: str = ""
    disruption: str | None = None
    """A ``DisruptionTarget`` condition's reason (``DeletionByTaintManager``: the node was lost)."""


@dataclass(frozen=True)
class Story:
    """What the cluster does with one job, step by step ``step_s`` apart."""

    ends: list[PodEnd] | None = None
    """One per pod; ``None``: the pods run until the job is deleted."""
    deleted_outside: bool = False
    """After running, someone else deletes the job (``kubectl delete``)."""
    run_s: float = 0.3
    log: str = "step 1 loss 2.0\n"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Cluster:
    """The objects, their event history, and the stories of the jobs to come (by trial label)."""

    stories: dict[str, Story] = field(default_factory=dict)
    default_story: Story = field(default_factory=lambda: Story(ends=[PodEnd()]))
    objects: dict[tuple[str, str, str], dict] = field(default_factory=dict)
    """(resource, namespace, name) → object."""
    events: list[tuple[int, str, str, dict]] = field(default_factory=list)
    """(resourceVersion, resource, type, object) in order."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    version: int = 100
    compacted: int = 0
    forbidden: set[str] = field(default_factory=set)
    """Resources (plurals) the client may not create: 403 Forbidden, as RBAC answers."""
    expired: list[int] = field(default_factory=list)
    """The resourceVersions watches were refused from (410)."""
    changed: threading.Condition = field(default_factory=threading.Condition)

    # ------------------------------------------------------------------ store

    def record(self, resource: str, kind: str, obj: dict) -> None:
        """Store ``obj`` at a new resourceVersion and append its event (call with ``changed`` held)."""
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        key = (resource, obj["metadata"]["namespace"], obj["metadata"]["name"])
        if kind == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj
        self.events.append((self.version, resource, kind, json.loads(json.dumps(obj))))
        self.changed.notify_all()

    def compact(self) -> None:
        """Every resourceVersion handed out so far becomes too old (as for a restarted API server whose watch
        cache starts after them): open watch streams end, and a watch from one of them gets 410 Expired."""
        with self.changed:
            self.version += 1  # the store's revision moves on; lists answer from it
            self.compacted = self.version
            self.changed.notify_all()

    def live(self, resource: str) -> list[dict]:
        with self.changed:
            return [o for (r, _, _), o in self.objects.items() if r == resource]

    # ------------------------------------------------------------------ the controllers, as the story says

    def play(self, resource: str, namespace: str, name: str) -> None:
        key = (resource, namespace, name)
        with self.changed:
            job = self.objects[key]
            story = self.stories.get(job["metadata"]["labels"].get(TRIAL_LABEL, ""), self.default_story)
        pods = self.pod_names(job)
        self.set_phase(key, "Created", None)
        time.sleep(0.05)
        started = now()
        with self.changed:
            for i, pod in enumerate(pods):
                self.record("pods", "ADDED", self.pod(job, pod, i, None, story))
        self.set_phase(key, "Running", None, start=started)
        deadline = time.monotonic() + story.run_s
        while (story.ends is None and not story.deleted_outside) or time.monotonic() < deadline:
            with self.changed:
                if key not in self.objects:
                    return  # deleted while running
                self.changed.wait(0.05)
        if story.deleted_outside:
            self.delete(resource, namespace, name)
            return
        ends = story.ends or []
        with self.changed:
            if key not in self.objects:
                return
            for i, pod in enumerate(pods):
                self.record("pods", "MODIFIED", self.pod(job, pod, i, ends[min(i, len(ends) - 1)], story))
        ok = all(e.exit_code == 0 and e.disruption is None for e in ends)
        failed = None if ok else next((e for e in ends if e.exit_code != 0), ends[0])
        self.set_phase(key, "Succeeded" if ok else "Failed", failed, start=started)

    def set_phase(self, key: tuple[str, str, str], phase: str, failed: PodEnd | None, start: str | None = None) -> None:
        """The job's status as the training operator (PyTorchJob) or the job controller (Job) writes it."""
        with self.changed:
            if key not in self.objects:
                return
            job = json.loads(json.dumps(self.objects[key]))
            status = job.setdefault("status", {})
            if start:
                status["startTime"] = start
            if job["kind"] == "PyTorchJob":
                conditions = status.setdefault("conditions", [])
                for c in conditions:
                    c["status"] = "False" if phase in ("Succeeded", "Failed") and c["type"] == "Running" else c["status"]
                message = f"PyTorchJob {job['metadata']['name']} is {phase.lower()}."
                if failed is not None:
                    message = f"PyTorchJob {job['metadata']['name']} is failed because 1 Master replica(s) failed."
                conditions.append({"type": phase, "status": "True", "reason": f"PyTorchJob{phase}", "message": message,
                                   "lastUpdateTime": now(), "lastTransitionTime": now()})  # fmt: skip
            else:
                nodes = job["spec"]["completions"]
                if phase == "Running":
                    status["active"] = nodes
                elif phase in ("Succeeded", "Failed"):
                    status.pop("active", None)
                    status["succeeded" if phase == "Succeeded" else "failed"] = nodes if phase == "Succeeded" else 1
                    kind, reason = ("Complete", "CompletionsReached") if phase == "Succeeded" else ("Failed", "BackoffLimitExceeded")
                    status["conditions"] = [{"type": kind, "status": "True", "reason": reason,
                                             "lastProbeTime": now(), "lastTransitionTime": now()}]  # fmt: skip
            if phase in ("Succeeded", "Failed"):
                status["completionTime"] = now()
            self.record(key[0], "MODIFIED", job)

    def pod_names(self, job: dict) -> list[str]:
        name = job["metadata"]["name"]
        if job["kind"] == "PyTorchJob":
            replicas = job["spec"]["pytorchReplicaSpecs"]
            workers = replicas.get("Worker", {}).get("replicas", 0)
            return [f"{name}-master-0", *(f"{name}-worker-{i}" for i in range(workers))]
        return [f"{name}-{i}-abcde" for i in range(job["spec"]["completions"])]

    def pod(self, job: dict, name: str, index: int, end: PodEnd | None, story: Story) -> dict:
        labels = dict(job["metadata"]["labels"])
        state: dict = {"running": {"startedAt": now()}}
        conditions = [{"type": "Ready", "status": "True"}]
        phase = "Running"
        if end is not None:
            phase = "Succeeded" if end.exit_code == 0 else "Failed"
            state = {"terminated": {"exitCode": end.exit_code, "reason": end.reason, "finishedAt": now()}}
            conditions = [{"type": "Ready", "status": "False"}]
            if end.disruption:
                conditions.append({"type": "DisruptionTarget", "status": "True", "reason": end.disruption,
                                   "message": "Taint manager: deleting due to NoExecute taint"})  # fmt: skip
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": job["metadata"]["namespace"], "labels": labels,
                         "uid": str(uuid.uuid4()), "creationTimestamp": now(),
                         "annotations": {"infrarsi.test/log": (end.log if end else "") or story.log}},  # fmt: skip
            "spec": {"containers": [{"name": "pytorch", "image": "x"}], "nodeName": f"node-{index}"},
            "status": {"phase": phase, "conditions": conditions,
                       "containerStatuses": [{"name": "pytorch", "ready": end is None, "restartCount": 0,
                                              "image": "x", "imageID": "", "state": state}]},  # fmt: skip
        }

    def delete(self, resource: str, namespace: str, name: str) -> dict | None:
        with self.changed:
            obj = self.objects.get((resource, namespace, name))
            if obj is None:
                return None
            self.record(resource, "DELETED", json.loads(json.dumps(obj)))
            if resource in ("pytorchjobs", "jobs"):  # the garbage collector takes the pods
                trial = obj["metadata"]["labels"].get(TRIAL_LABEL)
                for pod in [o for (r, ns, _), o in self.objects.items() if r == "pods" and ns == namespace]:
                    if pod["metadata"]["labels"].get(TRIAL_LABEL) == trial:
                        self.record("pods", "DELETED", json.loads(json.dumps(pod)))
            return obj


def status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip


def matches(obj: dict, query: dict[str, list[str]]) -> bool:
    for selector in query.get("fieldSelector", []):
        key, _, value = selector.partition("=")
        if key == "metadata.name" and obj["metadata"]["name"] != value:
            return False
    for selector in query.get("labelSelector", []):
        for term in selector.split(","):
            key, _, value = term.partition("=")
            if obj["metadata"].get("labels", {}).get(key) != value:
                return False
    return True


def route(path: str) -> tuple[str, str, str, str | None, str | None]:
    """``/apis/G/V/namespaces/NS/PLURAL[/NAME[/SUB]]`` or ``/api/v1/…`` → (apiVersion, namespace, plural, name, sub)."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        version, rest = parts[1], parts[2:]
    else:
        version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    if len(rest) < 3 or rest[0] != "namespaces":
        raise KeyError(path)
    return version, rest[1], rest[2], (rest[3] if len(rest) > 3 else None), (rest[4] if len(rest) > 4 else None)


@contextmanager
def kube_api(cluster: Cluster, tmp: Path) -> Iterator[Path]:
    """Serve ``cluster`` on a free port of 127.0.0.1; yields a kubeconfig file pointing at it."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def reply(self, code: int, body: dict | str) -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def handle_request(self, method: str) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            cluster.requests.append({"method": method, "path": url.path, "query": query, "body": body})
            try:
                version, namespace, plural, name, sub = route(url.path)
                kind = RESOURCES[(version, plural)]
            except KeyError:
                self.reply(404, status(404, "NotFound", f"the server could not find the requested resource {url.path}"))
                return
            match method, name, sub:
                case "POST", None, None:
                    self.create(version, kind, namespace, plural, body or {})
                case "GET", None, None if query.get("watch") == ["true"]:
                    self.watch(plural, query)
                case "GET", None, None:
                    items = [o for o in cluster.live(plural) if o["metadata"]["namespace"] == namespace and matches(o, query)]
                    self.reply(200, {"kind": f"{kind}List", "apiVersion": version, "items": items,
                                     "metadata": {"resourceVersion": str(cluster.version)}})  # fmt: skip
                case "GET", str(), "log":
                    pod = cluster.objects.get(("pods", namespace, name))
                    if pod is None:
                        self.reply(404, status(404, "NotFound", f'pods "{name}" not found'))
                    else:
                        self.reply(200, pod["metadata"]["annotations"]["infrarsi.test/log"])
                case "GET", str(), None:
                    obj = cluster.objects.get((plural, namespace, name))
                    if obj is None:
                        self.reply(404, status(404, "NotFound", f'{plural} "{name}" not found'))
                    else:
                        self.reply(200, obj)
                case "DELETE", str(), None:
                    obj = cluster.delete(plural, namespace, name)
                    if obj is None:
                        self.reply(404, status(404, "NotFound", f'{plural} "{name}" not found'))
                    else:
                        self.reply(200, obj)
                case _:
                    self.reply(405, status(405, "MethodNotAllowed", f"{method} {url.path}"))

        def create(self, version: str, kind: str, namespace: str, plural: str, body: dict) -> None:
            if plural in cluster.forbidden:
                group = version.rpartition("/")[0]
                self.reply(403, status(403, "Forbidden", f'{plural}.{group} is forbidden: User "test" cannot create '
                                                         f'resource "{plural}" in API group "{group}" in the namespace "{namespace}"'))  # fmt: skip
                return
            if body.get("apiVersion") != version or body.get("kind") != kind:
                self.reply(400, status(400, "BadRequest", f"expected {version} {kind}"))
                return
            schema = {"$ref": f"#/$defs/{version.replace('/', '.')}.{kind}", "$defs": SCHEMAS["$defs"]}
            errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(body), key=str)
            if errors:
                self.reply(422, status(422, "Invalid", f"{kind} is invalid: {errors[0].message}"))
                return
            name = body["metadata"]["name"]
            with cluster.changed:
                if (plural, namespace, name) in cluster.objects:
                    self.reply(409, status(409, "AlreadyExists", f'{plural}.{version} "{name}" already exists'))
                    return
                body["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now())
                cluster.record(plural, "ADDED", body)
            self.reply(201, body)
            if plural in ("pytorchjobs", "jobs"):
                threading.Thread(target=cluster.play, args=(plural, namespace, name), daemon=True).start()

        def watch(self, plural: str, query: dict[str, list[str]]) -> None:
            since = int(query.get("resourceVersion", ["0"])[0] or 0)
            deadline = time.monotonic() + float(query.get("timeoutSeconds", ["30"])[0])
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def send(event: dict) -> None:
                data = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            try:
                if since and since < cluster.compacted:
                    cluster.expired.append(since)
                    send({"type": "ERROR", "object": status(410, "Expired", f"too old resource version: {since} ({cluster.compacted})")})
                    return
                opened_after = cluster.compacted
                while time.monotonic() < deadline and cluster.compacted == opened_after:
                    with cluster.changed:
                        new = [(v, t, o) for v, r, t, o in cluster.events if v > since and r == plural and matches(o, query)]
                        if not new:
                            cluster.changed.wait(min(0.2, max(0.0, deadline - time.monotonic())))
                            continue
                    for v, kind, obj in new:
                        send({"type": kind, "object": obj})
                        since = v
            except (BrokenPipeError, ConnectionResetError):
                return
            finally:
                with contextlib.suppress(OSError):
                    self.wfile.write(b"0\r\n\r\n")  # the chunked stream's end: the watch timed out
                    self.wfile.flush()

        def do_GET(self) -> None:  # noqa: N802 — http.server's names
            self.handle_request("GET")

        def do_POST(self) -> None:  # noqa: N802
            self.handle_request("POST")

        def do_DELETE(self) -> None:  # noqa: N802
            self.handle_request("DELETE")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": "default"}}],
    }))  # fmt: skip
    try:
        yield kubeconfig
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
