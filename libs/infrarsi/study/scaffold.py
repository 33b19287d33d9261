"""From a launch command to a contract draft: ``infrarsi scaffold [--out FILE] -- <command>``.

Owns reading a user's launch command as written (``python …``, ``python -m …``, ``torchrun …``, ``accelerate
launch …``, ``deepspeed …``, ``srun … python …``, an installed tool, leading ``VAR=value`` assignments; its
positional arguments, config files and ``key=value`` overrides kept where they are) and the training script it
starts (by its source, never by running it: the imports tell Hugging Face
``Trainer``, Lightning or plain PyTorch; ``argparse``/``HfArgumentParser`` declarations tell each flag's
type, default and choices), recognising the usual knobs by name, and writing a commented contract draft
that ``infrarsi init`` accepts as it stands. Flags it does not know are listed as candidates in comments,
never guessed into the search space; flags that change what is trained (learning rate, seed, data, eval
cadence, output paths) are named as left out. A YAML/JSON config file the command names that sets the horizon
is where the knobs go (a per-trial copy); the repository's untracked and ignored data is listed as the job's
inputs outside git (``infrarsi.study.inputs``). It must not run the job, import the user's code or write
anything but the draft (the CLI verb writes it; ``scaffold`` returns text).

``scaffold(command, repo) -> (contract_yaml_text, ScaffoldReport)`` is the library entry point (the agent's
``infrarsi init --ask`` calls it too).
"""

from __future__ import annotations

import ast
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from infrarsi.study.inputs import find_inputs
from infrarsi.trial import launch
from infrarsi.trial.joblog import NUMBER

Framework = Literal["hf_trainer", "lightning", "plain"]
Role = Literal[
    "micro_batch", "accumulation", "precision", "checkpointing", "optimizer_impl", "attention", "compile",
    "workers", "steps", "steps_tokens", "global_batch", "left_out",
]  # fmt: skip

SHELL_TOKENS = frozenset({"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1", "&>"})
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "fish"})
SEARCH_HORIZON = 30
"""Optimiser steps of a search trial in the draft (verify runs twice as long)."""

# Flag names (the last dotted component, dashes as underscores) → the knob role they play.
ROLE_NAMES: dict[str, Role] = {
    **dict.fromkeys(("per_device_train_batch_size", "batch_size", "micro_batch_size", "micro_batch",
                     "train_batch_size", "mbs", "train_micro_batch_size_per_gpu"), "micro_batch"),
    **dict.fromkeys(("gradient_accumulation_steps", "accumulate_grad_batches", "grad_accum", "grad_accum_steps",
                     "accum_steps", "accumulation_steps", "gradient_accumulation"), "accumulation"),
    **dict.fromkeys(("bf16", "fp16", "precision", "mixed_precision", "amp", "autocast_dtype", "dtype"), "precision"),
    **dict.fromkeys(("gradient_checkpointing", "activation_checkpointing", "grad_checkpointing", "checkpointing",
                     "recompute"), "checkpointing"),
    **dict.fromkeys(("optim", "optimizer_impl", "optim_impl", "adamw_impl", "fused_adam", "fused_optimizer"),
                    "optimizer_impl"),
    **dict.fromkeys(("attn_implementation", "attention", "attn", "attention_impl", "sdpa"), "attention"),
    **dict.fromkeys(("torch_compile", "compile", "use_compile"), "compile"),
    **dict.fromkeys(("dataloader_num_workers", "num_workers", "workers", "loader_workers"), "workers"),
    **dict.fromkeys(("max_steps", "steps", "num_steps", "train_steps", "max_iters", "iters", "total_steps"), "steps"),
    "max_tokens": "steps_tokens",
    **dict.fromkeys(("global_batch_size", "global_batch"), "global_batch"),
    **dict.fromkeys(("learning_rate", "lr", "seed", "data_seed", "num_train_epochs", "epochs", "max_epochs",
                     "weight_decay", "warmup_steps", "warmup_ratio", "lr_scheduler_type", "max_grad_norm",
                     "adam_beta1", "adam_beta2", "adam_epsilon", "eval_steps", "eval_strategy",
                     "evaluation_strategy", "eval_every", "eval_interval", "val_check_interval",
                     "per_device_eval_batch_size", "eval_batch_size", "logging_steps", "log_every",
                     "save_steps", "save_strategy", "output_dir", "out_dir", "logging_dir", "report_to",
                     "data", "data_dir", "dataset", "dataset_name", "train_file", "model_name_or_path",
                     "config", "config_name", "tokenizer_name", "seq_len", "max_seq_length", "block_size",
                     "sequence_length", "label_smoothing", "dropout", "run_name", "resume_from_checkpoint",
                     "default_root_dir", "use_cpu", "no_cuda", "overwrite_output_dir"), "left_out"),
}  # fmt: skip
LEFT_OUT_WHY = "changes what is trained, how it is evaluated, or where it writes"

DeclaredType = Literal["int", "float", "str", "bool", "hfbool", "unknown"]
"""How a flag's value is read (``Declared.type``)."""
_PYTHON_KINDS: dict[str, DeclaredType] = {"int": "int", "float": "float", "str": "str", "bool": "bool"}
"""A Python type's name → the ``DeclaredType`` of a flag of that type."""

# What a framework's own flags are when the script only hands them to the framework's parser.
HF_TRAINING_ARGS: dict[str, tuple[DeclaredType, Any]] = {
    "per_device_train_batch_size": ("int", 8), "gradient_accumulation_steps": ("int", 1),
    "bf16": ("hfbool", False), "fp16": ("hfbool", False), "gradient_checkpointing": ("hfbool", False),
    "optim": ("str", None), "torch_compile": ("hfbool", False), "dataloader_num_workers": ("int", 0),
    "max_steps": ("int", -1),
}  # fmt: skip
"""The ``TrainingArguments`` fields the scaffold searches, with the type it writes them in; defaults are read
from the installed ``transformers`` when it is importable (``optim``'s changed between releases), else these
(``None``: unknown, so the flag is not written into the golden command)."""
KNOWN_CHOICES: dict[str, list[Any]] = {
    "optim": ["adamw_torch", "adamw_torch_fused"],
    "attn_implementation": ["eager", "sdpa"],
    "precision": ["32-true", "bf16-mixed"],
}
"""Values a framework is known to accept, for flags whose script declares no ``choices``."""


class ScaffoldError(ValueError):
    """A command the scaffold cannot turn into a contract; the message says why and what to do."""


@dataclass(frozen=True)
class Declared:
    """What the script's parser says of one flag."""

    type: DeclaredType
    """``bool``: a switch (``store_true``/``store_false``/``BooleanOptionalAction``); ``hfbool``: a
    Hugging Face boolean (takes ``--x`` or ``--x true|false``)."""
    default: Any = None
    choices: tuple[Any, ...] | None = None
    negatable: bool = False
    """``BooleanOptionalAction``: ``--no-x`` exists."""


@dataclass
class Knob:
    """One knob the draft searches, and why."""

    key: str
    role: Role
    spec: dict[str, Any]
    golden: Any
    why: str


@dataclass
class ScaffoldReport:
    """What the scaffold found and decided, for the CLI and the agent."""

    framework: Framework
    script: str
    command: list[str]
    """The command as given."""
    launcher: dict[str, int | str]
    knobs_via: launch.KnobsVia
    uses_probe: bool
    knobs: list[Knob] = field(default_factory=list)
    steps_key: str | None = None
    steps_key_tokens: int | None = None
    """Tokens per optimiser step when the horizon flag counts tokens (``max_tokens``)."""
    seq_len: int | None = None
    """Tokens of a training sequence, where the command, its config file or the script's defaults say it."""
    global_batch: dict[str, Any] | None = None
    left_out: dict[str, str] = field(default_factory=dict)
    """Flag → why it is not searched."""
    candidates: dict[str, str] = field(default_factory=dict)
    """Flags the scaffold does not know → what it saw of them (for the user to consider)."""
    notes: list[str] = field(default_factory=list)
    launch_file: str | None = None
    """The command's config file the knobs are written into (``knobs_via: launch_file``)."""
    inputs: list[str] = field(default_factory=list)
    """Untracked and ignored entries of the repository taken as the job's inputs outside git
    (``workload.inputs``: linked read-only into each trial, locked at ``init``)."""


OUTPUT_FLAGS = frozenset({"output_dir", "out_dir", "logging_dir", "default_root_dir", "save_dir", "checkpoint_dir",
                          "log_dir", "out"})  # fmt: skip
"""Flags whose value is where the job writes: never taken as an input."""


# --------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------


@dataclass
class ParsedCommand:
    env: dict[str, str]
    kind: Literal["python", "torchrun"]
    nnodes: int
    nproc_per_node: int
    head: list[str]
    """What the contract's command starts with, as written (``{python}`` for the interpreter): the script,
    ``-m module``, a wrapper with its own options (``{python} -m accelerate.commands.launch --num_processes 1
    train.py``) or an installed tool (``litgpt``)."""
    args: list[str]
    """The job's own arguments after the head, as written: flags, positionals, config files, overrides."""
    dropped: list[str]
    """Launcher options the launcher sets itself (rendezvous, node rank…)."""
    script: str | None = None
    """The Python file the scaffold reads for flag declarations (``None``: an installed module or tool)."""
    module: str | None = None
    """``python -m MODULE`` / ``torchrun -m MODULE``: the module run."""
    wrapper: str | None = None
    """The wrapper the user's command ran through (``accelerate launch``, ``deepspeed``, ``srun``)."""

    @property
    def shown(self) -> str:
        """The job's name in the draft's header."""
        return self.script or self.module or self.head[0]


WRAPPERS: dict[str, tuple[list[str], frozenset[str]]] = {
    "accelerate": (["{python}", "-m", "accelerate.commands.launch"], frozenset({
        "cpu", "multi_gpu", "tpu", "use_deepspeed", "use_fsdp", "use_megatron_lm", "use_xpu", "no_python",
        "debug", "quiet", "q", "same_network", "rdzv_conf", "deepspeed_multinode_launcher", "downcast_bf16",
        "enable_cpu_affinity", "fsdp_use_orig_params", "fsdp_sync_module_states", "fsdp_cpu_ram_efficient_loading",
    })),
    "deepspeed": (["{python}", "-m", "deepspeed.launcher.runner"], frozenset({
        "no_python", "no_local_rank", "force_multi", "save_pid", "bind_cores_to_rank", "no_ssh_check", "no_ssh",
        "elastic_training",
    })),
}  # fmt: skip
"""A launcher wrapper's console script → (the contract's head running it by module, its switch options;
every other option takes a value). ``--module``/``-m`` (a module instead of a script) is read apart."""


def parse_command(command: Sequence[str]) -> ParsedCommand:
    """Split a launch command into environment, launcher layout, the command's head and the job's arguments.

    Recognised: ``[VAR=v …] [env VAR=v …]`` then ``python [opts] script.py|-m module``, ``script.py``,
    ``torchrun [opts] script.py|-m module``, ``python -m torch.distributed.run …``, ``accelerate launch
    [opts] script.py|-m module``, ``deepspeed [opts] script.py``, ``srun [opts] <any of these>``, or an
    installed tool (``litgpt pretrain …``), kept as written."""
    tokens = list(command)
    if not tokens:
        raise ScaffoldError("no command given: write it after '--', e.g. infrarsi scaffold -- python train.py --lr 1e-3")
    bad = [t for t in tokens if t in SHELL_TOKENS or t.startswith(("$(", "`")) or "\n" in t or "\0" in t]
    if bad:
        raise ScaffoldError(f"the command holds shell syntax {bad}: give the job's own command, not a pipeline "
                            "(InfraRSI runs it without a shell and captures its output itself)")  # fmt: skip
    env: dict[str, str] = {}
    while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0], flags=re.S):
        name, value = tokens.pop(0).split("=", 1)
        env[name] = value
    if tokens and Path(tokens[0]).name == "env":  # ``env VAR=1 python …``
        tokens.pop(0)
        while tokens and "=" in tokens[0] and not tokens[0].startswith("-"):
            name, value = tokens.pop(0).split("=", 1)
            env[name] = value
    if not tokens:
        raise ScaffoldError("the command sets variables but runs nothing")
    if Path(tokens[0]).name == "srun":
        # srun's own options are the scheduler's (backend.kind: slurm); the job starts at the first program
        # the scaffold knows
        at = next((i for i, t in enumerate(tokens[1:], 1) if _is_program(t)), None)
        if at is None:
            raise ScaffoldError("srun without a python, torchrun, accelerate or deepspeed command after its options")
        dropped_srun = tokens[1:at]
        parsed = parse_command([*(f"{k}={v}" for k, v in env.items()), *tokens[at:]])
        parsed.dropped = [*(["srun " + " ".join(dropped_srun)] if dropped_srun else ["srun"]), *parsed.dropped]
        parsed.wrapper = "srun"
        return parsed
    program = Path(tokens[0]).name
    if program in SHELLS:
        raise ScaffoldError(f"the command runs a shell ({tokens[0]}): give the training command it runs instead")
    rest = tokens[1:]
    if program == "torchrun":
        return _torchrun(env, rest)
    if program == "accelerate":
        if rest[:1] != ["launch"]:
            raise ScaffoldError(f"accelerate {' '.join(rest[:1])}: only `accelerate launch …` starts a training job")
        return _wrapped(env, "accelerate", rest[1:], "accelerate launch")
    if program == "deepspeed":
        return _wrapped(env, "deepspeed", rest, "deepspeed")
    if re.fullmatch(r"python(\d(\.\d+)?)?", program):
        interpreter_opts, rest = _interpreter_options(rest)
        if rest[:2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
            return _torchrun(env, rest[2:])
        if rest[:2] == ["-m", "accelerate.commands.launch"]:
            return _wrapped(env, "accelerate", rest[2:], "accelerate launch")
        if rest[:2] == ["-m", "deepspeed.launcher.runner"]:
            return _wrapped(env, "deepspeed", rest[2:], "deepspeed")
        if rest[:1] == ["-m"]:
            if len(rest) < 2:
                raise ScaffoldError("python -m without a module name")
            return ParsedCommand(env, "python", 1, 1, ["{python}", *interpreter_opts, "-m", rest[1]], rest[2:], [],
                                 module=rest[1])  # fmt: skip
        if not rest:
            raise ScaffoldError("python without a script: give the training script, e.g. python train.py")
        return ParsedCommand(env, "python", 1, 1, ["{python}", *interpreter_opts, rest[0]], rest[1:], [],
                             script=rest[0])  # fmt: skip
    if program.endswith(".py"):
        return ParsedCommand(env, "python", 1, 1, ["{python}", tokens[0]], rest, [], script=tokens[0])
    if tokens[0].startswith("-") or "/" in tokens[0] and not Path(tokens[0]).name:
        raise ScaffoldError(f"{tokens[0]!r} is not a command")
    # an installed training tool (``litgpt pretrain --config …``): run as written, its flags read from the
    # command alone
    return ParsedCommand(env, "python", 1, 1, [tokens[0]], rest, [], wrapper=program)


def _is_program(token: str) -> bool:
    name = Path(token).name
    return bool(re.fullmatch(r"python(\d(\.\d+)?)?", name)) or name in ("torchrun", "accelerate", "deepspeed") or (
        name.endswith(".py") and not token.startswith("-"))  # fmt: skip


def _wrapped(env: dict[str, str], wrapper: str, tokens: list[str], shown: str) -> ParsedCommand:
    """A wrapper's options (kept as written, in the head), then its script or ``-m module`` and the job's args."""
    head, switches = WRAPPERS[wrapper]
    options: list[str] = []
    module = False
    i = 0
    while i < len(tokens) and tokens[i].startswith("-"):
        token = tokens[i]
        name = token.lstrip("-").split("=", 1)[0].replace("-", "_")
        if name in ("m", "module"):
            module = True
            options.append(token)
            i += 1
        elif "=" in token or name in switches:
            options.append(token)
            i += 1
        else:
            if i + 1 >= len(tokens):
                raise ScaffoldError(f"{shown} {token} needs a value")
            options += tokens[i : i + 2]
            i += 2
    if i >= len(tokens):
        raise ScaffoldError(f"{shown} without a training script")
    target = tokens[i]
    return ParsedCommand(env, "python", 1, 1, [*head, *options, target], tokens[i + 1 :], [],
                         script=None if module else target, module=target if module else None, wrapper=shown)  # fmt: skip


def _interpreter_options(tokens: list[str]) -> tuple[list[str], list[str]]:
    opts = []
    while tokens and tokens[0].startswith("-") and tokens[0] not in ("-m", "-c"):
        opts.append(tokens.pop(0))
    if tokens[:1] == ["-c"]:
        raise ScaffoldError("python -c CODE is not a training script the scaffold can read")
    return opts, tokens


TORCHRUN_VALUE_OPTS = frozenset({
    "nnodes", "nproc_per_node", "node_rank", "master_addr", "master_port", "rdzv_backend", "rdzv_endpoint",
    "rdzv_id", "rdzv_conf", "max_restarts", "monitor_interval", "start_method", "role", "log_dir", "redirects",
    "tee", "local_addr", "logs_specs", "local_ranks_filter", "module_name",
})  # fmt: skip


def _torchrun(env: dict[str, str], tokens: list[str]) -> ParsedCommand:
    nnodes, nproc, dropped = 1, 1, []
    module = False
    i = 0
    while i < len(tokens) and tokens[i].startswith("-"):
        token = tokens[i]
        name, eq, inline = token.partition("=")
        value: str | None = inline if eq else None
        key = name.lstrip("-").replace("-", "_")
        if key in ("standalone", "no_python", "run_path", "module", "m"):
            if key == "no_python":
                raise ScaffoldError(f"torchrun {name} is not supported by the scaffold: run a Python script or module")
            if key in ("module", "m"):
                module = True
            else:
                dropped.append(token)
            i += 1
            continue
        if key not in TORCHRUN_VALUE_OPTS:
            raise ScaffoldError(f"unknown torchrun option {name}")
        if value is None:
            if i + 1 >= len(tokens):
                raise ScaffoldError(f"torchrun {name} needs a value")
            value = tokens[i + 1]
            i += 2
        else:
            i += 1
        if key == "nproc_per_node":
            if not value.isdigit():
                raise ScaffoldError(f"torchrun --nproc-per-node {value}: give a number of processes")
            nproc = int(value)
        elif key == "nnodes":
            if not value.isdigit():
                raise ScaffoldError(f"torchrun --nnodes {value}: give a fixed number of nodes")
            nnodes = int(value)
        else:
            dropped.append(f"{name} {value}")
    if i >= len(tokens):
        raise ScaffoldError("torchrun without a training script")
    if module:  # the launcher's torchrun runs ``{python} -m MODULE`` as ``--module MODULE``
        return ParsedCommand(env, "torchrun", nnodes, nproc, ["{python}", "-m", tokens[i]], tokens[i + 1 :], dropped,
                             module=tokens[i])  # fmt: skip
    return ParsedCommand(env, "torchrun", nnodes, nproc, ["{python}", tokens[i]], tokens[i + 1 :], dropped,
                         script=tokens[i])  # fmt: skip


# --------------------------------------------------------------------------------------------------
# The script
# --------------------------------------------------------------------------------------------------


@dataclass
class ScriptInfo:
    framework: Framework
    declared: dict[str, Declared]
    uses_probe: bool
    has_eval: bool
    hf_parser: bool
    """``HfArgumentParser(... TrainingArguments ...)``: every TrainingArguments field is a flag."""
    lightning_cli: bool


def read_script(path: Path) -> ScriptInfo:
    """What the script's source says: framework, declared flags, whether it calls the probe or evaluates."""
    try:
        source = path.read_text()
        tree = ast.parse(source, filename=str(path))
    except OSError as exc:
        raise ScaffoldError(f"cannot read the training script {path}: {exc}") from None
    except SyntaxError as exc:
        raise ScaffoldError(f"the training script {path} is not valid Python: {exc}") from None
    imports: set[str] = set()
    names: set[str] = set()
    declared: dict[str, Declared] = {}
    for node in ast.walk(tree):
        match node:
            case ast.Import(names=aliases):
                imports.update(a.name.split(".")[0] for a in aliases)
            case ast.ImportFrom(module=module, names=aliases) if module:
                imports.add(module.split(".")[0])
                names.update(a.name for a in aliases)
            case ast.Call(func=ast.Attribute(attr="add_argument")):
                for flag, info in _argparse_flag(node):
                    declared[flag] = info
            case ast.ClassDef(decorator_list=decorators) if any(_names_dataclass(d) for d in decorators):
                # HfArgumentParser turns each field of a dataclass into a flag of the same name
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        declared.setdefault(stmt.target.id, _dataclass_field(stmt))
            case ast.Name(id=name) | ast.Attribute(attr=name):
                names.add(name)
    hf = "transformers" in imports and bool({"Trainer", "TrainingArguments", "HfArgumentParser"} & names)
    lightning = bool({"lightning", "pytorch_lightning"} & imports)
    framework: Framework = "hf_trainer" if hf else "lightning" if lightning else "plain"
    has_eval = bool(re.search(r"eval_dataset|evaluate\(|val_dataloader|validation_step|eval_strategy|\beval_every\b|"
                              r"\beval_interval\b|\bdo_eval\b", source))  # fmt: skip
    return ScriptInfo(
        framework=framework,
        declared=declared,
        uses_probe="infrarsi" in imports,
        has_eval=has_eval,
        hf_parser=hf and "HfArgumentParser" in names and "TrainingArguments" in names,
        lightning_cli="LightningCLI" in names,
    )


def _argparse_flag(call: ast.Call) -> list[tuple[str, Declared]]:
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--")]
    if not flags:
        return []
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = _literal(kw.get("action"))
    action_node = kw.get("action")
    action_name = action_node.attr if isinstance(action_node, ast.Attribute) else None
    default = _literal(kw.get("default"))
    choices = _literal(kw.get("choices"))
    type_node = kw.get("type")
    type_name = type_node.id if isinstance(type_node, ast.Name) else None
    kind: DeclaredType
    negatable = False
    if action in ("store_true", "store_false"):
        kind, default = "bool", action == "store_false" if default is None else default
    elif action_name == "BooleanOptionalAction":
        kind, negatable = "bool", True
    elif type_name in ("int", "float", "str"):
        kind = _PYTHON_KINDS[type_name]
    elif type_name is None and "type" not in kw and action is None:
        kind = _PYTHON_KINDS.get("str" if default is None or isinstance(default, str) else type(default).__name__, "unknown")
    else:
        kind = "unknown"
    info = Declared(
        type=kind,
        default=default,
        choices=tuple(choices) if isinstance(choices, list | tuple) else None,
        negatable=negatable,
    )
    return [(f[2:], info) for f in flags]


def _names_dataclass(node: ast.AST) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return isinstance(target, ast.Name | ast.Attribute) and (getattr(target, "id", None) or getattr(target, "attr", None)) == "dataclass"


def _dataclass_field(stmt: ast.AnnAssign) -> Declared:
    annotation = ast.unparse(stmt.annotation).replace("Optional[", "").rstrip("]")
    annotation = annotation.split("|")[0].strip()
    value = stmt.value
    choices = None
    if isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", None)) == "field":
        kw = {k.arg: k.value for k in value.keywords if k.arg}
        default = _literal(kw.get("default"))
        metadata = _literal(kw.get("metadata"))
        if isinstance(metadata, dict) and isinstance(metadata.get("choices"), list | tuple):
            choices = tuple(metadata["choices"])
    else:
        default = _literal(value)
    kind = _PYTHON_KINDS.get(annotation, "unknown")
    return Declared("hfbool" if kind == "bool" else kind, default, choices)


def _literal(node: ast.AST | None) -> Any:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


# --------------------------------------------------------------------------------------------------
# The draft
# --------------------------------------------------------------------------------------------------


EVAL_SECTIONS = frozenset({"eval", "evaluation", "val", "validation", "test"})
"""Config sections whose counts are the evaluation's, never the training horizon (LitGPT's ``eval.max_iters``)."""


def role_of(flag: str) -> Role | None:
    """The knob role a flag name plays (``trainer.precision`` → ``precision``), or ``None``."""
    *sections, name = flag.replace("-", "_").split(".")
    role = ROLE_NAMES.get(name)
    if role in ("steps", "steps_tokens") and EVAL_SECTIONS & {s.lstrip("_").lower() for s in sections}:
        return "left_out"
    return role


def scaffold(
    command: Sequence[str], repo: Path | str, *, name: str | None = None, contract_dir: Path | str | None = None
) -> tuple[str, ScaffoldReport]:
    """A contract draft for ``command`` run in ``repo`` (commented YAML) and what was found.

    ``contract_dir`` is where the draft will be written (``workload.repo`` is made relative to it; default
    the repo itself). Raises ``ScaffoldError`` for a command it cannot read."""
    repo = Path(repo).resolve()
    parsed = parse_command(command)
    script_path = _script_file(parsed, repo)
    info = read_script(script_path) if script_path is not None else ScriptInfo("plain", {}, False, False, False, False)
    via: launch.KnobsVia = "overrides" if _has_overrides(parsed.args) else "argv"
    golden_args = list(parsed.args)
    config = _config_file(golden_args, repo) if via == "argv" else None
    if config is not None:  # the job reads its settings from this file: knobs go into a per-trial copy of it
        index, config_rel, settings = config
        via = "launch_file"
        golden_args[index] = golden_args[index].replace(golden_args[index].split("=", 1)[-1], "{launch_file}")
    report = ScaffoldReport(
        framework=info.framework, script=script_path.relative_to(repo).as_posix() if script_path else parsed.shown,
        command=list(command),
        launcher={"kind": parsed.kind, "nnodes": parsed.nnodes, "nproc_per_node": parsed.nproc_per_node},
        knobs_via=via, uses_probe=info.uses_probe,
    )  # fmt: skip
    if parsed.dropped:
        report.notes.append(f"launcher options left to InfraRSI's launcher: {' '.join(parsed.dropped)}")
    if parsed.wrapper is not None:
        report.notes.append(f"run through {parsed.wrapper}, kept as written: {shlex.join(parsed.head)}")
    if script_path is None:
        report.notes.append(f"{parsed.shown} is not a file of the repository: its flags are read from the command "
                            "alone (none declared)")  # fmt: skip
    if (tool := _tool_log(parsed)) is not None and not info.uses_probe:
        report.notes.append(tool.note)
    positionals = _positionals(golden_args, via)
    if positionals:
        report.notes.append(f"positional arguments kept as written: {' '.join(positionals)}")
    if config is not None:
        report.launch_file = config_rel
        report.notes.append(f"the command's config file {config_rel} holds the settings: each trial gets a copy of "
                            "it with the knobs set (the command names the copy)")  # fmt: skip
        flags = {key: (Declared("unknown"), value) for key, value in _flat(settings).items()}
    else:
        flags = _known_flags(info, golden_args, via)
    golden_args = _plan_knobs(report, info, flags, golden_args, via, parsed)
    outputs = [str(golden) for flag, (_decl, golden) in flags.items()
               if isinstance(golden, str) and flag.rsplit(".", 1)[-1].replace("-", "_") in OUTPUT_FLAGS]  # fmt: skip
    report.inputs = find_inputs(repo, outputs=outputs)
    text = _render(report, info, parsed, golden_args, repo, Path(contract_dir).resolve() if contract_dir else repo,
                   name or _name_of(repo))  # fmt: skip
    return text, report


def _has_overrides(args: Sequence[str]) -> bool:
    """Hydra/OmegaConf-style: ``key=value`` items that are not a flag's value, beside which ``--flag value``
    pairs (``--config-name base``, ``--config cfg.yaml``) and positionals (a config file) may stand."""
    flags = launch.argv_flags(args)
    values = {f.index + 1 for f in flags if f.value is not None and not f.equals}
    return any(i not in values for i, *_ in launch.override_items(args))


def _positionals(args: Sequence[str], via: launch.KnobsVia) -> list[str]:
    """The job's arguments that are neither flags, flag values nor (with overrides) ``key=value`` items: config
    files, subcommands. They stay in the golden command where they are; knobs never replace them."""
    flags = launch.argv_flags(args)
    used = {f.index for f in flags} | {f.index + 1 for f in flags if f.value is not None and not f.equals}
    if via == "overrides":
        used |= {i for i, *_ in launch.override_items(args)}
    return [a for i, a in enumerate(args) if i not in used]


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
HORIZON_ROLES: frozenset[Role] = frozenset({"steps", "steps_tokens"})
SEQUENCE_LENGTH_NAMES = ("max_seq_length", "seq_len", "sequence_length", "block_size")
"""Flags that say a sequence's tokens, in the order read (LitGPT: ``train.max_seq_length``, else the model's
``block_size``), to turn a token horizon into optimiser steps."""
CONFIG_FLAGS = frozenset({"config", "config_file", "cfg", "config_path"})


def _config_file(args: Sequence[str], repo: Path) -> tuple[int, str, dict[str, Any]] | None:
    """(argument index, repo-relative path, settings) of a YAML/JSON config file the command names — a
    positional or a ``--config`` flag's value — that sets the horizon, when no flag of the command does (then
    the flags override the file, and knobs go there); else ``None``."""
    if any(role_of(flag) in HORIZON_ROLES for flag in launch.argv_golden(args)):
        return None
    flags = launch.argv_flags(args)
    valued = {f.index + (0 if f.equals else 1): f for f in flags if f.value is not None}
    for i, token in enumerate(args):
        flag = valued.get(i)
        if flag is not None and flag.name.replace("-", "_") not in CONFIG_FLAGS:
            continue
        if flag is None and token.startswith("-"):
            continue
        rel = token.split("=", 1)[-1] if flag is not None and flag.equals else token
        path = (repo / rel).resolve()
        if not rel.endswith(CONFIG_SUFFIXES) or not path.is_file() or not path.is_relative_to(repo):
            continue
        try:
            settings = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(settings, dict) and any(role_of(key) in HORIZON_ROLES for key in _flat(settings)):
            return i, path.relative_to(repo).as_posix(), settings
    return None


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key → scalar value of a nested mapping (``{train: {max_steps: 3}}`` → ``train.max_steps``)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{dotted}."))
        elif isinstance(value, bool | int | float | str):
            out[dotted] = value
    return out


def _script_file(parsed: ParsedCommand, repo: Path) -> Path | None:
    """The repository file the command runs (its script, or its ``-m`` module's file), to read for flags."""
    if parsed.script is not None:
        script_path = (repo / parsed.script).resolve()
        if not script_path.is_relative_to(repo):
            raise ScaffoldError(f"the script {parsed.script} is outside the repository {repo}")
        if not script_path.is_file():
            raise ScaffoldError(f"the script {parsed.script} is not a file in {repo}")
        return script_path
    if parsed.module is not None:
        base = repo / parsed.module.replace(".", "/")
        for candidate in (base.with_suffix(".py"), base / "__main__.py"):
            if candidate.is_file() and candidate.resolve().is_relative_to(repo):
                return candidate.resolve()
    return None  # an installed module or tool


def _known_flags(info: ScriptInfo, args: Sequence[str], via: launch.KnobsVia) -> dict[str, tuple[Declared, Any]]:
    """Every flag the command or the script declares → (declaration, golden value or ``None`` if absent)."""
    golden: dict[str, Any] = launch.argv_golden(args) if via == "argv" else dict(launch.overrides_golden(args))
    declared = dict(info.declared)
    if info.hf_parser:
        defaults = _installed_training_defaults()
        for flag, (kind, default) in HF_TRAINING_ARGS.items():
            declared.setdefault(flag, Declared(kind, defaults.get(flag, default)))
    flags: dict[str, tuple[Declared, Any]] = {}
    for flag in [*golden, *declared]:
        if flag in flags or flag.startswith(("no-", "no_")) and flag[3:] in golden:
            continue
        flags[flag] = (declared.get(flag, Declared("unknown")), golden.get(flag))
    return flags


def _installed_training_defaults() -> dict[str, Any]:
    """Defaults of the installed ``transformers.TrainingArguments`` (a library, not the user's code)."""
    try:
        import dataclasses

        from transformers import TrainingArguments
    except ImportError:
        return {}
    return {f.name: str(f.default) if f.name == "optim" else f.default for f in dataclasses.fields(TrainingArguments)
            if f.name in HF_TRAINING_ARGS and f.default is not dataclasses.MISSING}  # fmt: skip


def _plan_knobs(
    report: ScaffoldReport, info: ScriptInfo, flags: dict[str, tuple[Declared, Any]], args: list[str],
    via: launch.KnobsVia, parsed: ParsedCommand,
) -> list[str]:
    """Fill the report's knobs, steps key, left-out and candidate flags; returns the golden arguments with
    every searched flag written out (the baseline made explicit)."""
    explicit: dict[str, Any] = {}
    by_role: dict[Role, list[str]] = {}
    for flag, (decl, golden) in flags.items():
        role = role_of(flag)
        seen = f"golden {golden!r}" if golden is not None else f"declared {decl.type}, default {decl.default!r}"
        if role is None:
            report.candidates[flag] = seen
        elif role == "left_out":
            report.left_out[flag] = LEFT_OUT_WHY
        else:
            by_role.setdefault(role, []).append(flag)
    # the horizon
    steps = by_role.pop("steps", [])
    token_budget = by_role.pop("steps_tokens", [])
    if not steps and token_budget:  # LitGPT's ``train.max_tokens``: steps × tokens per optimiser step
        report.steps_key_tokens = _tokens_per_step(flags, by_role.get("global_batch", []), token_budget[0])
        steps = token_budget
    elif not steps:
        raise ScaffoldError("no flag sets the number of optimiser steps (looked for --max_steps, --steps, "
                            "--max_iters, --max_tokens, …): add one to the script so trials can be short")  # fmt: skip
    else:
        for extra in token_budget:
            report.left_out[extra] = f"a token budget beside the step horizon; {steps[0]} sets the trial horizon"
    report.steps_key = steps[0]
    report.seq_len = _sequence_length(flags)
    for extra in steps[1:]:
        report.left_out[extra] = f"another horizon flag; {steps[0]} sets the trial horizon"
    # the batch and its accumulation: searched together or not at all
    ranks = parsed.nnodes * parsed.nproc_per_node
    micro = by_role.pop("micro_batch", [])
    accum = by_role.pop("accumulation", [])
    global_size = by_role.pop("global_batch", [])
    micro_flag = next((f for f in micro if _int_value(flags[f]) is not None), None)
    size_flag = next((f for f in global_size if _int_value(flags[f]) is not None), None)
    for flag in global_size:
        report.left_out[flag] = ("the global batch: held fixed (it sets the tokens per optimiser step)" if not accum
                                 else f"the global batch: {accum[0]} follows the micro-batch instead")  # fmt: skip
    if micro_flag is not None and size_flag is not None and not accum:
        # the job derives its accumulation from the global batch (LitGPT's ``train.global_batch_size``)
        mb, size = _int_value(flags[micro_flag]), _int_value(flags[size_flag])
        assert mb is not None and size is not None
        if size % (mb * ranks):
            raise ScaffoldError(f"{micro_flag} {mb} × {ranks} rank(s) does not divide {size_flag} {size}")
        per_replica = size // ranks
        choices = sorted({d for d in range(1, per_replica + 1) if per_replica % d == 0 and (d & (d - 1) == 0 or d == mb)})
        report.knobs.append(Knob(micro_flag, "micro_batch", {"type": "int", "choices": choices}, mb,
                                 f"micro-batch; the job derives its accumulation from {size_flag} {size}"))  # fmt: skip
        report.global_batch = {"size": size, "micro_batch_key": micro_flag, "data_parallel": ranks,
                               "size_key": size_flag}  # fmt: skip
        explicit[micro_flag] = mb
    elif micro_flag is not None and accum:
        mb = _int_value(flags[micro_flag])
        acc_value = _int_value(flags[accum[0]]) or 1
        assert mb is not None
        size = mb * acc_value * ranks
        per_replica = size // ranks
        choices = sorted({d for d in range(1, per_replica + 1) if per_replica % d == 0 and (d & (d - 1) == 0 or d == mb)})
        report.knobs.append(Knob(micro_flag, "micro_batch", {"type": "int", "choices": choices}, mb,
                                 f"micro-batch; accumulation {accum[0]} follows so the global batch stays {size}"))  # fmt: skip
        report.global_batch = {"size": size, "micro_batch_key": micro_flag, "data_parallel": ranks,
                               "accumulation_key": accum[0]}  # fmt: skip
        explicit[micro_flag] = mb
        explicit[accum[0]] = acc_value
    else:
        for flag in micro + accum:
            report.left_out[flag] = ("batch size without an accumulation flag: another value would change the "
                                     "tokens per optimiser step" if flag in micro else "no batch-size flag to pair it with")  # fmt: skip
    for extra in micro:
        if extra != micro_flag and extra not in report.left_out:
            report.left_out[extra] = f"another batch-size flag; {micro_flag} is searched"
    for extra in accum[1:]:
        report.left_out[extra] = f"another accumulation flag; {accum[0]} follows the micro-batch"
    # the rest: one knob per flag where its values are known
    for role, role_flags in by_role.items():
        for flag in role_flags:
            knob = _knob(role, flag, flags[flag], info, parsed)
            if isinstance(knob, str):
                report.candidates[flag] = knob
                continue
            report.knobs.append(knob)
            explicit[flag] = knob.golden
    return _explicit_args(args, explicit, flags, via)


def _sequence_length(flags: dict[str, tuple[Declared, Any]]) -> int | None:
    """The tokens of one training sequence, as the command, its config file or the script's declared default
    says (``SEQUENCE_LENGTH_NAMES``, first found); ``None`` when none does."""
    by_base = {f.rsplit(".", 1)[-1].replace("-", "_"): f for f in reversed(list(flags))}
    return next((v for name in SEQUENCE_LENGTH_NAMES if name in by_base and (v := _int_value(flags[by_base[name]]))),
                None)  # fmt: skip


def _tokens_per_step(flags: dict[str, tuple[Declared, Any]], global_size: list[str], horizon: str) -> int:
    """Tokens of one optimiser step, global batch × sequence length, for a horizon that counts tokens."""
    size = next((v for f in global_size if (v := _int_value(flags[f])) is not None), None)
    seq = _sequence_length(flags)
    if size is None or seq is None:
        raise ScaffoldError(f"the horizon {horizon} counts tokens: state the global batch (global_batch_size) and "
                            f"the sequence length ({', '.join(SEQUENCE_LENGTH_NAMES)}) in the command or its config "
                            "file, so a trial of N optimiser steps can be given N × their product")  # fmt: skip
    return size * seq


def _int_value(entry: tuple[Declared, Any]) -> int | None:
    decl, golden = entry
    value = golden if golden is not None else decl.default
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.isdigit() and int(value) > 0:
        return int(value)
    return None


def _knob(role: Role, flag: str, entry: tuple[Declared, Any], info: ScriptInfo, parsed: ParsedCommand) -> Knob | str:
    """The knob for a recognised flag, or why it stays a candidate."""
    decl, golden = entry
    base = flag.rsplit(".", 1)[-1].replace("-", "_")
    is_bool = decl.type in ("bool", "hfbool") or base in ("bf16", "fp16", "amp", "compile", "torch_compile",
                                                          "gradient_checkpointing", "use_compile", "fused_adam")  # fmt: skip
    if base == "fp16":
        return "fp16 needs a CUDA device and a loss scaler; left for the user to add on GPU hosts"
    if is_bool and decl.type in ("bool", "hfbool", "unknown"):
        value = golden if isinstance(golden, bool) else launch.parse_bool(golden) if isinstance(golden, str) else None
        if value is None:
            value = bool(decl.default) if isinstance(decl.default, bool | int) else False
        return Knob(flag, role, {"type": "bool"}, value, _WHY[role])
    if is_bool and decl.type == "int":  # ``--bf16 0`` declared type=int: value-style on/off
        value = launch.parse_bool(str(golden if golden is not None else decl.default or 0))
        return Knob(flag, role, {"type": "bool"}, bool(value), _WHY[role] + " (written 0/1)")
    if role == "workers":
        current = _int_value(entry) or 0
        high = max(current, min(4, os.cpu_count() or 1))
        return Knob(flag, role, {"type": "int", "low": 0, "high": high}, current, _WHY[role])
    choices = list(decl.choices) if decl.choices else KNOWN_CHOICES.get(base)
    if not choices:
        return f"recognised as {role.replace('_', ' ')}, but the script declares no choices to search"
    value = golden if golden is not None else decl.default
    if value is not None and value not in choices:
        choices = [value, *choices] if isinstance(value, type(choices[0])) else choices
    if any(launch.value_problem(flag, c, "argv") for c in choices if isinstance(c, str)):
        return "its choices hold values that would read as flags"
    # golden None: the job's default is unknown, so the flag stays out of the golden command
    return Knob(flag, role, {"type": "choice", "choices": choices}, value, _WHY[role])


_WHY: dict[Role, str] = {
    "precision": "precision: bf16 matmuls halve memory traffic where the host has bf16 units",
    "checkpointing": "activation checkpointing: trades recompute for memory (enables larger micro-batches)",
    "optimizer_impl": "optimiser implementation (fused/foreach kernels)",
    "attention": "attention implementation",
    "compile": "torch.compile",
    "workers": "data-loader worker processes",
    "micro_batch": "micro-batch",
    "accumulation": "accumulation",
    "steps": "horizon",
    "steps_tokens": "horizon in tokens",
    "global_batch": "global batch",
    "left_out": LEFT_OUT_WHY,
}


def _explicit_args(args: list[str], explicit: dict[str, Any], flags: dict[str, tuple[Declared, Any]],
                   via: launch.KnobsVia) -> list[str]:
    """The golden arguments with each searched flag present, so the baseline does not rest on defaults."""
    missing = {}
    for flag, value in explicit.items():
        decl, golden = flags.get(flag, (Declared("unknown"), None))
        if golden is not None or value is None:
            continue
        if decl.type == "bool":
            continue  # a switch: absent is its default; the launcher adds or drops it
        missing[flag] = ("true" if value else "false") if isinstance(value, bool) and decl.type == "hfbool" else (
            int(value) if isinstance(value, bool) else value)  # fmt: skip
    if not missing or via == "launch_file":
        return args
    return launch.argv_with(args, missing) if via == "argv" else launch.overrides_with(args, missing)


def _name_of(repo: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", repo.name).strip("-.") or "job"
    return name if name[0].isalnum() else f"job-{name}"


def _host_memory() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except (ImportError, OSError):
        return 8 << 30


def _render(report: ScaffoldReport, info: ScriptInfo, parsed: ParsedCommand, args: list[str], repo: Path,
            contract_dir: Path, name: str) -> str:
    """The commented YAML draft."""
    ranks = parsed.nnodes * parsed.nproc_per_node
    steps = SEARCH_HORIZON
    eval_on = info.has_eval and report.uses_probe
    capacity = _host_memory() // (2 * ranks)
    repo_rel = os.path.relpath(repo, contract_dir)
    knobs = {k.key: k.spec for k in report.knobs}
    launch_keys = [k.key for k in report.knobs]
    if report.global_batch and report.global_batch.get("accumulation_key"):
        launch_keys.append(report.global_batch["accumulation_key"])
    workload: dict[str, Any] = {
        "repo": repo_rel,
        "command": [*parsed.head, *args],
        "knobs_via": report.knobs_via,
        **({"launch_file": report.launch_file} if report.launch_file else {}),
        "launcher": report.launcher,
        "env": parsed.env,
        "steps": steps,
        "steps_key": report.steps_key,
        **({"steps_key_tokens": report.steps_key_tokens} if report.steps_key_tokens else {}),
        "verify_steps": 2 * steps,
    }
    if report.knobs_via == "argv" and any(d.negatable for d in info.declared.values()):
        workload["argv_switch_off"] = "no-"
    tool = _tool_log(parsed)
    # a tool that prints its held-out loss is compared on it: its train loss is of whichever batches it drew
    held_out = not report.uses_probe and tool is not None and bool(tool.eval_loss_regex) and tool.eval_held_out
    if not report.uses_probe and tool is not None:
        workload["measurement"] = {"kind": "coarse", "step_regex": tool.step_regex, "loss_regex": list(tool.loss_regex),
                                   "eval_loss_regex": list(tool.eval_loss_regex),
                                   **({"tokens_regex": list(tool.tokens_regex)} if tool.tokens_regex else {}),
                                   "log_defaults": False}  # fmt: skip
    elif not report.uses_probe:
        workload["measurement"] = {"kind": "coarse", "step_regex": default_step_regex(info.framework)}
    if not report.uses_probe and report.seq_len is not None and not report.steps_key_tokens:
        workload["shape"] = {"seq_len": report.seq_len}  # a coarse trial's tokens: steps × global batch × this
    if report.inputs:
        workload["inputs"] = report.inputs
    contract: dict[str, Any] = {
        "name": name,
        "goal": "Make this training job faster without changing what it learns.",
        "workload": workload,
        "cluster": {"id": "local", "accelerator": "cpu", "nodes": parsed.nnodes, "devices_per_node": parsed.nproc_per_node,
                    "memory_capacity_bytes": capacity, "peak_flops": None},  # fmt: skip
        "backend": {"kind": "local", "parallel": 1, "timeout_s": 900},
        "scope": {"files": [], "launch_keys": launch_keys},
        "search_space": {"knobs": knobs, **({"constraints": {"global_batch": report.global_batch}} if report.global_batch else {})},
        "invariants": {"loss": {"tolerance": 0.05, "mode": "relative", "at": "every_eval" if eval_on or held_out else "every_step"},
                       "steps": True, "tokens": True, "eval": eval_on, "timing_tolerance": 0.10},  # fmt: skip
        "budget": {"trials": 12, "accelerator_hours": 2.0},
    }
    for section, key in (("workload", "command"), ("workload", "launcher"), ("workload", "env"),
                         ("workload", "measurement"), ("workload", "inputs"), ("scope", "files"), ("scope", "launch_keys")):
        if key in contract[section]:
            contract[section][key] = _flow(contract[section][key])
    contract["search_space"]["knobs"] = {k: _flow(v) for k, v in knobs.items()}
    if report.global_batch:
        contract["search_space"]["constraints"]["global_batch"] = _flow(report.global_batch)
    for key in ("backend", "budget"):
        contract[key] = _flow(contract[key])
    contract["invariants"]["loss"] = _flow(contract["invariants"]["loss"])
    body = yaml.dump(contract, Dumper=_Dumper, sort_keys=False, width=1 << 16, default_flow_style=False)
    return _header(report, info, parsed) + _annotate(body, report)


class _FlowDict(dict[str, Any]):
    pass


class _FlowList(list[Any]):
    pass


class _Dumper(yaml.SafeDumper):
    """Block style, except the small mappings and lists that read better on one line."""


_Dumper.add_representer(_FlowDict, lambda d, v: d.represent_mapping("tag:yaml.org,2002:map", v, flow_style=True))
_Dumper.add_representer(_FlowList, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def _flow(value: Any) -> Any:
    if isinstance(value, dict):
        return _FlowDict(value)
    if isinstance(value, list):
        return _FlowList(value)
    return value


@dataclass(frozen=True)
class ToolLog:
    """How an installed training tool prints its steps and losses: read with these patterns only (a coarse
    draft's ``step_regex``, ``loss_regex``, ``eval_loss_regex`` and ``log_defaults: false``)."""

    step_regex: str
    loss_regex: tuple[str, ...]
    eval_loss_regex: tuple[str, ...]
    tokens_regex: tuple[str, ...]
    """The work done so far as the tool prints it (a group ``tokens`` or ``micro_batches``)."""
    eval_held_out: bool
    """The loss invariant compares the tool's printed eval loss (``loss.at: every_eval``), not its train loss:
    the tool's data loader deals the samples in an order that depends on speed knobs, so a candidate's per-step
    train loss is of other batches."""
    note: str
    """Said in the draft's header: what is read, and what is not and why."""


TOOL_LOGS: dict[str, ToolLog] = {
    # LitGPT 0.5 (pretrain and finetune print alike): "Epoch 1 | iter 8 step 2 | loss train: 5.773, val: n/a |
    # iter time: 176.69 ms (step) remaining time: …" once per logged optimiser step, "iter 8: val loss 5.0673,
    # val time: 124.99 ms" at each eval, "Final evaluation | val loss: 4.925 | val ppl: …" at the end. ``iter``
    # counts micro-batches (the eval line has no step), so the step is read only from the step line.
    "litgpt": ToolLog(
        step_regex=r"\| iter \d+ step (?P<number>\d+) \|",
        loss_regex=(rf"\| loss train: (?P<loss>{NUMBER}),",),
        eval_loss_regex=(rf"\bval loss:? (?P<loss>{NUMBER})",),
        tokens_regex=(r"\| iter (?P<micro_batches>\d+) step \d+ \|",),
        eval_held_out=True,
        note="LitGPT's output read for its steps (`iter N step M`: M), micro-batches (N: the tokens are N × the "
        "trial's micro-batch × the sequence length, LitGPT's own count), train loss (`loss train: X`) and eval loss "
        "(`val loss X`); its `iter time` is its last micro-batch's, not the optimiser step's, so no step time is "
        "read from it: timing is unchecked unless you give workload.measurement.step_time_regex for a line that "
        "prints an optimiser step's time. The loss is compared at every eval (its validation loss): litdata deals the "
        "training samples by micro-batch size, so another micro-batch trains on other batches first and its per-step "
        "train loss differs by their noise",
    ),
}
"""An installed tool's command name → how it prints (``litgpt pretrain …``)."""


def _tool_log(parsed: ParsedCommand) -> ToolLog | None:
    """How the installed tool the command runs prints (``.venv/bin/litgpt`` is ``litgpt``), if known."""
    if parsed.script is not None or parsed.module is not None:
        return None
    return TOOL_LOGS.get(Path(parsed.head[0]).name)


def default_step_regex(framework: Framework) -> str:
    """The ``measurement.step_regex`` a draft gets for a job without the probe (the count rules:
    ``infrarsi_services.launcher.output``)."""
    # tqdm's "12/30 [00:05<…" (Trainer and Lightning progress bars), or the line a plain loop prints per step:
    # "step 12 | loss …", "Step: 12", "iter 12", "step=12/30" — numbered from 0 or 1 (the ``number`` group
    # takes either), never "max_steps=30" or "steps: 30"
    if framework in ("hf_trainer", "lightning"):
        return r"(?P<step>\d+)/\d+ \["
    return r"(?i)\b(?:step|iter|iteration)\b[ \t]*[:=#]?[ \t]*(?P<number>\d+)"


def _header(report: ScaffoldReport, info: ScriptInfo, parsed: ParsedCommand) -> str:
    lines = [
        "# Contract draft written by `infrarsi scaffold` — review it, narrow the scope and tolerances, then",
        "# run `infrarsi init` on it.",
        f"# Job: {report.script} ({_FRAMEWORK_NAMES[report.framework]}), {report.launcher['kind']} with "
        f"{report.launcher['nnodes']} node(s) × {report.launcher['nproc_per_node']} process(es).",
        f"# Knobs reach the job as {_DELIVERY_NAMES[report.knobs_via]};"
        " the golden command below is the baseline.",
    ]
    if report.uses_probe:
        lines.append("# The script reports steps through InfraRSI's probe: every invariant is checked.")
    else:
        lines += [
            "# The script does not call InfraRSI's probe, so trials are measured COARSELY (wall time, exit",
            "# status, process-tree memory, steps counted by workload.measurement.step_regex in the job's output);",
            "# the train/eval loss and step times it prints are read from the same output (default patterns for",
            "# HF Trainer, Lightning, nanoGPT-style and Megatron-style logs, plus workload.measurement.loss_regex);",
            *_coarse_tokens_lines(report, parsed),
            "# The eval's work is not printed (invariants.eval is off; turned on, the steps after which an eval",
            "# loss is printed are held to the golden baseline's).",
            "# " + _PROBE_HINT[report.framework],
        ]
    if report.left_out:
        lines.append("# Left out of the search (" + LEFT_OUT_WHY + ", or said below):")
        lines += [f"#   --{flag}: {why}" if why != LEFT_OUT_WHY else f"#   --{flag}" for flag, why in sorted(report.left_out.items())]
    if report.candidates:
        lines.append("# Candidates the scaffold does not know (not searched; add a knob if one is a pure speed setting):")
        lines += [f"#   --{flag}: {seen}" for flag, seen in sorted(report.candidates.items())]
    if report.inputs:
        lines.append("# Inputs outside git (untracked or ignored; linked read-only into every trial and locked at init —")
        lines.append("# remove any the job does not read, e.g. outputs of earlier runs):")
        lines += [f"#   {rel}" for rel in report.inputs]
    lines += [f"# Note: {note}" for note in report.notes]
    lines.append(f"# Read from: {shlex.join(report.command)}")
    return "\n".join(lines) + "\n"


def _coarse_tokens_lines(report: ScaffoldReport, parsed: ParsedCommand) -> list[str]:
    """How a coarse draft's ``work.tokens`` will be known (``infrarsi.verdicts.stats.coarse_tokens``), or what to
    add so that it is: never left unchecked without saying so."""
    tool = _tool_log(parsed)
    if tool is not None and tool.tokens_regex:
        return ["# work.tokens: the work the job prints (workload.measurement.tokens_regex) × the trial's micro-batch",
                "# and sequence length, held to the golden baseline's."]
    if report.steps_key_tokens or (report.seq_len and report.global_batch):
        return ["# work.tokens: DERIVED — the steps counted × the tokens per step this contract states (global batch",
                "# × workload.shape.seq_len), held to the golden baseline's; if the job prints its tokens (HF's",
                "# `num_input_tokens_seen` is read by default), give workload.measurement.tokens_regex to count them."]
    return ["# work.tokens: UNCHECKED until you give workload.shape.seq_len (with a global-batch constraint) or",
            "# workload.measurement.tokens_regex for a line that prints the tokens (or micro-batches) done so far."]


_DELIVERY_NAMES = {"argv": "command-line flags", "overrides": "key=value overrides", "env": "environment variables",
                   "launch_file": "a per-trial copy of the command's config file"}  # fmt: skip
_FRAMEWORK_NAMES = {"hf_trainer": "Hugging Face Trainer", "lightning": "PyTorch Lightning", "plain": "plain PyTorch"}
_PROBE_HINT = {
    "hf_trainer": "For a full measurement add Trainer(..., callbacks=[InfraRSICallback()]) with\n"
                  "# `from infrarsi.probe.integrations.hf import InfraRSICallback`, then scaffold again.",
    "lightning": "For a full measurement add Trainer(..., callbacks=[InfraRSICallback()]) with\n"
                 "# `from infrarsi.probe.integrations.lightning import InfraRSICallback`, then scaffold again.",
    "plain": "For a full measurement wrap the loop's step with `from infrarsi.probe.integrations.torch import\n"
             "# track` (@track(model, opt).step), then scaffold again.",
}  # fmt: skip


def _annotate(body: str, report: ScaffoldReport) -> str:
    """A ``# why`` comment after each knob line of the dumped YAML."""
    why = {k.key: f"{k.why}; golden {k.golden!r}" for k in report.knobs}
    out = []
    for line in body.splitlines():
        match = re.match(r"\s+(['\"]?)([^:'\"]+)\1:", line)
        if match and match.group(2) in why and "type:" in line:
            line = f"{line}  # {why.pop(match.group(2))}"
        elif line.startswith("scope:"):
            out.append("# scope.files: the files patches may touch (none yet: list them to let the search patch code)")
        elif line.strip().startswith("memory_capacity_bytes:"):
            line += "  # half this host's memory per rank: set the real device capacity"
        out.append(line)
    return "\n".join(out) + "\n"
