"""The downstream evaluation of a verify run (``verify.downstream``): run the contract's command on the run's
final weights, read its metric. Facts only: the verifier compares the two arms' metrics.

The command runs in the run's worktree with the workload's environment, as an argv (no shell), under the
contract's timeout; its metric is the ``metric`` key of the last standard-output line that is a JSON object.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from infrarsi import events as ev
from infrarsi.study.contract import DownstreamSpec

OUTPUT_TAIL_CHARS = 600


def downstream_argv(spec: DownstreamSpec, *, python: str, launch_file: str, weights: Path) -> list[str]:
    values = {"python": python, "launch_file": launch_file, "weights": str(weights)}
    return [arg.format_map(values) for arg in spec.command]


def parse_metric(stdout: str, metric: str) -> tuple[float | None, str]:
    """The value of ``metric`` in the last stdout line that is a JSON object, or ``None`` and why not."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict):
            continue
        if metric not in record:
            return None, f"the last JSON line has no {metric!r} (keys: {', '.join(sorted(record)) or 'none'})"
        value = record[metric]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return None, f"{metric!r} is {value!r}, not a finite number"
        return float(value), ""
    return None, "the command printed no JSON object line"


def run_downstream(
    spec: DownstreamSpec, argv: list[str], *, cwd: Path, env: Mapping[str, str]
) -> ev.DownstreamResult:
    """Run the command once and return what it measured (a failure is a result with ``error``, never raised)."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=spec.timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return ev.DownstreamResult(metric=spec.metric, error=f"timed out after {spec.timeout_s:g}s",
                                   wall_s=time.monotonic() - started)  # fmt: skip
    except OSError as exc:
        return ev.DownstreamResult(metric=spec.metric, error=f"could not start {argv[:2]!r}: {exc}",
                                   wall_s=time.monotonic() - started)  # fmt: skip
    wall = time.monotonic() - started
    if done.returncode != 0:
        tail = (done.stderr or done.stdout)[-OUTPUT_TAIL_CHARS:].strip()
        return ev.DownstreamResult(metric=spec.metric, error=f"exit code {done.returncode}: {tail}", wall_s=wall)
    value, why = parse_metric(done.stdout, spec.metric)
    if value is None:
        return ev.DownstreamResult(metric=spec.metric, error=f"{why}; output: {done.stdout[-OUTPUT_TAIL_CHARS:].strip()}",
                                   wall_s=wall)  # fmt: skip
    return ev.DownstreamResult(metric=spec.metric, value=value, wall_s=wall)
