"""The Kubernetes backend through the official client against a real HTTP server speaking the Kubernetes API.

No Kubernetes API server can run here: ``tests/support/kube_api.py`` serves the API's wire protocol (objects,
lists, chunked watch streams with resourceVersions and 410 Expired, deletes, pod logs) and plays each job's
story as the training operator / job controller would write it. The backend is UNTESTED against a live cluster.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from infrarsi.backends import JobSpec, make_backend
from infrarsi.backends.kubernetes import KubernetesBackend
from infrarsi.study.contract import BackendSpec
from support.backend_jobs import run_to_end
from support.kube_api import Cluster, PodEnd, Story, kube_api

pytest.importorskip("kubernetes", reason="the kubernetes extra is not installed")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Cluster, Path]]:
    cluster = Cluster()
    with kube_api(cluster, tmp_path) as kubeconfig:
        yield cluster, kubeconfig


def backend_for(kubeconfig: Path, state: Path, manifest: str = "pytorchjob", **options: object) -> KubernetesBackend:
    spec = BackendSpec(kind="kubernetes", namespace="ml", image="registry.example/train:1", manifest=manifest,
                       kubeconfig=str(kubeconfig), **options)  # type: ignore[arg-type]  # fmt: skip
    backend = make_backend("kubernetes", state, spec)
    assert isinstance(backend, KubernetesBackend)
    backend.open()
    return backend


def job(tmp: Path, name: str, *, nnodes: int = 1) -> JobSpec:
    return JobSpec(name=name, argv=[sys.executable, "train.py"], workdir=tmp / "wt" / name, env={"A": "1"},
                   state_dir=tmp / "state" / name, launcher="torchrun", nnodes=nnodes)  # fmt: skip


@pytest.mark.parametrize("manifest", ["pytorchjob", "job"])
def test_a_two_node_trial_is_created_watched_collected_and_deleted(
    cluster: tuple[Cluster, Path], tmp_path: Path, manifest: str
) -> None:
    api, kubeconfig = cluster
    api.stories["t1"] = Story(ends=[PodEnd(log="node 0 done\n"), PodEnd(log="node 1 done\n")], run_s=0.5)
    backend = backend_for(kubeconfig, tmp_path / "state", manifest, gpus_per_node=2)
    try:
        result = run_to_end(backend, backend.submit(job(tmp_path, "t1", nnodes=2)))
    finally:
        backend.close()
    assert result.exit_code == 0 and result.cancelled is None and not result.oom
    assert "node 0 done" in result.output_tail and "node 1 done" in result.output_tail
    assert result.accelerator_s is not None and result.accelerator_s >= 0, "priced from the job's own times"
    posts = [r for r in api.requests if r["method"] == "POST"]
    kinds = ["PyTorchJob"] if manifest == "pytorchjob" else ["Service", "Job"]
    assert [p["body"]["kind"] for p in posts] == kinds, "created as rendered (and accepted by the schema check)"
    watches = [r for r in api.requests if r["query"].get("watch") == ["true"]]
    assert watches and all(w["query"]["fieldSelector"] == [f"metadata.name={posts[-1]['body']['metadata']['name']}"]
                           for w in watches)  # fmt: skip
    deletes = {r["path"].rsplit("/", 2)[-2] for r in api.requests if r["method"] == "DELETE"}
    assert deletes == {"pytorchjobs"} if manifest == "pytorchjob" else {"jobs", "services"}
    assert api.live("pytorchjobs") == api.live("jobs") == api.live("services") == api.live("pods") == []


def test_a_failed_pod_gives_its_exit_code_and_log(cluster: tuple[Cluster, Path], tmp_path: Path) -> None:
    api, kubeconfig = cluster
    api.stories["bad"] = Story(ends=[PodEnd(exit_code=3, reason="Error", log="Traceback: boom\n")])
    backend = backend_for(kubeconfig, tmp_path / "state")
    try:
        result = run_to_end(backend, backend.submit(job(tmp_path, "bad")))
    finally:
        backend.close()
    assert result.exit_code == 3 and "Traceback: boom" in result.output_tail
    assert result.cancelled is None and result.infrastructure_failure is None


def test_oomkilled_is_an_oom(cluster: tuple[Cluster, Path], tmp_path: Path) -> None:
    api, kubeconfig = cluster
    api.stories["big"] = Story(ends=[PodEnd(exit_code=137, reason="OOMKilled")])
    backend = backend_for(kubeconfig, tmp_path / "state", "job")
    try:
        result = run_to_end(backend, backend.submit(job(tmp_path, "big")))
    finally:
        backend.close()
    assert result.oom and "OOMKilled" in result.oom_detail and result.exit_code == 137


def test_a_lost_node_is_an_infrastructure_failure(cluster: tuple[Cluster, Path], tmp_path: Path) -> None:
    api, kubeconfig = cluster
    api.stories["lost"] = Story(ends=[PodEnd(), PodEnd(exit_code=137, reason="Error", disruption="DeletionByTaintManager")])
    backend = backend_for(kubeconfig, tmp_path / "state")
    try:
        result = run_to_end(backend, backend.submit(job(tmp_path, "lost", nnodes=2)))
    finally:
        backend.close()
    assert result.infrastructure_failure is not None and "DeletionByTaintManager" in result.infrastructure_failure


def test_a_job_deleted_outside_infrarsi_is_cancelled_outside(cluster: tuple[Cluster, Path], tmp_path: Path) -> None:
    api, kubeconfig = cluster
    api.stories["gone"] = Story(deleted_outside=True)
    backend = backend_for(kubeconfig, tmp_path / "state")
    try:
        result = run_to_end(backend, backend.submit(job(tmp_path, "gone")))
    finally:
        backend.close()
    assert result.cancelled is not None and result.cancelled.startswith("cancelled outside InfraRSI")


def test_the_watch_resumes_after_410_expired(cluster: tuple[Cluster, Path], tmp_path: Path) -> None:
    """etcd compaction: the stream ends, the watch from the last resourceVersion gets ERROR 410; the backend
    re-reads the object and watches again from its new version, and still sees the job end."""
    api, kubeconfig = cluster
    api.stories["long"] = Story(ends=[PodEnd(log="finished\n")], run_s=1.5)
    backend = backend_for(kubeconfig, tmp_path / "state")
    try:
        handle = backend.submit(job(tmp_path, "long"))
        deadline = time.monotonic() + 30
        while not any(r["query"].get("watch") for r in api.requests):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        api.compact()
        result = run_to_end(backend, handle)
    finally:
        backend.close()
    assert result.exit_code == 0 and "finished" in result.output_tail
    assert api.expired, "a watch came back from before the compaction and was refused"
    resumed = [r for r in api.requests if r["query"].get("watch")][-1]["query"]["resourceVersion"][0]
    assert int(resumed) >= api.compacted, "after the 410 the backend watched from a fresh version"


def test_a_restarted_launcher_reattaches(cluster: tuple[Cluster, Path], tmp_path: Path) -> None:
    api, kubeconfig = cluster
    api.stories["again"] = Story(ends=[PodEnd(log="done after the restart\n")], run_s=1.0)
    first = backend_for(kubeconfig, tmp_path / "state")
    spec = job(tmp_path, "again")
    first.submit(spec)  # the launcher dies here: no cancel, no close
    second = backend_for(kubeconfig, tmp_path / "state")
    try:
        assert KubernetesBackend.survives_launcher and second.reap() == 0
        handle = second.attach(spec)
        assert handle is not None
        result = run_to_end(second, handle)
    finally:
        second.close()
    assert result.exit_code == 0 and "done after the restart" in result.output_tail
    assert len([r for r in api.requests if r["method"] == "POST"]) == 1, "the job was not submitted twice"
    assert second.attach(job(tmp_path, "never-submitted")) is None


def test_a_name_taken_is_a_submit_error(cluster: tuple[Cluster, Path], tmp_path: Path) -> None:
    from infrarsi.backends import SubmitError

    api, kubeconfig = cluster
    api.stories["dup"] = Story(ends=None)
    backend = backend_for(kubeconfig, tmp_path / "state")
    try:
        backend.submit(job(tmp_path, "dup"))
        with pytest.raises(SubmitError, match="409 .*already exists"):
            backend.submit(job(tmp_path / "other", "dup"))
    finally:
        backend.close()
    assert api.live("pytorchjobs") == []


def test_a_refused_job_leaves_no_service_behind(cluster: tuple[Cluster, Path], tmp_path: Path) -> None:
    """RBAC lets the launcher create Services but not Jobs: the submit fails saying so, and the Service it had
    made is deleted again."""
    from infrarsi.backends import SubmitError

    api, kubeconfig = cluster
    api.forbidden = {"jobs"}
    backend = backend_for(kubeconfig, tmp_path / "state", "job")
    try:
        with pytest.raises(SubmitError, match="403 .*cannot create resource \"jobs\""):
            backend.submit(job(tmp_path, "rbac"))
    finally:
        backend.close()
    assert [r["body"]["kind"] for r in api.requests if r["method"] == "POST"] == ["Service", "Job"]
    assert api.live("services") == [] and api.live("jobs") == []


def test_no_cluster_configuration_is_a_clear_error(tmp_path: Path) -> None:
    from infrarsi.backends import SubmitError

    options = BackendSpec(kind="kubernetes", image="i", kubeconfig=str(tmp_path / "missing-kubeconfig"))
    with pytest.raises(SubmitError, match="no usable cluster configuration"):
        make_backend("kubernetes", tmp_path / "state", options).open()


async def test_the_launcher_takes_kind_kubernetes_and_says_why_a_trial_cannot_start(tmp_path: Path) -> None:
    """Through the launcher service: a contract of kind kubernetes whose cluster cannot be reached ends its
    trial ``crash`` with the reason, nothing left running."""
    from infrarsi_services.launcher.service import LauncherService
    from test_launcher_helpers import make_workload, serving

    backend = {"kind": "kubernetes", "image": "registry.example/train:1", "kubeconfig": str(tmp_path / "nope")}
    async with serving(tmp_path, lambda h, url: LauncherService(h.data_dir, nats_url=url)) as h:
        study = await h.create_study(make_workload(tmp_path, backend=backend))
        trial = await h.propose(study, knobs={"knobs.mode": "ok"})
        finished = await h.wait_for(trial, "TrialFinished", timeout_s=60)
    assert finished.status == "crash" and "no usable cluster configuration" in finished.reason, finished


def visible_in_pod(path: Path, data_dir: Path, claim_mounts: list[dict]) -> bool:
    """Whether a pod with ``claim_mounts`` (mounts of the claim holding ``data_dir``) sees ``path``: a mount shows
    its ``subPath`` of the claim and everything under it; a mount without one shows the whole claim."""
    rel = path.relative_to(data_dir)
    for mount in claim_mounts:
        sub = Path(mount.get("subPath", ""))
        if sub == Path("") or sub == rel or sub in rel.parents:
            return True
    return False


async def test_a_trials_pods_mount_only_its_own_paths_of_the_data_directory(
    cluster: tuple[Cluster, Path], tmp_path: Path
) -> None:
    """Through the launcher service, with the data directory on a volume claim: every pod's mounts of the claim, as
    the API received them, are the trial's own worktree, probe directory and launch file, at their launcher
    paths; nothing of ``creds/`` (the services' seeds), the analyst database or the other trial's directory."""
    from infrarsi.bus import credentials
    from infrarsi_services.launcher.service import LauncherService
    from test_launcher_helpers import make_workload, serving

    api, kubeconfig = cluster
    backend = {"kind": "kubernetes", "image": "registry.example/train:1", "kubeconfig": str(kubeconfig),
               "volume_claim": "infrarsi-data"}  # fmt: skip
    async with serving(tmp_path, lambda h, url: LauncherService(h.data_dir, nats_url=url)) as h:
        data_dir = h.data_dir.absolute()
        credentials.ensure(data_dir)
        (data_dir / "reporter").mkdir(parents=True)
        (data_dir / "reporter" / "analyst.duckdb").write_bytes(b"the analyst's rows")
        study = await h.create_study(make_workload(tmp_path, backend=backend))
        trials = []
        for _ in range(2):  # the second trial runs beside the first one's directory
            trials.append(await h.propose(study, knobs={"knobs.mode": "ok"}))
            await h.wait_for(trials[-1], "TrialFinished", timeout_s=60)
    jobs = [r["body"] for r in api.requests if r["method"] == "POST" and r["body"]["kind"] == "PyTorchJob"]
    assert len(jobs) == 2, [r["path"] for r in api.requests if r["method"] == "POST"]
    secrets = [*(data_dir / "creds").iterdir(), data_dir / "reporter" / "analyst.duckdb"]
    assert any(p.name == "admin.nk" for p in secrets)
    for trial, body in zip(trials, jobs, strict=True):
        pod = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        claims = {v["name"] for v in pod["volumes"] if v["persistentVolumeClaim"]["claimName"] == "infrarsi-data"}
        mounts = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] in claims]
        tdir = data_dir / "launcher" / "trials" / trial
        assert {(m["mountPath"], m.get("readOnly", False)) for m in mounts} == {
            (str(tdir / "worktree"), False), (str(tdir / "probe"), False), (str(tdir / "launch.yaml"), True),
        }, mounts  # fmt: skip
        assert all(Path(m["mountPath"]) == data_dir / m["subPath"] for m in mounts), "each at its launcher path"
        other = next(t for t in trials if t != trial)
        for path in [*secrets, data_dir / "creds", *(data_dir / "launcher" / "trials" / other).rglob("*")]:
            assert not visible_in_pod(path, data_dir, mounts), f"trial {trial}'s pod sees {path}"
