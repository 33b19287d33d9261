"""How a trial's knob values reach the job: a launch file, command-line flags, environment variables or
Hydra/OmegaConf-style overrides (the contract's ``workload.knobs_via``).

Owns the four deliveries, both ways: reading the golden values back out of the golden launch (the launch
file, the golden command line, the workload's fixed environment) and writing a trial's values into it, plus
the rule that keeps a value from ever becoming an extra argument. Pure functions over lists and mappings:
no shell, no I/O (the contract reads the golden launch file and hands its mapping over).

Written forms, per delivery (``docs/contract.md`` "How knob values reach the job"):

- ``argv``: knob ``per_device_train_batch_size`` is the flag ``--per_device_train_batch_size``. The golden
  command is the baseline: a flag it has keeps its place and its form (``--x 1`` or ``--x=1``) with the new
  value; a flag it lacks is appended as ``--x VALUE``. A boolean keeps the golden spelling: a value-style
  flag (``--bf16 0``, ``--bf16=true``) gets ``1``/``0``, ``true``/``false`` or ``True``/``False`` as the
  golden wrote it; a switch (``--bf16``, ``--no-bf16``, ``--no_bf16``) is written as the switch or its
  negation, and a switch turned off that the golden command has no negation for follows
  ``workload.argv_switch_off`` (``drop``: left out; ``no-``/``no_``: ``--no-bf16``/``--no_bf16``).
- ``env``: knob ``MICRO_BATCH`` is the environment variable of that name (golden: ``workload.env``).
- ``overrides``: knob ``trainer.precision`` is the item ``trainer.precision=VALUE`` of the command line
  (replaced in place, ``+``/``++`` prefixes kept; appended when absent).
- ``launch_file``: dotted keys of the launch YAML (``infrarsi.study.contract.set_dotted``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml

KnobsVia = Literal["launch_file", "argv", "env", "overrides"]
SwitchOff = Literal["drop", "no-", "no_"]

ARGV_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
"""A flag name after its ``--``."""
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
OVERRIDE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*")
"""A Hydra config path (``trainer.precision``, ``model.layers.0``); no ``+``/``~`` prefix."""
OVERRIDE_VALUE = re.compile(r"[A-Za-z0-9_.:/@+-]*")
"""String values Hydra's grammar reads back as the same plain string (no quotes, commas, brackets, spaces)."""

_BOOL_SPELLINGS: dict[str, tuple[str, str]] = {
    "1": ("1", "0"), "0": ("1", "0"),
    "true": ("true", "false"), "false": ("true", "false"),
    "True": ("True", "False"), "False": ("True", "False"),
    "TRUE": ("TRUE", "FALSE"), "FALSE": ("TRUE", "FALSE"),
    "yes": ("yes", "no"), "no": ("yes", "no"),
}  # fmt: skip
"""A golden boolean's spelling → the (on, off) pair written in its place."""


class LaunchValueError(ValueError):
    """A value that cannot be delivered safely; the message names the knob."""


# --------------------------------------------------------------------------------------------------
# Keys and values
# --------------------------------------------------------------------------------------------------


def key_problem(key: str, via: KnobsVia) -> str | None:
    """Why ``key`` cannot name a knob delivered ``via``, else ``None``."""
    match via:
        case "argv":
            if not ARGV_KEY.fullmatch(key):
                return f"{key!r} is not a flag name (letters, digits, '_', '-', '.'; written without its '--')"
        case "env":
            if not ENV_KEY.fullmatch(key):
                return f"{key!r} is not an environment variable name"
        case "overrides":
            if not OVERRIDE_KEY.fullmatch(key):
                return f"{key!r} is not an override path like trainer.precision"
        case "launch_file":
            pass
    return None


def value_problem(key: str, value: Any, via: KnobsVia) -> str | None:
    """Why ``value`` cannot be given to knob ``key`` without risk of becoming something else, else ``None``.

    A string starting with ``-`` would be read as another flag, a newline or NUL splits or truncates an
    argument or variable; refused in every delivery but the launch file (YAML-encoded, so inert there).
    """
    if via == "launch_file" or not isinstance(value, str):
        return None
    if "\0" in value or "\n" in value or "\r" in value:
        return f"knob {key}: value {value!r} holds a newline or NUL character"
    if value.startswith("-"):
        return f"knob {key}: value {value!r} starts with '-' and would be read as another argument"
    if via == "overrides" and not OVERRIDE_VALUE.fullmatch(value):
        return f"knob {key}: value {value!r} holds characters an override cannot carry unquoted"
    return None


def written(value: Any, golden_spelling: str | None = None) -> str:
    """A value as one argument: ints and floats as Python writes them, booleans in the golden spelling
    (default ``true``/``false``), strings as they are."""
    if isinstance(value, bool):
        on, off = _BOOL_SPELLINGS.get(golden_spelling or "", ("true", "false"))
        return on if value else off
    if isinstance(value, float):
        return repr(value)
    return str(value)


def parse_bool(text: str) -> bool | None:
    """``1``/``true``/``yes`` → True, ``0``/``false``/``no`` → False (any case); else ``None``."""
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "t", "y", "on"):
        return True
    if lowered in ("0", "false", "no", "f", "n", "off"):
        return False
    return None


def scalar(text: str) -> Any:
    """A golden string read as a number where it is one (``8`` → 8, ``1e-3`` → 0.001), else as YAML would
    (``true`` → True); anything not a scalar stays text."""
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, bool | int | float | str) else text


# --------------------------------------------------------------------------------------------------
# argv
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArgvFlag:
    """One ``--name`` of a golden command line."""

    name: str
    """The flag without its ``--`` (for a negated switch, the name it negates)."""
    index: int
    """Position of the flag's token."""
    value: str | None
    """The written value; ``None`` for a switch."""
    equals: bool = False
    """Written ``--name=value`` (one token) rather than ``--name value``."""
    negated: str | None = None
    """For ``--no-name``/``--no_name``: the negation prefix (``no-`` or ``no_``)."""


def argv_flags(command: Sequence[str]) -> list[ArgvFlag]:
    """The ``--flags`` of a command line, in order.

    Tokens before the first ``--flag`` (the interpreter, the script, a positional config file) and after a
    bare ``--`` are not flags. A flag followed by a token that does not start with ``-`` (or is a negative number) takes it as
    its value; otherwise it is a switch. ``--no-x``/``--no_x`` switches are reported as negations of ``x``.
    """
    flags: list[ArgvFlag] = []
    i = 0
    while i < len(command) and not command[i].startswith("--"):
        i += 1
    while i < len(command):
        token = command[i]
        if token == "--":
            break
        if not token.startswith("--"):
            i += 1  # a stray positional: not a flag, not a value of one (see the docstring)
            continue
        body = token[2:]
        if "=" in body:
            name, value = body.split("=", 1)
            flags.append(ArgvFlag(name, i, value, equals=True))
            i += 1
            continue
        nxt = command[i + 1] if i + 1 < len(command) else None
        if nxt is not None and (not nxt.startswith("-") or _is_number(nxt)):
            flags.append(ArgvFlag(body, i, nxt))
            i += 2
            continue
        prefix = next((p for p in ("no-", "no_") if body.startswith(p) and len(body) > 3), None)
        flags.append(ArgvFlag(body, i, None))
        if prefix is not None:
            flags.append(ArgvFlag(body[3:], i, None, negated=prefix))
        i += 1
    return flags


def argv_golden(command: Sequence[str]) -> dict[str, str | bool]:
    """Flag name → its golden written value (``True`` for a switch, ``False`` for a negated one); last wins."""
    golden: dict[str, str | bool] = {}
    for flag in argv_flags(command):
        golden[flag.name] = flag.value if flag.value is not None else flag.negated is None
    return golden


def argv_with(command: Sequence[str], values: Mapping[str, Any], *, switch_off: SwitchOff = "drop") -> list[str]:
    """The golden command with every ``values`` flag set (see the module docstring for the forms)."""
    out: list[str | None] = list(command)
    appended: list[str] = []
    flags = argv_flags(command)
    for name, value in values.items():
        mine = [f for f in flags if f.name == name]
        if not mine:
            appended += _new_flag(name, value, switch_off)
            continue
        for flag in mine:
            if flag.value is not None:
                text = written(value, flag.value)
                if flag.equals:
                    out[flag.index] = f"--{name}={text}"
                else:
                    out[flag.index + 1] = text
            elif isinstance(value, bool):
                if value:
                    out[flag.index] = f"--{name}"
                else:
                    off = flag.negated or (None if switch_off == "drop" else switch_off)
                    out[flag.index] = f"--{off}{name}" if off else None
            else:
                # A switch given a value (e.g. --compile in the golden, a choice knob now): value form.
                out[flag.index] = f"--{name}={written(value)}"
    # flags the golden lacks go before a bare ``--`` (what follows it is the job's positionals, not flags)
    taken = {f.index + 1 for f in flags if f.value is not None and not f.equals}
    end = next((i for i, t in enumerate(command) if t == "--" and i not in taken), len(command))
    return [t for t in out[:end] if t is not None] + appended + [t for t in out[end:] if t is not None]


def _new_flag(name: str, value: Any, switch_off: SwitchOff) -> list[str]:
    if isinstance(value, bool):
        if value:
            return [f"--{name}"]
        return [] if switch_off == "drop" else [f"--{switch_off}{name}"]
    return [f"--{name}", written(value)]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------------------------------
# Hydra-style overrides
# --------------------------------------------------------------------------------------------------


def override_items(command: Sequence[str]) -> list[tuple[int, str, str, str]]:
    """(index, prefix, key, value) of every ``[+|++]key=value`` token of the command line."""
    items = []
    for i, token in enumerate(command):
        match = re.fullmatch(r"(\+{0,2})([A-Za-z_][A-Za-z0-9_.-]*)=(.*)", token, flags=re.S)
        if match and not token.startswith("-"):
            items.append((i, match.group(1), match.group(2), match.group(3)))
    return items


def overrides_golden(command: Sequence[str]) -> dict[str, str]:
    """Override key → its golden written value."""
    return {key: value for _i, _prefix, key, value in override_items(command)}


def overrides_with(command: Sequence[str], values: Mapping[str, Any]) -> list[str]:
    """The golden command with each ``key=value`` replaced in place (prefix kept) or appended."""
    out = list(command)
    items = override_items(command)
    for key, value in values.items():
        mine = [(i, prefix, v) for i, prefix, k, v in items if k == key]
        if not mine:
            out.append(f"{key}={written(value)}")
        for i, prefix, golden in mine:
            out[i] = f"{prefix}{key}={written(value, golden)}"
    return out


# --------------------------------------------------------------------------------------------------
# env
# --------------------------------------------------------------------------------------------------


def env_with(golden_env: Mapping[str, str], values: Mapping[str, Any]) -> dict[str, str]:
    """The variables a trial sets: the golden ones, each knob's replacing its own."""
    env = dict(golden_env)
    for key, value in values.items():
        env[key] = written(value, golden_env.get(key))
    return env
