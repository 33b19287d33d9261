"""The patch library's format and loader: a directory of ``.patch``/``.diff`` files and the index describing
them (kind, priors, what a reward hack breaks, conflicts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
)

from infrarsi.study import userfiles
from infrarsi.study.contract.base import ContractError, Problem, StrictModel, pydantic_problems


class LogRatioPrior(StrictModel):
    """A prior on log(candidate / baseline) of a quantity: negative = smaller (faster / less memory)."""

    mean: float = 0.0
    """Expected log-ratio."""
    std: float = Field(default=0.1, gt=0)
    """Uncertainty of the log-ratio."""


PATCH_SUFFIXES = (".patch", ".diff")


class PatchInfo(StrictModel):
    """One entry of a workload's patch library (``<patch_dir>/index.yaml``); the diff is ``<id>.patch``
    or ``<id>.diff`` beside it (or the file named by ``diff``)."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Patch id (``<id>.patch`` / ``<id>.diff`` is the diff unless ``diff`` names another file)."""
    diff: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """File name of the diff in the patch directory, when it is not ``<id>.patch`` or ``<id>.diff``."""
    description: str
    """What the patch does and why it should help."""
    files: list[str] = []
    """Repo-relative files the diff touches (informational; the diff itself is what is checked)."""
    risk: Literal["low", "medium", "high"] = "medium"
    """How likely the patch is to change numerics or break the job."""
    kind: Literal["speedup", "memory", "math_change", "conflict", "reward_hack"] = "speedup"
    """What the patch is for. ``math_change`` changes what is computed (verify should catch it),
    ``conflict`` does not apply together with some other patch, ``reward_hack`` games a measurement."""
    breaks: (
        Literal[
            "scope", "work.optimizer_steps", "work.tokens", "work.eval", "loss", "loss.trend", "loss.parity",
            "parity.deterministic", "timing", "checkpoint.restart", "checkpoint.across_change", "downstream",
        ]
        | None
    ) = None
    """For ``reward_hack`` / ``math_change``: the invariant that should catch it."""
    conflicts_with: list[str] = []
    """Patch ids this one does not apply together with."""
    action_class: Literal["code_patch", "kernel_patch", "data_change"] = "code_patch"
    """Apply-policy class of the change (see ``infrarsi.verdicts.policy``)."""
    time_log_ratio: LogRatioPrior = LogRatioPrior()
    """Prior effect on step time."""
    memory_log_ratio: LogRatioPrior = LogRatioPrior()
    """Prior effect on peak memory."""

    _path: Path | None = PrivateAttr(default=None)

    def diff_candidates(self) -> list[str]:
        """File names the diff may have, in order of preference."""
        return [self.diff] if self.diff else [f"{self.id}{suffix}" for suffix in PATCH_SUFFIXES]

    @property
    def path(self) -> Path:
        """The diff file (set when loaded by ``load_patch_library``)."""
        if self._path is None:
            raise ValueError(f"patch {self.id} was not loaded from a library")
        return self._path


class PatchIndex(StrictModel):
    """The file ``<patch_dir>/index.yaml``."""

    patches: list[PatchInfo]
    """Every patch of the library."""


def load_patch_library(patch_dir: Path | str) -> dict[str, PatchInfo]:
    """Read ``index.yaml`` of a patch library; every entry's ``<id>.patch`` must exist beside it.

    Raises ``ContractError`` (paths relative to the index file) on a malformed index or a missing diff.
    """
    patch_dir = Path(patch_dir)
    index = patch_dir / "index.yaml"
    try:
        data = userfiles.load_yaml(index, what="the patch index")
    except FileNotFoundError:
        raise ContractError([Problem("", "patch library index not found")], index) from None
    except userfiles.UserFileError as exc:
        raise ContractError([Problem("", exc.problem)], index) from None
    try:
        parsed = PatchIndex.model_validate(data)
    except ValidationError as exc:
        raise ContractError(pydantic_problems(exc), index) from None
    library: dict[str, PatchInfo] = {}
    problems = []
    for i, info in enumerate(parsed.patches):
        if info.id in library:
            problems.append(Problem(f"patches[{i}].id", f"duplicate patch id {info.id!r}"))
        names = info.diff_candidates()
        diff = next((patch_dir / n for n in names if (patch_dir / n).is_file()), None)
        if diff is None:
            problems.append(Problem(f"patches[{i}]", f"diff {' or '.join(names)} not found in {patch_dir}"))
        info._path = diff
        library[info.id] = info
    if problems:
        raise ContractError(problems, index)
    return library
