"""Contract loading and validation: every rule of infrarsi.study.contract with a contract that breaks it."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from infrarsi import events as ev
from infrarsi.study.contract import (
    Contract,
    ContractError,
    contract_from_dict,
    contract_json_schema,
    load_contract,
    load_patch_library,
    locked_contract,
)
from infrarsi.verdicts.policy import Policy
from pydantic import ValidationError

LAUNCH = {
    "model": {"n_layer": 2, "d_model": 64},
    "run": {"steps": 30, "global_batch_size": 32, "seed": 1},
    "knobs": {"micro_batch_size": 4, "attention": "manual", "compile": False, "intra_op_threads": 2},
}

INDEX = {
    "patches": [
        {
            "id": "fused-qkv",
            "description": "one GEMM for q, k, v",
            "files": ["model.py"],
            "risk": "low",
            "kind": "speedup",
            "time_log_ratio": {"mean": -0.05, "std": 0.05},
            "memory_log_ratio": {"mean": 0.0, "std": 0.02},
        },
        {
            "id": "skip-steps",
            "description": "claims steps it did not take",
            "files": ["train.py"],
            "risk": "high",
            "kind": "reward_hack",
            "breaks": "work.optimizer_steps",
        },
    ]
}

CONTRACT: dict[str, Any] = {
    "name": "dense-1node",
    "goal": "faster, same learning",
    "workload": {
        "repo": "wl",
        "command": ["{python}", "train.py", "--launch", "{launch_file}"],
        "launch_file": "launch/dense.yaml",
        "launcher": {"kind": "python", "nnodes": 1, "nproc_per_node": 1},
        "env": {"OMP_NUM_THREADS": "2"},
        "steps": 30,
        "steps_key": "run.steps",
        "verify_steps": 60,
        "patch_dir": "patches",
    },
    "cluster": {
        "id": "local-cpu",
        "accelerator": "cpu",
        "nodes": 1,
        "devices_per_node": 1,
        "memory_capacity_bytes": 4_000_000_000,
        "peak_flops": None,
        "interconnect": "loopback",
    },
    "backend": {"kind": "local", "parallel": 1, "timeout_s": 300},
    "scope": {
        "files": ["model.py", "train.py", "kernels/**/*.py"],
        "launch_keys": [
            "knobs.micro_batch_size",
            "knobs.attention",
            "knobs.compile",
            "knobs.intra_op_threads",
            "knobs.capacity",
        ],
    },
    "search_space": {
        "knobs": {
            "knobs.micro_batch_size": {"type": "int", "choices": [1, 2, 4, 8, 16, 32]},
            "knobs.attention": {"type": "choice", "choices": ["manual", "sdpa"]},
            "knobs.compile": {"type": "bool"},
            "knobs.intra_op_threads": {"type": "int", "low": 1, "high": 2},
            "knobs.capacity": {"type": "float", "low": 1.0, "high": 2.0},
        },
        "constraints": {
            "global_batch": {
                "size": 32,
                "micro_batch_key": "knobs.micro_batch_size",
                "data_parallel": 1,
                "size_key": "run.global_batch_size",
            }
        },
        "patches": ["fused-qkv", "skip-steps"],
    },
    "invariants": {
        "loss": {"tolerance": 0.02, "mode": "relative", "at": "every_eval"},
        "steps": True,
        "tokens": True,
        "eval": True,
        "timing_tolerance": 0.1,
    },
    "budget": {"trials": 20, "accelerator_hours": 1.0, "repeats_per_trial": 1},
    "doctor": {"repeats": 5},
    "verify": {"top_k": 2, "repeats": 3, "passes_required": 2},
    "policy": "policy.yaml",
}

POLICY = {
    "actions": {
        "code_patch": {"owner": "ml-lead", "approvals": 1},
        "launch_keys": {"owner": "ml-lead", "approvals": False},
    },
    "forbidden_windows": [
        {"days": ["fri"], "from": "00:00", "to": "23:59", "tz": "UTC", "actions": ["auto_apply"]}
    ],
}


def make_workload(root: Path) -> Path:
    wl = root / "wl"
    (wl / "launch").mkdir(parents=True)
    (wl / "patches").mkdir()
    (wl / "kernels" / "cpu").mkdir(parents=True)
    (wl / "model.py").write_text("x = 1\n")
    (wl / "train.py").write_text("print('train')\n")
    (wl / "data.py").write_text("DATA = 1\n")
    (wl / "kernels" / "cpu" / "gemm.py").write_text("")
    (wl / "launch" / "dense.yaml").write_text(yaml.safe_dump(LAUNCH))
    (wl / "patches" / "index.yaml").write_text(yaml.safe_dump(INDEX))
    for entry in INDEX["patches"]:
        (wl / "patches" / f"{entry['id']}.patch").write_text("")
    (wl / "__pycache__").mkdir()
    (wl / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (root / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    return wl


@pytest.fixture
def root(tmp_path: Path) -> Path:
    make_workload(tmp_path)
    return tmp_path


def write(root: Path, data: dict[str, Any], name: str = "contract.yaml") -> Path:
    path = root / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def mutated(change) -> dict[str, Any]:
    data = copy.deepcopy(CONTRACT)
    change(data)
    return data


def problems_of(root: Path, data: dict[str, Any]) -> list[str]:
    path = write(root, data)
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert info.value.file == str(path)
    return [f"{p.path}: {p.reason}" for p in info.value.problems]


# ------------------------------------------------------------------------------------------ happy path


def test_valid_contract_loads_and_resolves(root: Path) -> None:
    contract = load_contract(write(root, CONTRACT))
    assert contract.workload.repo == (root / "wl").resolve()
    assert contract.source == (root / "contract.yaml").resolve()
    assert isinstance(contract.policy, Policy)
    assert contract.policy.actions["code_patch"].owner == "ml-lead"
    assert contract.policy.actions["launch_keys"].approvals == 0
    assert contract.policy.actions["kernel_patch"].approvals == 1  # default for an unlisted class
    assert contract.search_space.knobs["knobs.micro_batch_size"].choices == [1, 2, 4, 8, 16, 32]


def test_to_dict_is_json_and_roundtrips_without_disk(root: Path) -> None:
    contract = load_contract(write(root, CONTRACT))
    data = contract.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["workload"]["repo"] == str((root / "wl").resolve())
    assert data["policy"]["forbidden_windows"][0]["from"] == "00:00:00"
    again = contract_from_dict(data, check=False)
    assert again.to_dict() == data
    assert again.sha256() == contract.sha256()
    # defaults are filled in: a contract that spells out a default hashes the same as one that omits it
    lean = mutated(lambda d: d.pop("doctor"))
    assert load_contract(write(root, lean, "lean.yaml")).sha256() == contract.sha256()


def test_locked_contract_is_the_typed_contract_once_per_content(root: Path) -> None:
    lean = load_contract(write(root, mutated(lambda d: (d.pop("doctor"), d.pop("verify"))), "lean.yaml"))

    def created(contract: dict[str, Any]) -> ev.StudyCreated:
        return ev.StudyCreated(name="s", goal="g", contract=contract, contract_sha256="same for all", workload_dir="/w",
                               baseline_ref="0" * 40, locked_files={}, cluster=lean.cluster.info())

    first = locked_contract(created(lean.to_dict()))
    assert first is locked_contract(created(lean.to_dict())), "one Contract per locked contract, not one per call"
    assert (first.verify.top_k, first.verify.repeats, first.doctor.repeats) == (2, 3, 5)  # the models' defaults
    other = locked_contract(created({**lean.to_dict(), "goal": "another"}))
    assert other is not first and other.goal == "another", "the cache keys on content, not on the claimed hash"
    with pytest.raises(ContractError, match="budget"):
        locked_contract(created({k: v for k, v in lean.to_dict().items() if k != "budget"}))


def test_editable_globs(root: Path) -> None:
    contract = load_contract(write(root, CONTRACT))
    assert contract.editable("model.py")
    assert contract.editable("./train.py")
    assert contract.editable("kernels/cpu/gemm.py")
    assert contract.editable("kernels/gemm.py")  # ** matches zero directories
    assert not contract.editable("kernels/gemm.c")
    assert not contract.editable("data.py")
    assert not contract.editable("sub/model.py")  # globs are anchored at the repo root
    assert not contract.editable("/abs/model.py")
    assert not contract.editable("../wl/model.py")
    assert not contract.editable("launch/dense.yaml")


def test_knob_value_ok(root: Path) -> None:
    contract = load_contract(write(root, CONTRACT))
    ok = contract.knob_value_ok
    assert ok("knobs.micro_batch_size", 8) is None
    assert "not one of" in ok("knobs.micro_batch_size", 3)
    assert "expected an int" in ok("knobs.micro_batch_size", 8.0)
    assert "expected an int" in ok("knobs.micro_batch_size", True)
    assert ok("knobs.intra_op_threads", 2) is None
    assert "outside [1, 2]" in ok("knobs.intra_op_threads", 3)
    assert ok("knobs.capacity", 1) is None and ok("knobs.capacity", 1.5) is None
    assert "outside" in ok("knobs.capacity", 2.5)
    assert "expected a number" in ok("knobs.capacity", "1.5")
    assert ok("knobs.attention", "sdpa") is None
    assert "not one of" in ok("knobs.attention", "flash")
    assert ok("knobs.compile", True) is None
    assert "expected a bool" in ok("knobs.compile", 1)
    assert "not a knob" in ok("knobs.nope", 1)
    assert contract.candidate_problems({"knobs.micro_batch_size": 8}, ["fused-qkv"]) == []
    assert contract.candidate_problems({}, ["nope"]) == ["patch 'nope' is not in search_space.patches"]


def test_baseline_launch_and_launch_for(root: Path) -> None:
    contract = load_contract(write(root, CONTRACT))
    assert contract.baseline_launch() == LAUNCH
    launch = contract.launch_for({"knobs.micro_batch_size": 8, "knobs.attention": "sdpa"}, steps=60)
    assert launch["knobs"]["micro_batch_size"] == 8
    assert launch["knobs"]["attention"] == "sdpa"
    assert launch["run"]["steps"] == 60
    assert contract.baseline_launch()["knobs"]["micro_batch_size"] == 4  # not mutated
    assert contract.launch_for({})["run"]["steps"] == 30


def test_command_for(root: Path) -> None:
    contract = load_contract(write(root, CONTRACT))
    argv = contract.command_for(python="/usr/bin/python3", launch_file="/t/l.yaml", probe_dir="/t/p")
    assert argv == ["/usr/bin/python3", "train.py", "--launch", "/t/l.yaml"]


def test_locked_files_excludes_editable_and_caches(root: Path) -> None:
    contract = load_contract(write(root, CONTRACT))
    locked = contract.locked_files()
    assert set(locked) == {
        "data.py",
        "launch/dense.yaml",
        "patches/index.yaml",
        "patches/fused-qkv.patch",
        "patches/skip-steps.patch",
    }
    assert locked["data.py"] == hashlib.sha256(b"DATA = 1\n").hexdigest()


def test_patch_library(root: Path) -> None:
    library = load_patch_library(root / "wl" / "patches")
    assert set(library) == {"fused-qkv", "skip-steps"}
    assert library["fused-qkv"].time_log_ratio.mean == -0.05
    assert library["skip-steps"].breaks == "work.optimizer_steps"
    assert library["fused-qkv"].path == root / "wl" / "patches" / "fused-qkv.patch"
    assert library["fused-qkv"].action_class == "code_patch"


def test_patch_library_diff_suffix_and_explicit_name(root: Path) -> None:
    patches = root / "wl" / "patches"
    (patches / "fused-qkv.patch").rename(patches / "fused-qkv.diff")
    (patches / "skip-steps.patch").rename(patches / "hack-0001.txt")
    index = yaml.safe_load((patches / "index.yaml").read_text())
    index["patches"][1]["diff"] = "hack-0001.txt"
    (patches / "index.yaml").write_text(yaml.safe_dump(index))
    library = load_patch_library(patches)
    assert library["fused-qkv"].path == patches / "fused-qkv.diff"
    assert library["skip-steps"].path == patches / "hack-0001.txt"


def test_json_schema_documents_every_field() -> None:
    schema = contract_json_schema()
    assert schema["additionalProperties"] is False
    undocumented = []
    for name, definition in {"Contract": schema, **schema["$defs"]}.items():
        for field, spec in definition.get("properties", {}).items():
            if name.endswith("Knob") and field == "type":
                continue
            if not spec.get("description"):
                undocumented.append(f"{name}.{field}")
    assert undocumented == []
    policy = schema["properties"]["policy"]["anyOf"]
    assert {"description": "path to a policy YAML", "type": "string"} in policy


# ------------------------------------------------------------------------------------------ shape errors


def test_missing_field(root: Path) -> None:
    assert problems_of(root, mutated(lambda d: d["budget"].pop("trials"))) == [
        "budget.trials: required field is missing"
    ]


def test_wrong_type(root: Path) -> None:
    problems = problems_of(root, mutated(lambda d: d["workload"].update(steps="thirty")))
    assert problems == [
        "workload.steps: Input should be a valid integer, unable to parse string as an integer"
    ]


def test_unknown_field(root: Path) -> None:
    assert problems_of(root, mutated(lambda d: d["invariants"].update(losss=1))) == [
        "invariants.losss: unknown field"
    ]
    assert problems_of(root, mutated(lambda d: d.update(extra=1))) == ["extra: unknown field"]


def test_bad_literal(root: Path) -> None:
    problems = problems_of(root, mutated(lambda d: d["backend"].update(kind="pbs")))
    assert problems == ["backend.kind: Input should be 'local', 'sim', 'slurm' or 'kubernetes'"]


@pytest.mark.parametrize(
    ("backend", "problem"),
    [
        ({"kind": "slurm", "partition": "gpu; rm -rf /"}, "is not a single Slurm token"),
        ({"kind": "slurm", "time_limit": "1h"}, "is not a Slurm time"),
        ({"kind": "slurm", "extra_sbatch": ["--output=/tmp/x"]}, "--output is set by the Slurm backend itself"),
        ({"kind": "slurm", "extra_sbatch": ["--mem 0"]}, "is not one sbatch option"),
        ({"kind": "local", "partition": "gpu"}, "partition do not apply to backend kind local"),
        ({"kind": "local", "netns": ["bad name"]}, "is not a network namespace name"),
    ],
)
def test_backend_options_are_validated(root: Path, backend: dict, problem: str) -> None:
    problems = problems_of(root, mutated(lambda d: d.update(backend=backend)))
    assert len(problems) == 1 and problem in problems[0], problems


def test_slurm_backend_options_accepted(root: Path) -> None:
    backend = {"kind": "slurm", "partition": "gpu", "account": "lab", "qos": "high", "time_limit": "0-01:30:00",
               "gres": "gpu:a100:8", "constraint": "ib", "exclusive": True, "extra_sbatch": ["--mem=0", "--hint=nomultithread"]}  # fmt: skip
    contract = load_contract(write(root, mutated(lambda d: d.update(backend=backend))))
    assert contract.backend.gres == "gpu:a100:8" and contract.backend.extra_sbatch == ["--mem=0", "--hint=nomultithread"]


def test_knob_choice_of_wrong_type(root: Path) -> None:
    def change(d):
        d["search_space"]["knobs"]["knobs.micro_batch_size"]["choices"] = [1, 2, "4"]

    assert problems_of(root, mutated(change)) == [
        "search_space.knobs.knobs.micro_batch_size.choices[2]: Input should be a valid integer"
    ]

    def mixed(d):
        d["search_space"]["knobs"]["knobs.attention"]["choices"] = ["manual", 1]

    assert problems_of(root, mutated(mixed)) == [
        "search_space.knobs.knobs.attention.choices: choices mix types ['int', 'str']"
    ]


def test_knob_range_and_choices_rules(root: Path) -> None:
    def both(d):
        d["search_space"]["knobs"]["knobs.intra_op_threads"]["choices"] = [1]

    assert problems_of(root, mutated(both)) == [
        "search_space.knobs.knobs.intra_op_threads: give either choices or low/high, not both"
    ]

    def inverted(d):
        d["search_space"]["knobs"]["knobs.capacity"].update(low=3.0)

    assert problems_of(root, mutated(inverted)) == [
        "search_space.knobs.knobs.capacity: low (3.0) is greater than high (2.0)"
    ]


def test_verify_passes_are_rounds_not_bounded_by_pairs(root: Path) -> None:
    # passes_required counts verification rounds; each round has `repeats` interleaved pairs.
    assert load_contract(write(root, mutated(lambda d: d["verify"].update(passes_required=4)))).verify.passes_required == 4
    assert problems_of(root, mutated(lambda d: d["verify"].update(passes_required=0))) == [
        "verify.passes_required: Input should be greater than or equal to 1"
    ]


def test_invalid_yaml_names_file(root: Path) -> None:
    path = root / "broken.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert str(info.value).startswith(f"{path}: invalid YAML")


def test_policy_file_missing_and_policy_errors(root: Path) -> None:
    problems = problems_of(root, mutated(lambda d: d.update(policy="nope.yaml")))
    assert problems == [f"policy: policy file {root / 'nope.yaml'} not found"]
    inline = mutated(lambda d: d.update(policy={"actions": {"code_patch": {"approvals": -1}}}))
    assert problems_of(root, inline) == [
        "policy.actions.code_patch.approvals: Input should be greater than or equal to 0"
    ]
    window = mutated(
        lambda d: d.update(policy={"forbidden_windows": [{"days": ["fri"], "from": 0, "to": 1439}]})
    )
    assert problems_of(root, window) == [
        'policy.forbidden_windows[0].from: write times as quoted "HH:MM" strings (unquoted 23:59 is a YAML number)',
        'policy.forbidden_windows[0].to: write times as quoted "HH:MM" strings (unquoted 23:59 is a YAML number)',
    ]


# ------------------------------------------------------------------------------------------ checks against disk


def test_repo_missing(root: Path) -> None:
    problems = problems_of(root, mutated(lambda d: d["workload"].update(repo="nowhere")))
    assert problems == [f"workload.repo: {(root / 'nowhere').resolve()} is not a directory"]


def test_launch_file_missing(root: Path) -> None:
    problems = problems_of(root, mutated(lambda d: d["workload"].update(launch_file="launch/moe.yaml")))
    assert problems == [f"workload.launch_file: launch/moe.yaml not found in {(root / 'wl').resolve()}"]


def test_command_placeholder_unknown(root: Path) -> None:
    problems = problems_of(
        root, mutated(lambda d: d["workload"].update(command=["{python}", "{script}", "{launch_file!r}"]))
    )
    assert problems == [
        "workload.command[1]: unknown placeholder {script} (allowed: launch_file, probe_dir, python)",
        "workload.command[2]: placeholder {launch_file} takes no format spec or conversion",
    ]


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("/etc/passwd", "'/etc/passwd' must be relative to the workload repo"),
        ("../other/*.py", "'../other/*.py' must not contain '..'"),
        ("src/../../x.py", "'src/../../x.py' must not contain '..'"),
        ("~/x.py", "'~/x.py' must be relative to the workload repo"),
    ],
)
def test_scope_outside_repo(root: Path, pattern: str, reason: str) -> None:
    problems = problems_of(root, mutated(lambda d: d["scope"]["files"].append(pattern)))
    assert problems == [f"scope.files[3]: {reason}"]


def test_scope_symlink_leading_outside(root: Path) -> None:
    outside = root / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("")
    os.symlink(outside, root / "wl" / "vendor")
    os.symlink(root / "policy.yaml", root / "wl" / "linked.py")
    problems = problems_of(root, mutated(lambda d: d["scope"]["files"].extend(["vendor/secret.py", "*.py"])))
    assert problems == [
        "scope.files[3]: 'vendor/secret.py' resolves outside the workload repo (through a symlink)",
        "scope.files[4]: '*.py' matches linked.py, which resolves outside the workload repo",
    ]
    assert problems_of(root, mutated(lambda d: d["scope"]["files"].append("vendor/*"))) == [
        "scope.files[3]: 'vendor/*' resolves outside the workload repo (through a symlink)"
    ]


def test_knob_not_in_launch_scope(root: Path) -> None:
    problems = problems_of(root, mutated(lambda d: d["scope"]["launch_keys"].remove("knobs.attention")))
    assert problems == ["search_space.knobs.knobs.attention: launch key not in scope.launch_keys"]


def test_knob_on_horizon_refused(root: Path) -> None:
    def change(d):
        d["scope"]["launch_keys"].append("run.steps")
        d["search_space"]["knobs"]["run.steps"] = {"type": "int", "choices": [10, 20]}

    assert problems_of(root, mutated(change)) == [
        "search_space.knobs.run.steps: the trial horizon is fixed by workload.steps"
    ]


def test_golden_value_outside_knob(root: Path) -> None:
    def change(d):
        d["search_space"]["knobs"]["knobs.attention"]["choices"] = ["sdpa", "flash"]

    assert problems_of(root, mutated(change)) == [
        "search_space.knobs.knobs.attention: golden launch file value: 'manual' is not one of ['sdpa', 'flash']"
    ]


def test_global_batch_unsatisfiable(root: Path) -> None:
    def change(d):
        d["search_space"]["knobs"]["knobs.micro_batch_size"]["choices"] = [1, 2, 4, 6, 64]

    assert problems_of(root, mutated(change)) == [
        "search_space.knobs.knobs.micro_batch_size: micro-batch values [6, 64] do not divide global batch 32 / data_parallel 1"
    ]

    def dp(d):
        d["search_space"]["constraints"]["global_batch"]["data_parallel"] = 2

    assert problems_of(root, mutated(dp)) == [
        "search_space.knobs.knobs.micro_batch_size: micro-batch values [32] do not divide global batch 32 / data_parallel 2"
    ]

    def size(d):
        d["search_space"]["constraints"]["global_batch"]["size"] = 64
        d["search_space"]["knobs"]["knobs.micro_batch_size"]["choices"] = [1, 2, 4]

    assert problems_of(root, mutated(size)) == [
        "search_space.constraints.global_batch.size: launch file has run.global_batch_size=32, contract says 64"
    ]

    def accum(d):
        d["search_space"]["constraints"]["global_batch"]["accumulation_key"] = "knobs.grad_accum"

    assert problems_of(root, mutated(accum)) == [
        "search_space.constraints.global_batch.accumulation_key: 'knobs.grad_accum' is not in scope.launch_keys"
    ]


def test_global_batch_micro_batch_must_be_int_knob(root: Path) -> None:
    def change(d):
        d["search_space"]["knobs"]["knobs.micro_batch_size"] = {"type": "float", "low": 1.0, "high": 2.0}

    problems = problems_of(root, mutated(change))
    assert "search_space.knobs.knobs.micro_batch_size: the micro-batch knob must be type: int" in problems


def test_global_batch_parallel_key_must_be_int_knob(root: Path) -> None:
    # a derived data-parallel over a float knob is a named problem, not an AttributeError from the check
    def change(d):
        gb = d["search_space"]["constraints"]["global_batch"]
        del gb["data_parallel"]
        gb.update(devices=4, parallel_keys=["knobs.capacity"])

    problems = problems_of(root, mutated(change))
    assert "search_space.knobs.knobs.capacity: must be type: int (global_batch uses it)" in problems


def test_unknown_patch_id(root: Path) -> None:
    problems = problems_of(root, mutated(lambda d: d["search_space"]["patches"].append("flash-attn")))
    assert problems == ["search_space.patches[2]: unknown patch id 'flash-attn' (not in patches/index.yaml)"]


def test_patch_library_file_missing(root: Path) -> None:
    (root / "wl" / "patches" / "fused-qkv.patch").unlink()
    problems = problems_of(root, CONTRACT)
    index = root / "wl" / "patches" / "index.yaml"
    assert problems == [
        f"search_space.patches: {index}: patches[0]: diff fused-qkv.patch or fused-qkv.diff not found in {root / 'wl' / 'patches'}"
    ]
    (root / "wl" / "patches" / "index.yaml").unlink()
    assert problems_of(root, CONTRACT) == [f"search_space.patches: {index}: patch library index not found"]


def test_several_problems_reported_together(root: Path) -> None:
    def change(d):
        d["workload"]["launch_file"] = "missing.yaml"
        d["search_space"]["patches"] = ["nope"]

    problems = problems_of(root, mutated(change))
    assert len(problems) == 2
    assert problems[0].startswith("workload.launch_file:")
    assert problems[1].startswith("search_space.patches[0]:")


def test_error_lines_render_file_path_reason(root: Path) -> None:
    path = write(root, mutated(lambda d: d["budget"].pop("trials")))
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert info.value.lines() == [f"{path}: budget.trials: required field is missing"]


def test_contract_model_direct(root: Path) -> None:
    # The model alone (no disk checks) still refuses unknown fields: inner code can trust its shape.
    with pytest.raises(ValidationError, match="surprise"):
        Contract.model_validate({**CONTRACT, "surprise": 1})
