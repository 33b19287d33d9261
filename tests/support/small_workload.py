"""The small study workload the workspace and apply tests build: a model file of numbered lines (patches edit
single lines of it), a placeholder training script, a golden launch file with comments (apply must keep them)
and a patch library."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

LAUNCH_TEXT = """\
# golden launch file
run:
  steps: 30
  global_batch_size: 32
knobs:
  micro_batch_size: 4   # sequences per forward
  attention: manual
  compile: false
"""


WORKLOAD_SECTION = {
    "command": ["{python}", "train.py", "--launch", "{launch_file}"],
    "launch_file": "launch/dense.yaml",
    "steps": 30,
    "steps_key": "run.steps",
    "verify_steps": 60,
}
"""A contract's ``workload`` section for this workload, but for its ``repo``."""


def numbered_lines(n: int) -> str:
    """``line 1`` … ``line n``, one a line."""
    return "".join(f"line {i}\n" for i in range(1, n + 1))


def write_workload(wl: Path, model: str, patches: list[dict[str, Any]], files: dict[str, str] | None = None) -> None:
    """``model.py`` (``model``), ``train.py``, ``launch/dense.yaml`` and ``patches/index.yaml`` listing
    ``patches``; then ``files`` (path → text)."""
    (wl / "launch").mkdir(parents=True)
    (wl / "patches").mkdir()
    (wl / "model.py").write_text(model)
    (wl / "train.py").write_text("print('train')\n")
    (wl / "launch" / "dense.yaml").write_text(LAUNCH_TEXT)
    (wl / "patches" / "index.yaml").write_text(yaml.safe_dump({"patches": patches}))
    for path, text in (files or {}).items():
        (wl / path).write_text(text)
