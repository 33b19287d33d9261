"""The type-checking policy `make lint` relies on: mypy strict on libs/infrarsi and services, no module exempt,
and every `type: ignore` there saying on its line why (`make lint` itself runs mypy)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IGNORE = re.compile(r"#\s*type:\s*ignore(\[[^\]]*\])?(?P<rest>.*)$")


def test_mypy_is_strict_with_no_module_exempt() -> None:
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["strict"] is True
    assert set(mypy["files"]) == {"libs/infrarsi", "services"}
    loosened = [o["module"] for o in mypy.get("overrides", []) if set(o) - {"module", "ignore_missing_imports"}]
    assert loosened == [], f"overrides that relax checking of our own modules: {loosened}"


def test_every_type_ignore_says_why() -> None:
    unexplained = []
    for path in sorted([*(ROOT / "libs" / "infrarsi").rglob("*.py"), *(ROOT / "services").rglob("*.py")]):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            match = IGNORE.search(line)
            if match is None:
                continue
            if match.group(1) is None or "#" not in match.group("rest"):
                unexplained.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert unexplained == [], "type: ignore needs an error code and a '# why' after it:\n" + "\n".join(unexplained)
