"""``check_contract``: the second pass after pydantic's, checking a contract against the workload on disk and
against itself (scope inside the repository, knobs inside the editable launch keys, the global-batch
constraint satisfiable, delivery of every knob, patches present).
"""

from __future__ import annotations

import itertools
import string
from pathlib import PurePosixPath
from typing import Any

from infrarsi.study import inputs
from infrarsi.study.contract.base import ContractError, Problem
from infrarsi.study.contract.knobs import (
    GlobalBatchConstraint,
    IntKnob,
)
from infrarsi.study.contract.models import COMMAND_PLACEHOLDERS, Contract, SearchSpace
from infrarsi.study.contract.patches import load_patch_library
from infrarsi.study.contract.repository import (
    get_dotted,
    inside_problem,
    read_launch,
)
from infrarsi.trial import launch


def check_contract(contract: Contract) -> list[Problem]:
    """Check a shape-valid contract against the workload on disk and against itself."""
    problems: list[Problem] = []
    workload = contract.workload
    repo = workload.repo
    if not repo.is_dir():
        return [Problem("workload.repo", f"{repo} is not a directory")]

    # inputs outside git: inside the repo by path (their data may live anywhere), present, never editable
    for i, rel in enumerate(workload.inputs):
        pure = PurePosixPath(rel)
        if not rel or pure.is_absolute() or rel.startswith("~") or ".." in pure.parts:
            problems.append(Problem(f"workload.inputs[{i}]", f"{rel!r} must be a path relative to the workload repo, without '..'"))
        elif not (repo / rel).exists():
            problems.append(Problem(f"workload.inputs[{i}]", f"{rel} not found in {repo} (prepare the job's data first)"))
        elif editable := next((f for f in inputs.input_files(repo, rel) if contract.editable(f)), None):
            problems.append(Problem(f"workload.inputs[{i}]", f"{editable} is editable (scope.files): an input is read-only"))

    # command placeholders
    for i, arg in enumerate(workload.command):
        reason = _placeholder_problem(arg)
        if reason is None and workload.knobs_via != "launch_file" and "{launch_file}" in arg:
            reason = f"{{launch_file}} has no file to name with knobs_via: {workload.knobs_via}"
        if reason:
            problems.append(Problem(f"workload.command[{i}]", reason))

    # where the golden values are
    baseline: dict[str, Any] | None = None
    if workload.launch_file is not None:
        launch_reason = inside_problem(repo, workload.launch_file)
        if launch_reason:
            problems.append(Problem("workload.launch_file", launch_reason))
        elif not (repo / workload.launch_file).is_file():
            problems.append(Problem("workload.launch_file", f"{workload.launch_file} not found in {repo}"))
        else:
            try:
                baseline = read_launch(repo / workload.launch_file)
            except ValueError as exc:
                problems.append(Problem("workload.launch_file", str(exc)))
    else:
        baseline = contract.golden_values()
    problems += _delivery_problems(contract)

    # editable scope
    for i, pattern in enumerate(contract.scope.files):
        reason = inside_problem(repo, pattern, glob=True)
        if reason:
            problems.append(Problem(f"scope.files[{i}]", reason))

    # knobs
    space = contract.search_space
    launch_keys = set(contract.scope.launch_keys)
    for key in space.knobs:
        if key == workload.steps_key:
            problems.append(
                Problem(f"search_space.knobs.{key}", "the trial horizon is fixed by workload.steps")
            )
            continue
        if key not in launch_keys:
            problems.append(Problem(f"search_space.knobs.{key}", "launch key not in scope.launch_keys"))
        found, value = get_dotted(baseline or {}, key)
        if found:
            reason = space.knobs[key].problem(value)
            if reason:
                problems.append(Problem(f"search_space.knobs.{key}", f"golden launch file value: {reason}"))

    # global batch
    gb = space.constraints.global_batch
    if gb is not None:
        problems += _global_batch_problems(gb, space, launch_keys, baseline)

    # patches
    if space.patches:
        patch_dir_reason = inside_problem(repo, workload.patch_dir)
        if patch_dir_reason:
            problems.append(Problem("workload.patch_dir", patch_dir_reason))
        else:
            try:
                library = load_patch_library(repo / workload.patch_dir)
            except ContractError as exc:
                problems += [Problem("search_space.patches", line) for line in exc.lines()]
            else:
                for i, patch_id in enumerate(space.patches):
                    if patch_id not in library:
                        problems.append(
                            Problem(
                                f"search_space.patches[{i}]",
                                f"unknown patch id {patch_id!r} (not in {workload.patch_dir}/index.yaml)",
                            )
                        )

    # loss checkpoints inside the verify horizon
    at = contract.invariants.loss.at
    if isinstance(at, list):
        late = [s for s in at if s > workload.verify_steps]
        if late:
            problems.append(
                Problem("invariants.loss.at", f"steps {late} are beyond verify_steps {workload.verify_steps}")
            )
    return problems


def _delivery_problems(contract: Contract) -> list[Problem]:
    """Keys the delivery cannot carry, and choices that could become an extra argument of the job."""
    via = contract.workload.knobs_via
    space = contract.search_space
    named: list[tuple[str, str]] = [("workload.steps_key", contract.workload.steps_key)]
    named += [(f"search_space.knobs.{key}", key) for key in space.knobs]
    gb = space.constraints.global_batch
    if gb is not None:
        where = "search_space.constraints.global_batch"
        named += [(f"{where}.{field}", key) for field in ("micro_batch_key", "size_key", "accumulation_key")
                  if (key := getattr(gb, field)) is not None]  # fmt: skip
        named += [(f"{where}.parallel_keys[{i}]", key) for i, key in enumerate(gb.parallel_keys)]
    problems = [Problem(where, reason) for where, key in named if (reason := launch.key_problem(key, via))]
    for key, knob in space.knobs.items():
        for choice in getattr(knob, "choices", None) or []:
            reason = launch.value_problem(key, choice, via)
            if reason:
                problems.append(Problem(f"search_space.knobs.{key}.choices", reason))
    return problems


def _derived_data_parallel_problems(
    gb: GlobalBatchConstraint, space: SearchSpace, launch_keys: set[str], baseline: dict[str, Any] | None
) -> list[Problem]:
    """Data-parallel = devices / product(parallel_keys): each involved key is an int knob or an int in the
    launch file, and at least one allowed combination keeps the constraint (the search filters the others)."""
    where = "search_space.constraints.global_batch"
    problems: list[Problem] = []
    options: dict[str, list[Any]] = {}
    for key in (gb.micro_batch_key, *gb.parallel_keys):
        knob = space.knobs.get(key)
        if knob is not None:
            if isinstance(knob, IntKnob):
                options[key] = list(knob.values() or [])
            else:
                problems.append(Problem(f"search_space.knobs.{key}", "must be type: int (global_batch uses it)"))
            continue
        found, fixed = get_dotted(baseline or {}, key)
        if found and (isinstance(fixed, bool) or not isinstance(fixed, int)):
            problems.append(Problem(where, f"{key!r} is not an int in the launch file"))
        options[key] = [fixed] if found else ([1] if key in gb.parallel_keys else [])
    if problems or not all(options.values()) or len(list(itertools.product(*options.values()))) > 100_000:
        return problems
    if not any(gb.problem(dict(zip(options, combo, strict=True))) is None
               for combo in itertools.product(*options.values())):
        problems.append(Problem(where, f"no allowed {' / '.join(options)} keeps micro-batch x data-parallel "
                                       f"(devices {gb.devices} / {' x '.join(gb.parallel_keys) or '1'}) "
                                       f"dividing global batch {gb.size}"))
    if gb.accumulation_key is not None and gb.accumulation_key not in launch_keys:
        problems.append(Problem(f"{where}.accumulation_key", f"{gb.accumulation_key!r} is not in scope.launch_keys"))
    return problems


def _global_batch_problems(
    gb: GlobalBatchConstraint, space: SearchSpace, launch_keys: set[str], baseline: dict[str, Any] | None
) -> list[Problem]:
    where = "search_space.constraints.global_batch"
    problems = []
    if gb.devices is not None:
        return _derived_data_parallel_problems(gb, space, launch_keys, baseline)
    if gb.size % gb.data_parallel:
        return [Problem(f"{where}.size", f"{gb.size} is not divisible by data_parallel {gb.data_parallel}")]
    per_replica = gb.size // gb.data_parallel
    if gb.size_key is not None and baseline is not None:
        found, size = get_dotted(baseline, gb.size_key)
        if found and size != gb.size:
            problems.append(
                Problem(f"{where}.size", f"launch file has {gb.size_key}={size!r}, contract says {gb.size}")
            )
    knob = space.knobs.get(gb.micro_batch_key)
    if knob is None:
        found, fixed = get_dotted(baseline or {}, gb.micro_batch_key)
        if found and (isinstance(fixed, bool) or not isinstance(fixed, int)):
            problems.append(
                Problem(
                    f"{where}.micro_batch_key", f"{gb.micro_batch_key!r} is not an int in the launch file"
                )
            )
        elif found and per_replica % fixed:
            problems.append(
                Problem(f"{where}.micro_batch_key", f"launch value {fixed} does not divide {per_replica}")
            )
    elif not isinstance(knob, IntKnob):
        problems.append(
            Problem(f"search_space.knobs.{gb.micro_batch_key}", "the micro-batch knob must be type: int")
        )
    else:
        bad = [v for v in knob.values() or [] if v <= 0 or per_replica % v]
        if bad:
            problems.append(
                Problem(
                    f"search_space.knobs.{gb.micro_batch_key}",
                    f"micro-batch values {bad} do not divide global batch {gb.size} / data_parallel {gb.data_parallel}",
                )
            )
    if gb.accumulation_key is not None and gb.accumulation_key not in launch_keys:
        problems.append(
            Problem(f"{where}.accumulation_key", f"{gb.accumulation_key!r} is not in scope.launch_keys")
        )
    return problems


def _placeholder_problem(arg: str) -> str | None:
    try:
        fields = list(string.Formatter().parse(arg))
    except ValueError as exc:
        return f"bad braces in {arg!r}: {exc}"
    for _literal, name, spec, conversion in fields:
        if name is None:
            continue
        if name not in COMMAND_PLACEHOLDERS:
            return f"unknown placeholder {{{name}}} (allowed: {', '.join(sorted(COMMAND_PLACEHOLDERS))})"
        if spec or conversion:
            return f"placeholder {{{name}}} takes no format spec or conversion"
    return None
