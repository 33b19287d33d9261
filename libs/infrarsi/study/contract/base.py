"""What every part of the contract shares: the strict pydantic base model, and the problems a contract
can have (``Problem``, ``ContractError``) with their field paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
)


class StrictModel(BaseModel):
    """Every contract model: unknown fields are errors, values are frozen, attribute docstrings document."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


_KNOB_TAGS = frozenset({"int", "float", "choice", "bool"})
_UNION_BRANCH_NAMES = frozenset(
    {"str", "int", "float", "bool", "Policy", "tagged-union[IntKnob,FloatKnob,ChoiceKnob,BoolKnob]"}
)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a contract: where (dotted field path) and why."""

    path: str
    reason: str


class ContractError(Exception):
    """A contract that cannot be used. ``str()`` gives one ``<file>: <field path>: <reason>`` line per problem."""

    def __init__(self, problems: list[Problem], file: Path | str | None = None) -> None:
        self.problems = problems
        self.file = str(file) if file is not None else None
        super().__init__(self.render())

    def lines(self) -> list[str]:
        prefix = f"{self.file}: " if self.file else ""
        return [f"{prefix}{p.path}: {p.reason}" if p.path else f"{prefix}{p.reason}" for p in self.problems]

    def render(self) -> str:
        return "\n".join(self.lines())


def _error_path(loc: tuple[int | str, ...]) -> str:
    """``('search_space','knobs','mbs','int','choices',2)`` → ``search_space.knobs.mbs.choices[2]``.

    Drops the tag pydantic inserts for a discriminated union (the knob's ``type``) and the branch names it
    inserts for plain unions, which mean nothing to the person editing the YAML.
    """
    out = ""
    parts = list(loc)
    for i, part in enumerate(parts):
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        if i >= 3 and parts[i - 3] == "search_space" and parts[i - 2] == "knobs" and part in _KNOB_TAGS:
            continue
        if part in _UNION_BRANCH_NAMES or part.startswith(("function-", "literal[", "list[")):
            continue
        out += f".{part}" if out else part
    return out


def pydantic_problems(exc: ValidationError) -> list[Problem]:
    problems = []
    seen: set[tuple[str, str]] = set()
    for err in exc.errors(include_url=False):
        path = _error_path(err["loc"])
        reason = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if err["type"] == "missing":
            reason = "required field is missing"
        elif err["type"] == "extra_forbidden":
            reason = "unknown field"
        if (path, reason) not in seen:
            seen.add((path, reason))
            problems.append(Problem(path, reason))
    return problems
