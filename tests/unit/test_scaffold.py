"""``infrarsi scaffold``: drafts from plain, Hugging Face-style and Lightning-style scripts that ``init``
accepts as they stand, and the commands and flags it must refuse or leave out."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml
from infrarsi.cli import main
from infrarsi.commands.init import prepare_study
from infrarsi.study.contract import load_contract
from infrarsi.study.scaffold import ScaffoldError, scaffold

PLAIN = textwrap.dedent(
    """
    import argparse
    import torch

    def main():
        p = argparse.ArgumentParser()
        p.add_argument("--batch_size", type=int, default=8)
        p.add_argument("--grad_accum", type=int, default=1)
        p.add_argument("--bf16", type=int, default=0)
        p.add_argument("--compile", action="store_true")
        p.add_argument("--num_workers", type=int, default=0)
        p.add_argument("--attention", choices=["manual", "sdpa"], default="manual")
        p.add_argument("--lr", type=float, default=3e-4)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--max_steps", type=int, default=100)
        p.add_argument("--hidden", type=int, default=64)
        args = p.parse_args()
        for step in range(args.max_steps):
            print(f"step {step} loss 1.0", flush=True)

    if __name__ == "__main__":
        main()
    """
)

HF = textwrap.dedent(
    """
    from dataclasses import dataclass, field
    from transformers import AutoModelForCausalLM, GPT2Config, HfArgumentParser, Trainer, TrainingArguments

    @dataclass
    class ModelArguments:
        n_layer: int = 2
        attn_implementation: str = field(default="eager", metadata={"choices": ["eager", "sdpa"]})

    def main():
        model_args, training_args = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
        model = AutoModelForCausalLM.from_config(GPT2Config(n_layer=model_args.n_layer),
                                                 attn_implementation=model_args.attn_implementation)
        Trainer(model=model, args=training_args, train_dataset=None).train()

    if __name__ == "__main__":
        main()
    """
)

LIGHTNING = textwrap.dedent(
    """
    import argparse
    import lightning as L

    def main():
        p = argparse.ArgumentParser()
        p.add_argument("--batch_size", type=int, default=4)
        p.add_argument("--accumulate_grad_batches", type=int, default=2)
        p.add_argument("--precision", default="32-true")
        p.add_argument("--max_steps", type=int, default=50)
        p.add_argument("--num_workers", type=int, default=0)
        p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False)
        args = p.parse_args()
        trainer = L.Trainer(max_steps=args.max_steps, precision=args.precision,
                            accumulate_grad_batches=args.accumulate_grad_batches)

    if __name__ == "__main__":
        main()
    """
)

LIGHTNING_CLI = textwrap.dedent(
    """
    from lightning.pytorch.cli import LightningCLI

    def main():
        LightningCLI()

    if __name__ == "__main__":
        main()
    """
)


def repo_with(tmp_path: Path, script: str, *, name: str = "train.py", git: bool = True) -> Path:
    repo = tmp_path / "job"
    repo.mkdir()
    (repo / name).write_text(script)
    if git:
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "job"],
                       check=True)  # fmt: skip
    return repo


def accepted(tmp_path: Path, text: str, where: Path):
    """The draft as ``init`` takes it: loaded, checked, and a study prepared from it."""
    path = where / "contract.yaml"
    path.write_text(text)
    contract = load_contract(path)
    prepare_study(path, tmp_path / "data")
    return contract


def test_plain_torchrun_script(tmp_path: Path) -> None:
    repo = repo_with(tmp_path, PLAIN)
    command = ["OMP_NUM_THREADS=1", "torchrun", "--nproc-per-node", "2", "--standalone", "train.py",
               "--batch_size", "8", "--bf16", "0", "--lr", "1e-3", "--hidden", "32"]  # fmt: skip
    text, report = scaffold(command, repo, contract_dir=tmp_path)
    contract = accepted(tmp_path, text, tmp_path)
    assert report.framework == "plain" and not report.uses_probe
    w = contract.workload
    assert (w.launcher.kind, w.launcher.nproc_per_node, w.knobs_via, w.steps_key) == ("torchrun", 2, "argv", "max_steps")
    assert w.env == {"OMP_NUM_THREADS": "1"}
    assert w.measurement.kind == "coarse" and w.measurement.step_regex
    knobs = contract.search_space.knobs
    assert set(knobs) == {"batch_size", "bf16", "compile", "num_workers", "attention"}
    assert knobs["batch_size"].choices == [1, 2, 4, 8]
    gb = contract.search_space.constraints.global_batch
    assert (gb.size, gb.data_parallel, gb.accumulation_key) == (16, 2, "grad_accum")
    # the baseline is explicit: every searched flag is in the golden command with its value
    assert contract.golden_values() | {} == {
        "batch_size": 8, "bf16": False, "lr": 1e-3, "hidden": 32, "grad_accum": 1, "num_workers": 0, "attention": "manual",
    }  # fmt: skip
    argv = contract.trial_launch({"batch_size": 2, "bf16": True, "compile": True}, None, python="py",
                                 launch_file=None, probe_dir="p").argv  # fmt: skip
    assert argv[argv.index("--batch_size") + 1] == "2" and argv[argv.index("--grad_accum") + 1] == "4"
    assert argv[argv.index("--bf16") + 1] == "1" and "--compile" in argv and argv[-2:] == ["--max_steps", "30"]
    # never searched: math, unknown flags — named in comments instead
    assert {"lr", "seed"} <= set(report.left_out) and "hidden" in report.candidates
    assert "#   --hidden: golden '32'" in text and "#   --lr" in text
    assert "--standalone" in " ".join(report.notes)


def test_hf_trainer_script(tmp_path: Path) -> None:
    repo = repo_with(tmp_path, HF)
    command = ["torchrun", "--nproc-per-node", "2", "train.py", "--per_device_train_batch_size", "8", "--bf16", "0",
               "--max_steps", "200", "--output_dir", "out", "--learning_rate", "5e-4", "--report_to", "none",
               "--logging_steps", "1"]  # fmt: skip
    text, report = scaffold(command, repo)
    contract = accepted(tmp_path, text, repo)
    assert report.framework == "hf_trainer"
    knobs = contract.search_space.knobs
    assert set(knobs) == {"per_device_train_batch_size", "bf16", "gradient_checkpointing", "optim", "torch_compile",
                          "dataloader_num_workers", "attn_implementation"}  # fmt: skip
    assert knobs["optim"].choices == ["adamw_torch", "adamw_torch_fused"]
    assert knobs["attn_implementation"].choices == ["eager", "sdpa"]
    gb = contract.search_space.constraints.global_batch
    assert (gb.size, gb.micro_batch_key, gb.data_parallel, gb.accumulation_key) == (
        16, "per_device_train_batch_size", 2, "gradient_accumulation_steps")
    assert contract.workload.steps_key == "max_steps"
    assert {"output_dir", "learning_rate", "report_to", "logging_steps"} <= set(report.left_out)
    assert "fp16" in report.candidates  # a CUDA-only setting, named rather than searched
    golden = contract.golden_values()
    assert golden["bf16"] is False and golden["gradient_checkpointing"] is False  # made explicit, HF spelling
    argv = contract.trial_launch({"bf16": True, "gradient_checkpointing": True}, 10, python="py", launch_file=None,
                                 probe_dir="p").argv  # fmt: skip
    assert argv[argv.index("--bf16") + 1] == "1"
    assert argv[argv.index("--gradient_checkpointing") + 1] == "true"
    assert argv[argv.index("--max_steps") + 1] == "10"


def test_lightning_argparse_script(tmp_path: Path) -> None:
    repo = repo_with(tmp_path, LIGHTNING)
    text, report = scaffold(["python", "train.py", "--precision", "32-true", "--batch_size", "4"], repo)
    contract = accepted(tmp_path, text, repo)
    assert report.framework == "lightning"
    knobs = contract.search_space.knobs
    assert knobs["precision"].choices == ["32-true", "bf16-mixed"]
    assert contract.search_space.constraints.global_batch.size == 8  # 4 × accumulate 2 (its declared default)
    assert contract.workload.argv_switch_off == "no-"  # BooleanOptionalAction declares --no-compile
    argv = contract.trial_launch({"compile": False, "precision": "bf16-mixed"}, None, python="py", launch_file=None,
                                 probe_dir="p").argv  # fmt: skip
    assert "--no-compile" in argv and argv[argv.index("--precision") + 1] == "bf16-mixed"


def test_lightning_cli_dotted_flags(tmp_path: Path) -> None:
    repo = repo_with(tmp_path, LIGHTNING_CLI)
    command = ["python", "train.py", "--trainer.precision", "32-true", "--trainer.max_steps", "100",
               "--data.batch_size", "8", "--trainer.accumulate_grad_batches", "1", "--model.n_embd", "64"]  # fmt: skip
    text, report = scaffold(command, repo)
    contract = accepted(tmp_path, text, repo)
    assert contract.workload.steps_key == "trainer.max_steps"
    assert set(contract.search_space.knobs) == {"trainer.precision", "data.batch_size"}
    assert "model.n_embd" in report.candidates


def test_overrides_command(tmp_path: Path) -> None:
    repo = repo_with(tmp_path, "import hydra\n")
    text, _ = scaffold(["python", "train.py", "--config-name", "base", "trainer.precision=32-true", "trainer.max_steps=100",
                        "data.batch_size=8", "trainer.accumulate_grad_batches=1"], repo)  # fmt: skip
    contract = accepted(tmp_path, text, repo)
    assert contract.workload.knobs_via == "overrides"
    argv = contract.trial_launch({"trainer.precision": "bf16-mixed", "data.batch_size": 4}, 5, python="py",
                                 launch_file=None, probe_dir="p").argv  # fmt: skip
    assert argv[2:] == ["--config-name", "base", "trainer.precision=bf16-mixed", "trainer.max_steps=5",
                        "data.batch_size=4", "trainer.accumulate_grad_batches=2"]  # fmt: skip


def test_a_probe_job_is_measured_by_the_probe(tmp_path: Path) -> None:
    repo = repo_with(tmp_path, "import infrarsi.probe\n" + PLAIN + "\nx = evaluate()\n")
    text, report = scaffold(["python", "train.py"], repo)
    contract = accepted(tmp_path, text, repo)
    assert report.uses_probe and contract.workload.measurement.kind == "probe"
    assert contract.invariants.eval and contract.invariants.loss.at == "every_eval"


def test_batch_without_accumulation_is_left_out(tmp_path: Path) -> None:
    script = PLAIN.replace('    p.add_argument("--grad_accum", type=int, default=1)\n', "")
    repo = repo_with(tmp_path, script)
    text, report = scaffold(["python", "train.py"], repo)
    contract = accepted(tmp_path, text, repo)
    assert "batch_size" not in contract.search_space.knobs
    assert contract.search_space.constraints.global_batch is None
    assert "tokens per optimiser step" in report.left_out["batch_size"]


def test_choices_that_would_read_as_flags_are_not_searched(tmp_path: Path) -> None:
    script = PLAIN.replace('choices=["manual", "sdpa"]', 'choices=["manual", "--sdpa"]')
    repo = repo_with(tmp_path, script)
    _text, report = scaffold(["python", "train.py"], repo)
    assert "attention" not in {k.key for k in report.knobs}
    assert "read as flags" in report.candidates["attention"]


@pytest.mark.parametrize(
    ("command", "fragment"),
    [
        ([], "no command given"),
        (["python", "train.py", "|", "tee", "log"], "shell syntax"),
        (["bash", "-c", "python train.py"], "runs a shell"),
        (["python", "-c", "print(1)"], "python -c"),
        (["torchrun", "--no-python", "train.py"], "--no-python"),
        (["accelerate", "config"], "only `accelerate launch"),
        (["accelerate", "launch", "--num_processes"], "needs a value"),
        (["srun", "-n", "1", "hostname"], "srun without a python"),
        (["torchrun", "--nproc-per-node", "gpu", "train.py"], "give a number"),
        (["python", "missing.py"], "is not a file"),
        (["python", "../train.py"], "outside the repository"),
        (["python", "train.py", "--x", "$(rm -rf /)"], "shell syntax"),
    ],
)  # fmt: skip
def test_commands_it_refuses(tmp_path: Path, command: list[str], fragment: str) -> None:
    repo = repo_with(tmp_path, PLAIN, git=False)
    with pytest.raises(ScaffoldError, match=fragment.replace("(", r"\(").replace("$", r"\$").replace("|", r"\|")):
        scaffold(command, repo)


def test_a_script_without_a_steps_flag_is_refused(tmp_path: Path) -> None:
    repo = repo_with(tmp_path, PLAIN.replace("--max_steps", "--hidden2"), git=False)
    with pytest.raises(ScaffoldError, match="no flag sets the number of optimiser steps"):
        scaffold(["python", "train.py"], repo)


def test_cli_writes_the_draft_and_never_overwrites(tmp_path: Path, capsys) -> None:
    repo = repo_with(tmp_path, PLAIN)
    out = repo / "contract.yaml"
    assert main(["scaffold", "--repo", str(repo), "--out", str(out), "--", "python", "train.py", "--lr", "1"]) == 0
    err = capsys.readouterr().err
    assert "knobs batch_size, bf16, compile, num_workers, attention" in err and "coarsely" in err
    assert yaml.safe_load(out.read_text())["workload"]["knobs_via"] == "argv"
    before = out.read_text()
    assert main(["scaffold", "--repo", str(repo), "--out", str(out), "--", "python", "train.py"]) == 2
    assert "exists; pass --force" in capsys.readouterr().err and out.read_text() == before
    assert main(["scaffold", "--repo", str(repo), "--", "bash", "-c", "x"]) == 2
    assert "error: the command runs a shell" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# Commands as their authors wrote them (issue 35)
# --------------------------------------------------------------------------------------------------


def test_a_positional_config_file_stays_where_it_was_and_values_keep_their_spelling(tmp_path: Path) -> None:
    from support.gptlike_job import GOLDEN_COMMAND, make_gptlike_repo

    repo = make_gptlike_repo(tmp_path / "gpt")
    text, report = scaffold(GOLDEN_COMMAND, repo, contract_dir=tmp_path)
    contract = accepted(tmp_path, text, tmp_path)
    w = contract.workload
    assert w.command[:3] == ["{python}", "train.py", "config/train_tiny.py"] and w.knobs_via == "argv"
    assert "positional arguments kept as written: config/train_tiny.py" in report.notes
    assert w.steps_key == "max_iters" and set(contract.search_space.knobs) == {"batch_size", "compile"}
    argv = contract.trial_launch({"batch_size": 4, "compile": True}, 6, python="py", launch_file=None,
                                 probe_dir="p").argv  # fmt: skip
    # the config file is still the first argument; a Python literal stays one; the horizon replaces the golden's
    assert argv[:3] == ["py", "train.py", "config/train_tiny.py"]
    assert "--compile=True" in argv and "--batch_size=4" in argv and "--gradient_accumulation_steps=2" in argv
    assert "--max_iters=6" in argv and "--learning_rate=1e-2" in argv
    off = contract.trial_launch({"compile": False}, 6, python="py", launch_file=None, probe_dir="p").argv
    assert "--compile=False" in off


def test_config_file_with_overrides_keeps_the_file_and_replaces_the_items(tmp_path: Path) -> None:
    repo = repo_with(tmp_path, "import omegaconf\n", name="run.py")
    command = ["python", "run.py", "recipe.yaml", "--config", "recipe.yaml", "trainer.max_steps=100",
               "data.batch_size=8", "trainer.accumulate_grad_batches=1"]  # fmt: skip
    (repo / "recipe.yaml").write_text("trainer: {max_steps: 100}\n")
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "cfg"], check=True)
    text, report = scaffold(command, repo)
    contract = accepted(tmp_path, text, repo)
    assert contract.workload.knobs_via == "overrides"
    assert "positional arguments kept as written: recipe.yaml" in report.notes
    argv = contract.trial_launch({"data.batch_size": 4}, 5, python="py", launch_file=None, probe_dir="p").argv
    assert argv == ["py", "run.py", "recipe.yaml", "--config", "recipe.yaml", "trainer.max_steps=5",
                    "data.batch_size=4", "trainer.accumulate_grad_batches=2"]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "head", "kind"),
    [
        (["accelerate", "launch", "--num_processes", "1", "--cpu", "train.py"],
         ["{python}", "-m", "accelerate.commands.launch", "--num_processes", "1", "--cpu", "train.py"], "python"),
        (["deepspeed", "--num_gpus=1", "train.py"], ["{python}", "-m", "deepspeed.launcher.runner", "--num_gpus=1", "train.py"],
         "python"),
        (["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"], ["{python}", "train.py"], "torchrun"),
        (["torchrun", "--nproc-per-node", "2", "-m", "pkg.train"], ["{python}", "-m", "pkg.train"], "torchrun"),
        (["python", "-m", "pkg.train"], ["{python}", "-m", "pkg.train"], "python"),
        (["srun", "-N", "1", "--ntasks", "1", "python", "train.py"], ["{python}", "train.py"], "python"),
    ],
)  # fmt: skip
def test_launcher_wrappers_are_recognised(tmp_path: Path, command: list[str], head: list[str], kind: str) -> None:
    repo = repo_with(tmp_path, PLAIN)
    (repo / "pkg").mkdir()
    (repo / "pkg" / "train.py").write_text(PLAIN)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "pkg"], check=True)
    text, report = scaffold([*command, "--batch_size", "8", "--grad_accum", "1", "--max_steps", "100"], repo)
    contract = accepted(tmp_path, text, repo)
    written = [*head, "--batch_size", "8", "--grad_accum", "1", "--max_steps", "100"]
    assert contract.workload.command[: len(written)] == written  # then the searched flags' defaults, made explicit
    assert contract.workload.launcher.kind == kind
    # the script (or the module's file) was read: its declared knobs are searched
    assert {"batch_size", "bf16", "attention"} <= set(contract.search_space.knobs), report


def test_an_installed_tool_runs_as_written(tmp_path: Path) -> None:
    repo = repo_with(tmp_path, "train: {max_steps: 100}\n", name="cfg.yaml")
    text, report = scaffold(["litgpt", "pretrain", "--config", "cfg.yaml", "--train.micro_batch_size", "4",
                             "--train.max_steps", "100"], repo)  # fmt: skip
    contract = accepted(tmp_path, text, repo)
    assert contract.workload.command[:4] == ["litgpt", "pretrain", "--config", "cfg.yaml"]
    assert contract.workload.steps_key == "train.max_steps"
    assert any("not a file of the repository" in n for n in report.notes)


LITGPT_CONFIG = """\
model_config: {name: tiny, block_size: 64, n_layer: 2}
precision: 32-true
data: {class_path: litgpt.data.TextFiles, init_args: {train_data_path: data/text, num_workers: 0}}
train: {global_batch_size: 8, micro_batch_size: 2, max_seq_length: 64, max_tokens: 15360, log_interval: 1}
eval: {interval: 10, max_iters: 2}
"""


def test_a_litgpt_config_with_a_token_horizon_and_a_global_batch(tmp_path: Path) -> None:
    repo = repo_with(tmp_path, LITGPT_CONFIG, name="pretrain.yaml")
    text, report = scaffold(["/opt/tools/bin/litgpt", "pretrain", "--config", "pretrain.yaml"], repo)
    contract = accepted(tmp_path, text, repo)
    # the horizon is LitGPT's token budget: N optimiser steps are N × global batch × sequence length tokens
    assert (contract.workload.steps_key, contract.workload.steps_key_tokens) == ("train.max_tokens", 8 * 64)
    assert contract.launch_values({}, steps=30)["train.max_tokens"] == 30 * 8 * 64
    assert "eval.max_iters" in report.left_out  # the eval's batches, not the training horizon
    # the job derives its accumulation from the global batch: the micro-batch is searched under it
    gb = contract.search_space.constraints.global_batch
    assert gb is not None and (gb.size, gb.size_key, gb.accumulation_key) == (8, "train.global_batch_size", None)
    assert contract.search_space.knobs["train.micro_batch_size"].choices == [1, 2, 4, 8]  # type: ignore[union-attr]
    # LitGPT's own output format, the defaults off: its `iter time` is a micro-batch's, never read as a step time
    m = contract.workload.measurement
    assert m.kind == "coarse" and not m.log_defaults and not m.step_time_regex and m.step_regex
    assert any("iter time" in n for n in report.notes)
    # its tokens: the micro-batches it prints (`iter N`) × the trial's micro-batch × the sequence length
    assert m.tokens_regex and "work.tokens: the work the job prints" in text
    from infrarsi_services.telemetry.service import stated_work

    golden, larger = stated_work(contract, {}), stated_work(contract, {"train.micro_batch_size": 8})
    assert (golden.tokens_per_step, golden.tokens_per_micro_batch, larger.tokens_per_micro_batch) == (512, 2 * 64, 8 * 64)


def test_a_coarse_draft_says_how_its_tokens_are_known(tmp_path: Path) -> None:
    from infrarsi_services.telemetry.service import stated_work
    from support.accelerate_job import GOLDEN_COMMAND, make_accelerate_repo

    repo = make_accelerate_repo(tmp_path / "acc")
    text, _report = scaffold(GOLDEN_COMMAND, repo)
    contract = accepted(tmp_path, text, repo)
    # the script's own --seq_len default (16) is the sequence: tokens are derived from the steps counted
    assert contract.workload.shape is not None and contract.workload.shape.seq_len == 16
    assert "work.tokens: DERIVED" in text
    stated = stated_work(contract, {"per_device_train_batch_size": 8})
    assert (stated.tokens_per_step, stated.how) == (8 * 16, "global batch 8 × sequence 16"), stated
    # a script that says no sequence length: the draft says work.tokens stays unchecked, and what to give
    (tmp_path / "bare").mkdir()
    bare = repo_with(tmp_path / "bare", PLAIN)
    text, _report = scaffold(["python", "train.py", "--batch_size", "8"], bare)
    assert "work.tokens: UNCHECKED until you give workload.shape.seq_len" in text
    assert stated_work(accepted(tmp_path / "bare", text, bare), {}).tokens_per_step is None


def test_a_token_horizon_without_a_sequence_length_is_refused_by_name(tmp_path: Path) -> None:
    repo = repo_with(tmp_path, "train: {global_batch_size: 8, micro_batch_size: 2, max_tokens: 1000}\n", name="c.yaml")
    with pytest.raises(ScaffoldError, match=r"train.max_tokens counts tokens: state the global batch .* sequence"):
        scaffold(["litgpt", "pretrain", "--config", "c.yaml"], repo)


def test_data_outside_git_is_listed_as_inputs(tmp_path: Path) -> None:
    from support.gptlike_job import GOLDEN_COMMAND, make_gptlike_repo

    repo = make_gptlike_repo(tmp_path / "gpt")
    (repo / "out").mkdir()
    (repo / "out" / "ckpt.pt").write_text("an earlier run's output")
    (repo / "__pycache__").mkdir(exist_ok=True)
    (repo / "__pycache__" / "x.pyc").write_text("")
    text, report = scaffold([*GOLDEN_COMMAND, "--out_dir=out"], repo, contract_dir=tmp_path)
    assert report.inputs == ["data"]  # ignored by .gitignore; out/ is the job's output, caches are not inputs
    contract = accepted(tmp_path, text, tmp_path)
    assert contract.workload.inputs == ["data"]
    assert "#   data" in text


@pytest.mark.parametrize("name", ["recipe.yaml", "recipe.json"])
def test_knobs_go_into_a_copy_of_the_config_file_the_command_names(tmp_path: Path, name: str) -> None:
    import json

    settings = {"trainer": {"max_steps": 100, "accumulate_grad_batches": 2, "precision": "32-true"},
                "data": {"batch_size": 4, "path": "data/"}, "optim": {"lr": 0.001}}  # fmt: skip
    repo = repo_with(tmp_path, json.dumps(settings) if name.endswith(".json") else yaml.safe_dump(settings), name=name)
    (repo / "run.py").write_text("import sys, yaml\ncfg = yaml.safe_load(open(sys.argv[-1]))\n")
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "run"], check=True)
    text, report = scaffold(["python", "run.py", "--config", name], repo)
    contract = accepted(tmp_path, text, repo)
    w = contract.workload
    assert (w.knobs_via, w.launch_file, w.steps_key) == ("launch_file", name, "trainer.max_steps")
    assert w.command == ["{python}", "run.py", "--config", "{launch_file}"]
    assert contract.search_space.constraints.global_batch.micro_batch_key == "data.batch_size"
    launched = contract.trial_launch({"data.batch_size": 8}, 5, python="py", launch_file="/t/launch", probe_dir="p")
    assert launched.argv == ["py", "run.py", "--config", "/t/launch"]
    assert launched.launch_file["trainer"] == {"max_steps": 5, "accumulate_grad_batches": 1, "precision": "32-true"}
    assert launched.launch_file["data"] == {"batch_size": 8, "path": "data/"} and launched.launch_file["optim"] == {"lr": 0.001}
    assert any("config file" in n for n in report.notes)
