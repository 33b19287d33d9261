"""How knob values reach a job (infrarsi.trial.launch and Contract.trial_launch): every delivery, every written
form of a flag, and every way a value could try to become an extra argument."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from infrarsi.study.contract import ContractError, contract_from_dict, load_contract
from infrarsi.trial import launch
from infrarsi.trial.launch import LaunchValueError

# ------------------------------------------------------------------------------------------ argv (pure)


@pytest.mark.parametrize(
    ("golden", "values", "expected"),
    [
        (["--lr", "1e-3", "--bs", "8"], {"bs": 16}, ["--lr", "1e-3", "--bs", "16"]),
        (["--bs=8", "--lr", "1e-3"], {"bs": 4}, ["--bs=4", "--lr", "1e-3"]),
        (["--lr", "1e-3"], {"bs": 4}, ["--lr", "1e-3", "--bs", "4"]),
        (["--lr", "1e-3"], {"lr": 0.002}, ["--lr", "0.002"]),
        (["--warmup", "-1"], {"warmup": 5}, ["--warmup", "5"]),
        # value-style booleans keep the golden spelling
        (["--bf16", "0"], {"bf16": True}, ["--bf16", "1"]),
        (["--bf16", "true"], {"bf16": False}, ["--bf16", "false"]),
        (["--bf16", "True"], {"bf16": False}, ["--bf16", "False"]),
        (["--bf16=0", "--x", "1"], {"bf16": True}, ["--bf16=1", "--x", "1"]),
        # switches
        (["--bf16", "--x", "1"], {"bf16": False}, ["--x", "1"]),
        (["--x", "1"], {"bf16": True}, ["--x", "1", "--bf16"]),
        (["--x", "1"], {"bf16": False}, ["--x", "1"]),
        (["--no-bf16", "--x", "1"], {"bf16": True}, ["--bf16", "--x", "1"]),
        (["--no_bf16"], {"bf16": False}, ["--no_bf16"]),
        (["--bf16"], {"bf16": True}, ["--bf16"]),
        # a repeated flag: every occurrence changes (argparse takes the last one)
        (["--bs", "8", "--bs", "8"], {"bs": 2}, ["--bs", "2", "--bs", "2"]),
    ],
)  # fmt: skip
def test_argv_forms(golden: list[str], values: dict[str, Any], expected: list[str]) -> None:
    command = ["/usr/bin/python3", "train.py", *golden]
    assert launch.argv_with(command, values) == ["/usr/bin/python3", "train.py", *expected]


@pytest.mark.parametrize(("off", "expected"), [("drop", []), ("no-", ["--no-bf16"]), ("no_", ["--no_bf16"])])
def test_switch_off_follows_the_contract(off: launch.SwitchOff, expected: list[str]) -> None:
    assert launch.argv_with(["p", "t.py", "--bf16"], {"bf16": False}, switch_off=off) == ["p", "t.py", *expected]
    assert launch.argv_with(["p", "t.py"], {"bf16": False}, switch_off=off) == ["p", "t.py", *expected]


def test_argv_golden_reads_every_form() -> None:
    command = ["python", "-u", "train.py", "--a", "1", "--b=x", "--c", "--no-d", "--e", "-2", "--", "--f", "3"]
    assert launch.argv_golden(command) == {"a": "1", "b": "x", "c": True, "no-d": True, "d": False, "e": "-2"}


def test_overrides_replace_in_place_keep_prefix_and_append() -> None:
    command = ["python", "train.py", "trainer.precision=32", "+model.dropout=0.1", "--config-name", "base"]
    out = launch.overrides_with(command, {"trainer.precision": "bf16-mixed", "model.dropout": 0.0, "data.workers": 2})
    assert out == ["python", "train.py", "trainer.precision=bf16-mixed", "+model.dropout=0.0", "--config-name",
                   "base", "data.workers=2"]  # fmt: skip
    assert launch.overrides_golden(command) == {"trainer.precision": "32", "model.dropout": "0.1"}


def test_env_keeps_golden_boolean_spelling() -> None:
    assert launch.env_with({"USE_BF16": "0", "OTHER": "x"}, {"USE_BF16": True, "MB": 8}) == {
        "USE_BF16": "1", "OTHER": "x", "MB": "8",
    }  # fmt: skip


@pytest.mark.parametrize("via", ["argv", "env", "overrides"])
@pytest.mark.parametrize("value", ["--output_dir=/etc", "-x", "a\nb", "a\0b", "a\rb"])
def test_injection_values_are_refused_naming_the_knob(via: launch.KnobsVia, value: str) -> None:
    reason = launch.value_problem("optim", value, via)
    assert reason is not None and reason.startswith("knob optim:")


def test_override_values_hydra_would_reinterpret_are_refused() -> None:
    assert launch.value_problem("a.b", "x,y", "overrides") is not None  # a sweep in Hydra's grammar
    assert launch.value_problem("a.b", "x y", "overrides") is not None
    assert launch.value_problem("a.b", "bf16-mixed", "overrides") is None
    assert launch.value_problem("a", "x,y", "argv") is None  # one argv element: inert


def test_launch_file_values_are_inert() -> None:
    assert launch.value_problem("knobs.x", "-x\n", "launch_file") is None


# ------------------------------------------------------------------------------------ contracts


def contract_dict(repo: Path, via: str, command: list[str], **workload: Any) -> dict[str, Any]:
    return {
        "name": "byo",
        "goal": "faster",
        "workload": {"repo": str(repo), "command": command, "knobs_via": via, "steps": 10, "verify_steps": 20,
                     **workload},  # fmt: skip
        "cluster": {"id": "c", "accelerator": "cpu", "memory_capacity_bytes": 1 << 30},
        "scope": {"files": [], "launch_keys": []},
        "invariants": {"loss": {"tolerance": 0.05}},
        "budget": {"trials": 4, "accelerator_hours": 1.0},
    }


def with_knobs(data: dict[str, Any], knobs: dict[str, Any], **constraints: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    data["scope"]["launch_keys"] = list(knobs) + [v for k, v in constraints.get("global_batch", {}).items()
                                                  if k == "accumulation_key"]  # fmt: skip
    data["search_space"] = {"knobs": knobs, "constraints": constraints}
    return data


HF_COMMAND = ["{python}", "train.py", "--per_device_train_batch_size", "8", "--bf16", "0", "--optim", "adamw_torch",
              "--max_steps", "100", "--output_dir", "out"]  # fmt: skip
HF_KNOBS = {
    "--per_device_train_batch_size": {"type": "int", "choices": [2, 4, 8, 16]},
    "bf16": {"type": "bool"},
    "optim": {"type": "choice", "choices": ["adamw_torch", "adamw_torch_fused"]},
    "gradient_checkpointing": {"type": "bool"},
}


def hf_contract(tmp_path: Path, **workload: Any):
    data = with_knobs(
        contract_dict(tmp_path, "argv", HF_COMMAND, steps_key="--max_steps", **workload), HF_KNOBS,
        global_batch={"size": 32, "micro_batch_key": "--per_device_train_batch_size",
                      "accumulation_key": "gradient_accumulation_steps"},
    )  # fmt: skip
    return contract_from_dict(data)


def test_argv_contract_golden_values_and_trial_argv(tmp_path: Path) -> None:
    contract = hf_contract(tmp_path)
    # keys written as flags are stored as flag names, everywhere
    assert contract.workload.steps_key == "max_steps"
    assert "per_device_train_batch_size" in contract.search_space.knobs
    golden = contract.golden_values()
    assert golden["per_device_train_batch_size"] == 8 and golden["bf16"] is False
    assert golden["optim"] == "adamw_torch" and golden["max_steps"] == 100
    trial = contract.trial_launch(
        {"per_device_train_batch_size": 16, "bf16": True, "optim": "adamw_torch_fused", "gradient_checkpointing": True},
        30, python="/py", launch_file=None, probe_dir="/p",
    )  # fmt: skip
    assert trial.launch_file is None
    assert trial.argv == ["/py", "train.py", "--per_device_train_batch_size", "16", "--bf16", "1", "--optim",
                          "adamw_torch_fused", "--max_steps", "30", "--output_dir", "out",
                          "--gradient_checkpointing", "--gradient_accumulation_steps", "2"]  # fmt: skip
    # the baseline: the golden command with only the horizon (and the derived accumulation) set
    base = contract.trial_launch({}, None, python="/py", launch_file=None, probe_dir="/p")
    assert base.argv == ["/py", *HF_COMMAND[1:]][:9] + ["10", "--output_dir", "out", "--gradient_accumulation_steps", "4"]


def test_env_contract(tmp_path: Path) -> None:
    data = with_knobs(
        contract_dict(tmp_path, "env", ["{python}", "train.py"], steps_key="MAX_STEPS",
                      env={"MICRO_BATCH": "4", "USE_BF16": "0"}),
        {"MICRO_BATCH": {"type": "int", "choices": [2, 4, 8]}, "USE_BF16": {"type": "bool"}},
    )  # fmt: skip
    contract = contract_from_dict(data)
    assert contract.golden_values() == {"MICRO_BATCH": 4, "USE_BF16": False}
    trial = contract.trial_launch({"MICRO_BATCH": 8, "USE_BF16": True}, None, python="/py", launch_file=None, probe_dir="/p")
    assert trial.argv == ["/py", "train.py"]
    assert trial.env == {"MICRO_BATCH": "8", "USE_BF16": "1", "MAX_STEPS": "10"}


def test_overrides_contract(tmp_path: Path) -> None:
    data = with_knobs(
        contract_dict(tmp_path, "overrides", ["{python}", "train.py", "trainer.precision=32-true", "data.batch_size=8"],
                      steps_key="trainer.max_steps"),
        {"trainer.precision": {"type": "choice", "choices": ["32-true", "bf16-mixed"]},
         "data.batch_size": {"type": "int", "choices": [4, 8]}},
    )  # fmt: skip
    contract = contract_from_dict(data)
    assert contract.golden_values() == {"trainer.precision": "32-true", "data.batch_size": 8}
    trial = contract.trial_launch({"trainer.precision": "bf16-mixed"}, 5, python="/py", launch_file=None, probe_dir="/p")
    assert trial.argv == ["/py", "train.py", "trainer.precision=bf16-mixed", "data.batch_size=8", "trainer.max_steps=5"]


def test_existing_launch_file_contracts_are_unchanged() -> None:
    root = Path(__file__).resolve().parents[2]
    for path in sorted((root / "workloads").glob("*/contracts/*.yaml")):
        contract = load_contract(path)
        assert contract.workload.knobs_via == "launch_file"
        trial = contract.trial_launch({}, None, python="/py", launch_file="/l.yaml", probe_dir="/p")
        assert trial.argv == contract.command_for(python="/py", launch_file="/l.yaml", probe_dir="/p")
        assert trial.launch_file == contract.launch_for({})


def problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ContractError) as info:
        contract_from_dict(data)
    return info.value.lines()


def test_contract_refuses_choices_that_would_inject(tmp_path: Path) -> None:
    knobs = {**HF_KNOBS, "optim": {"type": "choice", "choices": ["adamw_torch", "--output_dir=/etc", "a\nb"]}}
    data = with_knobs(contract_dict(tmp_path, "argv", HF_COMMAND, steps_key="max_steps"), knobs)
    lines = problems(data)
    assert any("search_space.knobs.optim.choices: knob optim: value '--output_dir=/etc' starts with '-'" in ln for ln in lines)
    assert any("newline" in ln for ln in lines)


def test_contract_refuses_keys_and_placeholders_a_delivery_cannot_carry(tmp_path: Path) -> None:
    data = with_knobs(contract_dict(tmp_path, "env", ["{python}", "t.py", "{launch_file}"], steps_key="max-steps"),
                      {"micro batch": {"type": "int", "choices": [1, 2]}})  # fmt: skip
    lines = problems(data)
    assert "workload.command[2]: {launch_file} has no file to name with knobs_via: env" in lines
    assert "workload.steps_key: 'max-steps' is not an environment variable name" in lines
    assert "search_space.knobs.micro batch: 'micro batch' is not an environment variable name" in lines
    flag = with_knobs(contract_dict(tmp_path, "argv", HF_COMMAND, steps_key="max_steps"), {"-x": {"type": "bool"}})
    assert any("search_space.knobs.-x: '-x' is not a flag name" in ln for ln in problems(flag))


def test_launch_file_only_with_file_delivery(tmp_path: Path) -> None:
    data = contract_dict(tmp_path, "argv", HF_COMMAND, steps_key="max_steps", launch_file="l.yaml")
    assert any("launch_file is only used with knobs_via: launch_file" in ln for ln in problems(data))
    data = contract_dict(tmp_path, "launch_file", ["{python}", "t.py"])
    assert any("launch_file is required with knobs_via: launch_file" in ln for ln in problems(data))


def test_golden_value_a_knob_cannot_read_is_named(tmp_path: Path) -> None:
    command = [*HF_COMMAND[:3], "eight", *HF_COMMAND[4:]]
    data = with_knobs(contract_dict(tmp_path, "argv", command, steps_key="max_steps"), HF_KNOBS)
    assert any("search_space.knobs.per_device_train_batch_size: golden launch file value: expected an int" in ln
               for ln in problems(data))  # fmt: skip


def test_trial_launch_refuses_an_injecting_value_naming_the_knob(tmp_path: Path) -> None:
    contract = hf_contract(tmp_path)
    # the contract refuses such a choice, so force one past it: the last line of defence still holds
    with pytest.raises(LaunchValueError, match="knob optim: value '--output_dir=/etc' starts with '-'"):
        contract.trial_launch({"optim": "--output_dir=/etc"}, None, python="/py", launch_file=None, probe_dir="/p")
    assert "starts with '-'" in (contract.knob_value_ok("optim", "-x") or "")
    assert contract.candidate_problems({"optim": "a\nb"}) != []


def test_yaml_contract_with_flag_keys_loads(tmp_path: Path) -> None:
    data = with_knobs(contract_dict(tmp_path, "argv", HF_COMMAND, steps_key="--max_steps"), HF_KNOBS)
    path = tmp_path / "contract.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert load_contract(path).search_space.knobs.keys() == {
        "per_device_train_batch_size", "bf16", "optim", "gradient_checkpointing",
    }  # fmt: skip


def test_a_flag_contract_becomes_a_search_space_with_the_golden_baseline(tmp_path: Path) -> None:
    from infrarsi import events as ev
    from infrarsi.study.space import StudySpace

    command = ["{python}", "train.py", "--batch-size", "8", "--bf16", "0", "--max-steps", "100"]
    data = with_knobs(contract_dict(tmp_path, "argv", command, steps_key="--max-steps"),
                      {"batch-size": {"type": "int", "choices": [2, 4, 8]}, "bf16": {"type": "bool"}},
                      global_batch={"size": 8, "micro_batch_key": "batch-size", "accumulation_key": "grad-accum"})  # fmt: skip
    contract = contract_from_dict(data)
    study = StudySpace.from_contract(contract, baseline_launch=contract.baseline_launch(), library=None)
    assert dict(study.baseline.knobs) == {"batch_size": 8, "bf16": False}  # argparse's names; the golden values
    assert study.kb.canonical("batch_size") == "micro_batch"  # so the micro-batch prior applies
    assert study.to_event(study.baseline) == ev.Candidate()  # the golden command is the baseline candidate


def test_a_flag_the_golden_lacks_goes_before_a_bare_double_dash() -> None:
    """Issue 35: what follows ``--`` is the job's positionals; an appended knob flag must not land there."""
    from infrarsi.trial.launch import argv_with

    golden = ["py", "train.py", "cfg.yaml", "--compile", "--lr", "1", "--", "extra"]
    assert argv_with(golden, {"batch_size": 4, "compile": False}) == ["py", "train.py", "cfg.yaml", "--lr", "1",
                                                                      "--batch_size", "4", "--", "extra"]  # fmt: skip
