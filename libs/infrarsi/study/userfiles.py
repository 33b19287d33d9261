"""Reading the files a user hands the CLI (contracts, policies, patch indexes, launch files, bank imports).

Owns the limits and the errors: a file is refused before it is parsed when it is larger than its kind
allows (PyYAML reads ~0.5 MB/s of a dense mapping: a 50 MB "contract" would hold ``init`` for minutes),
when it is not UTF-8 text (random bytes), or when it nests deeper than a parser can recurse. Each refusal is
a ``UserFileError`` naming the file and the problem; it is a ``ValueError`` so callers that already turn
``ValueError`` into a clear message keep doing so. It must not know what the files mean.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_CONFIG_BYTES = 1 << 20
"""Contracts, policies, patch indexes and launch files: hand-written YAML of a few KB; 1 MiB is ~100× that."""
MAX_IMPORT_BYTES = 512 << 20
"""Bank exports (JSON lines): machine-written, one line per entry."""


class UserFileError(ValueError):
    """A file the user named cannot be used: too large, not text, or not parseable.

    ``str()`` is ``<file>: <problem>``; ``problem`` is the part after the file, for errors that name it already.
    """

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(f"{source}: {problem}")
        self.problem = problem


def read_text(path: Path | str, *, what: str, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The file's text, refused if larger than ``max_bytes`` or not UTF-8 text. ``FileNotFoundError`` passes."""
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise UserFileError(str(path), f"{what} is {_mib(size)}, over the {_mib(max_bytes)} limit; is this the right file?")
    data = path.read_bytes()[: max_bytes + 1]  # a file that grew since the stat is still bounded
    if len(data) > max_bytes:
        raise UserFileError(str(path), f"{what} grew past the {_mib(max_bytes)} limit while being read")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserFileError(str(path), f"{what} is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})") from None
    if "\0" in text:
        raise UserFileError(str(path), f"{what} is binary (a NUL byte at offset {text.index(chr(0))}), not text")
    return text


def load_yaml(path: Path | str, *, what: str, max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """``yaml.safe_load`` of a bounded text file; every parse failure is a ``UserFileError`` naming the file."""
    return parse_yaml(read_text(path, what=what, max_bytes=max_bytes), source=str(path), what=what)


def parse_yaml(text: str, *, source: str, what: str = "the value") -> Any:
    """``yaml.safe_load`` with its failures (syntax, unsafe tags such as ``!!python/…``, nesting) as one line."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserFileError(source, f"invalid YAML in {what}: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise UserFileError(source, f"invalid YAML in {what}: nested too deeply") from None


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
