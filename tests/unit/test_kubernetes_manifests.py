"""The Kubernetes backend's manifests, validated against the published API schemas.

``tests/data/kubernetes/api-schemas.json`` bundles the Kubernetes v1.36.0 strict JSON schemas (``Job``,
``Service`` and what they reach; from PyPI ``kubernetes-validate==1.37.0``) and the Kubeflow Training Operator's
``PyTorchJob`` (from the OpenAPI models of PyPI ``kubeflow-training==1.9.4``); ``scripts/kubernetes_schemas.py``
regenerates it. Unknown fields are errors, as with the API server's strict field validation.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from pathlib import Path

import jsonschema
import pytest
from infrarsi.backends import JobSpec
from infrarsi.backends.kubernetes_manifests import (
    MAX_NAME,
    OWNER_ANNOTATION,
    TRIAL_LABEL,
    ManifestError,
    object_name,
    render,
    render_indexed_job,
    render_pytorchjob,
    trial_env,
)
from infrarsi.study.contract import BackendSpec

SCHEMAS = json.loads((Path(__file__).parent.parent / "data" / "kubernetes" / "api-schemas.json").read_text())
HOST_ENV = {"PATH": "/usr/bin", "HOME": "/root", "SHARED": "same"}


def validate(manifest: dict) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``manifest`` is a valid object of its apiVersion and kind."""
    name = f"{manifest['apiVersion'].replace('/', '.')}.{manifest['kind']}"
    root = {"$ref": f"#/$defs/{name}", "$defs": SCHEMAS["$defs"]}
    jsonschema.Draft202012Validator(root).validate(manifest)


def spec(tmp: Path, *, nnodes: int = 2, launcher: str = "torchrun", name: str = "t-0001-ab") -> JobSpec:
    """A trial as the launcher submits it: worktree, probe directory and launch file in its own directory under
    the data directory (``tmp / "data"``, which the volume claim holds), one input off the claim."""
    tdir = tmp / "data" / "launcher" / "trials" / name
    return JobSpec(
        name=name, argv=[sys.executable, "train.py", "--launch", str(tdir / "launch.yaml")],
        workdir=tdir / "worktree", state_dir=tdir,
        env={**HOST_ENV, "INFRARSI_TRIAL_ID": name, "PATH": "/launcher/venv/bin"},
        launcher=launcher, nnodes=nnodes, nproc_per_node=4,  # type: ignore[arg-type]
        writable=[str(tdir / "probe")], read_only=[str(tdir / "launch.yaml"), "/datasets/tokens"],
        hidden=[str(tmp / "data")],
    )  # fmt: skip


OPTIONS = BackendSpec(kind="kubernetes", namespace="ml", image="registry.example/train:1", gpus_per_node=4,
                      volume_claim="shared-data", service_account="trainer")  # fmt: skip


@pytest.mark.parametrize("manifest", ["pytorchjob", "job"])
@pytest.mark.parametrize("nnodes", [1, 3])
def test_rendered_objects_are_valid_api_objects(tmp_path: Path, manifest: str, nnodes: int) -> None:
    options = OPTIONS.model_copy(update={"manifest": manifest})
    objects = render(spec(tmp_path, nnodes=nnodes), options, "/state", HOST_ENV, tmp_path / "data")
    assert [o["kind"] for o in objects] == (["PyTorchJob"] if manifest == "pytorchjob" else ["Service", "Job"])
    for obj in objects:
        validate(obj)
        assert obj["metadata"]["namespace"] == "ml" and obj["metadata"]["annotations"][OWNER_ANNOTATION] == "/state"


def test_a_pytorchjob_runs_one_agent_per_node_with_the_rendezvous_on_the_master(tmp_path: Path) -> None:
    job = render_pytorchjob(spec(tmp_path, nnodes=3), OPTIONS, "/state", HOST_ENV, tmp_path / "data")
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 2
    pod = replicas["Worker"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[:3] == ["python3", "-m", "torch.distributed.run"], "the image's interpreter, not the launcher's"
    assert command[command.index("--rdzv-endpoint") + 1] == "irsi-t-0001-ab-master-0:29400"
    assert command[command.index("--nnodes") + 1] == "3" and "--node-rank" not in command
    tdir = tmp_path / "data" / "launcher" / "trials" / "t-0001-ab"
    assert command[-3:] == ["train.py", "--launch", str(tdir / "launch.yaml")]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "4"}}
    # of the claim, only the trial's own paths, at their launcher paths; the input off the claim is not mounted
    assert container["volumeMounts"] == [
        {"name": "infrarsi-data", "mountPath": str(tdir / "worktree"), "subPath": "launcher/trials/t-0001-ab/worktree"},
        {"name": "infrarsi-data", "mountPath": str(tdir / "probe"), "subPath": "launcher/trials/t-0001-ab/probe"},
        {"name": "infrarsi-data", "mountPath": str(tdir / "launch.yaml"), "subPath": "launcher/trials/t-0001-ab/launch.yaml",
         "readOnly": True},
    ]  # fmt: skip
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": "shared-data"}
    assert container["env"] == [{"name": "INFRARSI_TRIAL_ID", "value": "t-0001-ab"},
                                {"name": "PATH", "value": "/launcher/venv/bin"}]  # fmt: skip
    assert job["spec"]["runPolicy"] == {"cleanPodPolicy": "None", "backoffLimit": 0}


def test_an_indexed_job_names_node_zero_through_its_headless_service(tmp_path: Path) -> None:
    service, job = render_indexed_job(spec(tmp_path, nnodes=2), OPTIONS, "/state", HOST_ENV, tmp_path / "data")
    assert service["spec"]["clusterIP"] == "None"
    pod = job["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["subdomain"] == service["metadata"]["name"] == "irsi-t-0001-ab"
    command = pod["spec"]["containers"][0]["command"]
    assert command[command.index("--rdzv-endpoint") + 1] == "irsi-t-0001-ab-0.irsi-t-0001-ab:29400"
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2


def test_a_python_job_runs_its_argv_as_the_command_with_no_shell(tmp_path: Path) -> None:
    job = render_pytorchjob(spec(tmp_path, nnodes=1, launcher="python"), OPTIONS, "/state", HOST_ENV, tmp_path / "data")
    command = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
    tdir = tmp_path / "data" / "launcher" / "trials" / "t-0001-ab"
    assert command == ["python3", "train.py", "--launch", str(tdir / "launch.yaml")]


@pytest.mark.parametrize("trial", ["t-0001-ab", "Trial_7.b", "x" * 80])
def test_object_names_are_dns_labels(tmp_path: Path, trial: str) -> None:
    name = object_name(trial)
    assert len(name) <= MAX_NAME and name == name.lower()
    job = render_pytorchjob(spec(tmp_path, name=trial), OPTIONS, "/state", HOST_ENV, tmp_path / "data")
    validate(job)
    assert job["metadata"]["labels"][TRIAL_LABEL]
    assert object_name(trial) != object_name(trial + "x"), "distinct trials, distinct objects"


@pytest.mark.parametrize(
    ("path", "value", "complaint"),
    [
        (("spec", "pytorchReplicaSpecs", "Chief"), {"replicas": 1}, "Chief"),
        (("spec", "runPolicy", "cleanPodPolicy"), "Never", "Never"),
        (("spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers", 0, "cmd"), ["x"], "cmd"),
        (("spec", "pytorchReplicaSpecs", "Master", "replicas"), "1", "'1' is not of type 'integer'"),
    ],
)
def test_the_schemas_refuse_what_the_api_would(tmp_path: Path, path: tuple, value: object, complaint: str) -> None:
    """The validation can fail: an unknown replica type, a bad enum value, an unknown field, a wrong type."""
    job = copy.deepcopy(render_pytorchjob(spec(tmp_path), OPTIONS, "/state", HOST_ENV, tmp_path / "data"))
    node = job
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError, match=complaint):
        validate(job)


def test_a_job_without_its_template_is_refused(tmp_path: Path) -> None:
    _, job = render_indexed_job(spec(tmp_path), OPTIONS, "/state", HOST_ENV, tmp_path / "data")
    del job["spec"]["template"]
    with pytest.raises(jsonschema.ValidationError, match="'template' is a required property"):
        validate(job)


def test_the_trial_environment_leaves_the_launcher_hosts_out() -> None:
    assert trial_env({"PATH": "/usr/bin", "A": "1"}, {"PATH": "/usr/bin"}) == [{"name": "A", "value": "1"}]


def test_the_contract_takes_kubernetes_options_and_refuses_bad_ones() -> None:
    assert BackendSpec(kind="kubernetes", image="i", manifest="job").manifest == "job"
    with pytest.raises(ValueError, match="needs an image"):
        BackendSpec(kind="kubernetes")
    with pytest.raises(ValueError, match="not a Kubernetes name"):
        BackendSpec(kind="kubernetes", image="i", namespace="My_NS")
    with pytest.raises(ValueError, match="image do not apply to backend kind slurm"):
        BackendSpec(kind="slurm", image="i")


def test_a_pod_never_mounts_the_claims_root_or_a_writable_path_off_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    whole = dataclasses.replace(spec(tmp_path), read_only=[str(data)])
    with pytest.raises(ManifestError, match="is the data directory itself"):
        render(whole, OPTIONS, "/state", HOST_ENV, data)
    elsewhere = dataclasses.replace(spec(tmp_path), workdir=tmp_path / "scratch" / "worktree")
    with pytest.raises(ManifestError, match="is not on the volume claim"):
        render(elsewhere, OPTIONS, "/state", HOST_ENV, data)
    with pytest.raises(ManifestError, match="was not told which data directory"):
        render(spec(tmp_path), OPTIONS, "/state", HOST_ENV)
    # a path that only looks inside (``..``) is judged by where it leads
    sneaky = dataclasses.replace(spec(tmp_path), read_only=[str(data / "launcher" / "trials" / ".." / "..")])
    with pytest.raises(ManifestError, match="is the data directory itself"):
        render(sneaky, OPTIONS, "/state", HOST_ENV, data)
