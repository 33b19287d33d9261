"""Build tests/data/kubernetes/api-schemas.json: the published API schemas the Kubernetes backend's manifests are
validated against in the tests (no network at test time).

Sources, both from PyPI (downloaded with ``pip download`` when no wheel paths are given):

- ``kubernetes-validate==1.37.0``: the JSON schemas of the Kubernetes API, v1.36.0 "local-strict" (generated
  from the API's OpenAPI document; unknown fields are errors). Kept: ``batch/v1 Job``, ``v1 Service`` and every
  definition they reach.
- ``kubeflow-training==1.9.4``: the Training Operator's SDK, whose models are generated from the operator's
  published OpenAPI document (v1.9.4). Each ``KubeflowOrgV1*`` model reachable from ``KubeflowOrgV1PyTorchJob``
  becomes a definition: its fields and types (``openapi_types``/``attribute_map``), the required ones (the
  setters that refuse ``None``), unknown fields refused; ``V1…`` types point at the Kubernetes definitions above.
  The enumerations the SDK states only in field descriptions (``restartPolicy``, ``cleanPodPolicy``) and the
  replica types (``REPLICA_TYPE_MASTER``/``WORKER`` in its constants) are added by hand, named below.

Run: ``python scripts/kubernetes_schemas.py [--kubernetes-validate WHEEL] [--kubeflow-training WHEEL]``.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

K8S_VALIDATE = "kubernetes-validate==1.37.0"
KUBEFLOW_TRAINING = "kubeflow-training==1.9.4"
K8S_VERSION = "v1.36.0-local-strict"
OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "kubernetes" / "api-schemas.json"
ROOTS = {"batch.v1.Job": "job-batch-v1.json", "v1.Service": "service-v1.json"}
"""Root definitions are named ``<apiVersion with / as .>.<kind>`` (a JSON pointer cannot hold ``/``)."""
BY_HAND = {
    ("KubeflowOrgV1ReplicaSpec", "restartPolicy"): ["Always", "OnFailure", "Never", "ExitCode"],
    ("KubeflowOrgV1RunPolicy", "cleanPodPolicy"): ["All", "Running", "None"],
}
"""Enumerations the SDK gives in the fields' descriptions ("One of Always, OnFailure, Never and ExitCode")."""


def wheel(requirement: str, given: str | None, into: Path) -> Path:
    if given:
        return Path(given)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", requirement, "-d", str(into)], check=True)
    name = requirement.split("==")[0].replace("-", "_")
    return next(into.glob(f"{name}-*.whl"))


def rewrite_refs(node: object) -> object:
    """``/api/_definitions.json#/$defs/X`` and ``#/$defs/X`` → ``#/$defs/X`` (one bundle)."""
    if isinstance(node, dict):
        return {k: ("#/$defs/" + v.rsplit("/", 1)[1] if k == "$ref" else rewrite_refs(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [rewrite_refs(v) for v in node]
    return node


def refs_in(node: object) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[1]} if "$ref" in node else set()
        return found.union(*(refs_in(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs_in(v) for v in node))
    return set()


def closure(defs: dict, start: set[str]) -> dict:
    keep: dict = {}
    todo = set(start)
    while todo:
        name = todo.pop()
        if name not in keep:
            keep[name] = defs[name]
            todo |= refs_in(defs[name])
    return keep


def kubernetes_defs(whl: Path) -> tuple[dict, dict]:
    base = f"kubernetes_validate/kubernetes-json-schema/{K8S_VERSION}/"
    with zipfile.ZipFile(whl) as z:
        defs = json.loads(z.read(base + "_definitions.json"))["$defs"]
        roots = {name: rewrite_refs(json.loads(z.read(base + file))) for name, file in ROOTS.items()}
    for root in roots.values():  # inside the bundle: their own $id would move the base of their refs
        root.pop("$id", None)
        root.pop("$schema", None)
    return defs, roots


def kubeflow_defs(whl: Path, k8s_defs: dict) -> dict:
    with zipfile.ZipFile(whl) as z:
        sources = {
            Path(n).stem: z.read(n).decode() for n in z.namelist() if n.startswith("kubeflow/training/models/")
        }
        constants_text = z.read("kubeflow/training/constants/constants.py").decode()

    def constant(name: str) -> str:
        value = re.search(rf'^{name} = f?"([^"]*)"', constants_text, re.MULTILINE)
        assert value is not None, name
        return re.sub(r"\{(\w+)\}", lambda m: constant(m.group(1)), value.group(1))

    def class_dict(source: str, name: str) -> dict:
        """A generated model's ``openapi_types``/``attribute_map`` literal (read, not imported: no SDK deps)."""
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
                return ast.literal_eval(node.value)
        raise KeyError(name)

    def k8s_name(type_name: str) -> str:
        if type_name == "Quantity":
            return "io.k8s.apimachinery.pkg.api.resource.Quantity"
        if m := re.fullmatch(r"K8sIoApi(\w+?)(V\d\w*?)([A-Z]\w*)", type_name):
            return f"io.k8s.api.{m.group(1).lower()}.{m.group(2).lower()}.{m.group(3)}"
        short = type_name.removeprefix("V1")
        for prefix in ("io.k8s.api.core.v1.", "io.k8s.apimachinery.pkg.apis.meta.v1."):
            if prefix + short in k8s_defs:
                return prefix + short
        raise KeyError(type_name)

    out: dict = {}

    def schema_of(type_name: str) -> dict:
        if type_name in ("str", "datetime"):
            return {"type": "string"}
        if type_name in ("int", "bool", "float"):
            return {"type": {"int": "integer", "bool": "boolean", "float": "number"}[type_name]}
        if type_name == "object":
            return {}
        if m := re.fullmatch(r"list\[(.+)\]", type_name):
            return {"type": "array", "items": schema_of(m.group(1))}
        if m := re.fullmatch(r"dict\(str, (.+)\)", type_name):
            return {"type": "object", "additionalProperties": schema_of(m.group(1))}
        if type_name.startswith("KubeflowOrgV1"):
            model(type_name)
            return {"$ref": f"#/$defs/{type_name}"}
        return {"$ref": f"#/$defs/{k8s_name(type_name)}"}

    def model(name: str) -> None:
        if name in out:
            return
        out[name] = {}
        module = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower().replace("v1_", "v1_")
        source = next(text for stem, text in sources.items() if stem.replace("_", "") == module.replace("_", ""))
        openapi_types, attribute_map = class_dict(source, "openapi_types"), class_dict(source, "attribute_map")
        required = re.findall(r"Invalid value for `(\w+)`, must not be `None`", source)
        props = {}
        for attr, type_name in openapi_types.items():
            key = attribute_map[attr]
            props[key] = schema_of(type_name)
            if enum := BY_HAND.get((name, key)):
                props[key]["enum"] = enum
        out[name] = {
            "type": "object",
            "properties": props,
            "required": sorted(attribute_map[a] for a in set(required)),
            "additionalProperties": False,
        }

    model(constant("PYTORCHJOB_MODEL"))
    job = out[constant("PYTORCHJOB_MODEL")]
    job["properties"]["apiVersion"]["enum"] = [constant("API_VERSION")]
    job["properties"]["kind"]["enum"] = [constant("PYTORCHJOB_KIND")]
    job["required"] = sorted({*job["required"], "apiVersion", "kind", "metadata", "spec"})
    replicas = out["KubeflowOrgV1PyTorchJobSpec"]["properties"]["pytorchReplicaSpecs"]
    replicas["propertyNames"] = {"enum": [constant("REPLICA_TYPE_MASTER"), constant("REPLICA_TYPE_WORKER")]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubernetes-validate")
    parser.add_argument("--kubeflow-training")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        k8s_defs, roots = kubernetes_defs(wheel(K8S_VALIDATE, args.kubernetes_validate, Path(tmp)))
        kubeflow = kubeflow_defs(wheel(KUBEFLOW_TRAINING, args.kubeflow_training, Path(tmp)), k8s_defs)
    needed = set().union(*(refs_in(r) for r in roots.values()), *(refs_in(d) for d in kubeflow.values()))
    defs = {k: rewrite_refs(v) for k, v in closure(k8s_defs, needed - set(kubeflow)).items()}
    bundle = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": (
            f"Generated by scripts/kubernetes_schemas.py from PyPI {K8S_VALIDATE} (Kubernetes API JSON schemas "
            f"{K8S_VERSION}) and {KUBEFLOW_TRAINING} (Kubeflow Training Operator OpenAPI models v1.9.4)."
        ),
        "$defs": {**defs, **kubeflow, **roots, "kubeflow.org.v1.PyTorchJob": {"$ref": "#/$defs/KubeflowOrgV1PyTorchJob"}},
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(bundle, indent=1, sort_keys=True) + "\n")
    print(f"{OUT}: {len(bundle['$defs'])} definitions")


if __name__ == "__main__":
    main()
