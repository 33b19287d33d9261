"""Loading a contract (a file or a dict) through both passes, the locked contract a study carries in
``StudyCreated``, and the contract file's JSON Schema.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
from pydantic import (
    ValidationError,
)

from infrarsi.events import StudyCreated
from infrarsi.study import userfiles
from infrarsi.study.contract.base import ContractError, Problem, pydantic_problems
from infrarsi.study.contract.checks import check_contract
from infrarsi.study.contract.models import Contract


def load_contract(path: Path | str) -> Contract:
    """Load, validate and check a contract file; raises ``ContractError`` naming the file and field paths."""
    path = Path(path)
    try:
        data = userfiles.load_yaml(path, what="the contract")
    except (FileNotFoundError, IsADirectoryError):
        raise ContractError([Problem("", "contract file not found")], path) from None
    except userfiles.UserFileError as exc:
        raise ContractError([Problem("", exc.problem)], path) from None
    if not isinstance(data, dict):
        raise ContractError([Problem("", "a contract must be a YAML mapping")], path)
    return contract_from_dict(data, base_dir=path.resolve().parent, source=path)


def contract_from_dict(
    data: Mapping[str, Any],
    *,
    base_dir: Path | str | None = None,
    source: Path | str | None = None,
    check: bool = True,
) -> Contract:
    """Validate a contract given as a mapping (relative paths from ``base_dir``); ``check`` runs ``check_contract``.

    ``check=False`` rebuilds a contract already locked by ``init`` (e.g. from ``StudyCreated.contract``)
    without looking at the disk.
    """
    try:
        contract = Contract.model_validate(
            dict(data), context={"base_dir": str(base_dir) if base_dir else None}
        )
    except ValidationError as exc:
        raise ContractError(pydantic_problems(exc), source) from None
    contract._source = Path(source).resolve() if source is not None else None
    if check:
        problems = check_contract(contract)
        if problems:
            raise ContractError(problems, source)
    return contract


def locked_contract(created: StudyCreated) -> Contract:
    """The contract ``init`` locked into ``created``, validated without touching the disk.

    Cached per contract content: every service and command asking about the same study shares one
    ``Contract`` (treat it as read-only). Raises ``ContractError`` when the locked contract no longer validates
    (a log written by another version)."""
    return _locked(msgspec.json.encode(created.contract))


@functools.lru_cache(maxsize=64)
def _locked(raw: bytes) -> Contract:
    return contract_from_dict(msgspec.json.decode(raw), check=False)


def contract_json_schema() -> dict[str, Any]:
    """JSON Schema of the contract file, for ``schemas/contract.schema.json`` and editors."""
    return Contract.model_json_schema(mode="validation", by_alias=True)
