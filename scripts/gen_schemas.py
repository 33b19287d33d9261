"""Write the JSON Schemas of the wire format into ``schemas/`` (``make schemas``).

- ``schemas/events.schema.json``   from ``infrarsi.events.json_schema()`` (the envelope and every payload);
- ``schemas/contract.schema.json`` from ``infrarsi.study.contract.contract_json_schema()``, when that exists.

The files are generated, never edited: ``tests/unit/test_schemas.py`` renders them again in memory and
fails when ``schemas/`` is stale. ``--check`` does the same from the command line (exit 1 when stale).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_DIR = ROOT / "schemas"


def _contract_schema() -> Callable[[], dict[str, Any]] | None:
    try:
        contract = importlib.import_module("infrarsi.study.contract")
    except ModuleNotFoundError as exc:
        if exc.name == "infrarsi.study.contract":
            return None  # not part of this build
        raise
    return getattr(contract, "contract_json_schema", None)


def render() -> dict[str, str]:
    """File name → exact file content (indent 2, sorted keys, trailing newline: stable diffs)."""
    from infrarsi.events import json_schema

    sources: dict[str, Callable[[], dict[str, Any]]] = {"events.schema.json": json_schema}
    if (contract_schema := _contract_schema()) is not None:
        sources["contract.schema.json"] = contract_schema
    return {name: json.dumps(make(), indent=2, sort_keys=True) + "\n" for name, make in sources.items()}


def stale(schema_dir: Path = SCHEMA_DIR) -> list[str]:
    """Names of the files in ``schema_dir`` that differ from what ``render()`` gives (or are missing)."""
    out = []
    for name, text in render().items():
        path = schema_dir / name
        if not path.exists() or path.read_text() != text:
            out.append(name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    parser.add_argument("--out", type=Path, default=SCHEMA_DIR, help="directory to write (default schemas/)")
    args = parser.parse_args(argv)
    if args.check:
        names = stale(args.out)
        for name in names:
            print(f"stale: {args.out / name} (run `make schemas`)", file=sys.stderr)
        return 1 if names else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        path = args.out / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
